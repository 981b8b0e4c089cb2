//! The verdict of `kforge verify`: gate 1's static findings and the runner's runtime checks
//! (the JSON `python3 -m kforge.verify.runner` writes) composed in cascade order.
//!
//! When the candidate process ends without a result, [`classify`] is the one place that decides
//! whose failure it was, from how it ended ([`Ending`]), its stderr and its progress file
//! ([`Progress`]): the candidate's own (a rejection by `STAGE:crash`, `STAGE:timeout`,
//! `STAGE:memory-limit`, with the cause) or the environment's (`could-not-run`, with the fix).

use std::collections::BTreeMap;

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
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RunnerResult {
    pub checks: Vec<CheckResult>,
    #[serde(default)]
    pub device: Option<String>,
    /// What the runner wants said about how it ran (e.g. Triton's interpreter on the CPU).
    #[serde(default)]
    pub notes: Vec<String>,
    /// Seconds per phase of the runner (`setup`, `checks`, `baseline-compile`, `timing`, …).
    #[serde(default)]
    pub phase_seconds: BTreeMap<String, f64>,
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
    /// Why the candidate process ended without a result, when it did: whose failure, the stage
    /// and check running, exit status or signal, the limit, the last traceback lines, the fix.
    pub cause: Option<Cause>,
    /// How it ran (the runner's notes, and the orchestrator's).
    pub notes: Vec<String>,
    /// The policy's torch rule (`dispatch-aware`, `strict-no-torch`).
    #[serde(default)]
    pub torch_policy: TorchPolicy,
    /// The vendor-library calls of the reference the candidate was allowed to keep (empty under
    /// `strict-no-torch`); what it dispatched of them is in the `dispatch` gate's evidence.
    #[serde(default)]
    pub allowed_vendor_calls: Vec<VendorCall>,
    /// The problem's size preset the candidate ran at (`default`, `large`: `kforge verify --size`).
    #[serde(default = "default_size")]
    pub size: String,
    /// Where the time went: the runner's phases (`setup`: torch, the problem, the identities;
    /// `checks`: gates 2–3 and the exploit checks; gate 4's `baseline-compile`, `timing`,
    /// `revalidation-after-timing`, `plausibility`) and the orchestrator's `total`.
    #[serde(default)]
    pub phase_seconds: BTreeMap<String, f64>,
}

fn default_size() -> String {
    "default".into()
}

impl Verdict {
    /// Gate 4's measured speedup of the candidate over the reference (`performance:speedup`'s
    /// evidence: the interleaved rounds in the candidate's own process against a fresh baseline);
    /// `None` where gate 4 did not measure one.
    pub fn speedup(&self) -> Option<f64> {
        let checks = self.gates.iter().flat_map(|g| &g.checks);
        let c = checks.into_iter().find(|c| c.gate == "performance" && c.name == "speedup")?;
        c.evidence.get("speedup")?.as_f64().filter(|x| x.is_finite() && *x > 0.0)
    }

    /// The verdict with the policy's torch rule and allowed vendor calls recorded.
    pub fn with_policy(mut self, policy: &Policy) -> Verdict {
        self.torch_policy = policy.torch_policy;
        self.allowed_vendor_calls = match policy.torch_policy {
            TorchPolicy::DispatchAware | TorchPolicy::ReferenceOps => policy.reference_vendor_calls.clone(),
            TorchPolicy::StrictNoTorch => Vec::new(),
        };
        self
    }
}

/// Whose failure a cause is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Side {
    /// The candidate's own: a rejection (a search counts it as a failed candidate).
    Candidate,
    /// The environment's (no driver, torch missing, a sibling's memory, the daemon, the harness):
    /// could not run, and the fix is named.
    Environment,
}

