//! The search: a beam of chains over the LLM agents. Chains start from the baseline (and the
//! synthesis step's kernel when it was accepted); each iteration plans per chain, executes every
//! plan (in parallel, `executors` threads), judges, summarizes, and picks the next chains.
//!
//! Determinism (what replay needs): given the same replies and verdicts, the same candidates
//! come with the same ids in the same order, and the same requests are sent, whatever the
//! threads do. Results are collected in (iteration, chain, plan, attempt) order and memory and
//! tracker updates are applied in that order after each iteration; prompts hold nothing
//! run-dependent (no times, no counters of other threads).

use crate::analyst::analyze;
use crate::candidate::{Candidate, Judge, Judgement};
use crate::context::ProblemContext;
use crate::executor::{execute, fusible_group, Executed, Ledger, Task};
use crate::memory::{Experience, Memory, MemoryConfig, Tracker, TrackerConfig};
use crate::planner::{plan, PlanInputs};
use crate::summarizer::lesson;
use crate::talk::{parallel_map, Counters, Env, Halt};
use kforge_llm::{Answer, Chat, LlmError, Params, Request, Scope};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};

/// How much of each text goes into a prompt (characters; longer text is cut with a visible
/// `[… N chars cut]` marker).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bounds {
    /// The problem's source and a chain's kernel.
    pub source_chars: usize,
    /// The strategy analysis and the synthesis group's kernels (together).
    pub summary_chars: usize,
    /// The judge's feedback to the executor.
    pub feedback_chars: usize,
    /// One tool answer of the planner (a kernel, the profile, the memory).
    pub tool_chars: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds { source_chars: 12_000, summary_chars: 4_000, feedback_chars: 2_000, tool_chars: 6_000 }
    }
}

/// The search's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopConfig {
    /// The model every call names.
    pub model: String,
    pub params: Params,
    /// Iterations at most (T = 5).
    pub iterations: u32,
    /// Chains kept per iteration (B = 4).
    pub chains: usize,
    /// Plans asked per chain (N = 4).
    pub plans: usize,
    /// Attempts per plan at most, the first included (K = 4).
    pub retries: u32,
    /// Threads that write and judge candidates at once (4).
    pub executors: usize,
    /// Stop after this many iterations in a row without improvement (2; 0: never).
    pub patience: u32,
    /// An iteration improves when one of its accepted candidates has a speedup greater than
    /// `min_gain` × the best speedup so far (which starts at 1.0, the baseline). 1.0: any gain.
    /// Untimed acceptances (the CPU device) never improve.
    pub min_gain: f64,
    /// Ask the summarizer for each attempt's lesson; false: deterministic lessons, no calls.
    pub summarize: bool,
    /// Calls of one planning conversation at most (L), tool look-ups and malformed replies included.
    pub max_plan_rounds: u32,
    /// Malformed replies tolerated per planning conversation and per executor attempt before
    /// the task gives up.
    pub malformed_limit: u32,
    /// Run the synthesis step (when the inventory has a fusible group).
    pub synthesis: bool,
    pub memory: MemoryConfig,
    pub tracker: TrackerConfig,
    pub bounds: Bounds,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            model: String::new(),
            params: Params::default(),
            iterations: 5,
            chains: 4,
            plans: 4,
            retries: 4,
            executors: 4,
            patience: 2,
            min_gain: 1.0,
            summarize: true,
            max_plan_rounds: 6,
            malformed_limit: 2,
            synthesis: true,
            memory: MemoryConfig::default(),
            tracker: TrackerConfig::default(),
            bounds: Bounds::default(),
        }
    }
}

/// A setting of [`LoopConfig`] that makes no search.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("LLM search setting {setting} = {value}: {problem}")]
pub struct ConfigError {
    pub setting: &'static str,
    pub value: String,
    pub problem: &'static str,
}

