//! The LLM family in a report: what the LLM agents' search (`kforge_agents::search`, run by the
//! binary's llm step) wrote and how each candidate was judged, what the calls cost, and the
//! family's decision. Only the harness declares a candidate correct or faster: an LLM candidate
//! improves the problem only when `kforge verify` accepted it with gate 4's timing (a GPU); on
//! the CPU a candidate that passed every other gate is correct but not timed, and the baseline
//! stays.

use crate::{Agent, Decision};
use serde::{Deserialize, Serialize};

/// The llm step's outputs below the problem's folder: the family's report (`LlmReport`; every
/// candidate and judgement is in `llm/outcome.json` beside it), and the best candidate's result
/// file and the family's verify policy.
pub const LLM_OUTPUTS: [&str; 3] = ["llm/search.json", "llm/model_new.py", "llm/policy.toml"];

/// A variant name of the LLM family: `llm:` and the candidate's id.
pub fn variant(candidate: &str) -> String {
    format!("llm:{candidate}")
}

/// One judged candidate, as the report lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmCandidate {
    pub id: String,
    pub strategy: String,
    /// `accepted`, `passed-without-performance`, `rejected`, `could-not-run`.
    pub verdict: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<String>,
    /// Rejected by an exploit check (a cheat caught).
    #[serde(default)]
    pub exploit: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci95: Option<[f64; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate_of: Option<String>,
    /// Its source file.
    pub source: String,
}

/// What the calls cost and how the model behaved.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmUsage {
    pub calls: u64,
    /// Answered from the replay cache (no tokens).
    pub replayed: u64,
    /// HTTP attempts beyond the first (429, 5xx, timeouts).
    pub retries: u64,
    pub tokens: u64,
    pub usd: f64,
    /// Replies that could not be used (bad tool-call arguments, no tool call, empty), fed back.
    pub malformed: u64,
    /// Executor attempts after the first, with the compiler's or verifier's error fed back.
    pub executor_retries: u64,
    pub duplicates: u64,
    pub meltdowns: u64,
}

/// The LLM family of a report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmReport {
    /// The endpoint and model (never the key).
    pub endpoint: String,
    pub model: String,
    /// The run whose recorded answers this search replayed (`--replay RUN`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed_from: Option<i64>,
    pub iterations: u32,
    /// Why the search stopped (iterations, no improvement, budget, provider failed).
    pub stop: String,
    /// The provider's failure that stopped the agent, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub candidates: Vec<LlmCandidate>,
    /// The best accepted candidate (its id), when any was accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<String>,
    pub usage: LlmUsage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// The best candidate's result file (`llm/model_new.py`; copied to the result when it wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
}

impl LlmReport {
    /// Whether a budget or the provider stopped the search before its own stop rules did (a
    /// resumed run continues it rather than taking this report).
    pub fn cut_short(&self) -> bool {
        self.error.is_some() || self.stop.starts_with("budget")
    }

    /// The family's decision on its own: the best candidate that `kforge verify` accepted with
    /// its timing; else why none counts.
    pub fn decide(&self, gpu: bool) -> Decision {
        let best = self.best.as_ref().and_then(|b| self.candidates.iter().find(|c| &c.id == b));
        if let Some(c) = best.filter(|c| c.verdict == "accepted") {
            if let Some(speedup) = c.speedup {
                let ci95 = c.ci95.unwrap_or([speedup, speedup]);
                return Decision::Improved { agent: Agent::Llm, mode: variant(&c.id), speedup, ci95 };
            }
        }
        Decision::Fallback { reason: self.why_none(gpu) }
    }

    fn why_none(&self, gpu: bool) -> String {
        let count = |v: &str| self.candidates.iter().filter(|c| c.verdict == v && c.duplicate_of.is_none()).count();
        let (passed, rejected, failed) =
            (count("passed-without-performance"), count("rejected"), count("could-not-run"));
        let cheats = self.candidates.iter().filter(|c| c.exploit && c.duplicate_of.is_none()).count();
        let mut why = format!(
            "llm: no candidate accepted faster ({} judged: {passed} correct, {rejected} rejected ({cheats} by exploit checks), {failed} could not run; stopped: {})",
            passed + rejected + failed + count("accepted"),
            self.stop
        );
        if !gpu && passed > 0 {
            why.push_str("; on the cpu a correct candidate is not timed");
        }
        if let Some(e) = &self.error {
            why.push_str(&format!("; {e}"));
        }
        why
    }

    /// The table's llm section: one line per candidate, then the cost.
    pub fn lines(&self) -> String {
        let mut t = format!(
            "llm: {} on {}, {} iteration(s), stopped: {}\n",
            self.model, self.endpoint, self.iterations, self.stop
        );
        for c in &self.candidates {
            let speed = c.speedup.map(|s| format!("{s:.3}x")).unwrap_or_else(|| "-".into());
            let why = match (&c.duplicate_of, &c.gate) {
                (Some(d), _) => format!("duplicate of {d}"),
                (None, Some(g)) => format!("{g}{}", if c.exploit { " (exploit)" } else { "" }),
                (None, None) => String::new(),
            };
            t.push_str(&format!("  {:<14} {:<22} {:<27} {speed:>8}  {why}\n", c.id, c.strategy, c.verdict));
        }
        let u = &self.usage;
        t.push_str(&format!(
            "llm: {} calls ({} replayed, {} retried), {} tokens, ${:.4}; {} malformed, {} executor retries, {} duplicates, {} meltdowns\n",
            u.calls, u.replayed, u.retries, u.tokens, u.usd, u.malformed, u.executor_retries, u.duplicates, u.meltdowns
        ));
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(id: &str, verdict: &str, speedup: Option<f64>) -> LlmCandidate {
        LlmCandidate {
            id: id.into(),
            strategy: "block-size".into(),
            verdict: verdict.into(),
            gate: None,
            exploit: false,
            speedup,
            ci95: speedup.map(|s| [s * 0.9, s * 1.1]),
            duplicate_of: None,
            source: format!("llm/candidates/{id}.py"),
        }
    }

    #[test]
    fn only_an_accepted_timed_candidate_improves_the_problem() {
        let mut r = LlmReport {
            candidates: vec![
                candidate("i1-c0-p0-a0", "accepted", Some(1.4)),
                candidate("i1-c0-p1-a0", "rejected", None),
            ],
            best: Some("i1-c0-p0-a0".into()),
            stop: "iterations".into(),
            ..LlmReport::default()
        };
        assert_eq!(
            r.decide(true),
            Decision::Improved {
                agent: Agent::Llm,
                mode: "llm:i1-c0-p0-a0".into(),
                speedup: 1.4,
                ci95: [1.4 * 0.9, 1.4 * 1.1]
            }
        );
        r.candidates[0] = candidate("i1-c0-p0-a0", "passed-without-performance", None);
        let Decision::Fallback { reason } = r.decide(false) else { panic!("untimed: no improvement") };
        assert!(reason.contains("1 correct, 1 rejected") && reason.contains("not timed"), "{reason}");
        r.best = None;
        r.candidates[1].exploit = true;
        r.candidates[1].gate = Some("exploits:cache-pointer".into());
        r.error = Some("http://x/v1: HTTP 401: bad key".into());
        let Decision::Fallback { reason } = r.decide(true) else { panic!("no best") };
        assert!(reason.contains("(1 by exploit checks)") && reason.ends_with("HTTP 401: bad key"), "{reason}");
        assert!(r.lines().contains("(exploit)"), "{}", r.lines());
    }
}
