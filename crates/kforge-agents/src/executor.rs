//! The executor: per plan (or per fusible group, the synthesis step) a conversation that writes a
//! complete `ModelNew` file, de-duplicated, checked statically here, then judged; every failure
//! is fed back and the task tries again, up to `retries` attempts.
//!
//! Tasks run in rounds — every unfinished task's attempt `a` is written in parallel, then
//! de-duplicated and checked in (chain, plan) order, then judged in parallel — so which
//! candidate is a duplicate of which never depends on which thread finished first.

use crate::candidate::{check_static, source_hash, Candidate, Judgement, Verdict};
use crate::context::{KernelInfo, KernelKind, ProblemContext};
use crate::planner::Plan;
use crate::prompt::{cut, Prompt};
use crate::search::Chain;
use crate::talk::{lock, object, parallel_map, text_field, tool, Conversation, Env, Halt};
use kforge_llm::{FinishReason, LlmError, Reply, Tool};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Candidates judged so far by hash: the first candidate with that hash and its judgement.
pub(crate) type Ledger = BTreeMap<String, (String, Judgement)>;

/// One plan (or the synthesis group) being executed.
pub(crate) struct Task {
    pub iteration: u32,
    pub chain: u32,
    pub plan: u32,
    pub strategy: String,
    pub change: String,
    pub parent: Option<String>,
    conv: Conversation,
    attempts: u32,
    done: bool,
    /// The submit_kernel call whose answer is the next feedback.
    pending: Option<String>,
}

fn tools() -> Vec<Tool> {
    let source = serde_json::json!({"source": {"type": "string", "description": "the complete Python file"}});
    vec![tool("submit_kernel", "Submit the complete ModelNew file for the harness to judge.", source, &["source"])]
}

impl Task {
    /// The executor task of `plan` on `chain` (`key`: iteration, chain index, plan index).
    pub fn executor(env: &Env, chain: &Chain, plan: &Plan, key: (u32, u32, u32)) -> Task {
        let b = &env.cfg.bounds;
        let rendered = Prompt::Executor
            .render(&[
                ("problem", env.ctx.problem.clone()),
                ("device", env.ctx.device.clone()),
                ("problem_source", cut(&env.ctx.source, b.source_chars)),
                ("chain", chain.label()),
                ("current", cut(&chain.source, b.source_chars)),
                ("strategy", plan.strategy.clone()),
                ("change", cut(&plan.change, b.feedback_chars)),
                (
                    "rationale",
                    if plan.rationale.is_empty() {
                        "(none given)".into()
                    } else {
                        cut(&plan.rationale, b.feedback_chars)
                    },
                ),
            ])
            .expect("the embedded executor prompt has exactly these placeholders (every prompt is rendered in tests)");
        Task::new(
            key,
            plan.strategy.clone(),
            plan.change.clone(),
            chain.kernel.clone(),
            Conversation::new(Prompt::Executor, format!("i{}-c{}-p{}", key.0, key.1, key.2), rendered, tools()),
        )
    }

    /// The synthesis task for `group` (adjacent generated kernels, in launch order).
    pub fn synthesis(env: &Env, group: &[KernelInfo]) -> Task {
        let b = &env.cfg.bounds;
        let per_kernel = b.summary_chars / group.len().max(1);
        let text: Vec<String> = group
            .iter()
            .map(|k| {
                let source = k.source.as_deref().map(|s| cut(s, per_kernel)).unwrap_or_else(|| "(no source)".into());
                format!("- {} ({:.1}% of GPU time):\n```python\n{source}\n```", k.name, k.share * 100.0)
            })
            .collect();
        let share: f64 = group.iter().map(|k| k.share).sum();
        let rendered = Prompt::Synthesis
            .render(&[
                ("problem", env.ctx.problem.clone()),
                ("device", env.ctx.device.clone()),
                ("problem_source", cut(&env.ctx.source, b.source_chars)),
                ("baseline", crate::search::baseline_text(env.ctx)),
                ("group_share", format!("{:.1}%", share * 100.0)),
                ("group", text.join("\n")),
            ])
            .expect("the embedded synthesis prompt has exactly these placeholders (every prompt is rendered in tests)");
        let names: Vec<&str> = group.iter().map(|k| k.name.as_str()).collect();
        let change = format!("fuse {} into one Triton kernel", names.join(", "));
        Task::new(
            (0, 0, 0),
            "synthesis".into(),
            change,
            None,
            Conversation::new(Prompt::Synthesis, "i0-c0-p0".into(), rendered, tools()),
        )
    }

    fn new(key: (u32, u32, u32), strategy: String, change: String, parent: Option<String>, conv: Conversation) -> Task {
        let (iteration, chain, plan) = key;
        Task { iteration, chain, plan, strategy, change, parent, conv, attempts: 0, done: false, pending: None }
    }

