//! Running a workload through a private daemon under one policy and ablation, and the run
//! manifests the report reads.

use crate::workload::{self, Command};
use anyhow::{bail, Context, Result};
use kforge_client::Client;
use kforge_proto::{Policy, Reply, Request, SubmitSpec};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A daemon of our own on a private socket, stopped (and waited for) on drop.
pub struct PrivateDaemon {
    pub socket: PathBuf,
    child: Child,
}

impl PrivateDaemon {
    /// Start `kforge daemon` with its socket and log in `dir`, its store at `db`.
    pub fn start(kforge: &Path, dir: &Path, db: &Path, extra: &[String]) -> Result<PrivateDaemon> {
        let socket = dir.join("kforge.sock");
        let log_path = dir.join("daemon.log");
        let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let child = std::process::Command::new(kforge)
            .arg("--socket")
            .arg(&socket)
            .arg("daemon")
            .arg("--db")
            .arg(db)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} daemon", kforge.display()))?;
        let mut d = PrivateDaemon { socket, child };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if Client::connect(&d.socket).is_ok() {
                return Ok(d);
            }
            if let Ok(Some(st)) = d.child.try_wait() {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                bail!("the private daemon exited ({st}) before listening:\n{log}");
            }
            if Instant::now() > deadline {
                bail!("the private daemon did not listen on {} within 30 s", d.socket.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn client(&self) -> Result<Client> {
        Ok(Client::connect(&self.socket)?)
    }

    pub fn report(&self, label: &str) -> Result<kforge_store::Report> {
        let parts = self.client()?.report_parts(Some(label.into()))?;
        kforge_store::Report::from_parts(parts).context("decoding the daemon's report")
    }

    pub fn status(&self) -> Result<kforge_proto::StatusReport> {
        match self.client()?.request(&Request::Status)? {
            Reply::Status(s) => Ok(s),
            other => bail!("unexpected reply to status: {other:?}"),
        }
    }
}

impl Drop for PrivateDaemon {
    fn drop(&mut self) {
        if let Ok(mut c) = Client::connect(&self.socket) {
            let _ = c.request(&Request::Shutdown);
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run one command through the daemon and wait for it; returns (exit code, stdout and stderr
/// interleaved as they came, and why the daemon ended it when it did).
pub fn run_job_capturing(socket: &Path, spec: SubmitSpec) -> Result<(i32, String)> {
    let out = RefCell::new(Vec::new());
    let exit = kforge_client::run_job(socket, spec, &mut Interleaved(&out), &mut Interleaved(&out))?;
    let mut out = out.into_inner();
    if let Some(r) = &exit.reason {
        out.extend(format!("\n[kforge: {r}]").bytes());
    }
    Ok((exit.shell_code(), String::from_utf8_lossy(&out).into_owned()))
}

/// One of the two writers of a job's output into one buffer: stdout and stderr interleaved.
struct Interleaved<'a>(&'a RefCell<Vec<u8>>);

impl std::io::Write for Interleaved<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Steps of the ablation, each adding one mechanism to the previous (policy `region` only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ablation {
    /// Close the submission gate only: no drain, no freeze, no core isolation, no settle.
    Gate,
    /// + wait for managed processes to drain their in-flight GPU work.
    Drain,
    /// + freeze sibling jobs (and settle the GPU's clocks).
    Freeze,
    /// + pin the measuring thread to a reserved core (everything but warm workers).
    Isolate,
    /// + run commands in warm workers.
    Warm,
}

impl Ablation {
    pub fn as_str(self) -> &'static str {
        match self {
            Ablation::Gate => "gate",
            Ablation::Drain => "drain",
            Ablation::Freeze => "freeze",
            Ablation::Isolate => "isolate",
            Ablation::Warm => "warm",
        }
    }

    /// Daemon flags of this step.
    pub fn daemon_flags(self, reserve_cores: usize, concurrency: usize) -> Vec<String> {
        let mut f: Vec<&str> = match self {
            Ablation::Gate => vec!["--freeze", "none", "--no-drain", "--settle-timeout-ms", "0"],
            Ablation::Drain => vec!["--freeze", "none", "--settle-timeout-ms", "0"],
            Ablation::Freeze => vec!["--freeze", "device"],
            Ablation::Isolate | Ablation::Warm => vec!["--freeze", "device"],
        };
        let reserve = if matches!(self, Ablation::Isolate | Ablation::Warm) { reserve_cores } else { 0 };
        let r = reserve.to_string();
        let w = if self == Ablation::Warm { concurrency.to_string() } else { "0".into() };
        f.extend(["--reserve-cores", r.as_str(), "--warm-workers", w.as_str()]);
        f.into_iter().map(String::from).collect()
    }
}

/// Name of a ground-truth manifest: `name`, by default `truth` (or `truth-warm`: one state may
/// hold both, to compare them), with `-OFFSET` added when the truth is a part of one (an offset
/// or a limit given).
pub fn truth_name(name: Option<&str>, warm: bool, offset: usize, limit: Option<usize>) -> String {
    let base = name.unwrap_or(if warm { "truth-warm" } else { "truth" });
    if offset > 0 || limit.is_some() {
        format!("{base}-{offset}")
    } else {
        base.into()
    }
}

/// Default name of a run: its policy, plus the ablation step under `region`.
pub fn run_name(policy: Policy, ablation: Ablation) -> String {
    if policy == Policy::Region {
        format!("region-{}", ablation.as_str())
    } else {
        policy.as_str().to_string()
    }
}

/// Default store of a workload's runs: `kforge-eval.db` beside the workload.
pub fn default_db(workload: &Path) -> PathBuf {
    workload.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).join("kforge-eval.db")
}

/// `flags` with the daemon's settle step set to at most `ms` (0: no settle step), replacing
/// what the ablation step chose.
pub fn with_settle_timeout(mut flags: Vec<String>, ms: Option<u64>) -> Vec<String> {
    if let Some(ms) = ms {
        if let Some(i) = flags.iter().position(|f| f == "--settle-timeout-ms") {
            flags.drain(i..(i + 2).min(flags.len()));
        }
        flags.extend(["--settle-timeout-ms".to_string(), ms.to_string()]);
    }
    flags
}

/// What a run did; the report reads these.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunManifest {
    pub name: String,
    /// `truth` for the isolated ground truth, `run` otherwise.
    pub kind: String,
    pub policy: String,
    pub ablation: String,
    pub warm: bool,
    pub concurrency: usize,
    pub workload: String,
    pub db: String,
    /// Store label of the run's jobs.
    pub label: String,
    pub device: String,
    pub daemon_flags: Vec<String>,
    pub started_unix: f64,
    pub wall_s: f64,
    pub commands: usize,
    /// (command id, exit code, end of its output)
    pub failed: Vec<(String, i32, String)>,
    /// A run over every GPU sent each candidate group to one GPU (the daemon's GPU groups), so
    /// that every candidate pair is timed on one GPU; false: each command to the least busy GPU.
    #[serde(default)]
    pub gpu_groups: bool,
}

impl RunManifest {
    /// Read a manifest. A workload or store file found beside the manifest (its state directory,
    /// possibly moved between machines) is used instead of the recorded path.
    pub fn load(path: &Path) -> Result<RunManifest> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading run manifest {}", path.display()))?;
        let mut m: RunManifest =
            serde_json::from_str(&text).with_context(|| format!("{} is not a kforge run manifest", path.display()))?;
        // A state directory holds the workload and store next to its manifests; prefer those
        // copies, so that manifests written in other directories (or on other machines) agree.
        let beside = |p: &str| -> String {
            match (Path::new(p).file_name(), path.parent()) {
                (Some(name), Some(dir)) if dir.join(name).is_file() => {
                    dir.join(name).canonicalize().unwrap_or_else(|_| dir.join(name)).display().to_string()
                }
                _ => p.to_string(),
            }
        };
        m.workload = beside(&m.workload);
        m.db = beside(&m.db);
        Ok(m)
    }
}

pub struct RunOptions {
    pub kforge: PathBuf,
    pub workload: PathBuf,
    pub policy: Policy,
    pub ablation: Ablation,
    pub concurrency: usize,
    /// `auto`, `cpu`, a GPU index, or `all`: every GPU of the machine, `concurrency` commands in
    /// flight on each, each command on the least busy GPU or, with `gpu_groups`, on its candidate
    /// group's GPU (scaling runs; not the ground truth).
    pub device: String,
    pub name: String,
    pub truth: bool,
    pub db: PathBuf,
    pub reserve_cores: usize,
    /// Skip the first N commands (to split a long run, e.g. the ground truth, over several calls).
    pub offset: usize,
    /// Run only N commands (after the offset).
    pub limit: Option<usize>,
    /// Time limit per command.
    pub timeout: Duration,
    /// Longest settle step before a region (None: the ablation step's choice; 0: none).
    pub settle_timeout_ms: Option<u64>,
    /// With `device` `all`: send the commands of one candidate group (operator and group) to one
    /// GPU, the GPU its first command went to, so that its candidates are compared on one GPU.
    pub gpu_groups: bool,
}

/// Run a workload and write `<workload dir>/<name>.run.json`; returns the manifest and its path.
pub fn run(o: &RunOptions) -> Result<(RunManifest, PathBuf)> {
    if o.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    if o.truth && o.device == "all" {
        bail!("the ground truth times one command at a time on one device: --device all is for runs");
    }
    let cmds = selected_commands(o)?;
    let workload_abs = o.workload.canonicalize().with_context(|| format!("resolving {}", o.workload.display()))?;
    let dir = workload_abs.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let (policy, concurrency, ablation) = protocol(o);
    let warm = ablation == Ablation::Warm && (policy == Policy::Region || o.truth);
    let mut flags = with_settle_timeout(ablation.daemon_flags(o.reserve_cores, concurrency), o.settle_timeout_ms);
    flags.extend(["--max-concurrent".into(), concurrency.to_string()]);
    let tmp = tempfile::Builder::new().prefix("kforge-eval-").tempdir().context("creating a daemon directory")?;
    let daemon = PrivateDaemon::start(&o.kforge, tmp.path(), &o.db, &flags)?;
    let placement = Placement::of(o, &daemon.status()?, concurrency);
    let label = format!("eval:{}", o.name);
    let env: Vec<(String, String)> =
        std::env::vars().filter(|(k, _)| ["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"].contains(&k.as_str())).collect();
    eprintln!(
        "kforge workload: {} — {} commands, policy {}, ablation {}, {} in flight, device {}",
        o.name,
        cmds.len(),
        policy.as_str(),
        ablation.as_str(),
        placement.in_flight,
        placement.device
    );
    let spec_of = |c: &Command| SubmitSpec {
        argv: c.argv.clone(),
        cwd: dir.display().to_string(),
        env: env.clone(),
        device: placement.job_device.clone(),
        policy: Some(policy),
        label: Some(label.clone()),
        warm,
        timeout_ms: Some(o.timeout.as_millis() as u64),
        gpu_group: placement.gpu_groups.then(|| format!("{}/{}", c.operator, c.group)),
        ..SubmitSpec::default()
    };
    let started_unix =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let t0 = Instant::now();
    let failed = run_all(&daemon.socket, &cmds, placement.in_flight, spec_of);
    let wall_s = t0.elapsed().as_secs_f64();
    drop(daemon);
    let m = RunManifest {
        name: o.name.clone(),
        kind: if o.truth { "truth".into() } else { "run".into() },
        policy: policy.as_str().into(),
        ablation: if policy == Policy::Region { ablation.as_str().into() } else { "-".into() },
        warm,
        concurrency: placement.in_flight,
        workload: workload_abs.display().to_string(),
        db: o.db.canonicalize().unwrap_or_else(|_| o.db.clone()).display().to_string(),
        label,
        device: placement.device,
        daemon_flags: flags,
        started_unix,
        wall_s,
        commands: cmds.len(),
        failed,
        gpu_groups: placement.gpu_groups,
    };
    let path = dir.join(format!("{}.run.json", o.name));
    std::fs::write(&path, serde_json::to_vec_pretty(&m)?).with_context(|| format!("writing {}", path.display()))?;
    if !m.failed.is_empty() {
        eprintln!(
            "  {} of {} commands failed; first: {} (exit {}): {}",
            m.failed.len(),
            m.commands,
            m.failed[0].0,
            m.failed[0].1,
            m.failed[0].2
        );
    }
    Ok((m, path))
}

/// The workload's commands after the offset, at most the limit.
fn selected_commands(o: &RunOptions) -> Result<Vec<Command>> {
    let mut cmds: Vec<Command> = workload::read(&o.workload)?;
    if o.offset >= cmds.len() {
        bail!("--offset {} skips all {} commands of {}", o.offset, cmds.len(), o.workload.display());
    }
    cmds.drain(..o.offset);
    if let Some(n) = o.limit {
        cmds.truncate(n);
    }
    Ok(cmds)
}

/// The policy, concurrency and ablation step a run uses.
///
/// The ground truth runs one command at a time on an otherwise idle device; with the warm step it
/// runs them in one warm worker (same timing protocol, no start-up). Its timed parts are regions,
/// like the runs': nothing else runs to gate, drain or freeze, but each one starts after the
/// settle step (the GPU out of power-cap throttling) and records the SM clock at grant and
/// release — which the report needs to tell power capping from the runtime's effect.
fn protocol(o: &RunOptions) -> (Policy, usize, Ablation) {
    if o.truth {
        (Policy::Region, 1, if o.ablation == Ablation::Warm { Ablation::Warm } else { Ablation::Isolate })
    } else {
        (o.policy, o.concurrency, o.ablation)
    }
}

/// Where a run's jobs go.
struct Placement {
    /// The device every job is submitted to (`auto` over every GPU).
    job_device: String,
    /// The device as the manifest records it: `NAME (DESCRIPTION)`, or `all: A; B`.
    device: String,
    /// Commands in flight: `concurrency`, per GPU over every GPU.
    in_flight: usize,
    /// Each candidate group to one GPU (over every GPU only).
    gpu_groups: bool,
}

impl Placement {
    fn of(o: &RunOptions, status: &kforge_proto::StatusReport, concurrency: usize) -> Placement {
        let gpus: Vec<&kforge_proto::DeviceStatus> = status.devices.iter().filter(|d| d.kind == "gpu").collect();
        let over_all = o.device == "all" && !gpus.is_empty();
        // The daemon puts each `auto` job on its least busy GPU, or with GPU groups on the GPU of
        // its candidate group; `concurrency` per GPU.
        if over_all {
            let list: Vec<String> = gpus.iter().map(|d| format!("{} ({})", d.name, d.description)).collect();
            return Placement {
                job_device: "auto".to_string(),
                device: format!("all: {}", list.join("; ")),
                in_flight: concurrency * gpus.len(),
                gpu_groups: o.gpu_groups,
            };
        }
        let dev = if o.device == "auto" || o.device == "all" {
            gpus.first().copied().unwrap_or(&status.devices[0]).name.clone()
        } else {
            o.device.clone()
        };
        let device = status
            .devices
            .iter()
            .find(|d| d.name == dev)
            .map(|d| format!("{} ({})", d.name, d.description))
            .unwrap_or_else(|| dev.clone());
        Placement { job_device: dev, device, in_flight: concurrency, gpu_groups: false }
    }
}

/// Run `cmds` through the daemon at `socket`, `in_flight` at a time, with progress on stderr;
/// returns the failures, sorted: (command id, exit code, end of its output).
fn run_all(
    socket: &Path,
    cmds: &[Command],
    in_flight: usize,
    spec_of: impl Fn(&Command) -> SubmitSpec + Sync,
) -> Vec<(String, i32, String)> {
    let total = cmds.len();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let failed = Mutex::new(Vec::new());
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..in_flight {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(c) = cmds.get(i) else { break };
                let fail = match run_job_capturing(socket, spec_of(c)) {
                    Ok((0, _)) => None,
                    Ok((code, out)) => Some((c.id.clone(), code, tail(&out))),
                    Err(e) => Some((c.id.clone(), -1, e.to_string())),
                };
                if let Some(f) = fail {
                    failed.lock().expect("failed list").push(f);
                }
                let n = done.fetch_add(1, Ordering::SeqCst) + 1;
                if n.is_multiple_of((total / 10).max(1)) || n == total {
                    eprintln!("  {n}/{total} commands, {:.1} s", t0.elapsed().as_secs_f64());
                }
            });
        }
    });
    let mut failed = failed.into_inner().expect("failed list");
    failed.sort();
    failed
}

