//! The search loop against a scripted chat and a judge that reads verdicts off the source.

mod common;

use common::*;
use kforge_agents::{search, Inventory, KernelInfo, KernelKind, LoopConfig, Observer, Quiet, Stop, Verdict};
use kforge_llm::{LlmError, Request, Role, Scope};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The strategy an executor request is about (`Plan (STRATEGY): …` in its first user message).
fn strategy_of(request: &Request) -> String {
    let text = first_user(request);
    let start = text.find("Plan (").expect("an executor prompt names its plan") + 6;
    text[start..].split(')').next().unwrap().to_string()
}

fn one_plan_each(cfg: &mut LoopConfig, plans: usize) {
    cfg.iterations = 1;
    cfg.plans = plans;
    cfg.chains = 1;
}

#[test]
fn plans_are_parsed_normalized_and_executed() {
    let chat = Scripted::new(|req, scope| match scope.role.as_str() {
        "planner" => Ok(plans(req, &[("Fuse Epilogue", "fuse the add"), ("tune_BLOCK size", "BLOCK=1024")])),
        "executor" => Ok(submit(req, &kernel(&strategy_of(req), "SPEED=1.2"))),
        other => panic!("unexpected role {other}"),
    });
    let judge = SourceJudge::default();
    let mut cfg = config();
    one_plan_each(&mut cfg, 2);
    let out = search(&context(), &cfg, &chat, &judge, &Quiet);
    let ids: Vec<&str> = out.candidates.iter().map(|(c, _)| c.id.as_str()).collect();
    assert_eq!(ids, ["i1-c0-p0-a1", "i1-c0-p1-a1"]);
    let strategies: Vec<&str> = out.candidates.iter().map(|(c, _)| c.strategy.as_str()).collect();
    assert_eq!(strategies, ["fuse-epilogue", "tune-block-size"]);
    assert_eq!(out.candidates[1].0.change, "BLOCK=1024");
    assert_eq!(out.candidates[0].0.parent, None);
    assert_eq!(out.best.as_deref(), Some("i1-c0-p0-a1"), "ties go to the earlier candidate");
    assert_eq!(out.best_speedup, Some(1.2));
    assert_eq!(out.stop, Stop::Iterations);
    assert_eq!(out.stats.calls, 3);
    let planner = &chat.requests("planner")[0];
    assert_eq!(planner.model, "fake-model");
    assert!(first_user(planner).contains("torch.compile default (1.500 ms per forward)"));
    assert!(planner.tools.iter().any(|t| t.name == "submit_plans"));
}

#[test]
fn malformed_planner_replies_are_fed_back_and_counted() {
    let chat = Scripted::new(|req, scope| match (scope.role.as_str(), turns(req)) {
        ("planner", 0) => Ok(malformed_call(req, "submit_plans")),
        ("planner", 1) => Ok(text("I think we should fuse things.")),
        ("planner", 2) => Ok(call(req, "submit_plans", serde_json::json!({"plans": [{"strategy": "x"}]}))),
        ("planner", _) => Ok(plans(req, &[("fuse", "fuse it")])),
        ("executor", _) => Ok(submit(req, &kernel("k", "SPEED=1.1"))),
        (other, _) => panic!("unexpected role {other}"),
    });
    let judge = SourceJudge::default();
    let mut cfg = config();
    one_plan_each(&mut cfg, 1);
    cfg.malformed_limit = 3;
    let out = search(&context(), &cfg, &chat, &judge, &Quiet);
    let requests = chat.requests("planner");
    assert_eq!(requests.len(), 4);
    let second = requests[1].messages.last().unwrap();
    assert_eq!(second.role, Role::Tool);
    assert_eq!(second.tool_call_id.as_deref(), Some("call-0"));
    assert!(second.content.contains("the arguments of submit_plans are not a JSON object (EOF while parsing)"));
    assert!(
        last(&requests[2]).starts_with("error: the reply called no tool. Call submit_plans"),
        "{}",
        last(&requests[2])
    );
    assert_eq!(last(&requests[3]), "error: plan 0: `change` is missing");
    assert_eq!(out.stats.malformed, 3);
    assert_eq!(out.candidates.len(), 1);
}