    /// The next attempt's source, asking again after malformed replies (None: gave up).
    fn write(&mut self, env: &Env) -> Result<Option<String>, Halt> {
        let mut malformed = 0;
        loop {
            let reply = self.conv.send(env)?;
            match self.read(&reply) {
                Ok(source) => return Ok(Some(source)),
                Err(problem) => {
                    env.counters.malformed();
                    malformed += 1;
                    if malformed > env.cfg.malformed_limit {
                        return Ok(None);
                    }
                    if reply.tool_calls.is_empty() {
                        self.conv.tell(format!(
                            "error: {problem}. Submit the complete file with submit_kernel{{source}} (or one ```python block)."
                        ));
                    }
                }
            }
        }
    }

    /// The source of a reply: a submit_kernel call's `source`, else the first ```python block
    /// of its text. Every other tool call is answered here.
    fn read(&mut self, reply: &Reply) -> Result<String, String> {
        let mut found = None;
        let mut problem = None;
        for call in &reply.tool_calls {
            let source = match call.name.as_str() {
                "submit_kernel" => object(call).and_then(|args| text_field(args, "source")),
                other => Err(format!("there is no tool `{other}` (the only tool is submit_kernel)")),
            };
            match source {
                Ok(s) if found.is_none() => found = Some((s, call.id.clone())),
                Ok(_) => self.conv.answer(&call.id, "ignored: one file per reply"),
                Err(e) => {
                    self.conv.answer(&call.id, format!("error: {e}"));
                    problem.get_or_insert(e);
                }
            }
        }
        if let Some((source, id)) = found {
            self.pending = Some(id);
            return Ok(source);
        }
        if let Some(source) = fenced_python(&reply.content) {
            self.pending = None;
            return Ok(source);
        }
        let problem = problem.unwrap_or_else(|| {
            if reply.is_empty() {
                "the reply was empty".into()
            } else {
                "no submit_kernel call and no ```python block".into()
            }
        });
        if reply.finish_reason == FinishReason::Length {
            return Err(format!("{problem} (the reply was cut at the length limit: write a shorter file)"));
        }
        Err(problem)
    }

    fn feed_back(&mut self, text: String) {
        match self.pending.take() {
            Some(id) => self.conv.answer(&id, text),
            None => self.conv.tell(text),
        }
    }

    fn candidate(&self, env: &Env, source: String) -> Candidate {
        let id = format!("i{}-c{}-p{}-a{}", self.iteration, self.chain, self.plan, self.attempts);
        Candidate {
            id,
            problem: env.ctx.problem.clone(),
            iteration: self.iteration,
            chain: self.chain,
            plan: self.plan,
            attempt: self.attempts,
            strategy: self.strategy.clone(),
            change: self.change.clone(),
            hash: source_hash(&source),
            source,
            parent: self.parent.clone(),
            duplicate_of: None,
        }
    }
}

/// The first fenced code block of `text` tagged python (or untagged), without its fences.
pub(crate) fn fenced_python(text: &str) -> Option<String> {
    let mut rest = text;
    // A fence opens a line; backticks inside a line are not one.
    while let Some(start) =
        rest.find("```").filter(|&i| i == 0 || rest[..i].ends_with('\n')).or_else(|| rest.find("\n```").map(|i| i + 1))
    {
        let after = &rest[start + 3..];
        let (tag, body) = after.split_once('\n')?;
        let end = body.find("```")?;
        let tag = tag.trim().to_lowercase();
        if tag.is_empty() || tag == "python" || tag == "py" {
            let code = body[..end].trim_end();
            if !code.trim().is_empty() {
                return Some(format!("{code}\n"));
            }
        }
        rest = &body[end + 3..];
    }
    None
}

/// What executing a set of tasks gave.
#[derive(Debug, Default)]
pub(crate) struct Executed {
    /// Every attempt with its judgement, in (round, task) order.
    pub results: Vec<(Candidate, Judgement)>,
    pub duplicates: u64,
    /// The first failed call (the search stops after this round).
    pub halt: Option<LlmError>,
}

/// An attempt waiting for its judgement.
enum Pending {
    /// Known without judging (the observer already told): a static rejection or a duplicate
    /// of an earlier round.
    Known(usize, Candidate, Judgement),
    /// Judged in this round (index into the round's judged list).
    Judged(usize, usize),
    /// A duplicate of one judged in this round.
    Same(usize, Candidate, usize),
}

