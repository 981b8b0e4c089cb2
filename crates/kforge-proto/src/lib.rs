//! The kforge wire protocol: length-prefixed JSON frames over a Unix stream socket.
//!
//! Every frame is a little-endian `u32` byte length followed by that many bytes of UTF-8 JSON.
//! Frames larger than [`MAX_FRAME`] are rejected before their body is read. The first request on
//! a connection must be [`Request::Hello`] carrying [`PROTOCOL_VERSION`]; the daemon answers
//! [`Reply::Welcome`] or an [`Reply::Error`] with [`ErrorCode::VersionMismatch`] and closes.
//!
//! This crate is the single source of truth for message shapes; `docs/protocol.md` documents them
//! for other clients (the Python package implements the same frames).

use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};

/// Version of the message set. Bumped on any incompatible change.
pub const PROTOCOL_VERSION: u32 = 3;
/// Largest accepted frame body, in bytes.
pub const MAX_FRAME: usize = 1 << 20;

/// The most bytes of rows a [`Reply::Report`] part carries: well inside [`MAX_FRAME`].
pub const REPORT_PART_BYTES: usize = 512 << 10;

/// Errors of framing and decoding.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    Oversized(usize),
    #[error("malformed message: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error("connection closed")]
    Closed,
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
}

/// Benchmark isolation policy of a job.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// No exclusivity at all: regions are recorded but granted at once.
    None,
    /// The job holds its device exclusively from start to exit.
    Command,
    /// Jobs run concurrently; only their timed regions are exclusive.
    Region,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::Command => "command",
            Policy::Region => "region",
        }
    }
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "none" => Some(Policy::None),
            "command" => Some(Policy::Command),
            "region" => Some(Policy::Region),
            _ => None,
        }
    }
}

/// What to run and where. `Default`: nothing to run, on no device, every option unset.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct SubmitSpec {
    /// Program and arguments; `argv[0]` is looked up on `PATH`.
    pub argv: Vec<String>,
    /// Working directory of the command.
    pub cwd: String,
    /// Complete environment of the command (the daemon adds the `KFORGE_*` variables).
    pub env: Vec<(String, String)>,
    /// `"auto"`, `"cpu"` or a GPU index such as `"0"`.
    pub device: String,
    /// Isolation policy; the daemon's default when absent.
    #[serde(default)]
    pub policy: Option<Policy>,
    /// Free-form label stored with the job (the demo uses it to group runs).
    #[serde(default)]
    pub label: Option<String>,
    /// Run this Python command in a warm worker of the device (no interpreter, torch or CUDA
    /// start-up).
    #[serde(default)]
    pub warm: bool,
    /// Kill the job (its process tree, or its warm worker) after this many milliseconds.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Jobs of one GPU group run on one GPU: a job for device `auto` goes where the group's first
    /// job went (that one: the least loaded GPU), so the candidates an agent compares are timed
    /// on the same GPU. A job sent to a GPU by name binds its group there.
    #[serde(default)]
    pub gpu_group: Option<String>,
    /// The job's expected peak GPU memory in bytes: the daemon starts it only when that fits
    /// beside what runs on the device. Absent: the most the last 8 runs of the same command (or
    /// label) peaked at, else a default (a quarter of the device's memory). See docs/protocol.md.
    #[serde(default)]
    pub gpu_memory_bytes: Option<u64>,
    /// `kforge run --auto-regions`: the job's Python processes enter regions around the timing
    /// calls of an unmodified script (`triton.testing.do_bench`, `torch.utils.benchmark.Timer`,
    /// CUDA-event intervals; `python/kforge/autoregions.py`). The daemon sets
    /// `KFORGE_AUTO_REGIONS=1` and prepends its bootstrap directory to `PYTHONPATH`, cold or
    /// warm alike. See docs/protocol.md and docs/auto-regions.md.
    #[serde(default)]
    pub auto_regions: bool,
    /// The command needs a process of its own (`kforge verify`'s runner patches the process it
    /// runs in): a warm worker runs it only in a child forked for it (`kforge daemon
    /// --worker-fork`). Under in-process warm workers it runs cold, and `warm` is refused.
    #[serde(default)]
    pub own_process: bool,
    /// How long the job is expected to run, in milliseconds, when the client knows (`kforge
    /// optimize`: what its kind of step took here before). Admission only: while a queue's head
    /// waits to run alone (after an out-of-memory error beside siblings), a later job that fits
    /// and is expected to end before the device's running jobs do starts beside them (backfill:
    /// it delays the head by nothing). Its length is this or, when longer, the longest of the
    /// last 8 runs of its command line the daemon saw. See docs/protocol.md, "GPU memory admission".
    #[serde(default)]
    pub expected_ms: Option<u64>,
}

