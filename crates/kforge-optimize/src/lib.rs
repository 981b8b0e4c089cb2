//! `kforge optimize`'s decisions, without processes: which agents run, what the dispatch agent
//! measured (`python3 -m kforge.optimize.dispatch`'s JSON, read here), and what the run ends
//! with — a winner that measured beyond noise and that `kforge verify` then accepted, or the
//! baseline kept (the fallback) with the reason. The binary runs the agent, writes the result
//! file and verifies it; this crate says what that means.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub mod beam;
pub mod budget;
pub mod html;
pub mod journal;
pub mod search;

/// An agent: what proposes candidates. Closed: a name outside it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Agent {
    /// Eager or a torch.compile mode per problem, by measurement.
    Dispatch,
    /// The baseline's mode with one of Inductor's knobs changed (`MODE+KNOB`), by measurement.
    Inductor,
    /// The forward rewritten by the FX rewrite rules, run in a mode (`MODE~rewrite`), by measurement.
    Rewrite,
}

impl Agent {
    pub const ALL: [(&'static str, Agent); 3] =
        [("dispatch", Agent::Dispatch), ("inductor", Agent::Inductor), ("rewrite", Agent::Rewrite)];

    /// The agent that proposed a measured variant: `MODE+KNOB` is the inductor agent's,
    /// `MODE~rewrite` the rewrite agent's.
    pub fn of_variant(variant: &str) -> Agent {
        if variant.ends_with("~rewrite") {
            Agent::Rewrite
        } else if variant.contains('+') {
            Agent::Inductor
        } else {
            Agent::Dispatch
        }
    }

    pub fn name(self) -> &'static str {
        Agent::ALL.iter().find(|(_, a)| *a == self).map(|(n, _)| *n).unwrap_or("?")
    }
}

/// What `kforge optimize` is measured against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Baseline {
    Default,
    MaxAutotune,
}

impl Baseline {
    pub fn mode(self) -> &'static str {
        match self {
            Baseline::Default => "default",
            Baseline::MaxAutotune => "max-autotune",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum OptimizeError {
    #[error("--agents: unknown agent {0:?} (known: {known})", known = Agent::ALL.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "))]
    UnknownAgent(String),
    #[error("--agents: no agent named")]
    NoAgent,
    #[error("{path}: not a problem file: {why}")]
    NotAProblem { path: String, why: String },
    #[error("the dispatch agent's result is not readable: {0}")]
    Measurement(String),
    #[error("{flag} must be a positive number of seconds, got {value}")]
    Budget { flag: &'static str, value: f64 },
}

/// `--agents LIST`: comma-separated names, each known, in order, without repeats.
pub fn parse_agents(list: &str) -> Result<Vec<Agent>, OptimizeError> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let (_, a) =
            Agent::ALL.iter().find(|(n, _)| *n == name).ok_or_else(|| OptimizeError::UnknownAgent(name.into()))?;
        if !out.contains(a) {
            out.push(*a);
        }
    }
    if out.is_empty() {
        return Err(OptimizeError::NoAgent);
    }
    Ok(out)
}

/// Inductor's knobs the inductor agent tries on a device (python/kforge/optimize/dispatch.py
/// `KNOBS`): on the CPU those that change its C++ backend's code.
pub fn inductor_knobs(gpu: bool) -> &'static [&'static str] {
    if gpu {
        &[
            "freezing",
            "aggressive-fusion",
            "coordinate-descent",
            "no-layout-optimization",
            "max-autotune-pointwise",
            "no-epilogue-fusion",
        ]
    } else {
        &["freezing", "aggressive-fusion"]
    }
}

/// The modes the dispatch agent measures on a device: CUDA graphs only on a GPU.
pub fn dispatch_modes(gpu: bool) -> &'static [&'static str] {
    if gpu {
        &["eager", "default", "max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead"]
    } else {
        &["eager", "default", "max-autotune-no-cudagraphs"]
    }
}

/// One timed mode of the dispatch agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModeTiming {
    pub speedup: f64,
    pub ci95: [f64; 2],
    pub beyond_noise: bool,
}

/// One prepared mode: whether it ran and matched eager, else why not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prepared {
    pub ok: bool,
    #[serde(default)]
    pub why: Option<String>,
    #[serde(default)]
    pub first_call_s: Option<f64>,
    /// A rewrite variant's rules, in the order applied (absent for other variants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<String>>,
    /// A rewrite variant's weakest exactness class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exactness: Option<String>,
}

