//! The verdict of `kforge verify`: gate 1's static findings and the runner's runtime checks
//! (the JSON `python3 -m kforge.verify.runner` writes) composed in cascade order.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Finding, Policy, TorchPolicy, VendorCall};

/// Gates in cascade order; a candidate is rejected by the first failing check. `dispatch` is
/// the run-time record of the aten ops the candidate's forward dispatched in all the runs before
/// it, checked against the policy (`python/kforge/verify/dispatch.py`): a wrong candidate is
/// named by the check it fails first, torch compute by `dispatch:torch-compute` once every
/// other check passed.
pub const GATES: [&str; 7] = ["static", "dry-run", "correctness", "model", "exploits", "dispatch", "performance"];

/// Gates that must report passing checks for a candidate to pass at all.
pub const MANDATORY: [&str; 4] = ["dry-run", "correctness", "model", "exploits"];

/// Gates that must be reported (passing, or not applicable: a replacement kernel's dispatch
/// record) for a candidate to pass at all.
pub const REPORTED: [&str; 1] = ["dispatch"];

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
    /// The policy's torch rule (`dispatch-aware`, `strict-no-torch`).
    #[serde(default)]
    pub torch_policy: TorchPolicy,
    /// The vendor-library calls of the reference the candidate was allowed to keep (empty under
    /// `strict-no-torch`); what it dispatched of them is in the `dispatch` gate's evidence.
    #[serde(default)]
    pub allowed_vendor_calls: Vec<VendorCall>,
}

impl Verdict {
    /// The verdict with the policy's torch rule and allowed vendor calls recorded.
    pub fn with_policy(mut self, policy: &Policy) -> Verdict {
        self.torch_policy = policy.torch_policy;
        self.allowed_vendor_calls = match policy.torch_policy {
            TorchPolicy::DispatchAware => policy.reference_vendor_calls.clone(),
            TorchPolicy::StrictNoTorch => Vec::new(),
        };
        self
    }
}

fn finding_check(f: &Finding) -> CheckResult {
    let rule = serde_json::to_value(f.rule).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
    CheckResult {
        gate: "static".into(),
        name: rule,
        ok: Some(false),
        evidence: serde_json::json!({"line": f.line, "col": f.col, "message": f.message}),
    }
}

