//! The kforge daemon: runs benchmark commands as managed jobs and grants exclusive regions.
//!
//! Structure (see ARCHITECTURE.md): [`server`] accepts connections and turns frames into
//! [`event::Event`]s; one thread runs the [`state::Daemon`] state machine over those events and
//! is the only place that changes job and region state; the machine answers each event with
//! [`effect::Effect`]s, which the server carries out; [`device_thread`]s (one per device) carry
//! out the slow steps of entering and leaving a region (gate, drain, freeze, isolate) and report
//! back as events; [`jobs`] spawns commands and pumps their output; [`warm`] runs the warm worker
//! processes; [`store`] is the single writer of the SQLite file; [`guardian`] makes sure nothing
//! stays frozen if the daemon dies. `event` and `effect` are the bottom: plain data, used by the
//! machine and by the process code alike; the machine uses none of the process code.

pub mod config;
pub mod device_thread;
pub mod devices;
pub mod effect;
pub mod event;
pub mod executor;
pub mod guardian;
pub mod jobs;
pub mod memory;
pub mod placement;
pub mod server;
pub mod signals;
pub mod state;
pub mod store;
pub mod warm;

pub use config::{Config, FreezeScope};
pub use devices::GpuSelection;
pub use server::{run, DaemonHandle};

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("{what} {path}: {source}")]
    Io { what: &'static str, path: String, source: std::io::Error },
    #[error("a daemon already listens at {0}")]
    AlreadyRunning(String),
    #[error(transparent)]
    Store(#[from] kforge_store::StoreError),
    #[error(transparent)]
    Freeze(#[from] kforge_freeze::FreezeError),
    #[error(transparent)]
    Gate(#[from] kforge_gate::GateError),
    #[error("the embedded Python package: {0}")]
    Python(#[from] kforge_python::WriteError),
}

impl DaemonError {
    pub fn io(what: &'static str, path: impl AsRef<std::path::Path>, source: std::io::Error) -> DaemonError {
        DaemonError::Io { what, path: path.as_ref().display().to_string(), source }
    }
}

/// Wall-clock time in nanoseconds since the Unix epoch (what the store records).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}