impl LoopConfig {
    /// Refuses settings that make no search: zero iterations, chains, plans, attempts,
    /// executors or plan rounds, a `min_gain` below 1 (or not a number), an empty model name.
    pub fn check(&self) -> Result<(), ConfigError> {
        let positive = [
            ("iterations", self.iterations as usize),
            ("chains", self.chains),
            ("plans", self.plans),
            ("retries", self.retries as usize),
            ("executors", self.executors),
            ("max_plan_rounds", self.max_plan_rounds as usize),
        ];
        if let Some((setting, value)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(ConfigError { setting, value: value.to_string(), problem: "must be at least 1" });
        }
        if self.min_gain.is_nan() || self.min_gain < 1.0 {
            let problem = "must be a factor of at least 1.0 (1.0: any gain improves)";
            return Err(ConfigError { setting: "min_gain", value: self.min_gain.to_string(), problem });
        }
        if self.model.trim().is_empty() {
            return Err(ConfigError { setting: "model", value: String::new(), problem: "names no model" });
        }
        Ok(())
    }
}

/// What the search reports while it runs. Called from several threads.
pub trait Observer: Send + Sync {
    /// After every call: its scope, its task, the request, the answer or the error. The task
    /// is `i{iteration}-c{chain}` for the planner, `i{iteration}-c{chain}-p{plan}` for the
    /// executor (`i0-c0-p0`: synthesis; its candidates add `-a{attempt}`), and the candidate's
    /// id for the summarizer.
    fn on_call(&self, _scope: &Scope, _task: &str, _request: &Request, _result: Result<&Answer, &LlmError>) {}
    /// The moment a candidate's verdict is known (judged, or known without judging: a static
    /// rejection, a duplicate).
    fn on_candidate(&self, _candidate: &Candidate, _judgement: &Judgement) {}
    /// After every iteration.
    fn on_iteration(&self, _summary: &IterationSummary) {}
    /// A line for a person watching.
    fn progress(&self, _text: &str) {}
}

/// An observer that ignores everything.
pub struct Quiet;
impl Observer for Quiet {}

/// One iteration, as [`Observer::on_iteration`] gets it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IterationSummary {
    pub iteration: u32,
    /// The chains planned from (their kernels; None: the baseline).
    pub chains: Vec<Option<String>>,
    pub plans: usize,
    pub candidates: usize,
    pub accepted: usize,
    pub improved: bool,
    /// The best candidate so far and its speedup.
    pub best: Option<String>,
    pub best_speedup: Option<f64>,
    /// The chains of the next iteration.
    pub next_chains: Vec<Option<String>>,
    pub meltdowns: Vec<Meltdown>,
}

/// Plans of one chain that collapsed onto ≤ 2 strategies, re-planned once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meltdown {
    pub iteration: u32,
    pub chain: u32,
    pub strategies: Vec<String>,
}

/// Why the search stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// Every iteration ran.
    Iterations,
    /// This many iterations in a row gave no improvement (the patience).
    NoImprovement { iterations: u32 },
    /// A budget was spent (the error's text).
    Budget(String),
    /// The provider failed after the client's own retries (the error's text).
    ProviderFailed(String),
}

/// Counts of the search.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Stats {
    /// Calls made to the chat (failed ones included).
    pub calls: u64,
    /// Malformed replies (fed back, or a summarizer's fallback lesson).
    pub malformed: u64,
    /// Attempts after a plan's first.
    pub executor_retries: u64,
    /// Candidates that got an earlier candidate's verdict without judging.
    pub duplicates: u64,
    pub meltdowns: u64,
    /// Iterations started.
    pub iterations: u32,
    /// The experience memory at the end, oldest first.
    pub memory: Vec<Experience>,
    /// Strategies avoided at the end.
    pub avoided: Vec<String>,
    /// Lessons made deterministically because the summarizer's reply was malformed.
    pub fallback_lessons: u64,
    pub meltdown_events: Vec<Meltdown>,
    /// The synthesis step's accepted candidate (it seeded a chain).
    pub synthesis: Option<String>,
}