/// What the dispatch agent measured (the fields of its JSON this side reads).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DispatchMeasurement {
    pub baseline: String,
    pub winner: String,
    pub fallback: bool,
    #[serde(default)]
    pub noise_floor: Option<f64>,
    #[serde(default)]
    pub modes: BTreeMap<String, ModeTiming>,
    #[serde(default)]
    pub prepared: BTreeMap<String, Prepared>,
    /// What the rewrite agent proposed (`None`: it did not run).
    #[serde(default)]
    pub rewrite: Option<RewriteProposal>,
}

/// One rewrite rule applied to the problem's FX graph, with its exactness class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewriteApplication {
    pub rule: String,
    pub exactness: String,
}

/// What the rewrite agent proposed: the rules that fired (its variants `MODE~rewrite`), or
/// nothing, and why (no rule fired: not an error).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewriteProposal {
    pub fired: bool,
    #[serde(default)]
    pub rules: Vec<RewriteApplication>,
    #[serde(default)]
    pub why: Option<String>,
}

impl RewriteProposal {
    /// One line for the table.
    pub fn line(&self) -> String {
        if self.fired {
            let rules: Vec<String> = self.rules.iter().map(|r| format!("{} ({})", r.rule, r.exactness)).collect();
            format!("rewrite: {}", rules.join(", "))
        } else {
            format!("rewrite: {}", self.why.as_deref().unwrap_or("proposes nothing"))
        }
    }
}

impl DispatchMeasurement {
    pub fn parse(text: &str) -> Result<DispatchMeasurement, OptimizeError> {
        let m: DispatchMeasurement =
            serde_json::from_str(text).map_err(|e| OptimizeError::Measurement(e.to_string()))?;
        if m.winner != m.baseline && !m.modes.contains_key(&m.winner) {
            return Err(OptimizeError::Measurement(format!("the winner {:?} was not timed", m.winner)));
        }
        Ok(m)
    }
}

/// How `kforge verify` judged the result file (its outcome's name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verified {
    Accepted,
    PassedWithoutPerformance,
    Rejected,
    CouldNotRun,
}

/// What the run ends with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Decision {
    /// A mode beat the baseline beyond noise and the result file passed verification.
    Improved { agent: Agent, mode: String, speedup: f64, ci95: [f64; 2] },
    /// The baseline is the result: nothing won, or the winner's file did not pass.
    Fallback { reason: String },
}

/// The decision from what was measured and how the winner's result file was judged. On a GPU
/// only `accepted` counts (gate 4 confirmed the speedup against the same baseline); without
/// one, `passed-without-performance` (every other gate passed; the speed is the agent's own
/// interleaved measurement).
pub fn decide(m: &DispatchMeasurement, verified: Option<Verified>, gpu: bool) -> Decision {
    if m.fallback || m.winner == m.baseline {
        return Decision::Fallback { reason: fallback_reason(m) };
    }
    let timing = &m.modes[&m.winner];
    let passed = match verified {
        Some(Verified::Accepted) => true,
        Some(Verified::PassedWithoutPerformance) => !gpu,
        _ => false,
    };
    if passed {
        Decision::Improved {
            agent: Agent::of_variant(&m.winner),
            mode: m.winner.clone(),
            speedup: timing.speedup,
            ci95: timing.ci95,
        }
    } else {
        let how = match verified {
            Some(v) => serde_json::to_value(v).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
            None => "not verified".into(),
        };
        Decision::Fallback {
            reason: format!("the winner {} measured {:.3}x but its result file was {how}", m.winner, timing.speedup),
        }
    }
}

fn fallback_reason(m: &DispatchMeasurement) -> String {
    let failed: Vec<String> = m
        .prepared
        .iter()
        .filter(|(_, p)| !p.ok)
        .map(|(n, p)| format!("{n}: {}", p.why.as_deref().unwrap_or("output differs from eager")))
        .collect();
    let best = m.modes.iter().max_by(|a, b| a.1.speedup.total_cmp(&b.1.speedup));
    let mut why = match (best, m.noise_floor) {
        (Some((n, t)), Some(f)) => format!(
            "no mode beat {} beyond the noise floor {f:.3} (best: {n} {:.3}x, interval {:.3}-{:.3})",
            m.baseline, t.speedup, t.ci95[0], t.ci95[1]
        ),
        _ => format!("no mode besides {} runs and matches eager", m.baseline),
    };
    if !failed.is_empty() {
        why.push_str(&format!("; left out: {}", failed.join("; ")));
    }
    if let Some(r) = m.rewrite.as_ref().filter(|r| !r.fired) {
        why.push_str(&format!("; {}", r.line()));
    }
    why
}