/// Why the candidate process ended without a result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cause {
    pub side: Side,
    /// `crash`, `timeout`, `memory-limit`, `syntax` (the candidate's); `environment`, `harness`,
    /// `killed`, `no-result` (the environment's); on the candidate's side it is the rejecting
    /// check's name.
    pub kind: String,
    /// The gate running when it ended (`setup` before the candidate was imported).
    pub stage: Option<String>,
    /// The check running when it ended.
    pub check: Option<String>,
    pub exit_status: Option<i32>,
    /// The signal that ended it, e.g. `SIGSEGV (11)`.
    pub signal: Option<String>,
    /// The limit it ran past, e.g. `time limit of 20 s`.
    pub limit: Option<String>,
    /// The last lines of the Python traceback, if there was one.
    pub traceback: Vec<String>,
    pub message: String,
    /// What to do about an environment failure.
    pub fix: Option<String>,
}

impl Cause {
    /// An environment failure with no process details (bad input found before a run, a lost result).
    pub fn environment(kind: &str, message: impl Into<String>, fix: Option<String>) -> Cause {
        Cause {
            side: Side::Environment,
            kind: kind.into(),
            stage: None,
            check: None,
            exit_status: None,
            signal: None,
            limit: None,
            traceback: Vec::new(),
            message: message.into(),
            fix,
        }
    }

    fn check_result(&self) -> CheckResult {
        CheckResult {
            gate: self.stage.clone().unwrap_or_else(|| "dry-run".into()),
            name: self.kind.clone(),
            ok: Some(false),
            evidence: serde_json::to_value(self).unwrap_or(Value::Null),
        }
    }
}

/// Which limit the watchdog (or the daemon) ended the process for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    Time,
    Memory,
}

/// How the candidate process ended, when it wrote no result.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    /// It exited with this status (0: without writing its result).
    Exit(i32),
    /// A signal ended it (not the watchdog's).
    Signal(i32),
    /// The watchdog or the daemon ended it for running past a limit (`limit`: e.g. `time limit of 20 s`).
    Limit { kind: LimitKind, limit: String },
    /// The daemon ended the job for another reason (cancelled, shut down, could not start it).
    Daemon(String),
}

/// What the runner's progress file (`--progress`) says: the checks reported, in order, and the
/// check that was running last. Lines that do not parse (a write cut short) are skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    pub checks: Vec<CheckResult>,
    pub running: Option<(String, String)>,
}

impl Progress {
    pub fn parse(text: &str) -> Progress {
        let mut p = Progress::default();
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
            if let Some(c) = v.get("check").and_then(|c| serde_json::from_value::<CheckResult>(c.clone()).ok()) {
                p.running = Some((c.gate.clone(), c.name.clone()));
                p.checks.push(c);
            } else if let Some(r) = v.get("running") {
                let field = |k: &str| r.get(k).and_then(Value::as_str).map(String::from);
                if let (Some(g), Some(n)) = (field("gate"), field("name")) {
                    p.running = Some((g, n));
                }
            }
        }
        p
    }
}

/// The candidate's stages: a failure while one of these runs is the candidate's unless shown otherwise.
fn candidate_stage(stage: Option<&str>) -> bool {
    stage.is_some_and(|s| GATES[1..].contains(&s))
}

fn signal_name(sig: i32) -> String {
    let name = match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => "signal",
    };
    format!("{name} ({sig})")
}

/// The last Python traceback in `stderr`: its frames' files and its last `keep` lines.
fn last_traceback(stderr: &str, keep: usize) -> Option<(Vec<String>, Vec<String>)> {
    let start = stderr.rfind("Traceback (most recent call last):")?;
    let lines: Vec<&str> = stderr[start..].lines().filter(|l| !l.trim().is_empty()).collect();
    // The traceback ends at its exception line: the first unindented line after the header.
    let end = lines.iter().skip(1).position(|l| !l.starts_with(' ')).map(|i| i + 2).unwrap_or(lines.len());
    let tb = &lines[..end];
    let files = tb
        .iter()
        .filter_map(|l| l.trim_start().strip_prefix("File \"").and_then(|r| r.split('"').next()).map(String::from))
        .collect();
    let tail = tb[tb.len().saturating_sub(keep)..].iter().map(|l| l.to_string()).collect();
    Some((files, tail))
}

/// The candidate process's description of the process's end, in this verdict's words.
pub struct Ended<'a> {
    pub ending: Ending,
    /// Everything the process wrote on stderr.
    pub stderr: &'a str,
    pub progress: Progress,
    /// The candidate file as the runner was given it (absolute): traceback frames in it are the
    /// candidate's code.
    pub candidate_file: &'a str,
}