/// What the search found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchOutcome {
    /// Every attempt with its judgement, in (iteration, chain, plan, attempt) order.
    pub candidates: Vec<(Candidate, Judgement)>,
    /// The candidate that last improved the best speedup (None: nothing beat the baseline by
    /// `min_gain`, which is always so without timing).
    pub best: Option<String>,
    pub best_speedup: Option<f64>,
    pub stop: Stop,
    pub stats: Stats,
}

/// Tried plans of a chain shown to its planner, the most recent.
pub const TRIED_SHOWN: usize = 16;

/// A chain of the beam: the kernel it is at.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Chain {
    /// The candidate (None: the baseline).
    pub kernel: Option<String>,
    pub source: String,
    pub speedup: Option<f64>,
    pub strategy: Option<String>,
    /// What plans on this chain gave so far, one line each (`strategy (change): verdict`).
    pub tried: Vec<String>,
}

impl Chain {
    fn baseline(ctx: &ProblemContext) -> Chain {
        Chain {
            kernel: None,
            source: ctx.baseline.source.clone(),
            speedup: Some(1.0),
            strategy: None,
            tried: Vec::new(),
        }
    }

    fn of(c: &Candidate, j: &Judgement) -> Chain {
        Chain {
            kernel: Some(c.id.clone()),
            source: c.source.clone(),
            speedup: j.verdict.speedup(),
            strategy: Some(c.strategy.clone()),
            tried: Vec::new(),
        }
    }

    /// The chain's last [`TRIED_SHOWN`] tried plans as prompt text.
    pub fn tried_text(&self) -> String {
        if self.tried.is_empty() {
            return "nothing yet".into();
        }
        let skip = self.tried.len().saturating_sub(TRIED_SHOWN);
        let mut lines: Vec<String> = self.tried[skip..].iter().map(|t| format!("- {t}")).collect();
        if skip > 0 {
            lines.insert(0, format!("({skip} earlier plans not shown)"));
        }
        lines.join("\n")
    }

    /// How prompts name the chain.
    pub fn label(&self) -> String {
        match (&self.kernel, &self.strategy) {
            (None, _) => "the baseline".into(),
            (Some(id), strategy) => {
                let speed = self.speedup.map(|s| format!("{s:.3}x")).unwrap_or_else(|| "untimed".into());
                format!("candidate {id}: {}, {speed}", strategy.as_deref().unwrap_or("?"))
            }
        }
    }
}

/// The baseline as prompts name it.
pub(crate) fn baseline_text(ctx: &ProblemContext) -> String {
    match ctx.baseline.time_ms {
        Some(t) => format!("{} ({t:.3} ms per forward)", ctx.baseline.label),
        None => ctx.baseline.label.clone(),
    }
}

/// The search's state between iterations.
struct State {
    candidates: Vec<(Candidate, Judgement)>,
    ledger: Ledger,
    memory: Memory,
    tracker: Tracker,
    best: Option<String>,
    /// The best speedup so far (1.0: the baseline).
    reference: f64,
    stats: Stats,
}

/// Searches for faster kernels for `ctx`: see the module's documentation. Never panics on a
/// provider's failure: the search stops with [`Stop::Budget`] or [`Stop::ProviderFailed`],
/// keeping every candidate judged so far. `cfg` should pass [`LoopConfig::check`] (a zero
/// setting makes an empty search).
pub fn search(
    ctx: &ProblemContext,
    cfg: &LoopConfig,
    chat: &dyn Chat,
    judge: &dyn Judge,
    observer: &dyn Observer,
) -> SearchOutcome {
    let env = Env { ctx, cfg, chat, judge, observer, counters: Counters::default(), stop: AtomicBool::new(false) };
    let mut s = State {
        candidates: Vec::new(),
        ledger: Ledger::new(),
        memory: Memory::new(cfg.memory),
        tracker: Tracker::new(cfg.tracker),
        best: None,
        reference: 1.0,
        stats: Stats::default(),
    };
    let stop = run(&env, &mut s);
    let mut stats = s.stats;
    stats.calls = env.counters.calls.load(Ordering::SeqCst);
    stats.malformed = env.counters.malformed.load(Ordering::SeqCst);
    stats.executor_retries = s.candidates.iter().filter(|(c, _)| c.attempt > 1).count() as u64;
    stats.memory = s.memory.items();
    stats.avoided = s.tracker.avoided();
    let best_speedup = s.best.as_ref().map(|_| s.reference);
    observer.progress(&format!("search of {} stopped: {stop:?}", ctx.problem));
    SearchOutcome { candidates: s.candidates, best: s.best, best_speedup, stop, stats }
}