#[test]
fn a_planner_that_stays_malformed_gives_up_at_the_limit() {
    let chat = Scripted::new(|_, scope| match scope.role.as_str() {
        "planner" => Ok(text("")),
        other => panic!("unexpected role {other}"),
    });
    let judge = SourceJudge::default();
    let mut cfg = config();
    one_plan_each(&mut cfg, 2);
    cfg.malformed_limit = 2;
    let out = search(&context(), &cfg, &chat, &judge, &Quiet);
    assert_eq!(chat.requests("planner").len(), 3, "the first reply and two retries");
    assert!(last(&chat.requests("planner")[1]).starts_with("error: the reply was empty"));
    assert_eq!(out.stats.malformed, 3);
    assert!(out.candidates.is_empty());
}

#[test]
fn planner_tools_are_answered_from_the_context() {
    let chat = Scripted::new(|req, scope| match (scope.role.as_str(), turns(req)) {
        ("planner", 0) => Ok(call(req, "read_kernel", serde_json::json!({"name": "triton_poi_0"}))),
        ("planner", 1) => Ok(call(req, "read_profile", serde_json::json!({}))),
        ("planner", _) => Ok(plans(req, &[("fuse", "fuse it")])),
        ("executor", _) => Ok(submit(req, &kernel("k", "SPEED=1.1"))),
        (other, _) => panic!("unexpected role {other}"),
    });
    let mut ctx = context();
    ctx.inventory = Some(Inventory {
        kernels: vec![KernelInfo {
            name: "triton_poi_0".into(),
            kind: KernelKind::Generated,
            share: 0.5,
            source: Some(format!("@triton.jit\ndef k():\n    pass\n{}", "x".repeat(100))),
            bandwidth_of_peak: None,
        }],
    });
    ctx.profile = Some(vec![kforge_agents::KernelProfile {
        name: "triton_poi_0".into(),
        sol_memory_pct: 91.0,
        sol_compute_pct: 3.0,
        occupancy_pct: Some(50.0),
        dram_of_peak_pct: Some(88.0),
    }]);
    let mut cfg = config();
    one_plan_each(&mut cfg, 1);
    cfg.bounds.tool_chars = 40;
    search(&ctx, &cfg, &chat, &SourceJudge::default(), &Quiet);
    let requests = chat.requests("planner");
    assert!(first_user(&requests[0]).contains("- triton_poi_0 generated 50.0% of GPU time: near-optimal"));
    assert!(first_user(&requests[0]).contains("Amdahl ceiling of changing the generated kernels only: 2.00x"));
    let kernel = last(&requests[1]);
    assert!(kernel.starts_with("@triton.jit\ndef k():") && kernel.ends_with("[… 90 chars cut]"), "{kernel}");
    assert_eq!(last(&requests[2]), "- triton_poi_0: memory SOL 91%, compute \n[… 51 chars cut]", "bounded too");
    assert_eq!(out_malformed(&requests), 0);
}

fn out_malformed(requests: &[Request]) -> usize {
    requests.iter().filter(|r| last(r).starts_with("error:")).count()
}

