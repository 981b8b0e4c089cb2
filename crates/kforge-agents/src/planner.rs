//! The planner: a conversation per chain that may look things up (read_kernel, read_profile,
//! search_memory) and ends with submit_plans — N plans, one minimal change each. Malformed
//! replies are fed back and retried; plans that collapse onto ≤ 2 strategies are re-planned
//! once with a diversity instruction (the meltdown detector).

use crate::memory::Memory;
use crate::prompt::{cut, Prompt};
use crate::search::Chain;
use crate::talk::{object, text_field, tool, Conversation, Env, Halt};
use kforge_llm::{Reply, Tool, ToolCall};
use serde::{Deserialize, Serialize};

/// One plan: one minimal change to a chain's kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Normalized: lowercase kebab-case ([`normalize_strategy`]).
    pub strategy: String,
    pub change: String,
    pub rationale: String,
}

/// The longest strategy name kept (characters).
pub const STRATEGY_CHARS: usize = 48;

/// A strategy name as the tracker counts it: lowercase, runs of anything but letters and digits
/// turned into one `-`, no `-` at the ends (`"Fuse Epilogue_2"` → `fuse-epilogue-2`), at most
/// [`STRATEGY_CHARS`] characters; `unnamed` when nothing is left.
pub fn normalize_strategy(name: &str) -> String {
    let mut out = String::new();
    for c in name.trim().chars().take(STRATEGY_CHARS) {
        if c.is_alphanumeric() {
            out.extend(c.to_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out.trim_end_matches('-').to_string();
    if out.is_empty() {
        "unnamed".into()
    } else {
        out
    }
}

/// What the planner is given for one chain.
pub(crate) struct PlanInputs<'a> {
    /// `i{iteration}-c{chain}`: the task the calls belong to.
    pub task: String,
    pub chain: &'a Chain,
    pub analysis: &'a str,
    pub memory: &'a Memory,
    pub avoid: &'a [String],
}

/// What one chain's planning gave.
#[derive(Debug, Default)]
pub(crate) struct Planned {
    pub plans: Vec<Plan>,
    /// The strategies the first plans collapsed onto, when the meltdown detector re-planned.
    pub meltdown: Option<Vec<String>>,
}

fn tools() -> Vec<Tool> {
    let string = serde_json::json!({"type": "string"});
    let plan = serde_json::json!({
        "type": "object",
        "properties": {"strategy": string, "change": string, "rationale": string},
        "required": ["strategy", "change", "rationale"],
    });
    vec![
        tool(
            "read_kernel",
            "The source of a kernel of the inventory, or `current` for this chain's kernel.",
            serde_json::json!({"name": string}),
            &["name"],
        ),
        tool(
            "read_profile",
            "The profile of every kernel: speed-of-light percentages and occupancy.",
            serde_json::json!({}),
            &[],
        ),
        tool(
            "search_memory",
            "Lessons from earlier attempts that mention words of the query.",
            serde_json::json!({"query": string}),
            &["query"],
        ),
        tool(
            "submit_plans",
            "Submit the plans (this ends planning).",
            serde_json::json!({"plans": {"type": "array", "items": plan}}),
            &["plans"],
        ),
    ]
}

/// Plans for one chain (empty when the planner gave up: too many malformed replies or rounds).
pub(crate) fn plan(env: &Env, inputs: &PlanInputs) -> Result<Planned, Halt> {
    let n = env.cfg.plans;
    let rendered = Prompt::Planner
        .render(&[
            ("plans", n.to_string()),
            ("problem", env.ctx.problem.clone()),
            ("device", env.ctx.device.clone()),
            ("baseline", crate::search::baseline_text(env.ctx)),
            ("analysis", cut(inputs.analysis, env.cfg.bounds.summary_chars)),
            ("chain", inputs.chain.label()),
            ("current", cut(&inputs.chain.source, env.cfg.bounds.source_chars)),
            ("tried", cut(&inputs.chain.tried_text(), env.cfg.bounds.summary_chars)),
            ("memory", inputs.memory.summary()),
            ("avoid", if inputs.avoid.is_empty() { "none".into() } else { inputs.avoid.join(", ") }),
        ])
        .expect("the embedded planner prompt has exactly these placeholders (every prompt is rendered in tests)");
    let mut conv = Conversation::new(Prompt::Planner, inputs.task.clone(), rendered, tools());
    let Some((plans, submit_id)) = ask(env, &mut conv, inputs)? else { return Ok(Planned::default()) };
    let mut distinct: Vec<String> = plans.iter().map(|p| p.strategy.clone()).collect();
    distinct.sort();
    distinct.dedup();
    if n < 3 || plans.len() < 3 || distinct.len() > 2 {
        return Ok(Planned { plans, meltdown: None });
    }
    conv.answer(&submit_id, format!("received {} plans", plans.len()));
    conv.tell(format!(
        "These plans use only {} distinct strateg{} ({}). Submit {n} plans again with submit_plans, each with a \
         different strategy, none of them {}.",
        distinct.len(),
        if distinct.len() == 1 { "y" } else { "ies" },
        distinct.join(", "),
        distinct.join(" or ")
    ));
    let replanned = ask(env, &mut conv, inputs)?.map(|(p, _)| p).unwrap_or(plans);
    Ok(Planned { plans: replanned, meltdown: Some(distinct) })
}

/// Rounds of the conversation until valid plans come (with the id of the submit_plans call),
/// or None when `max_plan_rounds` or `malformed_limit` run out.
fn ask(env: &Env, conv: &mut Conversation, inputs: &PlanInputs) -> Result<Option<(Vec<Plan>, String)>, Halt> {
    let mut malformed = 0;
    for _ in 0..env.cfg.max_plan_rounds {
        let reply = conv.send(env)?;
        let (plans, problem) = read_reply(env, conv, inputs, &reply);
        if let Some(found) = plans {
            return Ok(Some(found));
        }
        if let Some(problem) = problem {
            env.counters.malformed();
            malformed += 1;
            if malformed > env.cfg.malformed_limit {
                env.observer.progress(&format!(
                    "planner for {}: gave up after {malformed} malformed replies",
                    inputs.chain.label()
                ));
                return Ok(None);
            }
            if reply.tool_calls.is_empty() {
                conv.tell(format!(
                    "error: {problem}. Call submit_plans{{plans: [{{strategy, change, rationale}}, ...]}} with {} plans.",
                    env.cfg.plans
                ));
            }
        }
    }
    env.observer.progress(&format!(
        "planner for {}: no plans after {} rounds",
        inputs.chain.label(),
        env.cfg.max_plan_rounds
    ));
    Ok(None)
}

/// Answers every tool call of `reply`. Returns the plans when a valid submit_plans came, and
/// what was malformed (the reply counts once as malformed), already fed back as the calls'
/// answers when it had calls.
fn read_reply(
    env: &Env,
    conv: &mut Conversation,
    inputs: &PlanInputs,
    reply: &Reply,
) -> (Option<(Vec<Plan>, String)>, Option<String>) {
    if reply.tool_calls.is_empty() {
        let problem = if reply.is_empty() { "the reply was empty" } else { "the reply called no tool" };
        return (None, Some(problem.into()));
    }
    let mut plans = None;
    let mut problem = None;
    for call in &reply.tool_calls {
        match answer_call(env, inputs, call) {
            Ok(Answered::Text(text)) => conv.answer(&call.id, text),
            Ok(Answered::Plans(p)) if plans.is_none() => plans = Some((p, call.id.clone())),
            Ok(Answered::Plans(_)) => conv.answer(&call.id, "ignored: plans were already submitted"),
            Err(e) => {
                conv.answer(&call.id, format!("error: {e}"));
                problem.get_or_insert(e);
            }
        }
    }
    if plans.is_some() {
        return (plans, None);
    }
    (None, problem)
}

enum Answered {
    Text(String),
    Plans(Vec<Plan>),
}

fn answer_call(env: &Env, inputs: &PlanInputs, call: &ToolCall) -> Result<Answered, String> {
    let args = object(call)?;
    let limit = env.cfg.bounds.tool_chars;
    match call.name.as_str() {
        "read_kernel" => Ok(Answered::Text(cut(&read_kernel(env, inputs, &text_field(args, "name")?), limit))),
        "read_profile" => Ok(Answered::Text(cut(&read_profile(env), limit))),
        "search_memory" => {
            let query = text_field(args, "query")?;
            let found: Vec<String> = inputs
                .memory
                .search(&query)
                .iter()
                .map(|e| format!("- [{}] {}: {}", e.candidate, e.strategy, e.lesson))
                .collect();
            let text = if found.is_empty() { "the memory is empty".into() } else { found.join("\n") };
            Ok(Answered::Text(cut(&text, limit)))
        }
        "submit_plans" => parse_plans(args, env.cfg.plans).map(Answered::Plans),
        other => Err(format!(
            "there is no tool `{other}` (the tools are read_kernel, read_profile, search_memory, submit_plans)"
        )),
    }
}

fn read_kernel(env: &Env, inputs: &PlanInputs, name: &str) -> String {
    if name == "current" {
        return inputs.chain.source.clone();
    }
    let kernels = env.ctx.inventory.as_ref().map(|i| i.kernels.as_slice()).unwrap_or(&[]);
    match kernels.iter().find(|k| k.name == name) {
        Some(k) => k.source.clone().unwrap_or_else(|| format!("{name} is a {:?} call: no source", k.kind)),
        None => {
            let names: Vec<&str> = kernels.iter().map(|k| k.name.as_str()).collect();
            format!(
                "no kernel {name}; the kernels are: current{}{}",
                if names.is_empty() { "" } else { ", " },
                names.join(", ")
            )
        }
    }
}

fn read_profile(env: &Env) -> String {
    match &env.ctx.profile {
        None => "no profile was taken".into(),
        Some(rows) => rows
            .iter()
            .map(|p| {
                let occupancy = p.occupancy_pct.map(|o| format!(", occupancy {o:.0}%")).unwrap_or_default();
                let dram =
                    p.dram_of_peak_pct.map(|d| format!(", DRAM at {d:.0}% of the copy peak")).unwrap_or_default();
                format!(
                    "- {}: memory SOL {:.0}%, compute SOL {:.0}%{occupancy}{dram}",
                    p.name, p.sol_memory_pct, p.sol_compute_pct
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// The plans of a submit_plans call: a non-empty array of objects with a strategy and a change
/// (the rationale may be empty); the first `n` are kept.
fn parse_plans(args: &serde_json::Map<String, serde_json::Value>, n: usize) -> Result<Vec<Plan>, String> {
    let Some(serde_json::Value::Array(items)) = args.get("plans") else {
        return Err("submit_plans needs `plans`: an array of {strategy, change, rationale}".into());
    };
    if items.is_empty() {
        return Err("`plans` is empty".into());
    }
    let mut plans = Vec::new();
    for (i, item) in items.iter().take(n).enumerate() {
        let serde_json::Value::Object(map) = item else { return Err(format!("plan {i} is not an object")) };
        let field = |f: &str| text_field(map, f).map_err(|e| format!("plan {i}: {e}"));
        let rationale = map.get("rationale").and_then(|r| r.as_str()).unwrap_or("").to_string();
        plans.push(Plan { strategy: normalize_strategy(&field("strategy")?), change: field("change")?, rationale });
    }
    Ok(plans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_become_kebab_case() {
        assert_eq!(normalize_strategy("Fuse Epilogue_2"), "fuse-epilogue-2");
        assert_eq!(normalize_strategy("  --Tune BLOCK size!! "), "tune-block-size");
        assert_eq!(normalize_strategy("???"), "unnamed");
        assert_eq!(normalize_strategy(&"a".repeat(100)).len(), STRATEGY_CHARS);
    }

    #[test]
    fn plans_are_parsed_and_cut_to_n() {
        let args = serde_json::json!({"plans": [
            {"strategy": "Vectorize Loads", "change": "load float4", "rationale": "memory-bound"},
            {"strategy": "tune", "change": "BLOCK 1024"},
            {"strategy": "x", "change": "y"},
        ]});
        let plans = parse_plans(args.as_object().unwrap(), 2).unwrap();
        assert_eq!(plans.len(), 2);
        assert_eq!(plans[0].strategy, "vectorize-loads");
        assert_eq!(plans[1].rationale, "");
        let bad = serde_json::json!({"plans": [{"strategy": "a"}]});
        assert_eq!(parse_plans(bad.as_object().unwrap(), 2).unwrap_err(), "plan 0: `change` is missing");
        let empty = serde_json::json!({"plans": []});
        assert_eq!(parse_plans(empty.as_object().unwrap(), 2).unwrap_err(), "`plans` is empty");
    }
}