/// What a run is asked: the problem and everything that decides its answer (`--resume` takes an
/// earlier report only for the same question).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Question {
    pub problem: String,
    pub size: String,
    pub device: String,
    pub baseline: Baseline,
    pub agents: Vec<Agent>,
    /// The dispatch agent's timing rounds.
    pub rounds: u32,
    /// The beam's width: knobs combined in its second round (0: no second round).
    #[serde(default)]
    pub beam_width: u32,
}

/// The run's report: what was asked, measured, judged and decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    #[serde(flatten)]
    pub question: Question,
    pub measurement: DispatchMeasurement,
    /// The winner's verification (`None` when nothing won).
    pub verified: Option<Verified>,
    pub decision: Decision,
    /// The result file and its verify policy.
    pub result: String,
    pub policy: String,
    /// The beam's second round, when the beam was asked for (`--beam-width`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beam: Option<BeamOutcome>,
}

/// What the beam's second round did: measured knob combinations beside the first round's best
/// (`measurement`, the one the decision then used), or why the search stopped after round 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BeamOutcome {
    #[serde(default)]
    pub measurement: Option<DispatchMeasurement>,
    #[serde(default)]
    pub stopped: Option<String>,
}

impl Report {
    /// The measurement the decision used: the beam's second round when it ran, else the first.
    pub fn decisive(&self) -> &DispatchMeasurement {
        self.beam.as_ref().and_then(|b| b.measurement.as_ref()).unwrap_or(&self.measurement)
    }

    /// A table for people: every mode's timing, then the decision.
    pub fn table(&self) -> String {
        let q = &self.question;
        let mut t = format!("{} (size {}, device {}) against {}\n", q.problem, q.size, q.device, q.baseline.mode());
        t.push_str(&format!("{:<28} {:>9} {:>19}  {}\n", "MODE", "SPEEDUP", "95% INTERVAL", "NOTE"));
        for (name, p) in &self.measurement.prepared {
            let note = if p.ok {
                String::new()
            } else {
                format!("left out: {}", p.why.as_deref().unwrap_or("differs from eager"))
            };
            match self.measurement.modes.get(name) {
                Some(m) => t.push_str(&format!(
                    "{name:<28} {:>8.3}x {:>9.3}-{:<9.3}  {}\n",
                    m.speedup,
                    m.ci95[0],
                    m.ci95[1],
                    if m.beyond_noise { "beyond noise" } else { "within noise" }
                )),
                None if name == &self.measurement.baseline => {
                    t.push_str(&format!("{name:<28} {:>9} {:>19}  baseline\n", "1.000x", "-"))
                }
                None => t.push_str(&format!("{name:<28} {:>9} {:>19}  {note}\n", "-", "-")),
            }
        }
        if let Some(f) = self.measurement.noise_floor {
            t.push_str(&format!("noise floor {f:.3}\n"));
        }
        if let Some(r) = &self.measurement.rewrite {
            t.push_str(&format!("{}\n", r.line()));
        }
        t.push_str(&self.beam_lines());
        match &self.decision {
            Decision::Improved { agent, mode, speedup, .. } => {
                t.push_str(&format!("result: {mode} ({}), {speedup:.3}x, verified; {}\n", agent.name(), self.result))
            }
            Decision::Fallback { reason } => {
                t.push_str(&format!("result: the baseline kept ({reason}); {}\n", self.result))
            }
        }
        t
    }
}

