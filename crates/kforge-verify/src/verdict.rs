//! The verdict of `kforge verify`: gate 1's static findings and the runner's runtime checks
//! (the JSON `python3 -m kforge.verify_runner` writes) composed in cascade order.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Finding;

/// Gates in cascade order; a candidate is rejected by the first failing check.
pub const GATES: [&str; 6] = ["static", "dry-run", "correctness", "model", "exploits", "performance"];

/// One runtime check as the runner reports it. `ok: None` means "does not apply here".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    pub gate: String,
    pub name: String,
    pub ok: Option<bool>,
    #[serde(default)]
    pub evidence: Value,
}

/// What the runner wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunnerResult {
    pub checks: Vec<CheckResult>,
    #[serde(default)]
    pub device: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Every gate ran and passed, performance included.
    Accepted,
    /// Every gate that ran passed; the performance gate did not run (no GPU, or not asked).
    PassedWithoutPerformance,
    Rejected,
    /// The candidate could not be evaluated (runner failure, time or memory limit).
    CouldNotRun,
}

impl Outcome {
    /// `kforge verify`'s exit status: 0 accepted (or passed without the performance gate),
    /// 1 rejected, 2 could not run.
    pub fn exit_code(self) -> i32 {
        match self {
            Outcome::Accepted | Outcome::PassedWithoutPerformance => 0,
            Outcome::Rejected => 1,
            Outcome::CouldNotRun => 2,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateReport {
    pub gate: String,
    /// `passed`, `failed`, `not-applicable` or `not-run`.
    pub status: String,
    pub checks: Vec<CheckResult>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub problem: String,
    pub candidate: String,
    pub outcome: Outcome,
    /// `gate:check` of the first failing check.
    pub rejected_by: Option<String>,
    /// Why it could not run, when it could not.
    pub error: Option<String>,
    pub gates: Vec<GateReport>,
    /// Limits the candidate process ran under and whether each was enforced.
    pub limits: Value,
}

fn finding_check(f: &Finding) -> CheckResult {
    let rule = serde_json::to_value(f.rule).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
    CheckResult { gate: "static".into(), name: rule, ok: Some(false), evidence: serde_json::json!({"line": f.line, "col": f.col, "message": f.message}) }
}

/// Compose the verdict. `runner` is `None` when the candidate never ran (static rejection or a
/// runner failure given in `error`).
pub fn compose(problem: &str, candidate: &str, findings: &[Finding], runner: Option<&RunnerResult>, error: Option<String>, limits: Value) -> Verdict {
    let mut gates = Vec::new();
    let static_checks: Vec<CheckResult> = findings.iter().map(finding_check).collect();
    gates.push(GateReport { gate: "static".into(), status: if static_checks.is_empty() { "passed" } else { "failed" }.into(), checks: static_checks });
    for g in &GATES[1..] {
        let checks: Vec<CheckResult> = runner.map(|r| r.checks.iter().filter(|c| c.gate == *g).cloned().collect()).unwrap_or_default();
        let status = if checks.is_empty() {
            "not-run"
        } else if checks.iter().any(|c| c.ok == Some(false)) {
            "failed"
        } else if checks.iter().all(|c| c.ok.is_none()) {
            "not-applicable"
        } else {
            "passed"
        };
        gates.push(GateReport { gate: g.to_string(), status: status.into(), checks });
    }
    let rejected_by = gates.iter().find_map(|g| g.checks.iter().find(|c| c.ok == Some(false)).map(|c| format!("{}:{}", g.gate, c.name)));
    let outcome = if rejected_by.is_some() {
        Outcome::Rejected
    } else if error.is_some() || runner.is_none() {
        Outcome::CouldNotRun
    } else if gates.iter().find(|g| g.gate == "performance").is_some_and(|g| g.status == "passed") {
        Outcome::Accepted
    } else {
        Outcome::PassedWithoutPerformance
    };
    Verdict { problem: problem.into(), candidate: candidate.into(), outcome, rejected_by, error, gates, limits }
}

/// The table `kforge verify` prints last.
pub fn table(v: &Verdict) -> String {
    let mut s = format!("{} vs {}\n", v.candidate, v.problem);
    s.push_str(&format!("{:<12} {:<15} {}\n", "GATE", "STATUS", "FIRST FAILURE / CHECKS"));
    for g in &v.gates {
        let detail = match g.checks.iter().find(|c| c.ok == Some(false)) {
            Some(c) => format!("{}: {}", c.name, brief(&c.evidence)),
            None => format!("{} checks", g.checks.len()),
        };
        s.push_str(&format!("{:<12} {:<15} {}\n", g.gate, g.status, detail));
    }
    let outcome = serde_json::to_value(v.outcome).ok().and_then(|x| x.as_str().map(String::from)).unwrap_or_default();
    match (&v.rejected_by, &v.error) {
        (Some(r), _) => s.push_str(&format!("verdict: {outcome} by {r}\n")),
        (None, Some(e)) => s.push_str(&format!("verdict: {outcome}: {e}\n")),
        _ => s.push_str(&format!("verdict: {outcome}\n")),
    }
    s
}

fn brief(e: &Value) -> String {
    for k in ["message", "why", "note", "error"] {
        if let Some(t) = e.get(k).and_then(Value::as_str) {
            if !t.is_empty() {
                let line = e.get("line").and_then(Value::as_u64).map(|l| format!("line {l}: ")).unwrap_or_default();
                return format!("{line}{t}");
            }
        }
    }
    let t = e.to_string();
    if t.chars().count() > 100 {
        t.chars().take(99).collect::<String>() + "…"
    } else {
        t
    }
}