/// Runs `tasks` to the end: up to `retries` attempts each; every attempt de-duplicated against
/// `ledger` and this round's earlier attempts (a duplicate takes the first one's verdict),
/// else checked statically, else judged; added to `ledger`; fed back unless accepted.
pub(crate) fn execute(env: &Env, tasks: Vec<Task>, ledger: &mut Ledger) -> Executed {
    let tasks: Vec<Mutex<Task>> = tasks.into_iter().map(Mutex::new).collect();
    let mut out = Executed::default();
    for attempt in 1..=env.cfg.retries {
        let active: Vec<usize> = (0..tasks.len()).filter(|&i| !lock(&tasks[i]).done).collect();
        if active.is_empty() || out.halt.is_some() {
            break;
        }
        let written = parallel_map(&active, env.cfg.executors, |&i| lock(&tasks[i]).write(env));
        let mut pending = Vec::new();
        let mut to_judge: Vec<Candidate> = Vec::new();
        let mut this_round: BTreeMap<String, usize> = BTreeMap::new();
        for (&i, source) in active.iter().zip(written) {
            let mut task = lock(&tasks[i]);
            let source = match source {
                Ok(Some(source)) => source,
                Ok(None) | Err(Halt::Stopped) => {
                    task.done = true;
                    continue;
                }
                Err(Halt::Llm(e)) => {
                    task.done = true;
                    out.halt.get_or_insert(e);
                    continue;
                }
            };
            task.attempts = attempt;
            let mut c = task.candidate(env, source);
            if let Some((id, j)) = ledger.get(&c.hash) {
                c.duplicate_of = Some(id.clone());
                env.observer.on_candidate(&c, j);
                pending.push(Pending::Known(i, c, j.clone()));
            } else if let Some(&k) = this_round.get(&c.hash) {
                c.duplicate_of = Some(to_judge[k].id.clone());
                pending.push(Pending::Same(i, c, k));
            } else if let Err(reason) = check_static(&env.ctx.source, &c.source) {
                let verdict = Verdict::Rejected { gate: "static".into(), reason: reason.clone(), exploit: false };
                let j = Judgement { verdict, feedback: reason };
                ledger.insert(c.hash.clone(), (c.id.clone(), j.clone()));
                env.observer.on_candidate(&c, &j);
                pending.push(Pending::Known(i, c, j));
            } else {
                this_round.insert(c.hash.clone(), to_judge.len());
                pending.push(Pending::Judged(i, to_judge.len()));
                to_judge.push(c);
            }
        }
        let judged = parallel_map(&to_judge, env.cfg.executors, |c| {
            let j = env.judge.judge(c);
            env.observer.on_candidate(c, &j);
            j
        });
        for p in pending {
            let (i, c, j, told) = match p {
                Pending::Known(i, c, j) => (i, c, j, true),
                Pending::Same(i, c, k) => (i, c, judged[k].clone(), false),
                Pending::Judged(i, k) => {
                    let c = to_judge[k].clone();
                    ledger.insert(c.hash.clone(), (c.id.clone(), judged[k].clone()));
                    (i, c, judged[k].clone(), true)
                }
            };
            if c.duplicate_of.is_some() {
                out.duplicates += 1;
            }
            if !told {
                env.observer.on_candidate(&c, &j);
            }
            let mut task = lock(&tasks[i]);
            // A resubmitted file (a duplicate) is not an attempt that succeeded, even of an
            // accepted one: told so, the executor tries again.
            task.done = (j.verdict.accepted() && c.duplicate_of.is_none()) || attempt == env.cfg.retries;
            if !task.done {
                task.feed_back(feedback_text(env, &c, &j));
            }
            out.results.push((c, j));
        }
    }
    out
}

/// What the executor is told about an attempt that was not accepted.
fn feedback_text(env: &Env, c: &Candidate, j: &Judgement) -> String {
    let limit = env.cfg.bounds.feedback_chars;
    let text = match (&c.duplicate_of, &j.verdict) {
        (Some(original), v) => format!(
            "Attempt {} is the same file (up to comments and whitespace) as {original}, which was {}. Submit a different file.\n{}",
            c.attempt,
            v.describe(),
            j.feedback
        ),
        (None, Verdict::Rejected { gate, .. }) if gate == "static" => {
            format!("The harness did not run attempt {}: {}. Fix it and submit the whole file again.", c.attempt, j.feedback)
        }
        (None, v) => format!(
            "Attempt {} was {}.\n{}\nFix the problem and submit the whole file again.",
            c.attempt,
            v.describe(),
            j.feedback
        ),
    };
    cut(&text, limit)
}

/// The run of ≥ 2 adjacent generated kernels (in inventory order, not separated by a vendor or
/// aten call) with the largest share of GPU time; the first such run on a tie.
pub(crate) fn fusible_group(ctx: &ProblemContext) -> Option<Vec<KernelInfo>> {
    let kernels = &ctx.inventory.as_ref()?.kernels;
    let mut best: Option<&[KernelInfo]> = None;
    let share = |run: &[KernelInfo]| run.iter().map(|k| k.share).sum::<f64>();
    for run in kernels.split(|k| k.kind != KernelKind::Generated) {
        if run.len() >= 2 && best.is_none_or(|b| share(run) > share(b)) {
            best = Some(run);
        }
    }
    best.map(|run| run.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_python_block_is_found_in_text() {
        let text = "Here:\n```text\nnot this\n```\n```python\nclass ModelNew:\n    pass\n```\nbye";
        assert_eq!(fenced_python(text).unwrap(), "class ModelNew:\n    pass\n");
        assert_eq!(fenced_python("no code"), None);
        assert_eq!(fenced_python("```python\nunterminated"), None);
        // Backticks inside a line are not a fence: the block that opens a line is the file.
        let inline = "Use ```x``` sparingly.\n```python\nclass ModelNew:\n    pass\n```\n";
        assert_eq!(fenced_python(inline).unwrap(), "class ModelNew:\n    pass\n");
    }
}
