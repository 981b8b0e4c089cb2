//! A blocking client of the kforge daemon (used by the CLI, the demo and the benchmarks).

use kforge_proto::{ErrorCode, ProtoError, Reply, Request, PROTOCOL_VERSION};
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

    /// The underlying stream (e.g. to set timeouts).
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }
}