fn tail(s: &str) -> String {
    let t: Vec<&str> = s.lines().rev().take(5).collect();
    t.into_iter().rev().collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value_of<'a>(flags: &'a [String], name: &str) -> Vec<&'a str> {
        flags.windows(2).filter(|w| w[0] == name).map(|w| w[1].as_str()).collect()
    }

    #[test]
    fn default_names_and_store() {
        assert_eq!(truth_name(None, false, 0, None), "truth");
        assert_eq!(truth_name(None, true, 0, None), "truth-warm");
        assert_eq!(truth_name(Some("truth-gpu1"), false, 70, None), "truth-gpu1-70");
        assert_eq!(truth_name(None, false, 0, Some(5)), "truth-0");
        assert_eq!(run_name(Policy::Region, Ablation::Freeze), "region-freeze");
        assert_eq!(run_name(Policy::Command, Ablation::Warm), "command");
        assert_eq!(default_db(Path::new("w.jsonl")), PathBuf::from("./kforge-eval.db"));
        assert_eq!(default_db(Path::new("state/w.jsonl")), PathBuf::from("state/kforge-eval.db"));
    }

    #[test]
    fn ablation_steps_add_one_mechanism_each_and_settle_can_be_overridden() {
        let gate = Ablation::Gate.daemon_flags(2, 8);
        assert!(gate.contains(&"--no-drain".to_string()));
        assert_eq!(value_of(&gate, "--settle-timeout-ms"), ["0"]);
        assert_eq!(value_of(&Ablation::Drain.daemon_flags(2, 8), "--freeze"), ["none"]);
        let freeze = Ablation::Freeze.daemon_flags(2, 8);
        assert_eq!((value_of(&freeze, "--freeze"), value_of(&freeze, "--reserve-cores")), (vec!["device"], vec!["0"]));
        assert!(value_of(&freeze, "--settle-timeout-ms").is_empty(), "freeze settles with the daemon's default");
        assert_eq!(value_of(&Ablation::Isolate.daemon_flags(2, 8), "--reserve-cores"), ["2"]);
        assert_eq!(value_of(&Ablation::Warm.daemon_flags(2, 8), "--warm-workers"), ["8"]);
        // The override replaces the step's choice (one flag, never two), or adds it.
        let g = with_settle_timeout(gate.clone(), Some(700));
        assert_eq!(value_of(&g, "--settle-timeout-ms"), ["700"]);
        assert_eq!(g.len(), gate.len());
        let w = with_settle_timeout(Ablation::Warm.daemon_flags(2, 8), Some(0));
        assert_eq!(value_of(&w, "--settle-timeout-ms"), ["0"]);
        assert_eq!(with_settle_timeout(freeze.clone(), None), freeze);
    }
}
