//! `kforge optimize`'s decisions, without processes: which agents run, what the dispatch agent
//! measured (`python3 -m kforge.optimize.dispatch`'s JSON, read here), and what the run ends
//! with — a winner that measured beyond noise and that `kforge verify` then accepted, or the
//! baseline kept (the fallback) with the reason. The binary runs the agent, writes the result
//! file and verifies it; this crate says what that means.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// An agent: what proposes candidates. Closed: a name outside it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Agent {
    /// Eager or a torch.compile mode per problem, by measurement.
    Dispatch,
}

impl Agent {
    pub const ALL: [(&'static str, Agent); 1] = [("dispatch", Agent::Dispatch)];

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
            agent: Agent::Dispatch,
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
    why
}

/// The run's report: what was asked, measured, judged and decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub problem: String,
    pub size: String,
    pub device: String,
    pub baseline: Baseline,
    pub agents: Vec<Agent>,
    pub measurement: DispatchMeasurement,
    /// The winner's verification (`None` when nothing won).
    pub verified: Option<Verified>,
    pub decision: Decision,
    /// The result file and its verify policy.
    pub result: String,
    pub policy: String,
}

impl Report {
    /// A table for people: every mode's timing, then the decision.
    pub fn table(&self) -> String {
        let mut t =
            format!("{} (size {}, device {}) against {}\n", self.problem, self.size, self.device, self.baseline.mode());
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
        assert_eq!(parse_agents("dispatch,llm"), Err(OptimizeError::UnknownAgent("llm".into())));
        assert_eq!(parse_agents(" , "), Err(OptimizeError::NoAgent));
        assert!(OptimizeError::UnknownAgent("x".into()).to_string().contains("known: dispatch"));
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
    fn a_measurement_that_names_an_untimed_winner_is_refused() {
        let bad = r#"{"baseline": "default", "winner": "eager", "fallback": false, "modes": {}}"#;
        assert!(
            matches!(DispatchMeasurement::parse(bad), Err(OptimizeError::Measurement(w)) if w.contains("not timed"))
        );
        assert!(matches!(DispatchMeasurement::parse("{"), Err(OptimizeError::Measurement(_))));
    }

    #[test]
    fn the_table_lists_every_mode_and_the_decision() {
        let m = measured("default", false);
        let r = Report {
            problem: "p.py".into(),
            size: "default".into(),
            device: "0".into(),
            baseline: Baseline::MaxAutotune,
            agents: vec![Agent::Dispatch],
            decision: decide(&m, Some(Verified::Accepted), true),
            measurement: m,
            verified: Some(Verified::Accepted),
            result: "out/model_new.py".into(),
            policy: "out/policy.toml".into(),
        };
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
}
