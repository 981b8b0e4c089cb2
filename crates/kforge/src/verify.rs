//! `kforge verify`: gate 1's static check here, then the runtime gates in a separate candidate
//! process (`python3 -m kforge.verify.runner`) under a time limit, a memory limit and, where the
//! kernel lets us, without network; the verdict is composed by `kforge_verify::verdict`. When
//! the process ends without a result, `kforge_verify::verdict::classify` decides from how it
//! ended, its stderr and its progress file whose failure it was.

use anyhow::{bail, Context, Result};
use clap::Args;
use kforge_verify::verdict::{classify, compose, table, Cause, Ended, Ending, LimitKind, Progress, RunnerResult, Side};
use kforge_verify::{check_static_for, problem_dtypes, Finding, Policy};
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct VerifyArgs {
    /// The problem (KernelBench format: class Model, get_inputs(), get_init_inputs()).
    problem: PathBuf,
    /// The candidate: a file defining class ModelNew with the same constructor as Model, or with
    /// --kernel the source of a replacement for one Inductor kernel of the compiled problem.
    candidate: PathBuf,
    /// CANDIDATE replaces this Triton kernel of the torch.compile'd problem (a name `kforge
    /// inspect` lists); it is verified re-stitched into the compiled model (needs a GPU).
    #[arg(long)]
    kernel: Option<String>,
    /// A preset (dispatch-aware, the default: the reference's vendor-library calls stay allowed;
    /// strict-no-torch; reference-ops: what the reference computes with, for results that are
    /// torch code by design) or a policy file (TOML): torch_policy, allowed_torch_ops, allowed_aten_ops, precision (strict |
    /// tf32-allowed | low-allowed), [rtol] / [atol] per dtype, seeds, rounds, [ragged] sizes (NAME = value).
    #[arg(long)]
    policy: Option<String>,
    /// Write the verdict as JSON to this file (`-`: standard output).
    #[arg(long)]
    json: Option<String>,
    /// Where the candidate runs: auto (a GPU if torch sees one), cpu, or a GPU index.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Skip gate 4 (timing); the verdict is then at best "passed-without-performance".
    #[arg(long)]
    no_performance: bool,
    /// The problem's size preset: default (its constants as written) or large (its LARGE dict,
    /// see problems/README.md).
    #[arg(long, default_value = "default")]
    size: String,
    /// Wall-clock limit of the candidate process, seconds.
    #[arg(long, default_value_t = 600)]
    time_limit_s: u64,
    /// Resident-memory limit of the candidate process, GiB.
    #[arg(long, default_value_t = 32.0)]
    memory_limit_gib: f64,
    /// Python interpreter with torch (and Triton).
    #[arg(long, default_value = "python3")]
    python: String,
    /// Run the candidate process as a job of the kforge daemon (--socket): on a shared GPU its
    /// work is then held at the gate during other jobs' regions, and gate 4 times inside
    /// regions. The daemon enforces the time limit; the memory limit and the private network
    /// namespace are not applied on this path (the verdict's limits say so).
    #[arg(long)]
    daemon: bool,
    /// With --daemon: the candidate job's peak GPU memory, GiB, for the daemon's admission.
    /// Without it the daemon uses what earlier verifications of the same problem and size used
    /// (the job's label is `verify:PROBLEM:SIZE`), else its default for unknown jobs.
    #[arg(long, value_name = "GIB", requires = "daemon")]
    gpu_memory: Option<f64>,
    /// With --daemon: how long the candidate job is expected to run, seconds. The daemon may
    /// then start it beside running jobs while its queue's head waits to run alone, when it is
    /// expected to end before they do (backfill; `kforge optimize` passes what its verify steps
    /// took before).
    #[arg(long, value_name = "SECONDS", requires = "daemon")]
    expected_s: Option<f64>,
    /// With --daemon: run the candidate process in a warm worker, which has imported torch
    /// (and what else the daemon's --worker-preload names) already, so that a verify skips that
    /// start-up. The daemon must fork its workers' jobs (`kforge daemon --worker-fork`): each
    /// candidate then runs in a child process of its own; with in-process workers the runner
    /// refuses (could-not-run, naming the fix).
    #[arg(long, requires = "daemon")]
    warm: bool,
}