fn stop_of(e: LlmError) -> Stop {
    match e {
        LlmError::Budget { .. } | LlmError::BudgetRecorded { .. } => Stop::Budget(e.to_string()),
        other => Stop::ProviderFailed(other.to_string()),
    }
}

/// Keeps the failure that stops the search: the first, unless a later one is a budget's (a
/// budget stop is what the run was told; another call's error after it is its consequence).
fn keep(failed: &mut Option<LlmError>, e: LlmError) {
    let budget = |e: &LlmError| matches!(e, LlmError::Budget { .. } | LlmError::BudgetRecorded { .. });
    if failed.as_ref().is_none_or(|f| !budget(f) && budget(&e)) {
        *failed = Some(e);
    }
}

fn run(env: &Env, s: &mut State) -> Stop {
    let analysis = analyze(env.ctx).render();
    let mut chains = vec![Chain::baseline(env.ctx)];
    match synthesize(env, s) {
        Ok(Some(seed)) => chains.push(seed),
        Ok(None) => {}
        Err(stop) => return stop,
    }
    let mut streak = 0;
    for iteration in 1..=env.cfg.iterations {
        s.stats.iterations = iteration;
        env.observer.progress(&format!("iteration {iteration}: planning for {} chains", chains.len()));
        let (tasks, meltdowns) = match plan_all(env, s, &chains, &analysis, iteration) {
            Ok(planned) => planned,
            Err(stop) => return stop,
        };
        let plans = tasks.len();
        let executed = execute(env, tasks, &mut s.ledger);
        let (results, improved) = match absorb(env, s, executed) {
            Ok(absorbed) => absorbed,
            Err(stop) => return stop,
        };
        note_tried(&mut chains, &results);
        let next = select(&chains, &results, env.cfg.chains);
        env.observer.on_iteration(&IterationSummary {
            iteration,
            chains: chains.iter().map(|c| c.kernel.clone()).collect(),
            plans,
            candidates: results.len(),
            accepted: results.iter().filter(|(_, j)| j.verdict.accepted()).count(),
            improved,
            best: s.best.clone(),
            best_speedup: s.best.as_ref().map(|_| s.reference),
            next_chains: next.iter().map(|c| c.kernel.clone()).collect(),
            meltdowns,
        });
        chains = next;
        streak = if improved { 0 } else { streak + 1 };
        if env.cfg.patience > 0 && streak >= env.cfg.patience {
            return Stop::NoImprovement { iterations: streak };
        }
    }
    Stop::Iterations
}

/// The synthesis step: the chain its accepted kernel seeds, if any.
fn synthesize(env: &Env, s: &mut State) -> Result<Option<Chain>, Stop> {
    if !env.cfg.synthesis {
        return Ok(None);
    }
    let Some(group) = fusible_group(env.ctx) else { return Ok(None) };
    env.observer.progress(&format!("synthesis: fusing {} adjacent generated kernels", group.len()));
    let executed = execute(env, vec![Task::synthesis(env, &group)], &mut s.ledger);
    let (results, _) = absorb(env, s, executed)?;
    let seed = results.iter().find(|(_, j)| j.verdict.accepted()).map(|(c, j)| Chain::of(c, j));
    s.stats.synthesis = seed.as_ref().and_then(|c| c.kernel.clone());
    Ok(seed)
}