impl Report {
    /// The beam's second round in the table: each variant measured again, or why none was.
    fn beam_lines(&self) -> String {
        let Some(b) = &self.beam else { return String::new() };
        match (&b.measurement, &b.stopped) {
            (Some(m), _) => {
                let mut t = format!("beam round 2 (knobs combined, against {} again):\n", m.baseline);
                for (name, x) in &m.modes {
                    t.push_str(&format!(
                        "  {name:<26} {:>8.3}x {:>9.3}-{:<9.3}  {}\n",
                        x.speedup,
                        x.ci95[0],
                        x.ci95[1],
                        if x.beyond_noise { "beyond noise" } else { "within noise" }
                    ));
                }
                t
            }
            (None, Some(why)) => format!("{why}\n"),
            (None, None) => String::new(),
        }
    }
}

/// One problem of a campaign: its report's decision, why it could not be optimized, or why it
/// was not reached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProblemOutcome {
    pub problem: String,
    /// The group it is summarised in: its folder's name (`level1`), else `.`.
    pub level: String,
    /// The decision (`None`: the run failed, `error` says why, or it was not reached).
    pub decision: Option<Decision>,
    #[serde(default)]
    pub error: Option<String>,
    /// Why no step of it (or not all) ran: `budget` (a budget was spent first). Not a failure:
    /// `--resume` continues it.
    #[serde(default)]
    pub not_reached: Option<String>,
    pub seconds: f64,
    /// The device seconds its steps spent in this run (region time where known, else the
    /// steps' wall seconds; see the journal).
    #[serde(default)]
    pub gpu_seconds: f64,
    /// Taken from an earlier run's report (`--resume`), not run again.
    #[serde(default)]
    pub resumed: bool,
}

impl ProblemOutcome {
    /// The speedup it counts with: the verified winner's, else 1.0 (the baseline kept, or a
    /// failed run: the campaign ships the baseline for it).
    pub fn speedup(&self) -> f64 {
        match &self.decision {
            Some(Decision::Improved { speedup, .. }) => *speedup,
            _ => 1.0,
        }
    }
}

/// A campaign's summary for one level (or all): geometric-mean speedup over the baseline
/// (fallbacks and failures count as 1.0), how many were optimized, kept, failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelSummary {
    pub level: String,
    pub problems: usize,
    pub optimized: usize,
    pub fallbacks: usize,
    pub failed: usize,
    /// Not reached (a budget was spent); counted as the baseline like a fallback.
    #[serde(default)]
    pub not_reached: usize,
    pub geomean: f64,
    /// Share of problems faster than the baseline by a verified winner (KernelBench's fast_1).
    pub fast_1: f64,
    pub seconds: f64,
    #[serde(default)]
    pub gpu_seconds: f64,
}

/// Per level, in name order, then `all`.
pub fn summarize(outcomes: &[ProblemOutcome]) -> Vec<LevelSummary> {
    let mut levels: Vec<String> = outcomes.iter().map(|o| o.level.clone()).collect();
    levels.sort();
    levels.dedup();
    let mut out: Vec<LevelSummary> =
        levels.iter().map(|l| level_summary(l, outcomes.iter().filter(|o| &o.level == l))).collect();
    if levels.len() != 1 {
        out.push(level_summary("all", outcomes.iter()));
    }
    out
}

fn level_summary<'a>(level: &str, of: impl Iterator<Item = &'a ProblemOutcome>) -> LevelSummary {
    let of: Vec<&ProblemOutcome> = of.collect();
    let n = of.len();
    let optimized = of.iter().filter(|o| matches!(o.decision, Some(Decision::Improved { .. }))).count();
    let not_reached = of.iter().filter(|o| o.decision.is_none() && o.not_reached.is_some()).count();
    let failed = of.iter().filter(|o| o.decision.is_none()).count() - not_reached;
    let logs: f64 = of.iter().map(|o| o.speedup().ln()).sum();
    LevelSummary {
        level: level.into(),
        problems: n,
        optimized,
        fallbacks: n - optimized - failed - not_reached,
        failed,
        not_reached,
        geomean: if n == 0 { 1.0 } else { (logs / n as f64).exp() },
        fast_1: if n == 0 { 0.0 } else { optimized as f64 / n as f64 },
        seconds: of.iter().map(|o| o.seconds).sum(),
        gpu_seconds: of.iter().map(|o| o.gpu_seconds).sum(),
    }
}