/// A job whose peak GPU memory is neither declared nor learned is expected to peak at its
/// device's total memory divided by this (docs/protocol.md, "GPU memory admission").
pub const DEFAULT_GPU_MEMORY_SHARE: u64 = 4;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// First message of every connection.
    Hello { protocol: u32, client: String },
    /// Ask for a [`Reply::Status`].
    Status,
    /// Run a command; the connection then receives its queue/start/output/end messages.
    /// Closing the connection before `job_ended` cancels the job.
    Submit(SubmitSpec),
    /// Cancel a job (queued or running).
    Cancel { job: u64 },
    /// Ask for the exclusive region of a device. `job` names the calling job (from `KFORGE_JOB`);
    /// without it `device` must be given. `tid` is the measuring thread to pin.
    RegionEnter {
        #[serde(default)]
        job: Option<u64>,
        #[serde(default)]
        device: Option<String>,
        name: String,
        pid: u32,
        tid: u32,
        #[serde(default)]
        lease_ms: Option<u64>,
    },
    /// Leave a region previously granted on this connection.
    RegionExit { region: u64 },
    /// Record timing samples (milliseconds), optionally tied to a region.
    Measurement {
        #[serde(default)]
        region: Option<u64>,
        #[serde(default)]
        job: Option<u64>,
        name: String,
        samples_ms: Vec<f64>,
    },
    /// Dump the store as JSON (jobs, regions and measurements, optionally only jobs with a label).
    Report {
        #[serde(default)]
        label: Option<String>,
    },
    /// The region time of the jobs labelled `label` (only job `job`; only those queued at or
    /// after `since_ns`): a [`Reply::RegionTime`], small whatever the jobs recorded (a report of
    /// a long measuring job passes [`MAX_FRAME`]).
    RegionTime {
        label: String,
        #[serde(default)]
        job: Option<u64>,
        #[serde(default)]
        since_ns: Option<i64>,
    },
    /// Stop the daemon: running jobs are killed, queued jobs fail.
    Shutdown,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    VersionMismatch,
    Malformed,
    Oversized,
    OutOfOrder,
    BadRequest,
    NoSuchJob,
    NoSuchRegion,
    NoSuchDevice,
    SpawnFailed,
    ShuttingDown,
    Internal,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// How a job ended.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct JobExit {
    /// Exit code when it exited normally.
    pub code: Option<i32>,
    /// Signal number when it was killed by a signal.
    pub signal: Option<i32>,
    /// Why the daemon ended it, when it did (cancelled, shutdown, spawn failure).
    pub reason: Option<String>,
    /// The most GPU memory the job's processes used in the daemon's samples, when it sampled
    /// any (`kforge optimize` journals it per problem and step and declares it next time, so
    /// that a fresh daemon admits a resumed campaign's jobs by what they used, not by a
    /// default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_peak_bytes: Option<u64>,
}

impl JobExit {
    /// The exit status a shell would report: code, or 128 + signal, or 1 when unknown.
    pub fn shell_code(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            _ => 1,
        }
    }
}