/// The problem size presets (`--size`); the runner and the capture know the same list
/// (python/kforge/harness.py `SIZES`).
pub const SIZES: [&str; 2] = ["default", "large"];

fn rss_bytes(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = s.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resident memory of every process in process group `pgid` (the candidate process and what it
/// started: compile workers, helpers).
fn group_rss_bytes(pgid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else { return rss_bytes(pgid).unwrap_or(0) };
    let mut total = 0;
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // Fields after the parenthesised command: state ppid pgrp ...
        let pgrp =
            stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(2)).and_then(|x| x.parse::<u32>().ok());
        if pgrp == Some(pgid) {
            total += rss_bytes(pid).unwrap_or(0);
        }
    }
    total
}

fn net_ns(pid: &str) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()
}

pub fn verify(socket: &Path, a: VerifyArgs) -> Result<i32> {
    if !(a.memory_limit_gib > 0.0 && a.memory_limit_gib.is_finite()) {
        bail!("--memory-limit-gib must be a positive number");
    }
    if a.time_limit_s == 0 {
        bail!("--time-limit-s must be at least 1");
    }
    if !SIZES.contains(&a.size.as_str()) {
        bail!("--size must be one of {}, got {:?}", SIZES.join(", "), a.size);
    }
    let device = match a.device.as_str() {
        "auto" | "cpu" => a.device.clone(),
        d if d.parse::<u32>().is_ok() => "cuda".into(),
        d => bail!("--device must be auto, cpu or a GPU index, got {d:?}"),
    };
    let policy = match &a.policy {
        Some(p) => Policy::load(p).with_context(|| format!("--policy {p}"))?,
        None => Policy::default(),
    };
    for f in [&a.problem, &a.candidate] {
        if !f.is_file() {
            bail!("{}: no such file", f.display());
        }
    }
    let started = Instant::now();
    let source = std::fs::read_to_string(&a.candidate).with_context(|| format!("reading {}", a.candidate.display()))?;
    let (problem, candidate) = (a.problem.display().to_string(), a.candidate.display().to_string());
    let mut limits = serde_json::json!({"time_s": a.time_limit_s, "memory_gib": a.memory_limit_gib});

    let problem_source =
        std::fs::read_to_string(&a.problem).with_context(|| format!("reading {}", a.problem.display()))?;
    let policy = policy.for_problem(&problem_source);
    let evidence = match check_static_for(&source, &policy, &problem_dtypes(&problem_source)) {
        // A candidate that does not parse is its own failure: rejected, never run.
        Err(e) => {
            let mut cause = Cause::environment("syntax", format!("{candidate}: {e}"), None);
            cause.side = Side::Candidate;
            cause.stage = Some("static".into());
            Evidence { findings: Vec::new(), result: None, cause: Some(cause) }
        }
        Ok(findings) if !findings.is_empty() => Evidence { findings, result: None, cause: None },
        Ok(_) if a.daemon => run_candidate_job(&a, socket, &policy, &mut limits)?,
        Ok(_) => run_candidate(&a, &device, &policy, &mut limits)?,
    };
    let mut verdict =
        compose(&problem, &candidate, &evidence.findings, evidence.result.as_ref(), evidence.cause, limits)
            .with_policy(&policy);
    verdict.size = a.size.clone();
    verdict.phase_seconds.insert("total".into(), started.elapsed().as_secs_f64());
    if a.device == "cpu" && !verdict.notes.iter().any(|n| n.contains("TRITON_INTERPRET")) {
        verdict
            .notes
            .push("--device cpu: TRITON_INTERPRET=1 set for the candidate process (Triton's interpreter)".into());
    }
    if let Some(j) = &a.json {
        crate::output::write_out(j, &serde_json::to_string_pretty(&verdict).context("serializing the verdict")?)?;
    }
    print!("{}", table(&verdict));
    Ok(verdict.outcome.exit_code())
}