/// Plans every chain (in parallel) and makes their executor tasks in (chain, plan) order.
fn plan_all(
    env: &Env,
    s: &mut State,
    chains: &[Chain],
    analysis: &str,
    iteration: u32,
) -> Result<(Vec<Task>, Vec<Meltdown>), Stop> {
    let avoid = s.tracker.avoided();
    let inputs: Vec<PlanInputs> = chains
        .iter()
        .enumerate()
        .map(|(ci, chain)| PlanInputs {
            task: format!("i{iteration}-c{ci}"),
            chain,
            analysis,
            memory: &s.memory,
            avoid: &avoid,
        })
        .collect();
    let planned = parallel_map(&inputs, env.cfg.executors, |i| plan(env, i));
    let mut tasks = Vec::new();
    let mut meltdowns = Vec::new();
    let mut failed = None;
    for (ci, (chain, p)) in chains.iter().zip(planned).enumerate() {
        let p = match p {
            Ok(p) => p,
            Err(Halt::Llm(e)) => {
                keep(&mut failed, e);
                continue;
            }
            Err(Halt::Stopped) => continue,
        };
        if let Some(strategies) = p.meltdown {
            let m = Meltdown { iteration, chain: ci as u32, strategies };
            env.observer.progress(&format!("meltdown on chain {ci}: plans collapsed onto {:?}", m.strategies));
            s.stats.meltdowns += 1;
            s.stats.meltdown_events.push(m.clone());
            meltdowns.push(m);
        }
        for (pi, plan) in p.plans.iter().enumerate() {
            tasks.push(Task::executor(env, chain, plan, (iteration, ci as u32, pi as u32)));
        }
    }
    match failed {
        Some(e) => Err(stop_of(e)),
        None => Ok((tasks, meltdowns)),
    }
}

/// Records an execution's candidates in (chain, plan, attempt) order and whether they improve
/// the best, then the tracker, the lessons and the memory in that order; a failed call stops
/// the search after the candidates (and the best) are kept.
fn absorb(env: &Env, s: &mut State, executed: Executed) -> Result<(Vec<(Candidate, Judgement)>, bool), Stop> {
    let Executed { mut results, duplicates, halt } = executed;
    results.sort_by_key(|(c, _)| (c.chain, c.plan, c.attempt));
    s.stats.duplicates += duplicates;
    s.candidates.extend(results.iter().cloned());
    let improved = improve(s, &results, env.cfg.min_gain);
    if let Some(e) = halt {
        return Err(stop_of(e));
    }
    let mut outcome: BTreeMap<(u32, u32), (String, bool)> = BTreeMap::new();
    for (c, j) in &results {
        // A file already judged (a duplicate) says nothing new about the strategy.
        let success = c.duplicate_of.is_none() && j.verdict.accepted() && j.verdict.speedup().is_none_or(|x| x >= 1.0);
        let entry = outcome.entry((c.chain, c.plan)).or_insert((c.strategy.clone(), false));
        entry.1 |= success;
    }
    for (strategy, success) in outcome.values() {
        s.tracker.record(strategy, *success);
    }
    // A lesson only for what the memory would keep: others are never read.
    let fresh: Vec<&(Candidate, Judgement)> = results
        .iter()
        .filter(|(c, j)| c.duplicate_of.is_none() && s.memory.worth_storing(j.verdict.speedup()))
        .collect();
    let lessons = parallel_map(&fresh, env.cfg.executors, |(c, j)| lesson(env, c, j));
    let mut failed = None;
    for ((c, j), l) in fresh.iter().zip(lessons) {
        match l {
            Ok(l) => {
                s.stats.fallback_lessons += u64::from(l.fallback);
                s.memory.offer(Experience {
                    candidate: c.id.clone(),
                    iteration: c.iteration,
                    strategy: c.strategy.clone(),
                    lesson: l.text,
                    speedup: j.verdict.speedup(),
                });
            }
            Err(Halt::Llm(e)) => keep(&mut failed, e),
            Err(Halt::Stopped) => {}
        }
    }
    match failed {
        Some(e) => Err(stop_of(e)),
        None => Ok((results, improved)),
    }
}

