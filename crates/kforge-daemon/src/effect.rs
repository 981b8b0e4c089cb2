//! What the state machine asks the rest of the daemon to do: the closed [`Effect`] enum and the
//! plain data effects carry. The server carries effects out in order; an effect whose outcome the
//! state machine needs (a spawned process, a hand-off) is answered with an [`Event`](crate::event::Event).
//!
//! A bottom module, like `event`: the state machine produces these, `server`, `store` and
//! `device_thread` consume them; it uses none of those modules.

use crate::event::ConnId;
use kforge_freeze::JobTarget;
use kforge_proto::Reply;
use kforge_store::{JobMemoryRow, JobRow, MeasurementRow, RegionHostRow, RegionRow};
use std::path::PathBuf;

/// Warm worker ids live in their own range of cgroup names (`job-<WORKER_CGROUP_BASE + id>`).
pub const WORKER_CGROUP_BASE: u64 = 1 << 40;

/// Which jobs a `region_time` request sums over (`Request::RegionTime`'s fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionTimeQuery {
    pub label: String,
    pub job: Option<u64>,
    pub since_ns: Option<i64>,
}

/// One thing to do. Every variant is carried out without blocking the state machine on a slow
/// step, except the spawns (a fork/exec) and the hand-off (one `sendmsg`).
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Send a reply on a connection.
    Send { conn: ConnId, reply: Reply },
    /// Flush what was sent on the connection, then close it.
    Close { conn: ConnId },
    /// Write to the store (the store thread applies writes in the order sent).
    Store(StoreWrite),
    /// Answer a `report` request: the store thread replies on the connection.
    Report { conn: ConnId, label: Option<String> },
    /// Answer a `region_time` request: the store thread replies on the connection.
    RegionTime { conn: ConnId, query: RegionTimeQuery },
    /// Ask a device's thread to enter or leave a region; answered by `RegionEntered` / `RegionLeft`.
    Step { device: usize, step: RegionStep },
    /// Start a job's process in its own cgroup; answered by `JobSpawned` or `JobSpawnFailed`.
    SpawnJob(JobLaunch),
    /// Start a warm worker process; answered by `WorkerSpawned` or `WorkerSpawnFailed`.
    SpawnWorker(WorkerLaunch),
    /// Hand a job to an idle warm worker; answered by `HandedToWorker`.
    HandToWorker(WarmLaunch),
    /// Kill a job's processes (thawing first); a failure is logged.
    KillJob(JobTarget),
    /// Kill a warm worker's processes (thawing first); it may be gone already.
    KillWorker(JobTarget),
    /// Remove the cgroup of an ended job or worker (by its cgroup id).
    RemoveCgroup { id: u64 },
    /// Rewrite the guardian's ledger: (id, process group) of every running job and worker.
    WriteLedger(Vec<(u64, i32)>),
    /// A line for the daemon's log (stderr).
    Log(String),
}

/// A write to the SQLite store.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreWrite {
    InsertJob(JobRow),
    JobStarted {
        id: u64,
        pid: u32,
        ns: i64,
    },
    JobEnded {
        id: u64,
        ns: i64,
        code: Option<i32>,
        signal: Option<i32>,
        reason: Option<String>,
    },
    InsertRegion(Box<RegionRow>),
    /// The region ended; `gpu` is (temperature °C, SM clock MHz) at release.
    RegionReleased {
        id: u64,
        ns: i64,
        revoked: bool,
        tainted: bool,
        gpu: Option<(u32, u32)>,
    },
    InsertMeasurement(MeasurementRow),
    /// A released region's host counters (`kforge_cores::host`).
    RegionHost(RegionHostRow),
    /// A job's GPU memory, when it ends.
    JobMemory(JobMemoryRow),
}

/// What a device thread does for the state machine.
#[derive(Debug, Clone, PartialEq)]
pub enum RegionStep {
    /// Close the gate, drain, freeze `targets`, settle, pin `tid` to `core`.
    Enter {
        region: u64,
        holder_pid: u32,
        tid: u32,
        /// Sibling jobs to freeze.
        targets: Vec<JobTarget>,
        /// Reserved core to pin the measuring thread to.
        core: Option<u32>,
        /// Process groups of every managed job and worker (for the taint check).
        managed_pgids: Vec<i32>,
        /// Participants an earlier drain timed out waiting for: not waited for while still
        /// behind on that drain (`Gate::wait_acks_skipping`).
        stragglers: Vec<kforge_gate::Straggler>,
    },
    /// Undo what entering did, in reverse.
    Leave { region: u64 },
}

/// A cold job to start.
#[derive(Debug, Clone, PartialEq)]
pub struct JobLaunch {
    pub job: u64,
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: Vec<(String, String)>,
    /// Cores the job may run on.
    pub cpus: Vec<u32>,
    /// The connection its output goes to (none: discarded).
    pub conn: Option<ConnId>,
}

/// A warm worker to start.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerLaunch {
    pub worker: u64,
    pub python: String,
    pub env: Vec<(String, String)>,
    pub cpus: Vec<u32>,
    /// Its stdout and stderr.
    pub log: PathBuf,
}

/// A warm job to hand to a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmLaunch {
    pub worker: u64,
    pub job: u64,
    /// The command line without the interpreter.
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: Vec<(String, String)>,
    /// The connection its output goes to (none: discarded).
    pub conn: Option<ConnId>,
}