fn run_candidate(a: &VerifyArgs, device: &str, policy: &Policy, limits: &mut serde_json::Value) -> Result<Evidence> {
    let mut cmd = Command::new(&a.python);
    let tmp = crate::output::embedded_python(&mut cmd)?;
    let out = tmp.path().join("result.json");
    let progress = tmp.path().join("progress.jsonl");
    cmd.args(runner_args(a, policy, &out, &progress, device)?);
    if let Ok(i) = a.device.parse::<u32>() {
        cmd.env("CUDA_VISIBLE_DEVICES", i.to_string());
    }
    if device == "cpu" {
        // Triton kernels on CPU tensors run in Triton's interpreter (the runner sets it too).
        cmd.env("TRITON_INTERPRET", "1");
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::inherit()).stderr(Stdio::piped());
    let mut child = spawn_confined(&mut cmd).with_context(|| format!("starting {}", a.python))?;
    let pid = child.id();
    let isolated = match (net_ns(&pid.to_string()), net_ns("self")) {
        (Some(c), Some(me)) => c != me,
        _ => false,
    };
    let stderr = StderrTee::start(child.stderr.take().context("capturing the candidate's stderr")?);
    let limit_memory = (a.memory_limit_gib * (1u64 << 30) as f64) as u64;
    let t0 = Instant::now();
    let watched = watch(&mut child, Duration::from_secs(a.time_limit_s), limit_memory)?;
    let err_text = stderr.text();
    limits["network_isolated"] = serde_json::json!(isolated);
    limits["peak_rss_bytes"] = serde_json::json!(watched.peak_rss);
    limits["wall_s"] = serde_json::json!(t0.elapsed().as_secs_f64());
    let status = watched.status;
    let ending = match watched.killed {
        Some(Limit::Time) => {
            Ending::Limit { kind: LimitKind::Time, limit: format!("time limit of {} s", a.time_limit_s) }
        }
        Some(Limit::Memory) => {
            Ending::Limit { kind: LimitKind::Memory, limit: format!("memory limit of {} GiB", a.memory_limit_gib) }
        }
        None => match (status.code(), status.signal()) {
            (Some(c), _) => Ending::Exit(c),
            (None, Some(s)) => Ending::Signal(s),
            (None, None) => Ending::Exit(1),
        },
    };
    Evidence::of_run(ending, &out, &progress, &err_text, a)
}

/// Start `cmd` in its own process group (so the whole tree can be killed), dying with kforge,
/// and in a new network namespace where permitted (whether it is, the caller checks).
fn spawn_confined(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setpgid(0, 0);
            // If kforge itself is killed or interrupted, the candidate dies with it.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
            libc::unshare(libc::CLONE_NEWNET);
            Ok(())
        });
    }
    cmd.spawn()
}

/// The candidate's stderr — the runner's progress, one line per check — shown as it comes and
/// kept (as bytes, decoded once at the end) for the reason of a failure.
struct StderrTee {
    bytes: Arc<Mutex<Vec<u8>>>,
    done: mpsc::Receiver<()>,
}

impl StderrTee {
    fn start(mut stderr: std::process::ChildStderr) -> StderrTee {
        let bytes = Arc::new(Mutex::new(Vec::<u8>::new()));
        let (done_tx, done) = mpsc::channel::<()>();
        let kept = bytes.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            let mut out = std::io::stderr();
            loop {
                match stderr.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let _ = out.write_all(&buf[..n]);
                        if let Ok(mut b) = kept.lock() {
                            b.extend_from_slice(&buf[..n]);
                        }
                    }
                }
            }
            let _ = done_tx.send(());
        });
        StderrTee { bytes, done }
    }

    /// Everything the candidate wrote. The reader may outlive the candidate if something that
    /// escaped its process group holds the pipe: it is waited for with a deadline.
    fn text(self) -> String {
        let _ = self.done.recv_timeout(Duration::from_secs(5));
        self.bytes.lock().map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }
}

