//! What arrives at the daemon's event loop: the closed [`Event`] enum the state machine handles
//! and the plain data events carry.
//!
//! A bottom module: the state machine and the threads that report to it (`server`, `jobs`, `warm`,
//! `device_thread`) all use it; it uses none of them.

use kforge_cores::host::HostDelta;
use kforge_proto::{ErrorCode, GpuSample, Reply, Request, StepTimings};
use serde::Deserialize;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::time::Instant;

pub type ConnId = u64;

/// What took the cpu from a region's measuring thread while the region was held: the counters'
/// growth on `cpu`, the core it was pinned to (`None`: not pinned, all cpus counted).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RegionHost {
    pub cpu: Option<u32>,
    pub delta: HostDelta,
}

/// What a connection's writer thread sends.
// `Close` is sent once per connection; boxing every reply instead would allocate per message.
#[allow(clippy::large_enum_variant)]
pub enum Outgoing {
    Msg(Reply),
    /// Flush what came before, then close the connection.
    Close,
}

/// What the event loop receives: a new connection (its writer channel and socket stay with the
/// server, which carries out effects on it) or an event for the state machine.
pub enum Inbound {
    Connected { conn: ConnId, tx: Sender<Outgoing>, stream: UnixStream },
    Event(Event),
}

impl From<Event> for Inbound {
    fn from(e: Event) -> Inbound {
        Inbound::Event(e)
    }
}

/// The moment an event is handled: a monotonic instant (leases, waits) and the wall clock in
/// nanoseconds since the Unix epoch (what the store records). The state machine reads no clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub at: Instant,
    pub unix_ns: i64,
}

impl Now {
    pub fn current() -> Now {
        Now { at: Instant::now(), unix_ns: crate::now_ns() }
    }
}

/// Everything that can happen to the daemon's state machine.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A client connected (the server keeps its socket).
    Connected {
        conn: ConnId,
    },
    Request {
        conn: ConnId,
        req: Request,
    },
    /// A frame that could not be decoded; the reader has stopped.
    BadFrame {
        conn: ConnId,
        code: ErrorCode,
        message: String,
    },
    /// The connection's reader ended: the client is gone.
    Hangup {
        conn: ConnId,
    },
    /// A job's process started (`Effect::SpawnJob` carried out).
    JobSpawned {
        job: u64,
        pid: u32,
        cgroup: Option<PathBuf>,
    },
    /// A job's process could not be started.
    JobSpawnFailed {
        job: u64,
        error: String,
    },
    /// A cold job's process ended and all its output was sent. `oom`: its stderr said CUDA ran
    /// out of memory ([`crate::memory::OOM_MARKERS`]).
    JobExited {
        job: u64,
        code: Option<i32>,
        signal: Option<i32>,
        oom: bool,
    },
    /// The device thread entered the region (`RegionStep::Enter` done).
    RegionEntered {
        region: u64,
        report: EnterReport,
    },
    /// The device thread left the region (`RegionStep::Leave` done): the GPU at that moment, and
    /// what took the cpu from the measuring thread while the region was held.
    RegionLeft {
        region: u64,
        gpu: Option<GpuSample>,
        host: Option<RegionHost>,
    },
    /// A warm worker process started (`Effect::SpawnWorker` carried out).
    WorkerSpawned {
        worker: u64,
        pid: u32,
        cgroup: Option<PathBuf>,
    },
    /// A warm worker process could not be started.
    WorkerSpawnFailed {
        worker: u64,
        error: String,
    },
    /// A job was handed to a warm worker (`Effect::HandToWorker` carried out), or could not be.
    HandedToWorker {
        worker: u64,
        job: u64,
        result: Result<(), String>,
    },
    /// A warm worker said something.
    Worker {
        worker: u64,
        msg: WorkerMsg,
    },
    /// A warm worker process ended.
    WorkerExited {
        worker: u64,
        code: Option<i32>,
        signal: Option<i32>,
    },
    /// Both output pipes of a warm job are closed; `oom` as for [`Event::JobExited`].
    WarmOutputClosed {
        job: u64,
        oom: bool,
    },
    /// A device's memory was sampled (NVML, or the `--debug-gpu-memory` file).
    GpuMemory {
        device: usize,
        sample: MemorySample,
    },
    /// A deadline may have passed (a lease, a job's time limit).
    Tick,
    /// Stop (a signal, or a `shutdown` request).
    Shutdown,
}

/// A device's memory at one moment, and what each process on it uses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemorySample {
    pub total: u64,
    pub free: u64,
    pub processes: Vec<ProcessMemory>,
}

impl MemorySample {
    /// What the processes of one process group (a managed job or worker) use, bytes.
    pub fn used_by(&self, pgid: i32) -> u64 {
        self.processes.iter().filter(|p| p.pgid == Some(pgid)).map(|p| p.used).sum()
    }
}

/// GPU memory one process uses; `pgid` is its process group (a managed job's or worker's pid),
/// None when this pid namespace cannot see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory {
    pub pid: u32,
    pub pgid: Option<i32>,
    pub used: u64,
}

/// Messages a warm worker sends (`python/kforge/worker.py`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerMsg {
    Ready {
        pid: u32,
        #[serde(default)]
        preloaded: Vec<String>,
        #[serde(default)]
        cuda: bool,
        #[serde(default)]
        startup_ms: f64,
        #[serde(default)]
        error: Option<String>,
    },
    Done {
        job: u64,
        exit_code: i32,
        /// A forked job's child killed by this signal (`exit_code` is then 128 + it).
        #[serde(default)]
        signal: Option<i32>,
        #[serde(default)]
        recycle: Vec<String>,
    },
}

/// A gate participant that had not acknowledged a drain when it timed out, as `/proc` had it
/// then (`pgid` None and `command` empty when it was gone).
#[derive(Debug, Clone, PartialEq)]
pub struct PendingProcess {
    pub pid: u32,
    /// Its process group: its job's, when a job's process (or a child of it) holds the slot.
    pub pgid: Option<u32>,
    pub command: String,
}

/// What entering a region took and found (the device thread's report).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnterReport {
    /// How long each step took.
    pub timings: StepTimings,
    /// Processes that had not acknowledged the drain when it timed out.
    pub pending: Vec<PendingProcess>,
    /// The drain's epoch (None: no gate, or draining is off).
    pub drain_epoch: Option<u64>,
    /// Stragglers the drain did not wait for: still behind on the earlier drain that timed out
    /// waiting for them.
    pub skipped: Vec<u32>,
    pub freeze_errors: Vec<String>,
    /// The measuring thread was pinned to the region's reserved core.
    pub pinned: bool,
    /// The GPU when the region is handed over (after the settle step).
    pub gpu: Option<GpuSample>,
    /// A process kforge does not manage uses the GPU (NVML): the region cannot be exclusive.
    pub tainted: bool,
    pub unmanaged_pids: Vec<u32>,
}
