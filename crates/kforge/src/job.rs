//! Running one command as a job of the kforge daemon and streaming its output here — what
//! `kforge run` does, as a function for commands (`verify --daemon`, `inspect --daemon`) whose
//! own helper process should be managed like any benchmark job.

use anyhow::{bail, Context, Result};
use kforge_proto::{b64, JobExit, Reply, Request, Stream, SubmitSpec};
use std::io::Write;
use std::path::Path;

/// Submit `argv` on `device` (`auto`, `cpu` or a GPU index) with the caller's environment
/// (minus PYTHONPATH: the daemon puts its own Python package there), stream stdout and stderr
/// through, and return the exit with everything the job wrote on stderr.
pub fn run_as_job(
    socket: &Path,
    argv: Vec<String>,
    device: &str,
    label: &str,
    timeout_s: Option<u64>,
) -> Result<(JobExit, String)> {
    let mut c =
        kforge_client::Client::connect(socket).with_context(|| format!("no kforge daemon on {}", socket.display()))?;
    let spec = SubmitSpec {
        argv,
        cwd: std::env::current_dir().context("reading the current directory")?.display().to_string(),
        env: std::env::vars().filter(|(k, _)| k != "PYTHONPATH").collect(),
        device: device.to_string(),
        policy: None,
        label: Some(label.to_string()),
        warm: false,
        timeout_ms: timeout_s.map(|s| s.saturating_mul(1000)),
        gpu_group: None,
    };
    c.send(&Request::Submit(spec)).context("submitting the job")?;
    let mut err_text = String::new();
    let mut out = std::io::stdout();
    loop {
        match c.recv().context("waiting for the job")? {
            Reply::JobQueued { .. } | Reply::JobStarted { .. } => {}
            Reply::Output { stream, data, .. } => {
                let bytes = b64::decode(&data).context("daemon sent undecodable output")?;
                match stream {
                    Stream::Stdout => {
                        out.write_all(&bytes).context("writing stdout")?;
                        out.flush().context("flushing stdout")?;
                    }
                    Stream::Stderr => {
                        let text = String::from_utf8_lossy(&bytes);
                        eprint!("{text}");
                        err_text.push_str(&text);
                    }
                }
            }
            Reply::JobEnded { exit, .. } => return Ok((exit, err_text)),
            other => bail!("unexpected reply while running the job: {other:?}"),
        }
    }
}