/// The campaign's table: one row per problem, then one per level.
pub fn campaign_table(outcomes: &[ProblemOutcome], summary: &[LevelSummary]) -> String {
    let mut t = format!("{:<52} {:>9} {:>8} {:>8}  {}\n", "PROBLEM", "SPEEDUP", "SECONDS", "GPU-S", "RESULT");
    for o in outcomes {
        let what = match (&o.decision, &o.error, &o.not_reached) {
            (Some(Decision::Improved { mode, agent, .. }), _, _) => format!("{mode} ({})", agent.name()),
            (Some(Decision::Fallback { .. }), _, _) => "baseline kept".to_string(),
            (None, _, Some(why)) => format!("not reached: {why}"),
            (None, e, None) => format!("failed: {}", e.as_deref().unwrap_or("?")),
        };
        let resumed = if o.resumed { " (resumed)" } else { "" };
        t.push_str(&format!(
            "{:<52} {:>8.3}x {:>8.1} {:>8.1}  {what}{resumed}\n",
            o.problem,
            o.speedup(),
            o.seconds,
            o.gpu_seconds
        ));
    }
    t.push_str(&format!(
        "\n{:<10} {:>8} {:>9} {:>9} {:>6} {:>11} {:>8} {:>6} {:>9} {:>8}\n",
        "LEVEL", "PROBLEMS", "OPTIMIZED", "FALLBACKS", "FAILED", "NOT-REACHED", "GEOMEAN", "FAST_1", "SECONDS", "GPU-S"
    ));
    for s in summary {
        t.push_str(&format!(
            "{:<10} {:>8} {:>9} {:>9} {:>6} {:>11} {:>7.3}x {:>6.2} {:>9.1} {:>8.1}\n",
            s.level,
            s.problems,
            s.optimized,
            s.fallbacks,
            s.failed,
            s.not_reached,
            s.geomean,
            s.fast_1,
            s.seconds,
            s.gpu_seconds
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(winner: &str, fallback: bool) -> DispatchMeasurement {
        DispatchMeasurement::parse(&format!(
            r#"{{"baseline": "max-autotune", "winner": "{winner}", "fallback": {fallback}, "noise_floor": 1.01,
                "modes": {{"default": {{"speedup": 1.2, "ci95": [1.15, 1.25], "beyond_noise": true}},
                          "eager": {{"speedup": 0.9, "ci95": [0.85, 0.95], "beyond_noise": false}}}},
                "prepared": {{"max-autotune": {{"ok": true}}, "default": {{"ok": true}}, "eager": {{"ok": true}},
                             "reduce-overhead": {{"ok": false, "why": "RuntimeError: boom"}}}}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn agents_are_a_closed_list() {
        assert_eq!(parse_agents("dispatch"), Ok(vec![Agent::Dispatch]));
        assert_eq!(parse_agents(" dispatch, dispatch "), Ok(vec![Agent::Dispatch]));
        assert_eq!(parse_agents("inductor,dispatch"), Ok(vec![Agent::Inductor, Agent::Dispatch]));
        assert_eq!(
            (Agent::of_variant("max-autotune+freezing"), Agent::of_variant("eager")),
            (Agent::Inductor, Agent::Dispatch)
        );
        assert_eq!(
            (Agent::of_variant("max-autotune~rewrite"), Agent::of_variant("eager~rewrite")),
            (Agent::Rewrite, Agent::Rewrite)
        );
        assert_eq!(parse_agents("dispatch,rewrite"), Ok(vec![Agent::Dispatch, Agent::Rewrite]));
        assert_eq!(parse_agents("dispatch,llm"), Err(OptimizeError::UnknownAgent("llm".into())));
        assert_eq!(parse_agents(" , "), Err(OptimizeError::NoAgent));
        assert!(OptimizeError::UnknownAgent("x".into()).to_string().contains("known: dispatch, inductor, rewrite"));
    }

    #[test]
    fn a_verified_winner_is_the_result_else_the_baseline_stays() {
        let m = measured("default", false);
        let improved = decide(&m, Some(Verified::Accepted), true);
        assert_eq!(
            improved,
            Decision::Improved { agent: Agent::Dispatch, mode: "default".into(), speedup: 1.2, ci95: [1.15, 1.25] }
        );
        // Without a GPU gate 4 cannot run: every other gate passing is what verification can say.
        assert_eq!(decide(&m, Some(Verified::PassedWithoutPerformance), false), improved);
        // On a GPU, passing without the performance gate is not enough; a rejection never is.
        for (v, gpu) in
            [(Some(Verified::PassedWithoutPerformance), true), (Some(Verified::Rejected), false), (None, false)]
        {
            match decide(&m, v, gpu) {
                Decision::Fallback { reason } => assert!(reason.contains("default measured 1.200x"), "{reason}"),
                d => panic!("{d:?}"),
            }
        }
    }

    #[test]
    fn a_fallback_says_why() {
        let m = DispatchMeasurement { winner: "max-autotune".into(), fallback: true, ..measured("default", false) };
        match decide(&m, None, true) {
            Decision::Fallback { reason } => {
                assert!(reason.contains("no mode beat max-autotune beyond the noise floor 1.010"), "{reason}");
                assert!(
                    reason.contains("best: default 1.200x") && reason.contains("reduce-overhead: RuntimeError: boom"),
                    "{reason}"
                );
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn a_rewrite_winner_is_the_rewrite_agents_and_no_rule_fired_is_said() {
        let mut m = measured("default", false);
        m.winner = "max-autotune~rewrite".into();
        m.modes
            .insert("max-autotune~rewrite".into(), ModeTiming { speedup: 3.0, ci95: [2.5, 3.5], beyond_noise: true });
        m.rewrite = Some(RewriteProposal {
            fired: true,
            rules: vec![RewriteApplication { rule: "diag-matmul".into(), exactness: "exact".into() }],
            why: None,
        });
        match decide(&m, Some(Verified::Accepted), true) {
            Decision::Improved { agent, mode, .. } => {
                assert_eq!((agent, mode.as_str()), (Agent::Rewrite, "max-autotune~rewrite"))
            }
            d => panic!("{d:?}"),
        }
        assert_eq!(m.rewrite.as_ref().unwrap().line(), "rewrite: diag-matmul (exact)");
        // Nothing fired: the agent proposed nothing, and the fallback says so.
        let none = DispatchMeasurement {
            modes: BTreeMap::new(),
            noise_floor: None,
            fallback: true,
            winner: "max-autotune".into(),
            rewrite: Some(RewriteProposal { fired: false, rules: vec![], why: Some("no rule fired".into()) }),
            ..m
        };
        match decide(&none, None, true) {
            Decision::Fallback { reason } => assert!(reason.ends_with("; rewrite: no rule fired"), "{reason}"),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn a_measurement_that_names_an_untimed_winner_is_refused() {
        let bad = r#"{"baseline": "default", "winner": "eager", "fallback": false, "modes": {}}"#;
        assert!(
            matches!(DispatchMeasurement::parse(bad), Err(OptimizeError::Measurement(w)) if w.contains("not timed"))
        );
        assert!(matches!(DispatchMeasurement::parse("{"), Err(OptimizeError::Measurement(_))));
    }

    #[test]
    fn the_beams_second_round_decides_when_it_ran_and_the_table_shows_it() {
        let first = measured("default", false);
        let mut second = measured("default", false);
        second.modes.insert(
            "max-autotune+freezing+coordinate-descent".into(),
            ModeTiming { speedup: 1.4, ci95: [1.35, 1.45], beyond_noise: true },
        );
        second.winner = "max-autotune+freezing+coordinate-descent".into();
        let question = Question {
            problem: "p.py".into(),
            size: "default".into(),
            device: "0".into(),
            baseline: Baseline::MaxAutotune,
            agents: vec![Agent::Dispatch, Agent::Inductor],
            rounds: 5,
            beam_width: 2,
        };
        let mut r = Report {
            question,
            decision: decide(&second, Some(Verified::Accepted), true),
            measurement: first,
            verified: Some(Verified::Accepted),
            result: "model_new.py".into(),
            policy: "policy.toml".into(),
            beam: Some(BeamOutcome { measurement: Some(second), stopped: None }),
        };
        assert_eq!(r.decisive().winner, "max-autotune+freezing+coordinate-descent");
        assert!(matches!(&r.decision, Decision::Improved { agent: Agent::Inductor, speedup, .. } if *speedup == 1.4));
        let t = r.table();
        assert!(t.contains("beam round 2 (knobs combined, against max-autotune again)"), "{t}");
        assert!(t.contains("max-autotune+freezing+coordinate-descent    1.400x"), "{t}");
        let back: Report = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        r.beam =
            Some(BeamOutcome { measurement: None, stopped: Some("beam: stopped after round 1: 1 knob(s)".into()) });
        assert_eq!(r.decisive().winner, "default", "no second round: the first decides");
        assert!(r.table().contains("beam: stopped after round 1"));
        // A report from before the beam reads back (no beam_width, no beam).
        let mut old = serde_json::to_value(&r).unwrap();
        old.as_object_mut().unwrap().remove("beam_width");
        old.as_object_mut().unwrap().remove("beam");
        let back: Report = serde_json::from_value(old).unwrap();
        assert_eq!((back.question.beam_width, back.beam), (0, None));
    }

    #[test]
    fn the_table_lists_every_mode_and_the_decision() {
        let m = measured("default", false);
        let question = Question {
            problem: "p.py".into(),
            size: "default".into(),
            device: "0".into(),
            baseline: Baseline::MaxAutotune,
            agents: vec![Agent::Dispatch],
            rounds: 5,
            beam_width: 0,
        };
        let r = Report {
            question: question.clone(),
            decision: decide(&m, Some(Verified::Accepted), true),
            measurement: m,
            verified: Some(Verified::Accepted),
            result: "out/model_new.py".into(),
            policy: "out/policy.toml".into(),
            beam: None,
        };
        // The report reads back as written, its question flattened into it (--resume reads it).
        let back: Report = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert_eq!(serde_json::to_value(&r).unwrap()["problem"], "p.py");
        assert_ne!(back.question, Question { rounds: 3, ..question });
        let t = r.table();
        for want in [
            "max-autotune",
            "baseline",
            "1.200x",
            "beyond noise",
            "within noise",
            "left out: RuntimeError: boom",
            "result: default (dispatch), 1.200x, verified",
        ] {
            assert!(t.contains(want), "{want} in\n{t}");
        }
    }

    fn outcome(problem: &str, level: &str, decision: Option<Decision>) -> ProblemOutcome {
        ProblemOutcome {
            problem: problem.into(),
            level: level.into(),
            decision,
            error: None,
            not_reached: None,
            seconds: 2.0,
            gpu_seconds: 1.5,
            resumed: false,
        }
    }

    #[test]
    fn a_campaign_counts_fallbacks_and_failures_as_the_baseline() {
        let won = |s: f64| {
            Some(Decision::Improved { agent: Agent::Dispatch, mode: "default".into(), speedup: s, ci95: [s, s] })
        };
        let kept = || Some(Decision::Fallback { reason: "nothing won".into() });
        let outcomes = vec![
            outcome("level1/a.py", "level1", won(4.0)),
            outcome("level1/b.py", "level1", kept()),
            outcome("level2/c.py", "level2", won(1.5)),
            ProblemOutcome {
                error: Some("the dispatch step ended with Some(1)".into()),
                ..outcome("level2/d.py", "level2", None)
            },
            ProblemOutcome { not_reached: Some("budget".into()), ..outcome("level2/e.py", "level2", None) },
        ];
        let s = summarize(&outcomes);
        assert_eq!(s.iter().map(|l| l.level.as_str()).collect::<Vec<_>>(), ["level1", "level2", "all"]);
        assert_eq!((s[0].problems, s[0].optimized, s[0].fallbacks, s[0].failed), (2, 1, 1, 0));
        assert!((s[0].geomean - 2.0).abs() < 1e-9, "sqrt(4 x 1)");
        // Not reached is neither a failure nor a fallback; it counts as the baseline.
        assert_eq!((s[1].optimized, s[1].fallbacks, s[1].failed, s[1].not_reached), (1, 0, 1, 1));
        assert!((s[1].geomean - 1.5f64.cbrt()).abs() < 1e-9);
        assert!((s[2].geomean - (4.0f64 * 1.5).powf(0.2)).abs() < 1e-9 && (s[2].fast_1 - 0.4).abs() < 1e-9);
        assert_eq!((s[2].seconds, s[2].gpu_seconds), (10.0, 7.5));
        let t = campaign_table(&outcomes, &s);
        for want in [
            "level1/a.py",
            "default (dispatch)",
            "baseline kept",
            "failed: the dispatch step ended",
            "not reached: budget",
            "GEOMEAN",
            "GPU-S",
            "all",
        ] {
            assert!(t.contains(want), "{want} in\n{t}");
        }
        // One level: no separate `all` row.
        assert_eq!(summarize(&outcomes[..2]).len(), 1);
    }
}