#[test]
fn the_executor_retries_with_the_judges_feedback_up_to_k_attempts() {
    let chat = Scripted::new(|req, scope| match scope.role.as_str() {
        "planner" => Ok(plans(req, &[("fix", "first broken then fixed"), ("never", "always broken")])),
        "executor" => {
            let fixed = strategy_of(req) == "fix" && turns(req) >= 1;
            Ok(submit(
                req,
                &kernel(&format!("{}-{}", strategy_of(req), turns(req)), if fixed { "SPEED=1.3" } else { "BROKEN" }),
            ))
        }
        other => panic!("unexpected role {other}"),
    });
    let judge = SourceJudge::default();
    let mut cfg = config();
    one_plan_each(&mut cfg, 2);
    cfg.retries = 3;
    let out = search(&context(), &cfg, &chat, &judge, &Quiet);
    let ids: Vec<&str> = out.candidates.iter().map(|(c, _)| c.id.as_str()).collect();
    assert_eq!(ids, ["i1-c0-p0-a1", "i1-c0-p0-a2", "i1-c0-p1-a1", "i1-c0-p1-a2", "i1-c0-p1-a3"]);
    assert_eq!(out.stats.executor_retries, 3);
    assert_eq!(out.candidates[1].1.verdict, Verdict::Accepted { speedup: Some(1.3) });
    let fix: Vec<Request> = chat.requests("executor").into_iter().filter(|r| strategy_of(r) == "fix").collect();
    assert_eq!(fix.len(), 2);
    let feedback = fix[1].messages.last().unwrap();
    assert_eq!(feedback.role, Role::Tool, "a submit_kernel call is answered by the verdict");
    assert!(
        feedback.content.starts_with("Attempt 1 was rejected by correctness: output 0 differs."),
        "{}",
        feedback.content
    );
    assert!(feedback.content.contains("max abs diff 0.5 at output 0 of i1-c0-p0-a1"));
}

#[test]
fn a_signature_mismatch_is_caught_before_judging() {
    let chat = Scripted::new(|req, scope| match scope.role.as_str() {
        "planner" => Ok(plans(req, &[("fuse", "fuse it")])),
        "executor" if turns(req) == 0 => Ok(text(&format!(
            "Here it is:\n```python\n{}```\n",
            kernel("k", "SPEED=2.0").replace("(self, a, b)", "(self, x)")
        ))),
        "executor" => Ok(submit(req, &kernel("k", "SPEED=2.0"))),
        other => panic!("unexpected role {other}"),
    });
    let judge = SourceJudge::default();
    let mut cfg = config();
    one_plan_each(&mut cfg, 1);
    let out = search(&context(), &cfg, &chat, &judge, &Quiet);
    assert_eq!(judge.judged(), ["i1-c0-p0-a2"], "the mismatching attempt never reached the judge");
    let Verdict::Rejected { gate, reason, exploit: false } = &out.candidates[0].1.verdict else {
        panic!("{:?}", out.candidates[0].1)
    };
    assert_eq!(gate, "static");
    assert_eq!(reason, "ModelNew.forward(self, x) must take the same parameters as Model.forward(self, a, b)");
    let second = &chat.requests("executor")[1];
    assert_eq!(second.messages.last().unwrap().role, Role::User, "a fenced reply is answered by a user message");
    assert!(last(second).starts_with("The harness did not run attempt 1: ModelNew.forward(self, x)"));
}

#[test]
fn duplicates_get_the_earlier_verdict_without_judging() {
    let chat = Scripted::new(|req, scope| match scope.role.as_str() {
        "planner" => Ok(plans(req, &[("a", "one"), ("b", "two"), ("c", "three")])),
        "executor" => {
            let source = match (strategy_of(req).as_str(), turns(req)) {
                ("a", _) => kernel("same", "BROKEN"),
                ("b", 0) => {
                    format!("# a comment\n{}\n\n   \n", kernel("same", "BROKEN").replace("a + b\n", "a + b   # sum\n"))
                }
                ("b", _) => kernel("b", "SPEED=1.1"),
                (_, _) => kernel("c", "SPEED=1.2"),
            };
            Ok(submit(req, &source))
        }
        other => panic!("unexpected role {other}"),
    });
    let judge = SourceJudge::default();
    let mut cfg = config();
    one_plan_each(&mut cfg, 3);
    cfg.retries = 3;
    let out = search(&context(), &cfg, &chat, &judge, &Quiet);
    let find = |id: &str| out.candidates.iter().find(|(c, _)| c.id == id).unwrap();
    let (dup, verdict) = find("i1-c0-p1-a1");
    assert_eq!(dup.duplicate_of.as_deref(), Some("i1-c0-p0-a1"));
    assert_eq!(verdict, &find("i1-c0-p0-a1").1);
    let (again, _) = find("i1-c0-p0-a2");
    assert_eq!(again.duplicate_of.as_deref(), Some("i1-c0-p0-a1"), "the same file again in a later round");
    assert_eq!(out.stats.duplicates, 3);
    assert_eq!(judge.judged(), ["i1-c0-p0-a1", "i1-c0-p1-a2", "i1-c0-p2-a1"]);
    let feedback =
        last(&chat.requests("executor").into_iter().find(|r| strategy_of(r) == "b" && turns(r) == 1).unwrap())
            .to_string();
    assert!(
        feedback.starts_with("Attempt 1 is the same file (up to comments and whitespace) as i1-c0-p0-a1"),
        "{feedback}"
    );
}