/// The GPU's state read through NVML (temperature, SM clock, clock-throttle reason bits).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Default)]
pub struct GpuSample {
    pub temp_c: u32,
    pub sm_clock_mhz: u32,
    pub throttle_reasons: u64,
}

/// What entering a region took, step by step: the daemon's device thread measures it, a
/// [`Grant`] carries it to the client and the store keeps it per region (one type for all three;
/// flattened, so its fields stay flat in the JSON and keep their column names in SQLite).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Default)]
pub struct StepTimings {
    /// a. closing the device's gate.
    pub gate_ms: f64,
    /// b. waiting for managed processes to drain their GPU work and acknowledge.
    pub drain_ms: f64,
    pub drain_timed_out: bool,
    /// c. freezing sibling jobs.
    pub freeze_ms: f64,
    pub frozen_jobs: u32,
    /// Waiting for GPU power-cap / thermal throttling to clear (GPU devices).
    #[serde(default)]
    pub settle_ms: f64,
    #[serde(default)]
    pub settle_timed_out: bool,
    /// d. pinning the measuring thread to a reserved core.
    pub isolate_ms: f64,
}

/// What the daemon did to grant a region, with each step's duration.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Grant {
    pub region: u64,
    pub device: String,
    /// Whether the device is exclusively the holder's for the region: false under the `none`
    /// policy; true under `region` (the daemon made it so) and `command` (the job holds the device).
    pub exclusive: bool,
    pub wait_ms: f64,
    /// The steps of entering the region (flat on the wire: `gate_ms`, `drain_ms`, …).
    #[serde(flatten)]
    pub steps: StepTimings,
    /// The GPU when the region was granted (GPU devices).
    #[serde(default)]
    pub gpu: Option<GpuSample>,
    /// Reserved core the measuring thread was pinned to, if core isolation is on.
    pub core: Option<u32>,
    pub tainted: bool,
    pub lease_ms: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct DeviceStatus {
    pub name: String,
    pub kind: String,
    pub description: String,
    pub running: Vec<u64>,
    pub queued: Vec<u64>,
    pub region_holder: Option<RegionStatus>,
    pub region_queue: Vec<RegionStatus>,
    pub max_concurrent: usize,
    /// The warm worker pool of the device.
    #[serde(default)]
    pub pool: PoolStatus,
    /// GPU groups bound to this device (`SubmitSpec::gpu_group`).
    #[serde(default)]
    pub gpu_groups: usize,
    /// The device's memory as last sampled (None: no sample, so admission does not look at memory).
    #[serde(default)]
    pub memory: Option<DeviceMemoryStatus>,
    /// Gate participants a drain here timed out waiting for and that are still behind on it: the
    /// drains of later regions do not wait for them, and those regions are tainted.
    #[serde(default)]
    pub stragglers: Vec<StragglerStatus>,
}

/// A gate participant still behind on a drain that timed out waiting for it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct StragglerStatus {
    pub pid: u32,
    /// The region whose drain timed out waiting for it.
    pub since_region: u64,
    /// Drains since that did not wait for it.
    pub skipped: u32,
}

/// A device's memory as the daemon's admission sees it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct DeviceMemoryStatus {
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// Held back for jobs started but not yet at their expected peak (what admission subtracts
    /// from `free_bytes`).
    pub reserved_bytes: u64,
    /// Used by managed jobs and warm workers in the sample.
    pub managed_bytes: u64,
}

/// A job's GPU memory as admission sees it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct JobMemoryStatus {
    /// The expected peak admission counts with (None: not known yet — the device has no sample).
    pub expected_bytes: Option<u64>,
    /// Where the expected peak came from: `declared`, `learned` or `default`.
    pub source: String,
    /// The highest use seen in the samples while it ran.
    pub observed_peak_bytes: u64,
    /// This is the job's second run, alone on its device, after a CUDA out-of-memory error
    /// beside siblings.
    pub retried: bool,
}

