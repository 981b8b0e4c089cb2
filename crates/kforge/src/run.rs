//! `kforge run`: submit one command as a job and stream its output; exit with its exit code.

use crate::values::PolicyArg;
use anyhow::{bail, Context, Result};
use kforge_client::Client;
use kforge_proto::SubmitSpec;
use std::path::Path;

#[derive(clap::Args)]
pub struct RunArgs {
    /// auto, cpu, or a GPU index.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Isolation policy (default: the daemon's).
    #[arg(long, value_enum)]
    policy: Option<PolicyArg>,
    /// Label stored with the job (to group a run in reports).
    #[arg(long)]
    label: Option<String>,
    /// Run the Python command in a warm worker (preloaded torch/triton, live CUDA context).
    #[arg(long)]
    warm: bool,
    /// Kill the job after this many seconds.
    #[arg(long)]
    timeout: Option<f64>,
    /// Run on the same GPU as the other jobs of this group (e.g. one operator's candidates, so
    /// that they are compared on one GPU): with --device auto, on the group's GPU — where its
    /// first job went, or where a job of it was last sent with --device N.
    #[arg(long, value_name = "NAME")]
    gpu_group: Option<String>,
    /// The job's expected peak GPU memory in GiB: the daemon starts it only when that fits beside
    /// what runs on the device (default: what earlier runs of the command peaked at, else a
    /// quarter of the device's memory).
    #[arg(long, value_name = "GIB")]
    gpu_memory: Option<f64>,
    /// How long the job is expected to run, seconds. While the device's queue waits for a job to
    /// run alone (after an out-of-memory error beside siblings), a job expected to end before
    /// the running ones do starts beside them (backfill); without it, the job waits.
    #[arg(long, value_name = "SECONDS")]
    expected_s: Option<f64>,
    /// Put the timing calls of an unmodified Python script inside regions: each call of
    /// `triton.testing.do_bench` / `do_bench_cudagraph` and of `torch.utils.benchmark.Timer`'s
    /// measuring methods, and each CUDA-event interval (see docs/auto-regions.md).
    #[arg(long)]
    auto_regions: bool,
    /// The command and its arguments.
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

fn timeout_ms(seconds: Option<f64>) -> Result<Option<u64>> {
    match seconds {
        Some(t) if !(t > 0.0 && t.is_finite()) => bail!("--timeout must be a positive number of seconds"),
        Some(t) => Ok(Some((t * 1e3).ceil() as u64)),
        None => Ok(None),
    }
}

pub fn run(socket: &Path, a: RunArgs) -> Result<i32> {
    let gpu_memory_bytes = crate::job::gpu_memory_bytes(a.gpu_memory)?;
    let expected_ms = crate::job::expected_ms(a.expected_s)?;
    let c = Client::connect(socket)?;
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let spec = SubmitSpec {
        argv: a.command,
        cwd: cwd.display().to_string(),
        env: std::env::vars().collect(),
        device: a.device,
        policy: a.policy.map(Into::into),
        label: a.label,
        warm: a.warm,
        timeout_ms: timeout_ms(a.timeout)?,
        gpu_group: a.gpu_group,
        gpu_memory_bytes,
        auto_regions: a.auto_regions,
        own_process: false,
        expected_ms,
    };
    let grouped = spec.gpu_group.is_some();
    let job = c.submit(spec)?;
    if grouped && job.gpu_group.is_none() {
        eprintln!("kforge run: warning: the daemon ignored --gpu-group (a daemon older than GPU groups)");
    }
    let exit = job.stream_output(&mut std::io::stdout().lock(), &mut std::io::stderr())?;
    if let Some(r) = &exit.reason {
        eprintln!("kforge: job ended: {r}");
    }
    Ok(exit.shell_code())
}