#[test]
fn failing_strategies_reach_the_planner_as_avoid() {
    let chat = Scripted::new(|req, scope| match scope.role.as_str() {
        "planner" => Ok(plans(req, &[("bad idea", "one"), ("Bad Idea", "two")])),
        "executor" => Ok(submit(req, &kernel(&format!("{}", first_user(req).len()), "BROKEN"))),
        other => panic!("unexpected role {other}"),
    });
    let mut cfg = config();
    cfg.plans = 2;
    cfg.iterations = 2;
    cfg.retries = 1;
    cfg.tracker.min_tries = 2;
    let out = search(&context(), &cfg, &chat, &SourceJudge::default(), &Quiet);
    let planner = chat.requests("planner");
    assert_eq!(planner.len(), 2);
    assert!(first_user(&planner[0]).contains("Avoid these strategies: none"));
    assert!(first_user(&planner[1]).contains("Avoid these strategies: bad-idea"), "{}", first_user(&planner[1]));
    assert_eq!(out.stats.avoided, ["bad-idea"]);
}

#[test]
fn collapsed_plans_are_replanned_once() {
    let chat = Scripted::new(|req, scope| match scope.role.as_str() {
        "planner" if turns(req) == 0 => Ok(plans(req, &[("same", "1"), ("Same", "2"), ("other", "3"), ("same", "4")])),
        "planner" => Ok(plans(req, &[("w", "1"), ("x", "2"), ("y", "3"), ("z", "4")])),
        "executor" => Ok(submit(req, &kernel(&strategy_of(req), "SPEED=1.1"))),
        other => panic!("unexpected role {other}"),
    });
    let mut cfg = config();
    one_plan_each(&mut cfg, 4);
    let out = search(&context(), &cfg, &chat, &SourceJudge::default(), &Quiet);
    let planner = chat.requests("planner");
    assert_eq!(planner.len(), 2, "one re-plan");
    let instruction = last(&planner[1]);
    assert!(instruction.starts_with("These plans use only 2 distinct strategies (other, same)."), "{instruction}");
    assert!(instruction.contains("none of them other or same"));
    assert_eq!(
        planner[1].messages[planner[1].messages.len() - 2].role,
        Role::Tool,
        "the first submit_plans is answered"
    );
    assert_eq!(out.stats.meltdowns, 1);
    assert_eq!(out.stats.meltdown_events[0].strategies, ["other", "same"]);
    let strategies: Vec<&str> = out.candidates.iter().map(|(c, _)| c.strategy.as_str()).collect();
    assert_eq!(strategies, ["w", "x", "y", "z"]);
}