/// A device's warm workers.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct PoolStatus {
    /// Target number of workers.
    pub size: usize,
    pub starting: usize,
    /// Warm and idle.
    pub warm: usize,
    pub busy: usize,
    /// Jobs served by workers of this pool.
    pub jobs_served: u64,
    /// Workers recycled, by reason (hygiene findings, job limits, crashes, time limits).
    pub recycled: std::collections::BTreeMap<String, u64>,
    /// Why the pool stopped starting workers, if it did.
    pub disabled: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RegionStatus {
    pub region: u64,
    pub name: String,
    pub job: Option<u64>,
    pub pid: u32,
    pub since_ms: f64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct JobStatus {
    pub job: u64,
    pub device: String,
    pub policy: Policy,
    pub state: String,
    pub pid: Option<u32>,
    pub argv: Vec<String>,
    pub frozen: bool,
    #[serde(default)]
    pub memory: Option<JobMemoryStatus>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct StatusReport {
    pub daemon_pid: u32,
    pub protocol: u32,
    pub socket: String,
    pub db: String,
    pub default_policy: Policy,
    pub freeze_mechanism: String,
    pub freeze_scope: String,
    pub isolation: String,
    /// The gate shim preloaded into GPU jobs, if any.
    #[serde(default)]
    pub gate_shim: Option<String>,
    pub reserved_cores: Vec<u32>,
    /// The reserved cores' SMT siblings, kept idle (no job shares a region core's physical core).
    #[serde(default)]
    pub idle_siblings: Vec<u32>,
    pub job_cores: Vec<u32>,
    pub devices: Vec<DeviceStatus>,
    pub jobs: Vec<JobStatus>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    Welcome {
        protocol: u32,
        daemon_pid: u32,
    },
    Error {
        code: ErrorCode,
        message: String,
    },
    Status(StatusReport),
    JobQueued {
        job: u64,
        device: String,
        policy: Policy,
        position: usize,
        /// The job's GPU group, echoed: a daemon that does not know groups leaves it out.
        #[serde(default)]
        gpu_group: Option<String>,
    },
    JobStarted {
        job: u64,
        pid: u32,
    },
    /// Output bytes, base64-encoded (standard alphabet, padded).
    Output {
        job: u64,
        stream: Stream,
        data: String,
    },
    JobEnded {
        job: u64,
        exit: JobExit,
    },
    /// The job's run failed with a CUDA out-of-memory error while sibling processes held memory
    /// on its device: it runs once more, alone. Its output and `job_started`/`job_ended` follow;
    /// the first run's exit is never reported as the job's.
    JobRetried {
        job: u64,
        reason: String,
    },
    RegionGranted(Grant),
    /// The region's lease ran out: its measurements are invalid. Sent unprompted.
    RegionRevoked {
        region: u64,
        reason: String,
    },
    RegionReleased {
        region: u64,
        valid: bool,
        revoked: bool,
        tainted: bool,
        held_ms: f64,
    },
    Recorded {
        measurement: u64,
        valid: bool,
    },
    /// One part of a report: `more` says another part follows on the connection (a report of a
    /// long campaign passes one frame's [`MAX_FRAME`]); the parts' rows, in order, are the report.
    Report {
        report: serde_json::Value,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        more: bool,
    },
    /// The jobs that matched, their released regions, and the seconds inside those regions.
    RegionTime {
        jobs: u64,
        regions: u64,
        seconds: f64,
    },
    Ok,
}

/// Encode one message as a frame (length prefix + JSON).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, ProtoError> {
    let body = serde_json::to_vec(msg)?;
    if body.len() > MAX_FRAME {
        return Err(ProtoError::Oversized(body.len()));
    }
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Write one message as a frame.
pub fn write_msg<T: Serialize, W: Write>(w: &mut W, msg: &T) -> Result<(), ProtoError> {
    let frame = encode(msg)?;
    w.write_all(&frame)?;
    w.flush()?;
    Ok(())
}

/// Read one frame body. `Closed` on a clean end of stream between frames.
pub fn read_frame<R: Read>(r: &mut R) -> Result<Vec<u8>, ProtoError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Err(ProtoError::Closed),
            Ok(0) => return Err(ProtoError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(ProtoError::Oversized(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(body)
}

/// Read and decode one message.
pub fn read_msg<T: for<'de> Deserialize<'de>, R: Read>(r: &mut R) -> Result<T, ProtoError> {
    let body = read_frame(r)?;
    decode(&body)
}

/// Decode a frame body.
pub fn decode<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ProtoError> {
    Ok(serde_json::from_slice(body)?)
}

/// Base64 helpers for [`Reply::Output`].
pub mod b64 {
    use base64::Engine;
    pub fn encode(data: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(data)
    }
    pub fn decode(s: &str) -> Option<Vec<u8>> {
        base64::engine::general_purpose::STANDARD.decode(s).ok()
    }
}

/// Where clients look for the daemon: `explicit`, else `$KFORGE_SOCKET`, else the default path
/// `$XDG_RUNTIME_DIR/kforge/kforge.sock`, else `/tmp/kforge-<uid>/kforge.sock`.
pub fn resolve_socket(explicit: Option<&std::path::Path>) -> std::path::PathBuf {
    if let Some(p) = explicit {
        return p.to_path_buf();
    }
    if let Some(p) = std::env::var_os("KFORGE_SOCKET").filter(|v| !v.is_empty()) {
        return p.into();
    }
    default_socket_path()
}

/// The default socket path (see [`resolve_socket`]).
pub fn default_socket_path() -> std::path::PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(d) => std::path::PathBuf::from(d).join("kforge").join("kforge.sock"),
        None => {
            // SAFETY: getuid has no preconditions and cannot fail.
            let uid = unsafe { libc_getuid() };
            std::path::PathBuf::from(format!("/tmp/kforge-{uid}")).join("kforge.sock")
        }
    }
}

extern "C" {
    #[link_name = "getuid"]
    fn libc_getuid() -> u32;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_grants_step_timings_are_flat_on_the_wire() {
        let steps = StepTimings {
            gate_ms: 0.25,
            drain_ms: 2.0,
            drain_timed_out: true,
            freeze_ms: 0.5,
            frozen_jobs: 2,
            settle_ms: 3.0,
            settle_timed_out: false,
            isolate_ms: 0.125,
        };
        let g = Grant {
            region: 3,
            device: "0".into(),
            exclusive: true,
            wait_ms: 1.5,
            steps,
            gpu: None,
            core: Some(1),
            tainted: false,
            lease_ms: 60_000,
        };
        let v = serde_json::to_value(Reply::RegionGranted(g.clone())).unwrap();
        assert_eq!(v["type"], "region_granted");
        assert_eq!(v["gate_ms"], 0.25);
        assert_eq!(v["frozen_jobs"], 2);
        assert_eq!(v["drain_timed_out"], true);
        assert!(v.get("steps").is_none(), "{v}");
        assert_eq!(serde_json::from_value::<Reply>(v.clone()).unwrap(), Reply::RegionGranted(g));
        // A grant without the settle fields (an older daemon's) still reads.
        let mut old = v;
        old.as_object_mut().unwrap().retain(|k, _| !k.starts_with("settle"));
        let Reply::RegionGranted(read) = serde_json::from_value::<Reply>(old).unwrap() else { panic!() };
        assert_eq!(read.steps, StepTimings { settle_ms: 0.0, ..steps });
    }

    #[test]
    fn hello_round_trips() {
        let m = Request::Hello { protocol: PROTOCOL_VERSION, client: "t".into() };
        let f = encode(&m).unwrap();
        let back: Request = read_msg(&mut &f[..]).unwrap();
        assert_eq!(back, m);
        assert_eq!(&f[..4], &((f.len() - 4) as u32).to_le_bytes());
    }

    #[test]
    fn json_shape_is_tagged() {
        let v = serde_json::to_value(Request::RegionExit { region: 7 }).unwrap();
        assert_eq!(v, serde_json::json!({"type": "region_exit", "region": 7}));
        let r: Request = decode(br#"{"type":"region_enter","name":"x","pid":1,"tid":2}"#).unwrap();
        assert!(matches!(r, Request::RegionEnter { job: None, lease_ms: None, .. }));
    }

    #[test]
    fn oversized_length_is_rejected_before_reading_body() {
        let mut f = ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec();
        f.extend_from_slice(b"{}");
        assert!(matches!(read_frame(&mut &f[..]), Err(ProtoError::Oversized(_))));
    }

    #[test]
    fn truncated_frame_is_an_error_not_closed() {
        let f = encode(&Request::Status).unwrap();
        let cut = &f[..f.len() - 1];
        assert!(matches!(read_frame(&mut &cut[..]), Err(ProtoError::Io(_))));
        assert!(matches!(read_frame(&mut &f[..2]), Err(ProtoError::Io(_))));
        assert!(matches!(read_frame(&mut &[][..]), Err(ProtoError::Closed)));
    }

    #[test]
    fn unknown_type_is_malformed() {
        assert!(matches!(decode::<Request>(br#"{"type":"nope"}"#), Err(ProtoError::Malformed(_))));
        assert!(matches!(decode::<Request>(b"\xff\xfe"), Err(ProtoError::Malformed(_))));
    }

    #[test]
    fn memory_fields_are_optional_on_the_wire() {
        // A submit from a client older than memory admission still reads.
        let r: Request = decode(br#"{"type":"submit","argv":["x"],"cwd":"/","env":[],"device":"auto"}"#).unwrap();
        let Request::Submit(spec) = r else { panic!("{r:?}") };
        assert_eq!(spec.gpu_memory_bytes, None);
        assert!(!spec.auto_regions, "a submit without the field asks for no automatic regions");
        let v = serde_json::to_value(Reply::JobRetried { job: 4, reason: "oom".into() }).unwrap();
        assert_eq!(v, serde_json::json!({"type": "job_retried", "job": 4, "reason": "oom"}));
        let j: JobStatus = serde_json::from_value(serde_json::json!({"job": 1, "device": "0", "policy": "region",
            "state": "queued", "pid": null, "argv": ["x"], "frozen": false}))
        .unwrap();
        assert_eq!(j.memory, None);
    }

    #[test]
    fn shell_code() {
        assert_eq!(JobExit { code: Some(3), ..JobExit::default() }.shell_code(), 3);
        assert_eq!(JobExit { signal: Some(9), ..JobExit::default() }.shell_code(), 137);
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let mut cur = &bytes[..];
            // Read frames until error; must terminate without panicking.
            for _ in 0..64 {
                match read_msg::<Request, _>(&mut cur) {
                    Ok(_) => continue,
                    Err(_) => break,
                }
            }
        }

        #[test]
        fn garbage_bodies_decode_to_error_or_valid(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(m) = decode::<Request>(&body) {
                // Anything accepted must re-encode and decode to the same message.
                let f = encode(&m).unwrap();
                prop_assert_eq!(read_msg::<Request, _>(&mut &f[..]).unwrap(), m);
            }
        }

        #[test]
        fn submit_round_trips(argv in proptest::collection::vec(".{0,20}", 1..5), dev in "[a-z0-9]{1,5}") {
            let m = Request::Submit(SubmitSpec { argv, cwd: "/".into(), env: vec![("A".into(), "b".into())], device: dev, policy: Some(Policy::Region), label: None, warm: false, timeout_ms: Some(5), gpu_group: Some("matmul/g1".into()), gpu_memory_bytes: Some(1 << 30), auto_regions: true, own_process: true, expected_ms: Some(7) });
            let f = encode(&m).unwrap();
            prop_assert_eq!(read_msg::<Request, _>(&mut &f[..]).unwrap(), m);
        }
    }
}
