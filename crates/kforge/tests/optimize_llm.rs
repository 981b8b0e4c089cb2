//! `kforge optimize --agents llm` end to end on the CPU against `kforge scripted-endpoint` (a
//! real HTTP server serving scripted replies: plans, valid kernels, broken code, cheats, a
//! malformed tool call, a 429, a rejected seed): the cascade's verdict on every candidate, the
//! calls' retries and malformed replies counted, replay with zero tokens, budgets that stop the
//! search at their limit, and a killed search resumed without losing a finished candidate.
//! Needs python3 with torch and Triton (scripts/test installs them).

mod common;

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A running `kforge scripted-endpoint SCRIPT --log LOG`: its URL (read from its first line of
/// output), killed when dropped.
struct Endpoint {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Endpoint {
    fn start(script: &str, log: PathBuf) -> Endpoint {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kforge"))
            .arg("scripted-endpoint")
            .arg(repo().join("tests/llm/vector_add").join(script))
            .arg("--log")
            .arg(&log)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert!(line.starts_with("http://"), "the endpoint printed {line:?}");
        Endpoint { child, url: line.trim().to_string(), log }
    }

    /// Every request it was sent, in order.
    fn requests(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

const PROBLEM: &str = "tests/candidates/problems/vector_add.py";

fn command(out: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kforge"));
    c.arg("optimize")
        .arg(PROBLEM)
        .args(["--device", "cpu", "--baseline", "default", "--agents", "llm", "--rounds", "2", "--model", "scripted"])
        .args(args)
        .arg("--out")
        .arg(out)
        .current_dir(repo())
        .env("KFORGE_SOCKET", out.with_extension("no-daemon.sock"))
        .env_remove("TRITON_INTERPRET")
        .env_remove("KFORGE_LLM_URL")
        .env_remove("KFORGE_LLM_CONFIG")
        .env_remove("KFORGE_LLM_MODEL");
    c
}

fn optimize(out: &Path, args: &[&str]) -> (Option<i32>, String) {
    let o = command(out, args).output().unwrap();
    (o.status.code(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

fn report(out: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap()
}

fn journal(out: &Path) -> kforge_store::Journal {
    kforge_store::Store::open(&out.join("journal.db")).unwrap().journal(None).unwrap()
}

/// (candidate id, verdict, rejecting check, exploit, duplicate of) of a report's llm family.
fn verdicts(r: &Value) -> Vec<(String, String, String, bool, String)> {
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    r["llm"]["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (s(&c["id"]), s(&c["verdict"]), s(&c["gate"]), c["exploit"].as_bool().unwrap(), s(&c["duplicate_of"])))
        .collect()
}

fn by_plan<'a>(
    v: &'a [(String, String, String, bool, String)],
    plan: &str,
) -> Vec<&'a (String, String, String, bool, String)> {
    v.iter().filter(|c| c.0.contains(plan)).collect()
}

/// The scripted search on the CPU: every candidate's verdict the cascade's (a broken file fed
/// back, a cheat that never runs its kernel and one that calls torch rejected as exploits, a
/// wrong kernel rejected by correctness, the honest kernel correct, a resend of it a
/// duplicate), the 429 retried, the rejected seed dropped, the malformed plan fed back; then the
/// same search replayed from the journal with the endpoint gone: the same candidates and
/// verdicts, zero tokens.
#[test]
fn the_llm_search_runs_against_the_scripted_endpoint_and_replays_with_zero_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let endpoint = Endpoint::start("script.json", dir.path().join("requests.jsonl"));
    let html = dir.path().join("report.html");
    let flags = [
        "--llm-seed",
        "7",
        "--llm-iterations",
        "1",
        "--llm-chains",
        "1",
        "--llm-plans",
        "3",
        "--llm-retries",
        "2",
        "--llm-executors",
        "3",
    ];
    let mut args = vec!["--llm", endpoint.url.as_str(), "--html", html.to_str().unwrap()];
    args.extend(flags);
    let (code, text) = optimize(&out, &args);
    assert_eq!(code, Some(0), "{text}");
    let r = report(&out);
    let v = verdicts(&r);
    // Plan A (p0): the broken file is caught and fed back, the second attempt is correct.
    let a = by_plan(&v, "-p0-");
    assert_eq!(a.len(), 2, "{v:?}");
    assert_ne!(a[0].1, "passed-without-performance", "{v:?}");
    assert_eq!(a[1].1, "passed-without-performance", "{v:?}");
    // Plan B (p1): two cheats, each rejected by an exploit defence and recorded as one.
    let b = by_plan(&v, "-p1-");
    assert_eq!((b.len(), b[0].1.as_str(), b[1].1.as_str()), (2, "rejected", "rejected"), "{v:?}");
    assert_eq!((b[0].2.as_str(), b[0].3), ("exploits:ghost-replay", true), "{v:?}");
    assert_eq!((b[1].2.as_str(), b[1].3), ("static:torch-compute", true), "{v:?}");
    // Plan C (p2): wrong, then plan A's kernel again (in a fenced block): a duplicate.
    let c = by_plan(&v, "-p2-");
    assert!(c[0].1 == "rejected" && c[0].2.starts_with("correctness:") && !c[0].3, "{v:?}");
    assert!(c[1].4 == a[1].0 || a[1].4 == c[1].0, "one of the two identical kernels is the other's duplicate: {v:?}");
    let llm = &r["llm"];
    assert!(llm["usage"]["retries"].as_u64().unwrap() >= 1, "the 429 was retried: {llm}");
    assert!(llm["usage"]["malformed"].as_u64().unwrap() >= 1, "the malformed plan was counted: {llm}");
    assert!(llm["usage"]["tokens"].as_u64().unwrap() > 0);
    assert_eq!(r["decision"]["kind"], "fallback", "on the cpu a correct candidate is not timed: {r}");
    assert!(r["decision"]["reason"].as_str().unwrap().contains("not timed"), "{r}");
    // The endpoint saw the seed once (rejected), never again; the planner's third request
    // carried the feedback about its malformed arguments.
    let sent = endpoint.requests();
    let seeds: Vec<bool> = sent.iter().map(|q| q["seed_sent"].as_bool().unwrap()).collect();
    assert_eq!(seeds.iter().filter(|s| **s).count(), 1, "{seeds:?}");
    assert_eq!(sent[0]["status"], 400, "the seed was rejected first");
    let planner: Vec<&Value> = sent.iter().filter(|q| q["request"].to_string().contains("kforge planner")).collect();
    assert!(planner.len() >= 4, "seed, 429, malformed, valid: {}", planner.len());
    // Every candidate journaled with its verdict; every call in the replay cache.
    let j = journal(&out);
    assert_eq!(j.llm_candidates.len(), v.len());
    assert!(j.llm_candidates.iter().any(|c| c.exploit && c.gate.as_deref() == Some("exploits:ghost-replay")));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("The LLM agents") && page.contains("(exploit)"), "the HTML report has the family");

    // Replay, the endpoint gone: the same search, zero tokens.
    drop(endpoint);
    let run = j.runs.last().unwrap().id.to_string();
    let mut args = vec!["--replay", run.as_str()];
    args.extend(flags);
    let (code, text) = optimize(&out, &args);
    assert_eq!(code, Some(0), "{text}");
    let again = report(&out);
    assert_eq!(verdicts(&again), v, "the replay repeats the run's candidates and verdicts");
    // Journaled as verdicts arrived (from the judging threads): compared by candidate.
    let hashes = |run: u64| -> std::collections::BTreeMap<String, String> {
        let j = journal(&out);
        j.llm_candidates
            .iter()
            .filter(|c| c.run == run)
            .map(|c| (c.candidate.clone(), c.content_hash.clone()))
            .collect()
    };
    let runs = journal(&out).runs;
    assert_eq!(hashes(runs[0].id), hashes(runs[1].id), "the same sources");
    let usage = &again["llm"]["usage"];
    assert_eq!(usage["tokens"], 0, "{usage}");
    assert_eq!(usage["replayed"], usage["calls"], "{usage}");
    assert_eq!(again["llm"]["replayed_from"].as_u64(), Some(runs[0].id));
}

/// A token budget stops the search at its limit: the call that would pass it is never sent, the
/// finished candidate is kept, and the report says why the search stopped.
#[test]
fn a_token_budget_stops_the_llm_search_at_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let endpoint = Endpoint::start("budget.json", dir.path().join("requests.jsonl"));
    let args = [
        "--llm",
        endpoint.url.as_str(),
        "--llm-max-tokens",
        "9000",
        "--llm-iterations",
        "1",
        "--llm-chains",
        "1",
        "--llm-plans",
        "2",
        "--llm-retries",
        "1",
        "--llm-executors",
        "1",
        "--llm-no-summarizer",
    ];
    let (code, text) = optimize(&out, &args);
    assert_eq!(code, Some(0), "{text}");
    let r = report(&out);
    let llm = &r["llm"];
    assert!(llm["stop"].as_str().unwrap().starts_with("budget"), "{llm}");
    assert_eq!(endpoint.requests().len(), 2, "the planner and one executor; the third call was refused unsent");
    assert_eq!(llm["usage"]["tokens"], 10000, "two calls of 5000 tokens each: {llm}");
    assert_eq!(verdicts(&r).len(), 1, "the finished candidate is kept: {llm}");

    // Its replay stops where it stopped (the refusal was recorded), spending nothing.
    let mut replay: Vec<&str> = args.iter().filter(|a| !a.starts_with("http")).copied().collect();
    replay.retain(|a| *a != "--llm");
    let (code, text) = optimize(&out, &[&replay[..], &["--replay", "1"]].concat());
    assert_eq!(code, Some(0), "{text}");
    let again = report(&out);
    assert!(again["llm"]["stop"].as_str().unwrap().starts_with("budget"), "{}", again["llm"]);
    assert_eq!((verdicts(&again), &again["llm"]["usage"]["tokens"]), (verdicts(&r), &Value::from(0)));
    assert_eq!(endpoint.requests().len(), 2, "a replay sends nothing");

    // A search a budget cut short is not finished: --resume with a larger budget continues it
    // (the two answers it paid for replayed, the third call asked) instead of taking its outcome.
    let mut more = args;
    more[3] = "30000";
    let (code, text) = optimize(&out, &[&more[..], &["--resume"]].concat());
    assert_eq!(code, Some(0), "{text}");
    let r = report(&out);
    assert_eq!(r["llm"]["stop"], "iterations", "{}", r["llm"]);
    assert_eq!(verdicts(&r).len(), 2, "{}", r["llm"]);
    assert_eq!(endpoint.requests().len(), 3, "only the call the budget had refused was sent");
    assert_eq!(r["llm"]["usage"]["replayed"], 2, "{}", r["llm"]);
}

/// Bad input is named before anything runs: llm flags without the llm agent, a replay of a run
/// that recorded no LLM call, zero limits.
#[test]
fn bad_llm_input_is_named_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let o = Command::new(env!("CARGO_BIN_EXE_kforge"))
        .args(["optimize", PROBLEM, "--device", "cpu", "--agents", "dispatch", "--llm", "http://127.0.0.1:9/v1"])
        .arg("--out")
        .arg(&out)
        .current_dir(repo())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{text}");
    assert!(text.contains("--llm is for the llm agent: add llm to --agents"), "{text}");
    let cases: [(&[&str], &str); 3] = [
        (&["--replay", "7"], "--replay 7: the journal"),
        (&["--llm", "http://127.0.0.1:9/v1", "--llm-max-tokens", "0"], "--llm-max-tokens must be at least 1"),
        (
            &["--llm", "http://127.0.0.1:9/v1", "--llm-capture", "/nonexistent.json"],
            "--llm-capture /nonexistent.json: no such file",
        ),
    ];
    for (args, why) in cases {
        let (code, text) = optimize(&out, args);
        assert_eq!(code, Some(2), "{args:?}: {text}");
        assert!(text.contains(why), "{args:?}: {text}");
    }
}

/// A search killed while an executor's second attempt waits on the endpoint, then `--resume`d
/// against a fresh endpoint: the killed run's replies are replayed (the new endpoint hears only
/// the unanswered request), its two judged candidates keep their verdicts without being judged
/// again, and the search completes.
#[test]
fn a_killed_llm_search_resumes_without_losing_a_finished_candidate() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let first = Endpoint::start("kill.json", dir.path().join("first.jsonl"));
    let flags =
        ["--llm-iterations", "1", "--llm-chains", "1", "--llm-plans", "2", "--llm-retries", "2", "--llm-no-summarizer"];
    let mut args = vec!["--llm", first.url.as_str(), "--llm-executors", "2"];
    args.extend(flags);
    let mut child = command(&out, &args).stderr(Stdio::piped()).process_group(0).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let judged = line.contains("[2 verdicts]");
        seen.push(line);
        if judged {
            break;
        }
    }
    assert!(seen.last().unwrap().contains("[2 verdicts]"), "{seen:#?}");
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    child.wait().unwrap();
    drop(lines);
    let before = journal(&out);
    assert_eq!(before.llm_candidates.len(), 2, "{:?}", before.llm_candidates);
    drop(first);

    let second = Endpoint::start("resume.json", dir.path().join("second.jsonl"));
    let mut args = vec!["--llm", second.url.as_str(), "--llm-executors", "2", "--resume"];
    args.extend(flags);
    let (code, text) = optimize(&out, &args);
    assert_eq!(code, Some(0), "{text}");
    for id in ["i1-c0-p0-a1", "i1-c0-p1-a1"] {
        assert!(text.contains(&format!("{id}: its verdict from the journal")), "judged once: {text}");
    }
    let heard = second.requests();
    assert!(
        !heard.is_empty() && heard.iter().all(|q| q["request"].to_string().contains("PLAN-B")),
        "the new endpoint heard only the unanswered executor: {heard:?}"
    );
    let after = journal(&out);
    let run2: Vec<_> = after.llm_candidates.iter().filter(|c| c.run == after.runs[1].id).collect();
    for kept in &before.llm_candidates {
        assert!(
            run2.iter().any(|c| c.candidate == kept.candidate
                && c.content_hash == kept.content_hash
                && c.verdict == kept.verdict),
            "{kept:?} in {run2:?}"
        );
    }
    let v = verdicts(&report(&out));
    assert_eq!(v.len(), 3, "plan A's kernel, plan B's two attempts: {v:?}");
    assert_eq!((v[2].0.as_str(), v[2].1.as_str()), ("i1-c0-p1-a2", "passed-without-performance"), "{v:?}");
}