#[test]
fn an_accepted_synthesis_kernel_seeds_a_chain() {
    let chat = Scripted::new(|req, scope| match scope.role.as_str() {
        "synthesis" => Ok(submit(req, &kernel("fused", "SPEED=1.5"))),
        "planner" => Ok(plans(req, &[("tune", "BLOCK=512")])),
        "executor" => Ok(submit(req, &kernel(&format!("{}", first_user(req).len()), "SPEED=1.1"))),
        other => panic!("unexpected role {other}"),
    });
    let mut ctx = context();
    let k = |name: &str, kind, share| KernelInfo {
        name: name.into(),
        kind,
        share,
        source: Some(format!("# {name}")),
        bandwidth_of_peak: None,
    };
    ctx.inventory = Some(Inventory {
        kernels: vec![
            k("triton_poi_0", KernelKind::Generated, 0.1),
            k("extern_mm", KernelKind::Vendor, 0.5),
            k("triton_poi_1", KernelKind::Generated, 0.2),
            k("triton_red_2", KernelKind::Generated, 0.15),
            k("aten_sort", KernelKind::Aten, 0.05),
        ],
    });
    let mut cfg = config();
    one_plan_each(&mut cfg, 1);
    let out = search(&ctx, &cfg, &chat, &SourceJudge::default(), &Quiet);
    let synthesis = chat.requests("synthesis");
    assert_eq!(synthesis.len(), 1);
    assert!(first_user(&synthesis[0]).contains("The group to fuse (35.0% of GPU time)"));
    assert!(first_user(&synthesis[0]).contains("- triton_poi_1 (20.0% of GPU time)"));
    assert!(!first_user(&synthesis[0]).contains("triton_poi_0 ("), "separated by a vendor call");
    assert_eq!(out.stats.synthesis.as_deref(), Some("i0-c0-p0-a1"));
    assert_eq!(out.candidates[0].0.strategy, "synthesis");
    let parents: Vec<Option<&str>> = out.candidates[1..].iter().map(|(c, _)| c.parent.as_deref()).collect();
    assert_eq!(parents, [None, Some("i0-c0-p0-a1")]);
    let planner = chat.requests("planner");
    assert!(planner.iter().any(|r| first_user(r).contains("(candidate i0-c0-p0-a1: synthesis, 1.500x)")));
    assert_eq!(out.best.as_deref(), Some("i0-c0-p0-a1"), "1.1 does not beat the seed's 1.5");
}

#[test]
fn untimed_acceptances_stop_by_patience() {
    let chat = Scripted::new(|req, scope| match scope.role.as_str() {
        "planner" => Ok(plans(req, &[("tune", "BLOCK=512")])),
        "executor" => Ok(submit(req, &kernel(&format!("{}", first_user(req).len()), "none"))),
        other => panic!("unexpected role {other}"),
    });
    let mut cfg = config();
    cfg.plans = 1;
    let iterations = Mutex::new(Vec::new());
    type Seen = Vec<(u32, bool, Vec<Option<String>>)>;
    struct Iterations<'a>(&'a Mutex<Seen>);
    impl Observer for Iterations<'_> {
        fn on_iteration(&self, s: &kforge_agents::IterationSummary) {
            self.0.lock().unwrap().push((s.iteration, s.improved, s.next_chains.clone()));
        }
    }
    let out = search(&context(), &cfg, &chat, &SourceJudge::default(), &Iterations(&iterations));
    assert_eq!(out.stop, Stop::NoImprovement { iterations: 2 });
    assert_eq!(out.stats.iterations, 2);
    assert_eq!(out.best, None);
    assert_eq!(out.best_speedup, None);
    let seen = iterations.into_inner().unwrap();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|(_, improved, _)| !improved));
    assert_eq!(seen[0].2, [None, Some("i1-c0-p0-a1".to_string())], "the baseline ranks above an untimed kernel");
    let planner = chat.requests("planner");
    assert!(first_user(&planner[0])
        .contains("Already tried on this chain (plan: verdict of its last attempt):\nnothing yet"));
    let baseline: Vec<&Request> =
        planner.iter().filter(|r| first_user(r).contains("Current kernel of this chain (the baseline)")).collect();
    assert_eq!(baseline.len(), 2, "planned in both iterations");
    let tried = first_user(baseline[1]);
    assert!(tried.contains("- tune (BLOCK=512): accepted (correct; not timed on this device)"), "{tried}");
}