/// The limit a candidate was killed for.
enum Limit {
    Time,
    Memory,
}

/// How a watched candidate ended.
struct Watched {
    status: std::process::ExitStatus,
    peak_rss: u64,
    killed: Option<Limit>,
}

/// Wait for the candidate, polling its resident memory, and kill its process group when it
/// runs past `time` or `memory` bytes; whatever it left behind in its group ends with it.
fn watch(child: &mut std::process::Child, time: Duration, memory: u64) -> Result<Watched> {
    let pid = child.id();
    let t0 = Instant::now();
    let mut peak = 0u64;
    let mut killed: Option<Limit> = None;
    let mut polls = 0u64;
    let kill_group = || {
        // SAFETY: signalling the candidate's own process group.
        unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
    };
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) => {}
            Err(e) => {
                kill_group();
                let _ = child.wait();
                return Err(e).context("waiting for the candidate process");
            }
        }
        // The candidate itself every poll; its whole process group every 10th (a /proc scan).
        polls += 1;
        let rss = if polls.is_multiple_of(10) { group_rss_bytes(pid) } else { rss_bytes(pid).unwrap_or(0) };
        peak = peak.max(rss);
        if killed.is_none() && t0.elapsed() > time {
            killed = Some(Limit::Time);
        } else if killed.is_none() && peak > memory {
            killed = Some(Limit::Memory);
        }
        if killed.is_some() {
            kill_group();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Whatever the candidate left behind in its group (a background process) ends with it.
    kill_group();
    Ok(Watched { status, peak_rss: peak, killed })
}

/// The runner's argv after the interpreter: the module, files, output and options.
fn runner_args(a: &VerifyArgs, policy: &Policy, out: &Path, progress: &Path, device: &str) -> Result<Vec<String>> {
    let abs = |p: &Path| std::fs::canonicalize(p).with_context(|| format!("resolving {}", p.display()));
    let mut v = vec![
        "-m".to_string(),
        "kforge.verify.runner".into(),
        abs(&a.problem)?.display().to_string(),
        abs(&a.candidate)?.display().to_string(),
        "--out".into(),
        out.display().to_string(),
        "--policy-json".into(),
        serde_json::to_string(policy).context("serializing the policy")?,
        "--device".into(),
        device.into(),
        "--progress".into(),
        progress.display().to_string(),
    ];
    if a.no_performance {
        v.push("--no-performance".into());
    }
    v.extend(["--size".to_string(), a.size.clone()]);
    if let Some(k) = &a.kernel {
        v.extend(["--kernel".to_string(), k.clone()]);
    }
    Ok(v)
}