/// Whose failure it was that the candidate process ended without a result, and the checks that
/// passed before it (the progress file's).
///
/// - The runner's own `kforge verify: WHY` line with exit status 2: the environment or bad input
///   (`kforge verify fix:` names the fix).
/// - Past the time or memory limit while a candidate stage ran (`dry-run` … `performance`): the
///   candidate's (`STAGE:timeout`, `STAGE:memory-limit`); during `setup` the environment's.
/// - A Python traceback: the candidate's (`STAGE:crash`) when one of its frames is in the
///   candidate's file, else the harness's or the problem's (could not run: `harness`).
/// - A signal or an exit without a traceback (`os._exit`, `sys.exit`, a native abort, a segfault)
///   while a candidate stage ran: the candidate's (`STAGE:crash`) — except SIGKILL from outside
///   the watchdog (the kernel's OOM killer, an operator: the environment's) and the daemon ending
///   the job for a reason of its own.
pub fn classify(e: &Ended) -> (RunnerResult, Cause) {
    let (stage, check) = match &e.progress.running {
        Some((g, n)) => (Some(g.clone()), Some(n.clone())),
        None => (None, None),
    };
    let running = match (&stage, &check) {
        (Some(g), Some(n)) => format!("while running {g}:{n}"),
        _ => "before the runner reported progress".into(),
    };
    let in_candidate = candidate_stage(stage.as_deref());
    let tb = last_traceback(e.stderr, 8);
    let mut cause = Cause::environment("environment", String::new(), None);
    cause.stage = stage.clone();
    cause.check = check.clone();
    cause.traceback = tb.as_ref().map(|(_, t)| t.clone()).unwrap_or_default();
    let own_line =
        |prefix: &str| e.stderr.lines().rev().find_map(|l| l.strip_prefix(prefix).map(|r| r.trim().to_string()));
    match &e.ending {
        Ending::Exit(2) if own_line("kforge verify: ").is_some() => {
            cause.exit_status = Some(2);
            cause.message = own_line("kforge verify: ").unwrap_or_default();
            cause.fix = own_line("kforge verify fix: ");
        }
        Ending::Limit { kind, limit } => {
            cause.limit = Some(limit.clone());
            cause.kind = match kind {
                LimitKind::Time => "timeout",
                LimitKind::Memory => "memory-limit",
            }
            .into();
            cause.message = format!("ran past the {limit} {running}");
            if in_candidate {
                cause.side = Side::Candidate;
            } else {
                cause.fix = Some(match kind {
                    LimitKind::Time => "raise --time-limit-s: the runner had not reached the candidate yet".into(),
                    LimitKind::Memory => {
                        "raise --memory-limit-gib: the runner had not reached the candidate yet".into()
                    }
                });
            }
        }
        Ending::Daemon(reason) => {
            cause.kind = "killed".into();
            cause.message = format!("the daemon ended the job {running}: {reason}");
            cause.fix = Some("run it again (the daemon's log says why it ended the job)".into());
        }
        ending => process_ended(&mut cause, ending, tb.as_ref(), e.candidate_file, &running, in_candidate),
    }
    if cause.message.is_empty() {
        cause.message = format!("the candidate process ended {running}");
    }
    let result = RunnerResult { checks: e.progress.checks.clone(), ..Default::default() };
    (result, cause)
}