#[test]
fn a_spent_budget_stops_the_search_and_keeps_its_candidates() {
    let calls = AtomicUsize::new(0);
    let chat = Scripted::new(move |req, scope| {
        if calls.fetch_add(1, Ordering::SeqCst) == 2 {
            return Err(LlmError::Budget { what: "tokens of the run".into(), limit: 1000.0, spent: 990.0 });
        }
        match scope.role.as_str() {
            "planner" => Ok(plans(req, &[("a", "1"), ("b", "2")])),
            "executor" => Ok(submit(req, &kernel(&strategy_of(req), "BROKEN"))),
            other => panic!("unexpected role {other}"),
        }
    });
    let mut cfg = config();
    cfg.plans = 2;
    cfg.executors = 1;
    let judge = SourceJudge::default();
    let out = search(&context(), &cfg, &chat, &judge, &Quiet);
    assert_eq!(out.stop, Stop::Budget("budget spent: tokens of the run (limit 1000, spent 990)".into()));
    let ids: Vec<&str> = out.candidates.iter().map(|(c, _)| c.id.as_str()).collect();
    assert_eq!(ids, ["i1-c0-p0-a1"], "the attempt written before the budget ran out is judged and kept");
    assert_eq!(judge.judged(), ids);
    assert_eq!(out.stats.calls, 3);
}

#[test]
fn a_budget_spent_on_the_summary_keeps_the_best_candidate() {
    let chat = Scripted::new(|req, scope| match scope.role.as_str() {
        "planner" => Ok(plans(req, &[("a", "1")])),
        "executor" => Ok(submit(req, &kernel("a", "SPEED=1.4"))),
        _ => Err(LlmError::Budget { what: "usd of the problem".into(), limit: 1.0, spent: 1.0 }),
    });
    let mut cfg = config();
    cfg.plans = 1;
    cfg.summarize = true;
    let out = search(&context(), &cfg, &chat, &SourceJudge::default(), &Quiet);
    assert!(matches!(out.stop, Stop::Budget(_)), "{:?}", out.stop);
    assert_eq!(out.best.as_deref(), Some("i1-c0-p0-a1"));
    assert_eq!(out.best_speedup, Some(1.4));
}

#[test]
fn a_failing_provider_stops_the_search_with_its_error() {
    let chat = Scripted::new(|req, scope| match scope.role.as_str() {
        "planner" => Ok(plans(req, &[("a", "1")])),
        "executor" if turns(req) == 0 => Ok(submit(req, &kernel("a", "BROKEN"))),
        _ => Err(LlmError::Status {
            url: "http://127.0.0.1:9/v1/chat/completions".into(),
            status: 500,
            body: "boom".into(),
        }),
    });
    let mut cfg = config();
    cfg.plans = 1;
    let out = search(&context(), &cfg, &chat, &SourceJudge::default(), &Quiet);
    assert_eq!(out.stop, Stop::ProviderFailed("http://127.0.0.1:9/v1/chat/completions: HTTP 500: boom".into()));
    assert_eq!(out.candidates.len(), 1);
    assert_eq!(out.stats.iterations, 1);
}

