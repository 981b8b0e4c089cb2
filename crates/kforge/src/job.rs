//! Running one command as a job of the kforge daemon and streaming its output here — what
//! `kforge run` does, as a function for commands (`verify --daemon`, `inspect --daemon`,
//! `profile --daemon`, `optimize --daemon`'s steps) whose own helper process should be managed
//! like any benchmark job.

use anyhow::{Context, Result};
use kforge_proto::{JobExit, SubmitSpec};
use std::io::Write;
use std::path::Path;

/// A helper command to run as a daemon job: `argv` on `device` (`auto`, `cpu` or a GPU index).
/// `label` names what the job is for its learned GPU-memory peak (a command not seen before gets
/// its label's); `gpu_memory_bytes` declares the peak instead.
pub struct JobRequest<'a> {
    pub argv: Vec<String>,
    pub device: &'a str,
    pub label: &'a str,
    pub timeout_s: Option<u64>,
    pub gpu_memory_bytes: Option<u64>,
    /// Run the Python command in a warm worker of the device.
    pub warm: bool,
    /// The command needs a process of its own (see `SubmitSpec::own_process`).
    pub own_process: bool,
    /// How long the job is expected to run (see `SubmitSpec::expected_ms`).
    pub expected_ms: Option<u64>,
}

/// Submit the job with the caller's environment (minus PYTHONPATH: the daemon puts its own
/// Python package there), write its standard output to `stdout` and its stderr through, and
/// return the exit, everything the job wrote on stderr, and the job's id (to look up its regions
/// in the daemon's store).
pub fn run_job(socket: &Path, req: JobRequest, stdout: &mut dyn Write) -> Result<(JobExit, String, u64)> {
    run_job_telling(socket, req, stdout, &mut |_| {})
}

/// `run_job`, telling `started` the job's id when the daemon starts it (never withdrawn).
pub fn run_job_telling(
    socket: &Path,
    req: JobRequest,
    stdout: &mut dyn Write,
    started: &mut dyn FnMut(u64),
) -> Result<(JobExit, String, u64)> {
    let told = &mut |id| {
        started(id);
        true
    };
    match run_job_to(socket, req, stdout, &mut std::io::stderr(), told)? {
        (Some(exit), err, id) => Ok((exit, err, id)),
        (None, _, id) => anyhow::bail!("job {id} was withdrawn without being asked to"),
    }
}

/// `run_job` with the job's stderr passed to `stderr` (a copy kept and returned) instead of this
/// process's, and `started` asked with the job's id when the daemon starts it (it may wait in
/// the daemon's queue first: GPU memory, slots) whether it should still run: `false` withdraws it
/// (the daemon cancels it) and returns no exit.
pub fn run_job_to(
    socket: &Path,
    req: JobRequest,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
    started: &mut dyn FnMut(u64) -> bool,
) -> Result<(Option<JobExit>, String, u64)> {
    let JobRequest { argv, device, label, timeout_s, gpu_memory_bytes, warm, own_process, expected_ms } = req;
    let spec = SubmitSpec {
        argv,
        cwd: std::env::current_dir().context("reading the current directory")?.display().to_string(),
        env: std::env::vars().filter(|(k, _)| k != "PYTHONPATH").collect(),
        device: device.to_string(),
        policy: None,
        label: Some(label.to_string()),
        warm,
        timeout_ms: timeout_s.map(|s| s.saturating_mul(1000)),
        gpu_group: None,
        gpu_memory_bytes,
        auto_regions: false,
        own_process,
        expected_ms,
    };
    let job = kforge_client::Client::connect(socket)
        .with_context(|| format!("no kforge daemon on {}", socket.display()))?
        .submit(spec)
        .context("submitting the job")?;
    let id = job.job;
    let mut kept = Kept { to: stderr, kept: Vec::new() };
    let exit = job.stream_output_with(stdout, &mut kept, &mut || started(id)).context("waiting for the job")?;
    Ok((exit, String::from_utf8_lossy(&kept.kept).into_owned(), id))
}

/// The line a command that runs as a daemon job (`kforge verify --daemon`) writes on its stderr
/// when the daemon starts the job: how long it waited in the daemon's queue. `kforge optimize`'s
/// verify step reads it (`is_started_line`) to tell waiting from running.
pub fn started_line(command: &str, job: u64, queued: std::time::Duration) -> String {
    format!("{command}: {STARTED} {job} after {:.1} s in the daemon's queue", queued.as_secs_f64())
}

const STARTED: &str = "the daemon started job";

/// Whether `line` is a `started_line`.
pub fn is_started_line(line: &str) -> bool {
    line.split_once(": ").is_some_and(|(command, rest)| command.starts_with("kforge") && rest.starts_with(STARTED))
}

/// Seconds inside released regions of the jobs labelled `label` (only job `job`; only those
/// queued at or after `since_ns`), summed by the daemon's store: one small reply, where the
/// label's [`labelled`] report of a long measuring job can pass the protocol's frame limit.
pub fn region_seconds(socket: &Path, label: &str, job: Option<u64>, since_ns: Option<i64>) -> Result<f64> {
    let mut c =
        kforge_client::Client::connect(socket).with_context(|| format!("no kforge daemon on {}", socket.display()))?;
    let req = kforge_proto::Request::RegionTime { label: label.to_string(), job, since_ns };
    match c.request(&req).with_context(|| format!("asking the daemon for the region time of {label}"))? {
        kforge_proto::Reply::RegionTime { seconds, .. } => Ok(seconds),
        other => anyhow::bail!("asking the daemon for the region time of {label}: unexpected reply {other:?}"),
    }
}

/// A writer passing everything to `to`, keeping a copy of what passed through.
struct Kept<'a> {
    to: &'a mut dyn Write,
    kept: Vec<u8>,
}

impl Write for Kept<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.to.write_all(buf)?;
        self.kept.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.to.flush()
    }
}

/// `--gpu-memory GiB` in bytes (`kforge run`, `verify --daemon`, `inspect --daemon`).
pub fn gpu_memory_bytes(gib: Option<f64>) -> Result<Option<u64>> {
    scaled("--gpu-memory", gib, "GiB (such as 40 or 0.5)", (1u64 << 30) as f64)
}

/// `--expected-s` in milliseconds for `SubmitSpec::expected_ms`.
pub fn expected_ms(seconds: Option<f64>) -> Result<Option<u64>> {
    scaled("--expected-s", seconds, "seconds (such as 90 or 2.5)", 1e3)
}

/// A flag's positive number of `unit` times `scale`, rounded up; a clear error for anything else.
fn scaled(flag: &str, value: Option<f64>, unit: &str, scale: f64) -> Result<Option<u64>> {
    match value {
        Some(v) if !(v > 0.0 && v.is_finite() && v < 1e9) => {
            anyhow::bail!("{flag} must be a positive number of {unit}, got {v}")
        }
        Some(v) => Ok(Some((v * scale).ceil() as u64)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_started_line_is_told_from_the_jobs_own_output() {
        let line = started_line("kforge verify", 12, std::time::Duration::from_millis(182_040));
        assert_eq!(line, "kforge verify: the daemon started job 12 after 182.0 s in the daemon's queue");
        assert!(is_started_line(&line));
        for other in [
            "kforge verify: job 12 ended",
            "candidate: the daemon started job 3", // the job's own output names no kforge command
            "the daemon started job 12",
            "",
        ] {
            assert!(!is_started_line(other), "{other:?}");
        }
    }
}