/// Adds each plan's last attempt to the chain it was planned on.
fn note_tried(chains: &mut [Chain], results: &[(Candidate, Judgement)]) {
    for (i, (c, j)) in results.iter().enumerate() {
        let last = results.get(i + 1).is_none_or(|(n, _)| (n.chain, n.plan) != (c.chain, c.plan));
        if let (true, Some(chain)) = (last, chains.get_mut(c.chain as usize)) {
            chain.tried.push(crate::summarizer::fallback(c, j));
        }
    }
}

/// Whether `results` improve the best speedup by more than `min_gain`; updates the best.
fn improve(s: &mut State, results: &[(Candidate, Judgement)], min_gain: f64) -> bool {
    let mut top: Option<(&Candidate, f64)> = None;
    for (c, j) in results {
        if let (None, Some(x)) = (&c.duplicate_of, j.verdict.speedup()) {
            if top.is_none_or(|(_, t)| x > t) {
                top = Some((c, x));
            }
        }
    }
    match top {
        Some((c, x)) if x > s.reference * min_gain => {
            s.best = Some(c.id.clone());
            s.reference = x;
            true
        }
        _ => false,
    }
}

/// The next chains: the current ones and this iteration's accepted candidates, ranked by
/// speedup (untimed last; ties in that order), the best of each strategy first, then the rest.
fn select(chains: &[Chain], results: &[(Candidate, Judgement)], width: usize) -> Vec<Chain> {
    let mut pool: Vec<Chain> = chains.to_vec();
    pool.extend(
        results.iter().filter(|(c, j)| j.verdict.accepted() && c.duplicate_of.is_none()).map(|(c, j)| Chain::of(c, j)),
    );
    let rank = |c: &Chain| c.speedup.unwrap_or(f64::NEG_INFINITY);
    pool.sort_by(|a, b| rank(b).total_cmp(&rank(a)));
    let mut picked = Vec::new();
    let mut strategies = BTreeSet::new();
    for (i, c) in pool.iter().enumerate() {
        if picked.len() < width && strategies.insert(c.strategy.clone()) {
            picked.push(i);
        }
    }
    for i in 0..pool.len() {
        if picked.len() < width && !picked.contains(&i) {
            picked.push(i);
        }
    }
    picked.sort();
    picked.into_iter().map(|i| pool[i].clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_make_no_search_are_refused() {
        let good = LoopConfig { model: "m".into(), ..LoopConfig::default() };
        assert_eq!(good.check(), Ok(()));
        let err = LoopConfig { plans: 0, ..good.clone() }.check().unwrap_err();
        assert_eq!(err.to_string(), "LLM search setting plans = 0: must be at least 1");
        assert_eq!(LoopConfig { min_gain: 0.9, ..good.clone() }.check().unwrap_err().setting, "min_gain");
        assert_eq!(LoopConfig { min_gain: f64::NAN, ..good.clone() }.check().unwrap_err().setting, "min_gain");
        assert_eq!(LoopConfig { model: " ".into(), ..good }.check().unwrap_err().setting, "model");
    }

    fn chain(kernel: &str, speedup: Option<f64>, strategy: &str) -> Chain {
        Chain {
            kernel: Some(kernel.into()),
            source: String::new(),
            speedup,
            strategy: Some(strategy.into()),
            tried: Vec::new(),
        }
    }

    #[test]
    fn selection_prefers_distinct_strategies_then_speed() {
        let chains = vec![
            chain("a", Some(1.5), "tune"),
            chain("b", Some(1.4), "tune"),
            chain("c", Some(1.1), "fuse"),
            chain("d", None, "vectorize"),
            chain("e", Some(1.4), "tune"),
        ];
        let picked: Vec<String> = select(&chains, &[], 3).into_iter().filter_map(|c| c.kernel).collect();
        assert_eq!(picked, ["a", "c", "d"], "one per strategy first, in rank order");
        let picked: Vec<String> = select(&chains, &[], 4).into_iter().filter_map(|c| c.kernel).collect();
        assert_eq!(picked, ["a", "b", "c", "d"], "then the best of the rest; ties keep their order");
    }
}