#[test]
fn the_summarizer_records_lessons_and_falls_back_on_malformed_replies() {
    let chat = Scripted::new(|req, scope| match scope.role.as_str() {
        "planner" => Ok(plans(req, &[("fast", "1"), ("slow", "2"), ("meh", "3")])),
        "executor" => {
            let speed = match strategy_of(req).as_str() {
                "fast" => "SPEED=1.5",
                "slow" => "SPEED=0.5",
                _ => "SPEED=1.01",
            };
            Ok(submit(req, &kernel(&strategy_of(req), speed)))
        }
        "summarizer" if first_user(req).contains("Strategy: slow") => Ok(text("no tool call")),
        "summarizer" => {
            Ok(call(req, "record_experience", serde_json::json!({"lesson": "fusing helped", "strategy": "fast"})))
        }
        other => panic!("unexpected role {other}"),
    });
    let mut cfg = config();
    one_plan_each(&mut cfg, 3);
    cfg.summarize = true;
    let out = search(&context(), &cfg, &chat, &SourceJudge::default(), &Quiet);
    assert_eq!(chat.requests("summarizer").len(), 2, "no lesson is asked for the 1.01x the memory would drop");
    assert_eq!(out.stats.fallback_lessons, 1);
    assert_eq!(out.stats.malformed, 1);
    let lessons: Vec<(&str, &str)> =
        out.stats.memory.iter().map(|e| (e.candidate.as_str(), e.lesson.as_str())).collect();
    assert_eq!(
        lessons,
        [("i1-c0-p0-a1", "fusing helped"), ("i1-c0-p1-a1", "slow (2): accepted, 0.500x the baseline")],
        "1.01x is below the store threshold"
    );
}

/// A script with retries, duplicates, different speeds per chain and summaries: replies depend
/// only on the request, never on call order.
fn busy_script(req: &Request, scope: &Scope) -> Result<kforge_llm::Reply, LlmError> {
    let digest = |s: &str| s.bytes().fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    match scope.role.as_str() {
        "planner" if turns(req) == 0 => Ok(call(req, "read_kernel", serde_json::json!({"name": "current"}))),
        "planner" => Ok(plans(req, &[("a", "1"), ("b", "2"), ("c", "3")])),
        "synthesis" if turns(req) == 0 => Ok(text("```python\nclass ModelNew:\n    pass\n```")),
        "synthesis" => Ok(submit(req, &kernel("fused", "SPEED=1.01"))),
        "executor" => {
            let base = digest(first_user(req)) % 40;
            let source = match (strategy_of(req).as_str(), turns(req)) {
                ("a", 0) => kernel(&format!("a{base}"), "BROKEN"),
                ("a", _) => kernel(&format!("a{base}"), &format!("SPEED={}", 1.0 + base as f64 / 100.0)),
                ("b", _) => kernel(&format!("b{base}"), &format!("SPEED={}", 1.05 + base as f64 / 50.0)),
                (_, _) => {
                    format!("# copy\n{}", kernel(&format!("b{base}"), &format!("SPEED={}", 1.05 + base as f64 / 50.0)))
                }
            };
            Ok(submit(req, &source))
        }
        "summarizer" => {
            let lesson = format!("lesson {}", digest(first_user(req)) % 1000);
            Ok(call(req, "record_experience", serde_json::json!({"lesson": lesson, "strategy": "x"})))
        }
        other => panic!("unexpected role {other}"),
    }
}

/// The problem with two adjacent generated kernels (a synthesis group).
fn busy_context() -> kforge_agents::ProblemContext {
    let mut ctx = context();
    let k = |name: &str| KernelInfo {
        name: name.into(),
        kind: KernelKind::Generated,
        share: 0.3,
        source: None,
        bandwidth_of_peak: None,
    };
    ctx.inventory = Some(Inventory { kernels: vec![k("triton_poi_0"), k("triton_poi_1")] });
    ctx
}