/// Compose the verdict. `runner` is `None` when the candidate never ran (static rejection or a
/// runner failure given in `error`).
pub fn compose(
    problem: &str,
    candidate: &str,
    findings: &[Finding],
    runner: Option<&RunnerResult>,
    error: Option<String>,
    limits: Value,
) -> Verdict {
    let mut gates = Vec::new();
    let static_checks: Vec<CheckResult> = findings.iter().map(finding_check).collect();
    gates.push(GateReport {
        gate: "static".into(),
        status: if static_checks.is_empty() { "passed" } else { "failed" }.into(),
        checks: static_checks,
    });
    for g in &GATES[1..] {
        let checks: Vec<CheckResult> =
            runner.map(|r| r.checks.iter().filter(|c| c.gate == *g).cloned().collect()).unwrap_or_default();
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
    let rejected_by = gates
        .iter()
        .find_map(|g| g.checks.iter().find(|c| c.ok == Some(false)).map(|c| format!("{}:{}", g.gate, c.name)));
    // Fail closed: a candidate passes only if every mandatory gate reported passing checks. A
    // result without them (a runner cut short, or a result file written by someone else) cannot
    // accept anything.
    let missing: Vec<&str> = if runner.is_some() && rejected_by.is_none() {
        let status = |m: &str| gates.iter().find(|g| g.gate == m).map(|g| g.status.as_str()).unwrap_or("not-run");
        MANDATORY
            .iter()
            .copied()
            .filter(|m| status(m) != "passed")
            .chain(REPORTED.iter().copied().filter(|m| !matches!(status(m), "passed" | "not-applicable")))
            .collect()
    } else {
        Vec::new()
    };
    let error = match (error, missing.is_empty()) {
        (Some(e), _) => Some(e),
        (None, false) => Some(format!("the runner reported no passing {} checks", missing.join(", "))),
        (None, true) => None,
    };
    let outcome = if rejected_by.is_some() {
        Outcome::Rejected
    } else if error.is_some() || runner.is_none() {
        Outcome::CouldNotRun
    } else if gates.iter().find(|g| g.gate == "performance").is_some_and(|g| g.status == "passed") {
        Outcome::Accepted
    } else {
        Outcome::PassedWithoutPerformance
    };
    Verdict {
        problem: problem.into(),
        candidate: candidate.into(),
        outcome,
        rejected_by,
        error,
        gates,
        limits,
        torch_policy: TorchPolicy::default(),
        allowed_vendor_calls: Vec::new(),
    }
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
    if !v.allowed_vendor_calls.is_empty() {
        let calls: Vec<String> = v
            .allowed_vendor_calls
            .iter()
            .map(|c| {
                let f =
                    serde_json::to_value(c.family).ok().and_then(|x| x.as_str().map(String::from)).unwrap_or_default();
                format!("{} ({f}, reference line {})", c.call, c.line)
            })
            .collect();
        s.push_str(&format!("vendor calls allowed (dispatch-aware): {}\n", calls.join(", ")));
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(gate: &str, name: &str, ok: Option<bool>) -> CheckResult {
        CheckResult { gate: gate.into(), name: name.into(), ok, evidence: json!({"why": "x"}) }
    }

    #[test]
    fn cascade_order_and_outcomes() {
        let all_ok = RunnerResult {
            checks: vec![
                check("dry-run", "runs", Some(true)),
                check("correctness", "seed-0", Some(true)),
                check("model", "eager", Some(true)),
                check("exploits", "determinism", Some(true)),
                check("dispatch", "torch-compute", Some(true)),
                check("performance", "speedup", None),
            ],
            device: Some("cpu".into()),
        };
        let v = compose("p", "c", &[], Some(&all_ok), None, json!({}));
        assert_eq!((v.outcome, v.rejected_by.as_deref()), (Outcome::PassedWithoutPerformance, None));
        assert_eq!(v.outcome.exit_code(), 0);
        let status: Vec<&str> = v.gates.iter().map(|g| g.status.as_str()).collect();
        assert_eq!(status, ["passed", "passed", "passed", "passed", "passed", "passed", "not-applicable"]);

        let mut perf = all_ok.clone();
        perf.checks[5].ok = Some(true);
        assert_eq!(compose("p", "c", &[], Some(&perf), None, json!({})).outcome, Outcome::Accepted);

        // The first failing check in gate order names the rejection, whatever the list order.
        let failing = RunnerResult {
            checks: vec![check("exploits", "ghost-replay", Some(false)), check("correctness", "seed-1", Some(false))],
            device: None,
        };
        let v = compose("p", "c", &[], Some(&failing), None, json!({}));
        assert_eq!((v.outcome, v.rejected_by.as_deref()), (Outcome::Rejected, Some("correctness:seed-1")));
        assert_eq!(v.outcome.exit_code(), 1);
        assert!(table(&v).contains("verdict: rejected by correctness:seed-1"));

        // Static findings reject before anything ran; a runner failure is "could not run".
        let f = crate::Finding { rule: crate::Rule::SideStream, line: 4, col: 9, message: "m".into() };
        let v = compose("p", "c", &[f], None, None, json!({}));
        assert_eq!(v.rejected_by.as_deref(), Some("static:side-stream"));
        assert!(table(&v).contains("line 4: m"));
        let v = compose("p", "c", &[], None, Some("time limit".into()), json!({}));
        assert_eq!((v.outcome, v.outcome.exit_code()), (Outcome::CouldNotRun, 2));
        // Fail closed: a result with only a passing performance check (or nothing) accepts nothing.
        let forged = RunnerResult { checks: vec![check("performance", "speedup", Some(true))], device: None };
        let v = compose("p", "c", &[], Some(&forged), None, json!({}));
        assert_eq!(v.outcome, Outcome::CouldNotRun);
        assert!(v.error.as_deref().unwrap().contains("dry-run, correctness, model, exploits"));
        let empty = RunnerResult { checks: vec![], device: None };
        assert_eq!(compose("p", "c", &[], Some(&empty), None, json!({})).outcome, Outcome::CouldNotRun);
    }

    #[test]
    fn the_dispatch_record_must_be_reported_and_rejects_in_cascade_order() {
        let with = |dispatch: Option<CheckResult>| RunnerResult {
            checks: [
                Some(check("dry-run", "runs", Some(true))),
                Some(check("correctness", "seed-0", Some(false))),
                Some(check("model", "eager", Some(true))),
                Some(check("exploits", "determinism", Some(true))),
                dispatch,
            ]
            .into_iter()
            .flatten()
            .collect(),
            device: None,
        };
        // A wrong candidate is named by its correctness failure; torch compute alone by the record.
        let mut computes = with(Some(check("dispatch", "torch-compute", Some(false))));
        let v = compose("p", "c", &[], Some(&computes), None, json!({}));
        assert_eq!(v.rejected_by.as_deref(), Some("correctness:seed-0"));
        computes.checks[1].ok = Some(true);
        let v = compose("p", "c", &[], Some(&computes), None, json!({}));
        assert_eq!((v.outcome, v.rejected_by.as_deref()), (Outcome::Rejected, Some("dispatch:torch-compute")));
        // A result without the dispatch record cannot accept (fail closed) ...
        let mut ok = with(None);
        ok.checks[1].ok = Some(true);
        let v = compose("p", "c", &[], Some(&ok), None, json!({}));
        assert_eq!(v.outcome, Outcome::CouldNotRun);
        assert!(v.error.as_deref().unwrap().contains("dispatch"), "{:?}", v.error);
        // ... one where it does not apply (a replacement kernel) can.
        let mut na = with(Some(check("dispatch", "torch-compute", None)));
        na.checks[1].ok = Some(true);
        assert_eq!(compose("p", "c", &[], Some(&na), None, json!({})).outcome, Outcome::PassedWithoutPerformance);
    }

    #[test]
    fn the_verdict_records_the_allowed_vendor_calls() {
        let problem = "import torch.nn as nn\nclass Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.linear = nn.Linear(4, 4)\n    def forward(self, x):\n        return self.linear(x).relu()\n";
        let aware = Policy::default().for_problem(problem);
        let v = compose("p", "c", &[], None, None, json!({})).with_policy(&aware);
        assert_eq!(v.torch_policy, TorchPolicy::DispatchAware);
        assert_eq!(v.allowed_vendor_calls.len(), 1);
        assert_eq!(v.allowed_vendor_calls[0].call, "torch.nn.Linear");
        let j = serde_json::to_value(&v).unwrap();
        assert_eq!(j["allowed_vendor_calls"][0]["family"], "gemm");
        assert!(table(&v).contains("vendor calls allowed (dispatch-aware): torch.nn.Linear (gemm, reference line 5)"));
        let strict = Policy::preset("strict-no-torch").unwrap().for_problem(problem);
        let v = compose("p", "c", &[], None, None, json!({})).with_policy(&strict);
        assert_eq!((v.torch_policy, v.allowed_vendor_calls.len()), (TorchPolicy::StrictNoTorch, 0));
    }
}