/// The cause of a process that ended by itself or by a signal (not a limit, not the daemon):
/// the candidate's when the traceback has a frame in its file, or it ended with no traceback
/// while the candidate ran; the harness's when the traceback has no such frame; the
/// environment's for a SIGKILL from outside or a runner that ended before the candidate ran.
fn process_ended(
    cause: &mut Cause,
    ending: &Ending,
    tb: Option<&(Vec<String>, Vec<String>)>,
    candidate_file: &str,
    running: &str,
    in_candidate: bool,
) {
    let (status, signal) = match ending {
        Ending::Exit(c) => (Some(*c), None),
        Ending::Signal(s) => (None, Some(*s)),
        _ => (None, None),
    };
    cause.exit_status = status;
    cause.signal = signal.map(signal_name);
    let how = match (status, signal) {
        (_, Some(s)) => format!("was killed by {}", signal_name(s)),
        (Some(0), _) => "exited with status 0 before writing its result".to_string(),
        (Some(c), _) => format!("exited with status {c}"),
        _ => "ended".to_string(),
    };
    match tb {
        Some((files, tail)) => {
            let last = tail.last().cloned().unwrap_or_default();
            if files.iter().any(|f| f == candidate_file) {
                cause.side = Side::Candidate;
                cause.kind = "crash".into();
                cause.message = format!("the candidate's code raised {last} {running} (the process {how})");
                if cause.stage.is_none() {
                    cause.stage = Some("dry-run".into());
                }
            } else {
                cause.kind = "harness".into();
                cause.message = format!("the harness failed {running}: {last} (the process {how})");
                cause.fix = Some(
                    "no frame of the traceback is in the candidate's file: the problem file or kforge \
                         failed (the traceback names the frame)"
                        .into(),
                );
            }
        }
        None if signal == Some(9) => {
            cause.kind = "killed".into();
            cause.message = format!("the process {how} from outside kforge {running}");
            cause.fix = Some("run it again; the kernel's OOM killer sends SIGKILL (dmesg says)".into());
        }
        None if in_candidate => {
            cause.side = Side::Candidate;
            cause.kind = "crash".into();
            cause.message = format!(
                "the process {how}, with no Python traceback, {running}: the candidate ended it (os._exit, \
                     sys.exit, a native crash or abort)"
            );
        }
        None => {
            cause.kind = if status == Some(0) { "no-result" } else { "crash" }.into();
            cause.message = format!("the runner {how} {running}, before the candidate ran");
            cause.fix = Some("the runner's own output above says why".into());
        }
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
/// failure found before a run); with a `cause`, it holds what the progress file reported before
/// the process ended. A candidate-side cause rejects by `STAGE:KIND`; an environment cause makes
/// it `could-not-run` (the checks that passed are kept).
pub fn compose(
    problem: &str,
    candidate: &str,
    findings: &[Finding],
    runner: Option<&RunnerResult>,
    cause: Option<Cause>,
    limits: Value,
) -> Verdict {
    let notes = runner.map(|r| r.notes.clone()).unwrap_or_default();
    let phase_seconds = runner.map(|r| r.phase_seconds.clone()).unwrap_or_default();
    let mut with_cause;
    let runner = match (&cause, runner) {
        (Some(c), r) if c.side == Side::Candidate => {
            with_cause = r.cloned().unwrap_or_default();
            with_cause.checks.push(c.check_result());
            Some(&with_cause)
        }
        (_, r) => r,
    };
    let error = cause.as_ref().filter(|c| c.side == Side::Environment).map(|c| match &c.fix {
        Some(f) => format!("{} (fix: {f})", c.message),
        None => c.message.clone(),
    });
    let mut gates = Vec::new();
    let mut static_checks: Vec<CheckResult> = findings.iter().map(finding_check).collect();
    // A candidate that does not parse is rejected by `static:syntax` (a cause of stage `static`).
    static_checks.extend(runner.iter().flat_map(|r| r.checks.iter().filter(|c| c.gate == "static").cloned()));
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
        cause,
        notes,
        torch_policy: TorchPolicy::default(),
        allowed_vendor_calls: Vec::new(),
        size: default_size(),
        phase_seconds,
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
    if let Some(c) = &v.cause {
        let mut how = Vec::new();
        if let Some(x) = c.exit_status {
            how.push(format!("exit status {x}"));
        }
        how.extend(c.signal.clone());
        how.extend(c.limit.clone());
        if let (Some(g), Some(n)) = (&c.stage, &c.check) {
            how.push(format!("running {g}:{n}"));
        }
        let side = match c.side {
            Side::Candidate => "the candidate's",
            Side::Environment => "the environment's",
        };
        let how = if how.is_empty() { String::new() } else { format!(" [{}]", how.join(", ")) };
        s.push_str(&format!("cause: {side} {}: {}{how}\n", c.kind, c.message));
        for l in &c.traceback {
            s.push_str(&format!("  | {l}\n"));
        }
        if let Some(f) = &c.fix {
            s.push_str(&format!("fix: {f}\n"));
        }
    }
    for n in &v.notes {
        s.push_str(&format!("note: {n}\n"));
    }
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
            phase_seconds: BTreeMap::from([("setup".to_string(), 1.5)]),
            ..Default::default()
        };
        let v = compose("p", "c", &[], Some(&all_ok), None, json!({}));
        assert_eq!((v.outcome, v.rejected_by.as_deref()), (Outcome::PassedWithoutPerformance, None));
        assert_eq!(v.phase_seconds.get("setup"), Some(&1.5), "the runner's phases are kept in the verdict");
        assert_eq!(v.outcome.exit_code(), 0);
        let status: Vec<&str> = v.gates.iter().map(|g| g.status.as_str()).collect();
        assert_eq!(status, ["passed", "passed", "passed", "passed", "passed", "passed", "not-applicable"]);

        let mut perf = all_ok.clone();
        perf.checks[5].ok = Some(true);
        assert_eq!(compose("p", "c", &[], Some(&perf), None, json!({})).outcome, Outcome::Accepted);
        assert_eq!(compose("p", "c", &[], Some(&perf), None, json!({})).speedup(), None, "no speedup in its evidence");
        perf.checks[5].evidence = json!({"speedup": 1.25, "ci95": [1.2, 1.3]});
        assert_eq!(compose("p", "c", &[], Some(&perf), None, json!({})).speedup(), Some(1.25), "gate 4's speedup");

        // The first failing check in gate order names the rejection, whatever the list order.
        let failing = RunnerResult {
            checks: vec![check("exploits", "ghost-replay", Some(false)), check("correctness", "seed-1", Some(false))],
            ..Default::default()
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
        let v = compose("p", "c", &[], None, Some(Cause::environment("environment", "no driver", None)), json!({}));
        assert_eq!((v.outcome, v.outcome.exit_code()), (Outcome::CouldNotRun, 2));
        // Fail closed: a result with only a passing performance check (or nothing) accepts nothing.
        let forged = RunnerResult { checks: vec![check("performance", "speedup", Some(true))], ..Default::default() };
        let v = compose("p", "c", &[], Some(&forged), None, json!({}));
        assert_eq!(v.outcome, Outcome::CouldNotRun);
        assert!(v.error.as_deref().unwrap().contains("dry-run, correctness, model, exploits"));
        let empty = RunnerResult { checks: vec![], ..Default::default() };
        assert_eq!(compose("p", "c", &[], Some(&empty), None, json!({})).outcome, Outcome::CouldNotRun);
    }

    fn ended(ending: Ending, stderr: &str, progress: &str) -> (RunnerResult, Cause) {
        classify(&Ended { ending, stderr, progress: Progress::parse(progress), candidate_file: "/w/cand.py" })
    }

    const PASSED_DRY_RUN: &str = concat!(
        r#"{"running": {"gate": "dry-run", "name": "runs"}}"#,
        "\n",
        r#"{"check": {"gate": "dry-run", "name": "runs", "ok": true, "evidence": {}}}"#,
        "\n",
        r#"{"running": {"gate": "correctness", "name": "seed-0-normal"}}"#,
        "\n",
        r#"{"check": {"gate": "correctness", "name": "cut sh"#,
    );

    #[test]
    fn progress_keeps_checks_and_the_check_running_and_skips_a_cut_line() {
        let p = Progress::parse(PASSED_DRY_RUN);
        assert_eq!(p.checks.len(), 1);
        assert_eq!(p.running, Some(("correctness".into(), "seed-0-normal".into())));
    }

    #[test]
    fn a_timeout_in_a_candidate_stage_rejects_keeping_what_passed() {
        let limit = Ending::Limit { kind: LimitKind::Time, limit: "time limit of 5 s".into() };
        let (r, c) = ended(limit.clone(), "", PASSED_DRY_RUN);
        assert_eq!((c.side, c.kind.as_str(), c.check.as_deref()), (Side::Candidate, "timeout", Some("seed-0-normal")));
        let v = compose("p", "c", &[], Some(&r), Some(c), json!({}));
        assert_eq!((v.outcome, v.rejected_by.as_deref()), (Outcome::Rejected, Some("correctness:timeout")));
        assert_eq!(v.gates[1].status, "passed", "the dry run that passed is kept");
        let t = table(&v);
        assert!(t.contains("cause: the candidate's timeout") && t.contains("running correctness:seed-0-normal"), "{t}");
        // Still in setup (torch importing): the environment's, with the fix.
        let (_, c) = ended(limit, "", r#"{"running": {"gate": "setup", "name": "import-torch"}}"#);
        assert_eq!(c.side, Side::Environment);
        assert!(c.fix.unwrap().contains("--time-limit-s"));
    }

    #[test]
    fn tracebacks_are_judged_by_their_frames() {
        let tb = |file: &str| {
            format!(
                "  correctness  seed-0-normal   ok\nTraceback (most recent call last):\n  File \"/k/kforge/verify/checks.py\", \
                 line 3, in run\n    f()\n  File \"{file}\", line 9, in forward\n    boom()\nKeyError: 'x'\n"
            )
        };
        let (_, c) = ended(Ending::Exit(1), &tb("/w/cand.py"), PASSED_DRY_RUN);
        assert_eq!((c.side, c.kind.as_str(), c.stage.as_deref()), (Side::Candidate, "crash", Some("correctness")));
        assert_eq!(c.traceback.last().map(String::as_str), Some("KeyError: 'x'"));
        assert_eq!(c.exit_status, Some(1));
        let (_, c) = ended(Ending::Exit(1), &tb("/w/problem.py"), PASSED_DRY_RUN);
        assert_eq!((c.side, c.kind.as_str()), (Side::Environment, "harness"));
        assert!(c.message.contains("KeyError: 'x'") && c.fix.is_some());
    }

    #[test]
    fn signals_exits_and_the_runners_own_line() {
        let (_, c) = ended(Ending::Signal(11), "", PASSED_DRY_RUN);
        assert_eq!((c.side, c.signal.as_deref()), (Side::Candidate, Some("SIGSEGV (11)")));
        let (_, c) = ended(Ending::Exit(0), "", PASSED_DRY_RUN);
        assert_eq!((c.side, c.kind.as_str(), c.exit_status), (Side::Candidate, "crash", Some(0)));
        // SIGKILL from outside the watchdog: the OOM killer or an operator, not a rejection.
        let (_, c) = ended(Ending::Signal(9), "", PASSED_DRY_RUN);
        assert_eq!((c.side, c.kind.as_str()), (Side::Environment, "killed"));
        let (_, c) = ended(
            Ending::Exit(2),
            "kforge verify: torch is not importable here (x)\nkforge verify fix: pip install torch\n",
            "",
        );
        assert_eq!(
            (c.side, c.message.as_str(), c.fix.as_deref()),
            (Side::Environment, "torch is not importable here (x)", Some("pip install torch"))
        );
        let v = compose("p", "c", &[], None, Some(c), json!({}));
        assert_eq!(v.outcome, Outcome::CouldNotRun);
        assert!(v.error.unwrap().contains("fix: pip install torch"));
        let (_, c) = ended(Ending::Daemon("daemon shut down".into()), "", PASSED_DRY_RUN);
        assert_eq!(c.side, Side::Environment);
        // Before the candidate ran, an exit without a traceback is not the candidate's.
        let (_, c) = ended(Ending::Exit(3), "", r#"{"running": {"gate": "setup", "name": "load-problem"}}"#);
        assert_eq!(c.side, Side::Environment);
    }

    #[test]
    fn a_syntax_error_is_a_static_rejection() {
        let mut c = Cause::environment("syntax", "line 1: invalid syntax", None);
        c.side = Side::Candidate;
        c.stage = Some("static".into());
        let v = compose("p", "c", &[], None, Some(c), json!({}));
        assert_eq!((v.outcome, v.rejected_by.as_deref()), (Outcome::Rejected, Some("static:syntax")));
        assert!(table(&v).contains("line 1: invalid syntax"));
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
            ..Default::default()
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
