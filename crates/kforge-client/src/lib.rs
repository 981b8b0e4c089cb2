//! A blocking client of the kforge daemon (used by the CLI, the demo and the benchmarks), and
//! [`run_job`]: submit one command and stream its output — the one loop that reads a job's frames.

use kforge_proto::{b64, ErrorCode, JobExit, ProtoError, Reply, Request, Stream, SubmitSpec, PROTOCOL_VERSION};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

pub use kforge_proto::resolve_socket;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the kforge daemon at {path}: {source} (start one with `kforge daemon`, or point --socket / KFORGE_SOCKET at it)")]
    Connect { path: String, source: std::io::Error },
    #[error("daemon at {path}: {source}")]
    Protocol { path: String, source: ProtoError },
    #[error("daemon refused: {message} ({code:?})")]
    Daemon { code: ErrorCode, message: String },
    #[error("daemon sent an unexpected reply: {0}")]
    Unexpected(String),
    #[error("daemon sent undecodable output of job {job}")]
    UndecodableOutput { job: u64 },
    #[error("writing the job's {stream}: {source}")]
    Output { stream: &'static str, source: std::io::Error },
}

pub struct Client {
    stream: UnixStream,
    path: PathBuf,
    pub daemon_pid: u32,
}

impl Client {
    /// Connect and greet. Fails with a clear message when no daemon listens or versions differ.
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(path)
            .map_err(|source| ClientError::Connect { path: path.display().to_string(), source })?;
        let mut c = Client { stream, path: path.to_path_buf(), daemon_pid: 0 };
        c.send(&Request::Hello {
            protocol: PROTOCOL_VERSION,
            client: format!("kforge-rs/{}", env!("CARGO_PKG_VERSION")),
        })?;
        match c.recv()? {
            Reply::Welcome { daemon_pid, .. } => c.daemon_pid = daemon_pid,
            other => return Err(ClientError::Unexpected(format!("{other:?}"))),
        }
        Ok(c)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn send(&mut self, req: &Request) -> Result<(), ClientError> {
        kforge_proto::write_msg(&mut self.stream, req)
            .map_err(|source| ClientError::Protocol { path: self.path.display().to_string(), source })
    }

    /// Next reply; a daemon `error` reply becomes [`ClientError::Daemon`].
    pub fn recv(&mut self) -> Result<Reply, ClientError> {
        match kforge_proto::read_msg::<Reply, _>(&mut self.stream) {
            Ok(Reply::Error { code, message }) => Err(ClientError::Daemon { code, message }),
            Ok(r) => Ok(r),
            Err(source) => Err(ClientError::Protocol { path: self.path.display().to_string(), source }),
        }
    }

    /// Send a request and return the next reply.
    pub fn request(&mut self, req: &Request) -> Result<Reply, ClientError> {
        self.send(req)?;
        self.recv()
    }

    /// The daemon's store as JSON (`label`: only those jobs), one part per reply: each part's
    /// `report` (jobs, regions, measurements, job_memory), in order, until the last. Ask on a
    /// connection with nothing else in flight (the parts are the next replies on it); after an
    /// error the connection is closed by the daemon and not to be reused.
    pub fn report_parts(&mut self, label: Option<String>) -> Result<Vec<serde_json::Value>, ClientError> {
        self.send(&Request::Report { label })?;
        let mut parts = Vec::new();
        loop {
            match self.recv()? {
                Reply::Report { report, more } => {
                    parts.push(report);
                    if !more {
                        return Ok(parts);
                    }
                }
                other => return Err(ClientError::Unexpected(format!("{other:?}"))),
            }
        }
    }

    /// The underlying stream (e.g. to set timeouts).
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }
}

/// A job the daemon accepted: what it acknowledged, and the connection its output comes on.
pub struct SubmittedJob {
    client: Client,
    pub job: u64,
    pub device: String,
    /// The job's GPU group as the daemon echoed it (None from a daemon that does not know groups).
    pub gpu_group: Option<String>,
}

impl Client {
    /// Submit a job and wait for the daemon to queue it.
    pub fn submit(mut self, spec: SubmitSpec) -> Result<SubmittedJob, ClientError> {
        self.send(&Request::Submit(spec))?;
        match self.recv()? {
            Reply::JobQueued { job, device, gpu_group, .. } => {
                Ok(SubmittedJob { client: self, job, device, gpu_group })
            }
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }
}

impl SubmittedJob {
    /// Copy the job's output to `stdout` and `stderr` as it comes (each chunk written, then
    /// flushed) until the job ends; returns how it ended. A job the daemon runs again (alone,
    /// after a CUDA out-of-memory error beside other jobs: `job_retried`) gets a line on
    /// `stderr` saying so; the second run's output follows, and its exit is the one returned.
    pub fn stream_output(self, stdout: &mut dyn Write, stderr: &mut dyn Write) -> Result<JobExit, ClientError> {
        let exit = self.stream_output_with(stdout, stderr, &mut || true)?;
        exit.ok_or_else(|| ClientError::Unexpected("a job withdrawn without being asked to".into()))
    }

    /// `stream_output`, asking `started` each time the daemon starts the job (it may wait in the
    /// daemon's queue first; a job run again alone starts twice) whether it should still run:
    /// `false` withdraws it (the connection is closed, so the daemon cancels it) and returns
    /// `None`.
    pub fn stream_output_with(
        mut self,
        stdout: &mut dyn Write,
        stderr: &mut dyn Write,
        started: &mut dyn FnMut() -> bool,
    ) -> Result<Option<JobExit>, ClientError> {
        loop {
            match self.client.recv()? {
                Reply::JobStarted { .. } if !started() => return Ok(None),
                Reply::JobStarted { .. } => {}
                Reply::Output { stream, data, .. } => {
                    let bytes = b64::decode(&data).ok_or(ClientError::UndecodableOutput { job: self.job })?;
                    let written = match stream {
                        Stream::Stdout => write_chunk(stdout, &bytes).map_err(|e| ("stdout", e)),
                        Stream::Stderr => write_chunk(stderr, &bytes).map_err(|e| ("stderr", e)),
                    };
                    written.map_err(|(stream, source)| ClientError::Output { stream, source })?;
                }
                Reply::JobEnded { exit, .. } => return Ok(Some(exit)),
                Reply::JobRetried { job, reason } => {
                    let line = format!("kforge: job {job}: {reason}\n");
                    write_chunk(stderr, line.as_bytes())
                        .map_err(|source| ClientError::Output { stream: "stderr", source })?;
                }
                other => return Err(ClientError::Unexpected(format!("{other:?}"))),
            }
        }
    }
}

fn write_chunk(w: &mut dyn Write, bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(bytes)?;
    w.flush()
}

/// Run one command as a job of the daemon at `socket`: submit `spec`, copy its output to
/// `stdout` and `stderr` as it comes, and return how it ended.
pub fn run_job(
    socket: &Path,
    spec: SubmitSpec,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<JobExit, ClientError> {
    Client::connect(socket)?.submit(spec)?.stream_output(stdout, stderr)
}