/// Through the daemon: the executors' candidates are verified as daemon jobs side by side (both
/// submitted before either ended), and the llm step's device seconds are their region time.
#[test]
fn through_the_daemon_the_executors_candidates_are_verified_side_by_side() {
    let mut d = common::TestDaemon::start(&[]);
    let out = d.path("o");
    let endpoint = Endpoint::start("two.json", d.path("requests.jsonl"));
    let args = [
        "--llm",
        endpoint.url.as_str(),
        "--daemon",
        "--llm-iterations",
        "1",
        "--llm-chains",
        "1",
        "--llm-plans",
        "2",
        "--llm-retries",
        "1",
        "--llm-executors",
        "2",
        "--llm-no-summarizer",
    ];
    let o = command(&out, &args).env("KFORGE_SOCKET", &d.socket).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{text}");
    let v = verdicts(&report(&out));
    assert_eq!(v.iter().filter(|c| c.1 == "passed-without-performance").count(), 2, "{v:?}");
    let jobs: Vec<_> =
        d.report().jobs.into_iter().filter(|j| j.label.as_deref().is_some_and(|l| l.starts_with("verify:"))).collect();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    let (a, b) = (&jobs[0], &jobs[1]);
    let ended = |j: &kforge_store::JobRow| j.ended_ns.unwrap();
    assert!(a.queued_ns < ended(b) && b.queued_ns < ended(a), "in flight at once: {a:?} {b:?}");
    let step = journal(&out).steps.into_iter().find(|s| s.step == "llm").unwrap();
    assert_eq!(step.gpu_seconds_kind.as_deref(), Some("region"), "{step:?}");
    d.shutdown();
}