#[test]
fn runs_with_the_same_replies_are_identical_whatever_the_threads_do() {
    let mut cfg = config();
    cfg.summarize = true;
    cfg.plans = 3;
    cfg.chains = 2;
    cfg.iterations = 3;
    cfg.patience = 0;
    cfg.executors = 4;
    let ctx = busy_context();
    let run = |executors: usize| {
        let chat = Scripted::new(busy_script);
        let judge = SourceJudge::default();
        let cfg = LoopConfig { executors, ..cfg.clone() };
        let out = search(&ctx, &cfg, &chat, &judge, &Quiet);
        (serde_json::to_string(&out).unwrap(), chat.texts(), out)
    };
    let (first, first_requests, out) = run(4);
    let (second, second_requests, _) = run(4);
    let (serial, serial_requests, _) = run(1);
    assert!(out.candidates.len() >= 20, "a busy run: {}", out.candidates.len());
    assert!(out.stats.duplicates > 0 && out.stats.executor_retries > 0);
    assert_eq!(out.stats.synthesis.as_deref(), Some("i0-c0-p0-a2"), "a static rejection, then the seed");
    assert_eq!(first, second);
    assert_eq!(first_requests, second_requests);
    assert_eq!(first, serial, "one executor or four: the same outcome");
    assert_eq!(first_requests, serial_requests);
    let mut keys: Vec<(u32, u32, u32, u32)> =
        out.candidates.iter().map(|(c, _)| (c.iteration, c.chain, c.plan, c.attempt)).collect();
    let order = keys.clone();
    keys.sort();
    assert_eq!(order, keys, "candidates in (iteration, chain, plan, attempt) order");
}

#[test]
fn an_executor_reply_without_a_file_is_fed_back_and_costs_no_attempt() {
    let chat = Scripted::new(|req, scope| match (scope.role.as_str(), turns(req)) {
        ("planner", _) => Ok(plans(req, &[("fuse", "fuse it")])),
        ("executor", 0) => Ok(text("I would fuse the two kernels.")),
        ("executor", 1) => Ok(call(req, "submit_kernel", serde_json::json!({"code": "x"}))),
        ("executor", _) => Ok(submit(req, &kernel("k", "SPEED=1.2"))),
        (other, _) => panic!("unexpected role {other}"),
    });
    let mut cfg = config();
    one_plan_each(&mut cfg, 1);
    let out = search(&context(), &cfg, &chat, &SourceJudge::default(), &Quiet);
    let requests = chat.requests("executor");
    assert_eq!(requests.len(), 3);
    assert!(last(&requests[1]).starts_with("error: no submit_kernel call and no ```python block."));
    assert_eq!(last(&requests[2]), "error: `source` is missing");
    assert_eq!(out.stats.malformed, 2);
    let ids: Vec<&str> = out.candidates.iter().map(|(c, _)| c.id.as_str()).collect();
    assert_eq!(ids, ["i1-c0-p0-a1"]);
    assert_eq!(out.stats.executor_retries, 0);
}

#[test]
fn the_observer_hears_every_call_and_every_verdict_once() {
    #[derive(Default)]
    struct Counting {
        calls: Mutex<Vec<String>>,
        verdicts: Mutex<Vec<String>>,
    }
    impl Observer for Counting {
        fn on_call(&self, scope: &Scope, task: &str, _: &Request, result: Result<&kforge_llm::Answer, &LlmError>) {
            self.calls.lock().unwrap().push(format!("{} {task} {}", scope.role, result.is_ok()));
        }
        fn on_candidate(&self, c: &kforge_agents::Candidate, _: &kforge_agents::Judgement) {
            self.verdicts.lock().unwrap().push(c.id.clone());
        }
    }
    let chat = Scripted::new(busy_script);
    let mut cfg = config();
    cfg.summarize = true;
    cfg.plans = 3;
    cfg.iterations = 2;
    let observer = Counting::default();
    let out = search(&busy_context(), &cfg, &chat, &SourceJudge::default(), &observer);
    let calls = observer.calls.into_inner().unwrap();
    assert_eq!(calls.len() as u64, out.stats.calls);
    for expected in
        ["planner i1-c0 true", "executor i1-c0-p0 true", "summarizer i1-c0-p1-a1 true", "synthesis i0-c0-p0 true"]
    {
        assert!(calls.iter().any(|c| c == expected), "{expected} in {calls:?}");
    }
    assert_eq!(chat.log.lock().unwrap().len() as u64, out.stats.calls);
    let mut heard = observer.verdicts.into_inner().unwrap();
    heard.sort();
    let mut ids: Vec<String> = out.candidates.iter().map(|(c, _)| c.id.clone()).collect();
    ids.sort();
    assert_eq!(heard, ids);
}