/// The candidate process as a daemon job: the daemon's embedded Python package is on its
/// PYTHONPATH, CUDA_VISIBLE_DEVICES names its GPU, and the job's output streams back here.
fn run_candidate_job(
    a: &VerifyArgs,
    socket: &Path,
    policy: &Policy,
    limits: &mut serde_json::Value,
) -> Result<Evidence> {
    let tmp = tempfile::tempdir().context("creating a temporary directory")?;
    let out = tmp.path().join("result.json");
    let progress = tmp.path().join("progress.jsonl");
    let (job_device, runner_device) = match a.device.as_str() {
        "cpu" => ("cpu", "cpu"),
        "auto" => ("auto", "auto"),
        gpu => (gpu, "cuda"),
    };
    let mut argv = vec![a.python.clone()];
    argv.extend(runner_args(a, policy, &out, &progress, runner_device)?);
    let t0 = Instant::now();
    let label = format!("verify:{}:{}", a.problem.display(), a.size);
    let peak = crate::job::gpu_memory_bytes(a.gpu_memory)?;
    let req = crate::job::JobRequest {
        argv,
        device: job_device,
        label: &label,
        timeout_s: Some(a.time_limit_s),
        gpu_memory_bytes: peak,
        warm: a.warm,
        own_process: true,
        expected_ms: crate::job::expected_ms(a.expected_s)?,
    };
    let queued = Instant::now();
    let say = &mut |job| eprintln!("{}", crate::job::started_line("kforge verify", job, queued.elapsed()));
    let (exit, err_text) = match crate::job::run_job_telling(socket, req, &mut std::io::stdout(), say) {
        Ok((exit, err, _)) => (exit, err),
        // No daemon, or it went away mid-run: the environment's, with what passed until then.
        Err(e) => {
            let progress = Progress::parse(&std::fs::read_to_string(&progress).unwrap_or_default());
            let fix = if a.warm {
                "start the daemon with warm workers that fork (kforge daemon --warm-workers N --worker-fork), \
                 or run without --warm"
            } else {
                "start the daemon (kforge daemon) and run it again, or run without --daemon"
            };
            let mut cause = Cause::environment("daemon", format!("--daemon: {e:#}"), Some(fix.into()));
            (cause.stage, cause.check) = progress.running.clone().unzip();
            let result = RunnerResult { checks: progress.checks, ..Default::default() };
            return Ok(Evidence { findings: Vec::new(), result: Some(result), cause: Some(cause) });
        }
    };
    limits["via_daemon"] = serde_json::json!(true);
    limits["warm"] = serde_json::json!(a.warm);
    limits["memory_limit_enforced"] = serde_json::json!(false);
    limits["network_isolated"] = serde_json::json!(false);
    limits["wall_s"] = serde_json::json!(t0.elapsed().as_secs_f64());
    if let Some(peak) = exit.gpu_memory_peak_bytes {
        limits["gpu_memory_peak_bytes"] = serde_json::json!(peak); // what its job used, the daemon's samples say
    }
    let ending = match (&exit.reason, exit.code, exit.signal) {
        // The daemon's own time limit (`time limit of S s exceeded`).
        (Some(r), _, _) if r.starts_with("time limit") => {
            Ending::Limit { kind: LimitKind::Time, limit: format!("time limit of {} s", a.time_limit_s) }
        }
        (Some(r), _, _) => Ending::Daemon(r.clone()),
        (None, Some(c), _) => Ending::Exit(c),
        (None, None, Some(s)) => Ending::Signal(s),
        (None, None, None) => Ending::Exit(exit.shell_code()),
    };
    Evidence::of_run(ending, &out, &progress, &err_text, a)
}

/// What a verdict is composed from besides the files' names and the limits: the static gate's
/// findings, the runner's result, or why there is none.
struct Evidence {
    findings: Vec<Finding>,
    result: Option<RunnerResult>,
    cause: Option<Cause>,
}

impl Evidence {
    /// After the candidate's process or job ended: the runner's result in `out` when it exited 0
    /// and wrote one, else the classified cause with the checks its progress file reported.
    fn of_run(ending: Ending, out: &Path, progress: &Path, stderr: &str, a: &VerifyArgs) -> Result<Evidence> {
        if ending == Ending::Exit(0) && out.is_file() {
            return Ok(match read_result(out) {
                Ok(result) => Evidence { findings: Vec::new(), result: Some(result), cause: None },
                Err(e) => Evidence {
                    findings: Vec::new(),
                    result: None,
                    cause: Some(Cause::environment(
                        "no-result",
                        format!("the candidate process wrote no usable result ({e:#})"),
                        None,
                    )),
                },
            });
        }
        let candidate_file = std::fs::canonicalize(&a.candidate)
            .with_context(|| format!("resolving {}", a.candidate.display()))?
            .display()
            .to_string();
        let progress = Progress::parse(&std::fs::read_to_string(progress).unwrap_or_default());
        let (result, cause) = classify(&Ended { ending, stderr, progress, candidate_file: &candidate_file });
        Ok(Evidence { findings: Vec::new(), result: Some(result), cause: Some(cause) })
    }
}

fn read_result(p: &Path) -> Result<RunnerResult> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading the runner's result {}", p.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a runner result", p.display()))
}