/// A capture of the baseline (`--llm-capture`, here one the H200 wrote) gives the agents its
/// kernels: the synthesis step asks for one kernel for the two adjacent generated kernels, the
/// planner sees their names and shares. (Both candidates fail the executor's static check, so
/// nothing runs the problem's large tensors on the CPU.)
#[test]
fn a_capture_gives_the_synthesis_step_its_group_and_the_planner_the_kernels() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let log = dir.path().join("requests.jsonl");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kforge"))
        .arg("scripted-endpoint")
        .arg(repo().join("tests/llm/cross_entropy/script.json"))
        .arg("--log")
        .arg(&log)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut url = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut url).unwrap();
    let capture = repo().join("crates/kforge-inductor/tests/fixtures/h200/default_025_cross_entropy_fp32.capture.json");
    let o = Command::new(env!("CARGO_BIN_EXE_kforge"))
        .arg("optimize")
        .arg("problems/level1/025_cross_entropy_fp32.py")
        .args([
            "--device",
            "cpu",
            "--baseline",
            "default",
            "--agents",
            "llm",
            "--model",
            "scripted",
            "--llm",
            url.trim(),
        ])
        .args([
            "--llm-iterations",
            "1",
            "--llm-chains",
            "1",
            "--llm-plans",
            "1",
            "--llm-retries",
            "1",
            "--llm-no-summarizer",
        ])
        .arg("--llm-capture")
        .arg(&capture)
        .arg("--out")
        .arg(&out)
        .current_dir(repo())
        .env("KFORGE_SOCKET", out.with_extension("no-daemon.sock"))
        .output()
        .unwrap();
    child.kill().ok();
    child.wait().ok();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{text}");
    let v = verdicts(&report(&out));
    let ids: Vec<&str> = v.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(ids, ["i0-c0-p0-a1", "i1-c0-p0-a1"], "the synthesis candidate, then the plan's: {v:?}");
    assert!(v.iter().all(|c| c.1 == "rejected" && c.2.starts_with("static")), "{v:?}");
    let sent = std::fs::read_to_string(&log).unwrap();
    let rules: Vec<Value> = sent.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["rule"].clone()).collect();
    assert_eq!(rules, ["synthesis", "planner", "executor"], "every request matched its rule (kernel names in it)");
}
