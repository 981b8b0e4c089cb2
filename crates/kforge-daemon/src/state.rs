//! The daemon's state machine. One thread owns [`Daemon`] and feeds it [`Event`]s; it is the only
//! code that changes job, region and connection state. Side effects that take time (starting a
//! process, freezing, draining, SQLite writes) are handed to other threads, which answer with
//! events.

use crate::config::{Config, FreezeScope};
use crate::devices::{DeviceInfo, DeviceKind};
use crate::guardian::Ledger;
use crate::jobs::{self, SpawnSpec};
use crate::now_ns;
use crate::placement::{self, Placement};
use crate::store::{StoreHandle, StoreOp};
use crate::warm::{self, WorkerMsg, WorkerSpawn, WORKER_CGROUP_BASE};
use crate::device_thread::{EnterSteps, RegionStep};
use kforge_freeze::{Freezer, JobTarget};
use kforge_proto::{
    DeviceStatus, ErrorCode, Grant, JobExit, JobStatus, Policy, PoolStatus, RegionStatus, Reply, Request, StatusReport,
    SubmitSpec, PROTOCOL_VERSION,
};
use kforge_store::{JobRow, MeasurementRow, RegionRow};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub type ConnId = u64;

/// What a connection's writer thread sends.
// `Close` is sent once per connection; boxing every reply instead would allocate per message.
#[allow(clippy::large_enum_variant)]
pub enum Outgoing {
    Msg(Reply),
    /// Flush what came before, then close the connection.
    Close,
}

/// Everything that can happen to the daemon.
pub enum Event {
    Connected {
        conn: ConnId,
        tx: Sender<Outgoing>,
        stream: UnixStream,
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
    Hangup {
        conn: ConnId,
    },
    JobExited {
        job: u64,
        code: Option<i32>,
        signal: Option<i32>,
    },
    RegionReady {
        region: u64,
        steps: EnterSteps,
    },
    RegionLeft {
        region: u64,
        gpu: Option<kforge_proto::GpuSample>,
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
    /// Both output pipes of a warm job are closed.
    WarmOutputClosed {
        job: u64,
    },
    /// Stop (a signal, or a `shutdown` request).
    Shutdown,
}

struct Conn {
    tx: Sender<Outgoing>,
    stream: UnixStream,
    greeted: bool,
    /// Jobs submitted on this connection: cancelled if it goes away.
    jobs: BTreeSet<u64>,
    /// The region this connection holds or waits for.
    region: Option<u64>,
    /// Regions revoked and already left before the client asked to exit them.
    revoked_left: BTreeSet<u64>,
}

enum JobState {
    Queued,
    Running { pid: u32, cgroup: Option<PathBuf> },
}

struct Job {
    id: u64,
    device: usize,
    policy: Policy,
    spec: SubmitSpec,
    conn: Option<ConnId>,
    state: JobState,
    cancel_reason: Option<String>,
    /// What a warm worker runs (the command line without the interpreter); None = cold.
    warm_argv: Option<Vec<String>>,
    /// The warm worker running the job.
    worker: Option<u64>,
    /// Kill the job at this moment (time limit).
    deadline: Option<Instant>,
    /// Exit code a warm worker reported.
    warm_exit: Option<i32>,
    warm_output_closed: bool,
}

impl Job {
    fn target(&self) -> Option<JobTarget> {
        match &self.state {
            JobState::Running { pid, cgroup } => {
                Some(JobTarget { job: self.id, pgid: *pid as i32, cgroup: cgroup.clone() })
            }
            JobState::Queued => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RegionState {
    Queued,
    Entering,
    Held,
    Leaving,
}

struct Region {
    id: u64,
    conn: ConnId,
    job: Option<u64>,
    device: usize,
    name: String,
    pid: u32,
    tid: u32,
    policy: Policy,
    lease: Duration,
    requested: Instant,
    requested_ns: i64,
    granted: Option<Instant>,
    deadline: Option<Instant>,
    state: RegionState,
    core: Option<u32>,
    /// The connection went away while entering: leave as soon as entered.
    abandoned: bool,
    /// The client asked to exit (it waits for `region_released`).
    exit_requested: bool,
    /// Jobs this region froze (what `status` reports as frozen).
    frozen: Vec<u64>,
    revoked: bool,
    tainted: bool,
}

struct Device {
    info: DeviceInfo,
    max_concurrent: usize,
    running: BTreeSet<u64>,
    queue: VecDeque<u64>,
    command_holder: Option<u64>,
    /// The device thread, which enters and leaves regions.
    steps: Sender<RegionStep>,
    gate_path: Option<PathBuf>,
    pool: PoolStatus,
    /// Workers that died before becoming ready, in a row.
    pool_start_failures: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WorkerState {
    Starting,
    Idle,
    Busy(u64),
    /// Asked to go (recycled); its exit is expected.
    Stopping,
}

struct WarmWorker {
    id: u64,
    device: usize,
    pid: u32,
    control: Arc<std::os::fd::OwnedFd>,
    cgroup: Option<PathBuf>,
    state: WorkerState,
}

impl WarmWorker {
    fn target(&self) -> JobTarget {
        JobTarget { job: WORKER_CGROUP_BASE + self.id, pgid: self.pid as i32, cgroup: self.cgroup.clone() }
    }
}

/// Exclusive regions queue per device, or one queue for the node under `--freeze node`.
#[derive(Default)]
struct RegionLine {
    holder: Option<u64>,
    waiting: VecDeque<u64>,
}

pub struct Daemon {
    cfg: Config,
    freezer: Arc<Freezer>,
    store: StoreHandle,
    ledger: Ledger,
    events: Sender<Event>,
    python_dir: PathBuf,
    devices: Vec<Device>,
    lines: Vec<RegionLine>,
    conns: HashMap<ConnId, Conn>,
    jobs: BTreeMap<u64, Job>,
    regions: BTreeMap<u64, Region>,
    /// Regions already released: id → revoked (for measurements reported after release).
    finished_regions: HashMap<u64, bool>,
    reserved_cores: Vec<u32>,
    job_cores: Vec<u32>,
    busy_cores: BTreeSet<u32>,
    workers: BTreeMap<u64, WarmWorker>,
    next_job: u64,
    next_region: u64,
    next_measurement: u64,
    next_worker: u64,
    /// GPU groups and the GPU each was placed on (`SubmitSpec::gpu_group`).
    placement: Placement,
    stopping: bool,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub struct DaemonParts {
    pub cfg: Config,
    pub freezer: Arc<Freezer>,
    pub store: StoreHandle,
    pub ledger: Ledger,
    pub events: Sender<Event>,
    pub python_dir: PathBuf,
    pub devices: Vec<(DeviceInfo, Sender<RegionStep>, Option<PathBuf>)>,
    pub reserved_cores: Vec<u32>,
    pub job_cores: Vec<u32>,
    pub first_ids: (u64, u64, u64),
}

impl Daemon {
    pub fn new(p: DaemonParts) -> Daemon {
        let scope = p.cfg.freeze_scope;
        let ndev = p.devices.len();
        let devices: Vec<Device> = p
            .devices
            .into_iter()
            .map(|(info, steps, gate_path)| {
                let max_concurrent = p.cfg.max_concurrent.unwrap_or(match info.kind {
                    DeviceKind::Cpu => p.job_cores.len().max(1) * 2,
                    DeviceKind::Gpu => 4,
                });
                let size = p.cfg.warm_workers.unwrap_or(match info.kind {
                    DeviceKind::Cpu => 0,
                    DeviceKind::Gpu => max_concurrent,
                });
                let pool = PoolStatus { size, ..Default::default() };
                Device {
                    info,
                    max_concurrent,
                    running: BTreeSet::new(),
                    queue: VecDeque::new(),
                    command_holder: None,
                    steps,
                    gate_path,
                    pool,
                    pool_start_failures: 0,
                }
            })
            .collect();
        let nlines = if scope == FreezeScope::Node { 1 } else { ndev };
        Daemon {
            cfg: p.cfg,
            freezer: p.freezer,
            store: p.store,
            ledger: p.ledger,
            events: p.events,
            python_dir: p.python_dir,
            devices,
            lines: (0..nlines).map(|_| RegionLine::default()).collect(),
            conns: HashMap::new(),
            jobs: BTreeMap::new(),
            regions: BTreeMap::new(),
            finished_regions: HashMap::new(),
            reserved_cores: p.reserved_cores,
            job_cores: p.job_cores,
            busy_cores: BTreeSet::new(),
            workers: BTreeMap::new(),
            next_worker: 1,
            placement: Placement::default(),
            next_job: p.first_ids.0 + 1,
            next_region: p.first_ids.1 + 1,
            next_measurement: p.first_ids.2 + 1,
            stopping: false,
        }
    }

    pub fn stopping(&self) -> bool {
        self.stopping
    }

    /// Nothing left to wait for after a shutdown began.
    pub fn quiescent(&self) -> bool {
        self.jobs.is_empty() && self.regions.values().all(|r| r.state == RegionState::Queued)
    }

    pub fn store(self) -> StoreHandle {
        self.store
    }

    /// The earliest lease deadline, for the event loop's timeout.
    pub fn next_deadline(&self) -> Option<Instant> {
        let leases = self.regions.values().filter(|r| r.state == RegionState::Held).filter_map(|r| r.deadline);
        let limits = self.jobs.values().filter(|j| j.cancel_reason.is_none()).filter_map(|j| j.deadline);
        leases.chain(limits).min()
    }

    /// Start the warm worker pools (at daemon start).
    pub fn fill_pools(&mut self) {
        for d in 0..self.devices.len() {
            self.fill_pool(d);
        }
    }

    fn line_of(&self, device: usize) -> usize {
        if self.cfg.freeze_scope == FreezeScope::Node {
            0
        } else {
            device
        }
    }

    fn send(&self, conn: ConnId, msg: Reply) {
        if let Some(c) = self.conns.get(&conn) {
            let _ = c.tx.send(Outgoing::Msg(msg));
        }
    }

    /// Reply with an error and close the connection (every error closes: see docs/protocol.md).
    fn fail(&mut self, conn: ConnId, code: ErrorCode, message: String) {
        if let Some(c) = self.conns.get(&conn) {
            let _ = c.tx.send(Outgoing::Msg(Reply::Error { code, message }));
            let _ = c.tx.send(Outgoing::Close);
        }
    }

    pub fn handle(&mut self, ev: Event) {
        match ev {
            Event::Connected { conn, tx, stream } => {
                if self.stopping {
                    let _ = tx.send(Outgoing::Msg(Reply::Error {
                        code: ErrorCode::ShuttingDown,
                        message: "the daemon is shutting down".into(),
                    }));
                    let _ = tx.send(Outgoing::Close);
                    return;
                }
                self.conns.insert(
                    conn,
                    Conn {
                        tx,
                        stream,
                        greeted: false,
                        jobs: BTreeSet::new(),
                        region: None,
                        revoked_left: BTreeSet::new(),
                    },
                );
            }
            Event::Request { conn, req } => self.on_request(conn, req),
            Event::BadFrame { conn, code, message } => self.fail(conn, code, message),
            Event::Hangup { conn } => self.on_hangup(conn),
            Event::JobExited { job, code, signal } => self.on_job_exited(job, code, signal),
            Event::RegionReady { region, steps } => self.on_region_ready(region, steps),
            Event::RegionLeft { region, gpu } => self.on_region_left(region, gpu),
            Event::Worker { worker, msg } => self.on_worker_msg(worker, msg),
            Event::WorkerExited { worker, code, signal } => self.on_worker_exited(worker, code, signal),
            Event::WarmOutputClosed { job } => {
                if let Some(j) = self.jobs.get_mut(&job) {
                    j.warm_output_closed = true;
                }
                self.maybe_finish_warm(job);
            }
            Event::Shutdown => self.begin_shutdown(),
        }
    }

    /// Revoke regions whose lease ran out.
    pub fn on_tick(&mut self, now: Instant) {
        let overdue: Vec<(u64, Option<u64>)> = self
            .jobs
            .values()
            .filter(|j| j.cancel_reason.is_none() && j.deadline.is_some_and(|d| d <= now))
            .map(|j| (j.id, j.spec.timeout_ms.or(self.cfg.job_timeout.map(|t| t.as_millis() as u64))))
            .collect();
        for (id, ms) in overdue {
            let limit = ms.map(|m| format!("{:.3} s", m as f64 / 1e3)).unwrap_or_default();
            self.cancel_job(id, &format!("time limit of {limit} exceeded"));
        }
        let expired: Vec<u64> = self
            .regions
            .values()
            .filter(|r| r.state == RegionState::Held && r.deadline.is_some_and(|d| d <= now))
            .map(|r| r.id)
            .collect();
        for id in expired {
            let (conn, lease) = {
                let r = self.regions.get_mut(&id).expect("expired region exists");
                r.revoked = true;
                (r.conn, r.lease)
            };
            self.send(
                conn,
                Reply::RegionRevoked {
                    region: id,
                    reason: format!("lease of {} ms ran out; its measurements are invalid", lease.as_millis()),
                },
            );
            self.start_leave(id);
        }
    }

    fn on_request(&mut self, conn: ConnId, req: Request) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        if !c.greeted {
            match req {
                Request::Hello { protocol, client: _ } if protocol == PROTOCOL_VERSION => {
                    c.greeted = true;
                    let _ = c.tx.send(Outgoing::Msg(Reply::Welcome { protocol: PROTOCOL_VERSION, daemon_pid: std::process::id() }));
                }
                Request::Hello { protocol, .. } => self.fail(
                    conn,
                    ErrorCode::VersionMismatch,
                    format!("client speaks protocol {protocol}, this daemon speaks {PROTOCOL_VERSION}: upgrade the older side"),
                ),
                _ => self.fail(conn, ErrorCode::OutOfOrder, "the first message must be hello".into()),
            }
            return;
        }
        match req {
            Request::Hello { .. } => {
                self.fail(conn, ErrorCode::OutOfOrder, "hello was already sent on this connection".into())
            }
            Request::Status => {
                let s = self.status();
                self.send(conn, Reply::Status(s));
            }
            Request::Submit(spec) => self.on_submit(conn, spec),
            Request::Cancel { job } => {
                if self.jobs.contains_key(&job) {
                    self.cancel_job(job, "cancelled");
                    self.send(conn, Reply::Ok);
                } else {
                    self.fail(conn, ErrorCode::NoSuchJob, format!("no job {job} is queued or running"));
                }
            }
            Request::RegionEnter { job, device, name, pid, tid, lease_ms } => {
                self.on_region_enter(conn, job, device, name, pid, tid, lease_ms)
            }
            Request::RegionExit { region } => self.on_region_exit(conn, region),
            Request::Measurement { region, job, name, samples_ms } => {
                if samples_ms.iter().any(|s| !s.is_finite()) {
                    return self.fail(
                        conn,
                        ErrorCode::BadRequest,
                        format!("measurement {name:?}: samples must be finite numbers"),
                    );
                }
                let valid = match region {
                    None => true,
                    Some(r) => match (self.regions.get(&r), self.finished_regions.get(&r)) {
                        (Some(reg), _) => !reg.revoked,
                        (None, Some(revoked)) => !revoked,
                        (None, None) => {
                            return self.fail(
                                conn,
                                ErrorCode::NoSuchRegion,
                                format!("measurement {name:?} names unknown region {r}"),
                            )
                        }
                    },
                };
                let id = self.next_measurement;
                self.next_measurement += 1;
                let job = job.or_else(|| region.and_then(|r| self.regions.get(&r).and_then(|r| r.job)));
                self.store.send(StoreOp::InsertMeasurement(MeasurementRow {
                    id,
                    job,
                    region,
                    name,
                    recorded_ns: now_ns(),
                    samples_ms,
                    valid,
                }));
                self.send(conn, Reply::Recorded { measurement: id, valid });
            }
            Request::Report { label } => {
                if let Some(c) = self.conns.get(&conn) {
                    self.store.send(StoreOp::Report { label, reply: c.tx.clone() });
                }
            }
            Request::Shutdown => {
                self.send(conn, Reply::Ok);
                self.begin_shutdown();
            }
        }
    }

    /// The device a name means: `auto` is the least loaded GPU (the cpu device when there is
    /// none), for a job of a GPU group the group's GPU. Binds nothing.
    fn resolve_device(&self, name: &str, gpu_group: Option<&str>) -> Option<usize> {
        let loads: Vec<placement::DeviceLoad> = self
            .devices
            .iter()
            .map(|d| placement::DeviceLoad {
                name: &d.info.name,
                gpu: d.info.kind == DeviceKind::Gpu,
                load: d.running.len() + d.queue.len(),
            })
            .collect();
        self.placement.choose(&loads, name, gpu_group)
    }

    fn on_submit(&mut self, conn: ConnId, spec: SubmitSpec) {
        if spec.argv.is_empty() || spec.argv[0].is_empty() {
            return self.fail(conn, ErrorCode::BadRequest, "submit: the command is empty".into());
        }
        if self.stopping {
            return self.fail(conn, ErrorCode::ShuttingDown, "the daemon is shutting down".into());
        }
        if let Some(Err(why)) = spec.gpu_group.as_deref().map(placement::check_group) {
            return self.fail(conn, ErrorCode::BadRequest, format!("submit: {why}"));
        }
        let Some(device) = self.resolve_device(&spec.device, spec.gpu_group.as_deref()) else {
            let names: Vec<&str> = self.devices.iter().map(|d| d.info.name.as_str()).collect();
            return self.fail(
                conn,
                ErrorCode::NoSuchDevice,
                format!("no device {:?}; this daemon has: auto, {}", spec.device, names.join(", ")),
            );
        };
        let warm_argv = if spec.warm || (self.cfg.warm_python && warm::is_python(&spec.argv[0])) {
            let explicit = spec.warm;
            if !warm::is_python(&spec.argv[0]) {
                return self.fail(
                    conn,
                    ErrorCode::BadRequest,
                    format!("--warm runs Python commands only; {:?} is not a Python interpreter", spec.argv[0]),
                );
            }
            let d = &self.devices[device];
            match warm::warm_argv(&spec.argv) {
                Ok(_) if d.pool.size == 0 && explicit => {
                    return self.fail(
                        conn,
                        ErrorCode::BadRequest,
                        format!("device {} has no warm workers (start the daemon with --warm-workers N)", d.info.name),
                    );
                }
                Ok(_) if d.pool.disabled.is_some() && explicit => {
                    let why = d.pool.disabled.clone().unwrap_or_default();
                    return self.fail(
                        conn,
                        ErrorCode::BadRequest,
                        format!("the warm pool of device {} is disabled: {why}", d.info.name),
                    );
                }
                Ok(a) if d.pool.size > 0 && d.pool.disabled.is_none() => Some(a),
                Ok(_) => None,
                Err(e) if explicit => return self.fail(conn, ErrorCode::BadRequest, format!("cannot run warm: {e}")),
                Err(_) => None, // routed by --warm-python: this command line needs a real interpreter
            }
        } else {
            None
        };
        let id = self.next_job;
        self.next_job += 1;
        let policy = spec.policy.unwrap_or(self.cfg.default_policy);
        self.store.send(StoreOp::InsertJob(JobRow {
            id,
            label: spec.label.clone(),
            argv: spec.argv.clone(),
            cwd: spec.cwd.clone(),
            device: self.devices[device].info.name.clone(),
            policy: policy.as_str().into(),
            queued_ns: now_ns(),
            started_ns: None,
            ended_ns: None,
            pid: None,
            exit_code: None,
            signal: None,
            reason: None,
        }));
        self.jobs.insert(
            id,
            Job {
                id,
                device,
                policy,
                spec,
                conn: Some(conn),
                state: JobState::Queued,
                cancel_reason: None,
                warm_argv,
                worker: None,
                deadline: None,
                warm_exit: None,
                warm_output_closed: false,
            },
        );
        // Accepted: the job's GPU group is bound to its GPU from now on.
        if let Some(g) =
            self.jobs[&id].spec.gpu_group.as_deref().filter(|_| self.devices[device].info.kind == DeviceKind::Gpu)
        {
            self.placement.bind(g, device);
        }
        self.devices[device].queue.push_back(id);
        if let Some(c) = self.conns.get_mut(&conn) {
            c.jobs.insert(id);
        }
        let position = self.devices[device].queue.len();
        let gpu_group = self.jobs[&id].spec.gpu_group.clone();
        self.send(
            conn,
            Reply::JobQueued { job: id, device: self.devices[device].info.name.clone(), policy, position, gpu_group },
        );
        self.admit(device);
    }

    /// A region on the device (or the node) is held or being entered: new jobs wait, since they
    /// would only be frozen.
    fn region_busy(&self, device: usize) -> bool {
        self.cfg.freeze_scope != FreezeScope::None && self.lines[self.line_of(device)].holder.is_some()
    }

    fn admit_all(&mut self) {
        for d in 0..self.devices.len() {
            self.admit(d);
        }
    }

    /// Start queued jobs of a device in FIFO order while its admission rules allow.
    fn admit(&mut self, device: usize) {
        if self.stopping {
            return;
        }
        while let Some(&head) = self.devices[device].queue.front() {
            let policy = self.jobs[&head].policy;
            let needs_worker = self.jobs[&head].warm_argv.is_some();
            let d = &self.devices[device];
            let ok = if (needs_worker && self.idle_worker(device).is_none()) || d.command_holder.is_some() {
                false
            } else if policy == Policy::Command {
                d.running.is_empty()
            } else {
                d.running.len() < d.max_concurrent && !self.region_busy(device)
            };
            if !ok {
                break;
            }
            self.devices[device].queue.pop_front();
            self.start_job(head);
        }
    }

    fn idle_worker(&self, device: usize) -> Option<u64> {
        self.workers.values().find(|w| w.device == device && w.state == WorkerState::Idle).map(|w| w.id)
    }

    /// The environment of a job or worker on a device: `base` without kforge's own variables,
    /// plus the `KFORGE_*` variables, CUDA_VISIBLE_DEVICES, PYTHONPATH and (GPU) the shim.
    fn device_env(
        &self,
        device: usize,
        base: &[(String, String)],
        job: Option<u64>,
        policy: Policy,
    ) -> Vec<(String, String)> {
        let dev = &self.devices[device];
        let mut env: Vec<(String, String)> =
            base.iter().filter(|(k, _)| !k.starts_with("KFORGE_") && k != "CUDA_VISIBLE_DEVICES").cloned().collect();
        env.push(("KFORGE_SOCKET".into(), self.cfg.socket.display().to_string()));
        if let Some(id) = job {
            env.push(("KFORGE_JOB".into(), id.to_string()));
        }
        env.push(("KFORGE_DEVICE".into(), dev.info.name.clone()));
        env.push(("KFORGE_POLICY".into(), policy.as_str().into()));
        env.push(("CUDA_VISIBLE_DEVICES".into(), dev.info.cuda_visible.clone()));
        if let Some(g) = &dev.gate_path {
            env.push(("KFORGE_GATE".into(), g.display().to_string()));
        }
        if let (DeviceKind::Gpu, Some(shim)) = (dev.info.kind, self.cfg.shim.as_ref()) {
            // The gate shim goes first, before whatever the job preloads itself.
            let shim = shim.display().to_string();
            match env.iter_mut().find(|(k, _)| k == "LD_PRELOAD") {
                Some((_, v)) if !v.is_empty() => *v = format!("{shim}:{v}"),
                Some((_, v)) => *v = shim,
                None => env.push(("LD_PRELOAD".into(), shim)),
            }
        }
        let py = self.python_dir.display().to_string();
        match env.iter_mut().find(|(k, _)| k == "PYTHONPATH") {
            Some((_, v)) if !v.is_empty() => *v = format!("{py}:{v}"),
            Some((_, v)) => *v = py,
            None => env.push(("PYTHONPATH".into(), py)),
        }
        env
    }

    fn start_job(&mut self, id: u64) {
        let (device, policy, spec, conn) = {
            let j = &self.jobs[&id];
            (j.device, j.policy, j.spec.clone(), j.conn)
        };
        let limit = spec.timeout_ms.map(Duration::from_millis).or(self.cfg.job_timeout);
        if let Some(j) = self.jobs.get_mut(&id) {
            j.deadline = limit.map(|l| Instant::now() + l);
        }
        if self.jobs[&id].warm_argv.is_some() {
            return self.start_warm_job(id);
        }
        let env = self.device_env(device, &spec.env, Some(id), policy);
        let (procs, cgroup) = match self.freezer.create_job(id) {
            Ok(Some(p)) => {
                let dir = p.parent().map(|d| d.to_path_buf());
                (Some(p), dir)
            }
            Ok(None) => (None, None),
            Err(e) => {
                eprintln!("kforge daemon: job {id}: no cgroup ({e}); freezing falls back to its process group");
                (None, None)
            }
        };
        let out =
            conn.and_then(|c| self.conns.get(&c)).map(|c| c.tx.clone()).unwrap_or_else(|| std::sync::mpsc::channel().0);
        let spawn_spec = SpawnSpec {
            job: id,
            argv: spec.argv.clone(),
            cwd: spec.cwd.clone(),
            env,
            cgroup_procs: procs,
            cpus: self.job_cores.clone(),
        };
        match jobs::spawn(spawn_spec, out, self.events.clone(), self.freezer.clone(), cgroup.clone()) {
            Ok(pid) => {
                let j = self.jobs.get_mut(&id).expect("job exists");
                j.state = JobState::Running { pid, cgroup };
                let d = &mut self.devices[device];
                d.running.insert(id);
                if policy == Policy::Command {
                    d.command_holder = Some(id);
                }
                self.store.send(StoreOp::JobStarted { id, pid, ns: now_ns() });
                if let Some(c) = conn {
                    self.send(c, Reply::JobStarted { job: id, pid });
                }
                self.write_ledger();
            }
            Err(e) => {
                let _ = self.freezer.remove_job(id);
                let reason = format!("could not start {:?} in {}: {e}", spec.argv[0], spec.cwd);
                self.finish_job(id, Some(127), None, Some(reason));
            }
        }
    }

    fn start_warm_job(&mut self, id: u64) {
        let (device, policy, spec, conn, argv) = {
            let j = &self.jobs[&id];
            (j.device, j.policy, j.spec.clone(), j.conn, j.warm_argv.clone().unwrap_or_default())
        };
        let Some(wid) = self.idle_worker(device) else {
            // admit() checked; a worker cannot vanish in between (single thread).
            return self.finish_job(id, Some(1), None, Some("no warm worker was free".into()));
        };
        let env = self.device_env(device, &spec.env, Some(id), policy);
        let out =
            conn.and_then(|c| self.conns.get(&c)).map(|c| c.tx.clone()).unwrap_or_else(|| std::sync::mpsc::channel().0);
        let w = self.workers.get_mut(&wid).expect("idle worker exists");
        match warm::start_job(&w.control, id, &argv, &spec.cwd, &env, out, self.events.clone()) {
            Ok(()) => {
                w.state = WorkerState::Busy(id);
                let (pid, cgroup) = (w.pid, w.cgroup.clone());
                let j = self.jobs.get_mut(&id).expect("job exists");
                j.state = JobState::Running { pid, cgroup };
                j.worker = Some(wid);
                self.devices[device].running.insert(id);
                if policy == Policy::Command {
                    self.devices[device].command_holder = Some(id);
                }
                self.store.send(StoreOp::JobStarted { id, pid, ns: now_ns() });
                if let Some(c) = conn {
                    self.send(c, Reply::JobStarted { job: id, pid });
                }
            }
            Err(e) => {
                // The worker is unusable: replace it; the job fails with the reason.
                let t = w.target();
                w.state = WorkerState::Stopping;
                let _ = self.freezer.kill(&t);
                self.finish_job(id, Some(1), None, Some(format!("could not hand the job to warm worker {wid}: {e}")));
            }
        }
    }

    /// Start workers until the device's pool has its target size (not counting ones on their way out).
    fn fill_pool(&mut self, device: usize) {
        if self.stopping || self.devices[device].pool.disabled.is_some() {
            return;
        }
        let alive = self.workers.values().filter(|w| w.device == device && w.state != WorkerState::Stopping).count();
        for _ in alive..self.devices[device].pool.size {
            if let Err(e) = self.spawn_worker(device) {
                let why = format!("cannot start {}: {e}", self.cfg.worker_python);
                eprintln!("kforge daemon: warm pool of device {}: {why}", self.devices[device].info.name);
                self.disable_pool(device, why);
                return;
            }
        }
    }

    fn spawn_worker(&mut self, device: usize) -> std::io::Result<()> {
        let id = self.next_worker;
        self.next_worker += 1;
        let procs = self.freezer.create_job(WORKER_CGROUP_BASE + id).ok().flatten();
        let cgroup = procs.as_ref().and_then(|p| p.parent().map(|d| d.to_path_buf()));
        let base: Vec<(String, String)> = std::env::vars().collect();
        let mut env = self.device_env(device, &base, None, self.cfg.default_policy);
        env.push(("KFORGE_WORKER_PRELOAD".into(), self.cfg.worker_preload.clone()));
        env.push(("KFORGE_WORKER_MAX_JOBS".into(), self.cfg.worker_max_jobs.to_string()));
        env.push(("KFORGE_WORKER_MAX_RSS_MB".into(), self.cfg.worker_max_rss_mb.to_string()));
        let log = self.python_dir.parent().unwrap_or(&self.python_dir).join(format!("worker-{id}.log"));
        let spec = WorkerSpawn {
            id,
            python: self.cfg.worker_python.clone(),
            env,
            cgroup_procs: procs,
            cpus: self.job_cores.clone(),
            log,
        };
        let h = warm::spawn(spec, self.events.clone())?;
        self.workers.insert(
            id,
            WarmWorker { id, device, pid: h.pid, control: h.control, cgroup, state: WorkerState::Starting },
        );
        self.write_ledger();
        Ok(())
    }

    fn disable_pool(&mut self, device: usize, why: String) {
        self.devices[device].pool.disabled = Some(why.clone());
        // Warm jobs waiting for a worker of this pool would wait forever: fail them.
        let waiting: Vec<u64> =
            self.devices[device].queue.iter().copied().filter(|j| self.jobs[j].warm_argv.is_some()).collect();
        self.devices[device].queue.retain(|j| !waiting.contains(j));
        for j in waiting {
            self.finish_job(
                j,
                Some(1),
                None,
                Some(format!("warm pool of device {} disabled: {why}", self.devices[device].info.name)),
            );
        }
    }

    fn on_worker_msg(&mut self, wid: u64, msg: WorkerMsg) {
        let Some(w) = self.workers.get_mut(&wid) else { return };
        let device = w.device;
        match msg {
            WorkerMsg::Ready { pid: _, preloaded, cuda, startup_ms, error } => {
                if w.state == WorkerState::Starting {
                    w.state = WorkerState::Idle;
                }
                self.devices[device].pool_start_failures = 0;
                if let Some(e) = error {
                    eprintln!("kforge daemon: warm worker {wid}: {e}");
                }
                eprintln!("kforge daemon: warm worker {wid} ready on device {} in {startup_ms:.0} ms (preloaded {preloaded:?}, cuda {cuda})", self.devices[device].info.name);
                self.admit(device);
            }
            WorkerMsg::Done { job, exit_code, recycle } => {
                if w.state != WorkerState::Busy(job) {
                    eprintln!("kforge daemon: warm worker {wid} reported job {job}, which it was not running");
                    return;
                }
                self.devices[device].pool.jobs_served += 1;
                if recycle.is_empty() {
                    w.state = WorkerState::Idle;
                } else {
                    // The worker exits by itself after a recycle finding; replace it now.
                    w.state = WorkerState::Stopping;
                    for r in recycle {
                        eprintln!("kforge daemon: warm worker {wid} recycled after job {job}: {r}");
                        // Count by kind ("thread left running"), not by the detail after the colon.
                        let kind = r.split(':').next().unwrap_or(&r).trim().to_string();
                        *self.devices[device].pool.recycled.entry(kind).or_insert(0) += 1;
                    }
                    self.fill_pool(device);
                }
                if let Some(j) = self.jobs.get_mut(&job) {
                    j.warm_exit = Some(exit_code);
                    j.worker = None;
                }
                self.maybe_finish_warm(job);
                self.admit(device);
            }
        }
    }

    fn on_worker_exited(&mut self, wid: u64, code: Option<i32>, signal: Option<i32>) {
        let Some(w) = self.workers.remove(&wid) else { return };
        let device = w.device;
        // Whatever the worker or its job left behind goes with it.
        let _ = self.freezer.kill(&w.target());
        let _ = self.freezer.remove_job(WORKER_CGROUP_BASE + wid);
        let how = match (code, signal) {
            (_, Some(sig)) => format!("killed by signal {sig}"),
            (Some(c), None) => format!("exited with code {c}"),
            _ => "ended".into(),
        };
        match w.state {
            WorkerState::Busy(job) => {
                let reason = self.jobs.get(&job).and_then(|j| j.cancel_reason.clone());
                let key = reason
                    .clone()
                    .map(|r| if r.starts_with("time limit") { "time limit".to_string() } else { r })
                    .unwrap_or_else(|| "job killed its worker".into());
                *self.devices[device].pool.recycled.entry(key).or_insert(0) += 1;
                if let Some(j) = self.jobs.get_mut(&job) {
                    j.warm_exit = Some(code.unwrap_or(128 + signal.unwrap_or(0)));
                    j.worker = None;
                    j.cancel_reason = Some(reason.unwrap_or_else(|| format!("the job's warm worker {wid} {how}")));
                    // Its output pipes were closed with the worker's descriptors.
                }
                self.maybe_finish_warm(job);
            }
            WorkerState::Starting => {
                let d = &mut self.devices[device];
                d.pool_start_failures += 1;
                *d.pool.recycled.entry("failed to start".into()).or_insert(0) += 1;
                eprintln!("kforge daemon: warm worker {wid} {how} before it was ready (see its log)");
                if d.pool_start_failures >= 3 {
                    let why = format!("3 workers in a row {how} before becoming ready; see worker-{wid}.log");
                    self.disable_pool(device, why);
                }
            }
            WorkerState::Idle => {
                *self.devices[device].pool.recycled.entry(format!("idle worker {how}")).or_insert(0) += 1;
            }
            WorkerState::Stopping => {}
        }
        self.write_ledger();
        self.fill_pool(device);
        self.admit(device);
    }

    /// A warm job ends when its worker reported (or died) and its output is fully sent.
    fn maybe_finish_warm(&mut self, job: u64) {
        let Some(j) = self.jobs.get(&job) else { return };
        if let (Some(code), true) = (j.warm_exit, j.warm_output_closed) {
            let reason = j.cancel_reason.clone();
            self.finish_job(job, Some(code), None, reason);
        }
    }

    fn write_ledger(&self) {
        let pgids: Vec<(u64, i32)> = self
            .jobs
            .values()
            .filter_map(|j| match j.state {
                JobState::Running { pid, .. } => Some((j.id, pid as i32)),
                JobState::Queued => None,
            })
            .chain(self.workers.values().map(|w| (WORKER_CGROUP_BASE + w.id, w.pid as i32)))
            .collect();
        if let Err(e) = self.ledger.write(&pgids) {
            eprintln!("kforge daemon: {e}");
        }
    }

    fn cancel_job(&mut self, id: u64, reason: &str) {
        let Some(j) = self.jobs.get_mut(&id) else { return };
        match j.state {
            JobState::Queued => {
                let device = j.device;
                self.devices[device].queue.retain(|&q| q != id);
                self.finish_job(id, None, None, Some(reason.to_string()));
            }
            JobState::Running { .. } => {
                j.cancel_reason.get_or_insert_with(|| reason.to_string());
                if let Some(t) = j.target() {
                    if let Err(e) = self.freezer.kill(&t) {
                        eprintln!("kforge daemon: cancelling job {id}: {e}");
                    }
                }
            }
        }
    }

    fn on_job_exited(&mut self, id: u64, code: Option<i32>, signal: Option<i32>) {
        let reason = self.jobs.get(&id).and_then(|j| j.cancel_reason.clone());
        let _ = self.freezer.remove_job(id);
        self.finish_job(id, code, signal, reason);
        self.write_ledger();
    }

    /// Record the end of a job, tell its client, and let others in.
    fn finish_job(&mut self, id: u64, code: Option<i32>, signal: Option<i32>, reason: Option<String>) {
        let Some(j) = self.jobs.remove(&id) else { return };
        let d = &mut self.devices[j.device];
        d.running.remove(&id);
        if d.command_holder == Some(id) {
            d.command_holder = None;
        }
        self.store.send(StoreOp::JobEnded { id, ns: now_ns(), code, signal, reason: reason.clone() });
        if let Some(c) = j.conn {
            self.send(c, Reply::JobEnded { job: id, exit: JobExit { code, signal, reason } });
            if let Some(conn) = self.conns.get_mut(&c) {
                conn.jobs.remove(&id);
            }
        }
        self.admit(j.device);
    }

    #[allow(clippy::too_many_arguments)]
    fn on_region_enter(
        &mut self,
        conn: ConnId,
        job: Option<u64>,
        device: Option<String>,
        name: String,
        pid: u32,
        tid: u32,
        lease_ms: Option<u64>,
    ) {
        if self.conns.get(&conn).and_then(|c| c.region).is_some() {
            return self.fail(
                conn,
                ErrorCode::OutOfOrder,
                "this connection already holds or waits for a region; exit it first".into(),
            );
        }
        if self.stopping {
            return self.fail(conn, ErrorCode::ShuttingDown, "the daemon is shutting down".into());
        }
        let (dev, policy) = match job {
            Some(j) => match self.jobs.get(&j) {
                Some(jj) if matches!(jj.state, JobState::Running { .. }) => (jj.device, jj.policy),
                _ => {
                    return self.fail(
                        conn,
                        ErrorCode::NoSuchJob,
                        format!("region_enter: job {j} is not running under this daemon"),
                    )
                }
            },
            None => {
                let Some(name) = device.as_deref() else {
                    return self.fail(conn, ErrorCode::BadRequest, "region_enter needs a job or a device".into());
                };
                match self.resolve_device(name, None) {
                    Some(d) if name != "auto" => (d, self.cfg.default_policy),
                    _ => return self.fail(conn, ErrorCode::NoSuchDevice, format!("region_enter: no device {name:?}")),
                }
            }
        };
        if lease_ms == Some(0) {
            return self.fail(conn, ErrorCode::BadRequest, "region_enter: lease_ms must be positive".into());
        }
        let lease = lease_ms.map(Duration::from_millis).unwrap_or(self.cfg.lease);
        let id = self.next_region;
        self.next_region += 1;
        self.regions.insert(
            id,
            Region {
                id,
                conn,
                job,
                device: dev,
                name,
                pid,
                tid,
                policy,
                lease,
                requested: Instant::now(),
                requested_ns: now_ns(),
                granted: None,
                deadline: None,
                state: RegionState::Queued,
                core: None,
                abandoned: false,
                exit_requested: false,
                frozen: Vec::new(),
                revoked: false,
                tainted: false,
            },
        );
        if let Some(c) = self.conns.get_mut(&conn) {
            c.region = Some(id);
        }
        if policy == Policy::Region {
            let line = self.line_of(dev);
            self.lines[line].waiting.push_back(id);
            self.grant_next(line);
        } else {
            // none: nothing is made exclusive; command: the job already holds the device.
            self.grant(id, EnterSteps::default());
        }
    }

    /// Start entering the next waiting region of a line if none is held.
    fn grant_next(&mut self, line: usize) {
        if self.lines[line].holder.is_some() || self.stopping {
            return;
        }
        let Some(id) = self.lines[line].waiting.pop_front() else { return };
        self.lines[line].holder = Some(id);
        let (dev, job, pid, tid) = {
            let r = &self.regions[&id];
            (r.device, r.job, r.pid, r.tid)
        };
        let targets: Vec<JobTarget> = match self.cfg.freeze_scope {
            FreezeScope::None => vec![],
            scope => self
                .jobs
                .values()
                .filter(|j| Some(j.id) != job && (scope == FreezeScope::Node || j.device == dev))
                .filter_map(|j| j.target())
                .collect(),
        };
        let core = self.take_core();
        let managed_pgids: Vec<i32> = self
            .jobs
            .values()
            .filter_map(|j| j.target())
            .map(|t| t.pgid)
            .chain(self.workers.values().map(|w| w.pid as i32))
            .collect();
        let r = self.regions.get_mut(&id).expect("region exists");
        r.state = RegionState::Entering;
        r.core = core;
        r.frozen = targets.iter().map(|t| t.job).collect();
        let _ = self.devices[dev].steps.send(RegionStep::Enter {
            region: id,
            holder_pid: pid,
            tid,
            targets,
            core,
            managed_pgids,
        });
    }

    fn take_core(&mut self) -> Option<u32> {
        if self.reserved_cores.is_empty() {
            return None;
        }
        let free = self.reserved_cores.iter().copied().find(|c| !self.busy_cores.contains(c));
        // More concurrent regions than reserved cores: share the first (documented).
        let core = free.unwrap_or(self.reserved_cores[0]);
        self.busy_cores.insert(core);
        Some(core)
    }

    fn on_region_ready(&mut self, id: u64, steps: EnterSteps) {
        for e in &steps.freeze_errors {
            eprintln!("kforge daemon: region {id}: freeze failed: {e}");
        }
        if !steps.unmanaged_pids.is_empty() {
            eprintln!("kforge daemon: region {id}: tainted: unmanaged GPU processes {:?}", steps.unmanaged_pids);
        }
        if let Some(r) = self.regions.get_mut(&id) {
            r.tainted |= steps.tainted;
            if r.abandoned {
                return self.start_leave(id);
            }
        }
        self.grant(id, steps);
    }

    fn grant(&mut self, id: u64, steps: EnterSteps) {
        let Some(r) = self.regions.get_mut(&id) else { return };
        let now = Instant::now();
        r.state = RegionState::Held;
        r.granted = Some(now);
        r.deadline = Some(now + r.lease);
        let exclusive = r.policy != Policy::None;
        let wait_ms = ms(now - r.requested);
        let granted_ns = now_ns();
        let grant = Grant {
            region: id,
            device: self.devices[r.device].info.name.clone(),
            exclusive,
            wait_ms,
            steps: steps.timings,
            gpu: steps.gpu,
            core: if steps.pinned { r.core } else { None },
            tainted: r.tainted,
            lease_ms: r.lease.as_millis() as u64,
        };
        self.store.send(StoreOp::InsertRegion(Box::new(region_row(&grant, r, granted_ns))));
        let conn = r.conn;
        self.send(conn, Reply::RegionGranted(grant));
    }

    fn on_region_exit(&mut self, conn: ConnId, id: u64) {
        if self.conns.get_mut(&conn).is_some_and(|c| c.revoked_left.remove(&id)) {
            let held_ms = 0.0;
            return self.send(
                conn,
                Reply::RegionReleased { region: id, valid: false, revoked: true, tainted: false, held_ms },
            );
        }
        let held_here = self.regions.get(&id).is_some_and(|r| r.conn == conn);
        if !held_here {
            return self.fail(
                conn,
                ErrorCode::NoSuchRegion,
                format!("region_exit: region {id} is not held on this connection"),
            );
        }
        let r = self.regions.get_mut(&id).expect("checked above");
        r.exit_requested = true;
        match r.state {
            RegionState::Held => self.start_leave(id),
            // Revoked while the client was still measuring: its leave is under way.
            RegionState::Leaving if r.revoked => {}
            _ => self.fail(conn, ErrorCode::OutOfOrder, format!("region_exit: region {id} was not granted yet")),
        }
    }

    fn start_leave(&mut self, id: u64) {
        let Some(r) = self.regions.get_mut(&id) else { return };
        if r.state == RegionState::Leaving {
            return;
        }
        let entered_by_device_thread = r.policy == Policy::Region;
        r.state = RegionState::Leaving;
        if entered_by_device_thread {
            let dev = r.device;
            let _ = self.devices[dev].steps.send(RegionStep::Leave { region: id });
        } else {
            self.on_region_left(id, None);
        }
    }

    fn on_region_left(&mut self, id: u64, gpu: Option<kforge_proto::GpuSample>) {
        let Some(r) = self.regions.remove(&id) else { return };
        let held_ms = r.granted.map(|g| ms(g.elapsed())).unwrap_or(0.0);
        if r.granted.is_some() {
            self.store.send(StoreOp::RegionReleased {
                id,
                ns: now_ns(),
                revoked: r.revoked,
                tainted: r.tainted,
                gpu: gpu.map(|g| (g.temp_c, g.sm_clock_mhz)),
            });
        }
        self.finished_regions.insert(id, r.revoked);
        if let Some(core) = r.core {
            self.busy_cores.remove(&core);
        }
        if let Some(c) = self.conns.get_mut(&r.conn) {
            if c.region == Some(id) {
                c.region = None;
            }
            if r.revoked && !r.exit_requested && !r.abandoned {
                // Revoked while the client still measures: answer its exit when it comes.
                c.revoked_left.insert(id);
            }
        }
        if r.granted.is_some() && r.exit_requested && !r.abandoned {
            self.send(
                r.conn,
                Reply::RegionReleased {
                    region: id,
                    valid: !r.revoked,
                    revoked: r.revoked,
                    tainted: r.tainted,
                    held_ms,
                },
            );
        }
        if r.policy == Policy::Region {
            let line = self.line_of(r.device);
            if self.lines[line].holder == Some(id) {
                self.lines[line].holder = None;
            }
            self.admit_all();
            self.grant_next(line);
        }
    }

    fn on_hangup(&mut self, conn: ConnId) {
        let Some(c) = self.conns.remove(&conn) else { return };
        for job in c.jobs {
            if let Some(j) = self.jobs.get_mut(&job) {
                j.conn = None;
            }
            self.cancel_job(job, "client connection lost");
        }
        if let Some(id) = c.region {
            let state = self.regions.get(&id).map(|r| r.state);
            match state {
                Some(RegionState::Queued) => {
                    let line = self.line_of(self.regions[&id].device);
                    self.lines[line].waiting.retain(|&w| w != id);
                    self.regions.remove(&id);
                }
                Some(RegionState::Entering) => {
                    if let Some(r) = self.regions.get_mut(&id) {
                        r.abandoned = true;
                    }
                }
                Some(RegionState::Held) => {
                    if let Some(r) = self.regions.get_mut(&id) {
                        r.abandoned = true;
                    }
                    self.start_leave(id);
                }
                Some(RegionState::Leaving) | None => {}
            }
        }
    }

    fn begin_shutdown(&mut self) {
        if self.stopping {
            return;
        }
        self.stopping = true;
        let queued: Vec<u64> =
            self.jobs.values().filter(|j| matches!(j.state, JobState::Queued)).map(|j| j.id).collect();
        for d in &mut self.devices {
            d.queue.clear();
        }
        for id in queued {
            self.finish_job(id, None, None, Some("daemon shut down before the job started".into()));
        }
        let running: Vec<u64> = self.jobs.keys().copied().collect();
        for id in running {
            self.cancel_job(id, "daemon shut down");
        }
        for line in &mut self.lines {
            for id in line.waiting.drain(..) {
                self.regions.remove(&id);
            }
        }
        let held: Vec<u64> = self.regions.values().filter(|r| r.state == RegionState::Held).map(|r| r.id).collect();
        for id in held {
            self.start_leave(id);
        }
        for w in self.workers.values_mut() {
            w.state = WorkerState::Stopping;
            let _ = self.freezer.kill(&w.target());
        }
    }

    pub fn status(&self) -> StatusReport {
        let region_status = |id: u64| {
            let r = &self.regions[&id];
            RegionStatus {
                region: id,
                name: r.name.clone(),
                job: r.job,
                pid: r.pid,
                since_ms: ms(r.granted.unwrap_or(r.requested).elapsed()),
            }
        };
        let devices = self
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let line = &self.lines[self.line_of(i)];
                let on_dev = |id: &u64| self.regions.get(id).is_some_and(|r| r.device == i);
                DeviceStatus {
                    name: d.info.name.clone(),
                    kind: d.info.kind.as_str().into(),
                    description: d.info.description.clone(),
                    running: d.running.iter().copied().collect(),
                    queued: d.queue.iter().copied().collect(),
                    region_holder: line.holder.filter(on_dev).map(region_status),
                    region_queue: line.waiting.iter().filter(|id| on_dev(id)).map(|&id| region_status(id)).collect(),
                    max_concurrent: d.max_concurrent,
                    pool: {
                        let mut p = d.pool.clone();
                        let mine = self.workers.values().filter(|w| w.device == i);
                        for w in mine {
                            match w.state {
                                WorkerState::Starting => p.starting += 1,
                                WorkerState::Idle => p.warm += 1,
                                WorkerState::Busy(_) => p.busy += 1,
                                WorkerState::Stopping => {}
                            }
                        }
                        p
                    },
                    gpu_groups: self.placement.bound_to(i),
                }
            })
            .collect();
        let frozen_jobs: BTreeSet<u64> = self
            .lines
            .iter()
            .filter_map(|l| l.holder)
            .filter_map(|h| self.regions.get(&h))
            .filter(|r| r.state == RegionState::Held)
            .flat_map(|r| r.frozen.iter().copied())
            .collect();
        StatusReport {
            daemon_pid: std::process::id(),
            protocol: PROTOCOL_VERSION,
            socket: self.cfg.socket.display().to_string(),
            db: self.cfg.db.display().to_string(),
            default_policy: self.cfg.default_policy,
            freeze_mechanism: self.freezer.describe(),
            freeze_scope: self.cfg.freeze_scope.as_str().into(),
            isolation: if self.reserved_cores.is_empty() {
                "off (no reserved cores)".into()
            } else {
                format!(
                    "sched_setaffinity: region holders on {}, jobs on {}",
                    kforge_cores::format_cpu_list(&self.reserved_cores),
                    kforge_cores::format_cpu_list(&self.job_cores)
                )
            },
            gate_shim: self.cfg.shim.as_ref().map(|p| p.display().to_string()),
            reserved_cores: self.reserved_cores.clone(),
            job_cores: self.job_cores.clone(),
            devices,
            jobs: self
                .jobs
                .values()
                .map(|j| JobStatus {
                    job: j.id,
                    device: self.devices[j.device].info.name.clone(),
                    policy: j.policy,
                    state: match j.state {
                        JobState::Queued => "queued".into(),
                        JobState::Running { .. } => "running".into(),
                    },
                    pid: match j.state {
                        JobState::Running { pid, .. } => Some(pid),
                        JobState::Queued => None,
                    },
                    argv: j.spec.argv.clone(),
                    frozen: frozen_jobs.contains(&j.id),
                })
                .collect(),
        }
    }

    /// Close every connection (used at the very end of a shutdown).
    pub fn close_all(&mut self) {
        for (_, c) in self.conns.drain() {
            let _ = c.tx.send(Outgoing::Close);
            let _ = c.stream.shutdown(std::net::Shutdown::Read);
        }
    }
}

/// The store row of a region just granted: the grant's figures plus who asked and when.
fn region_row(g: &Grant, r: &Region, granted_ns: i64) -> RegionRow {
    RegionRow {
        id: g.region,
        job: r.job,
        device: g.device.clone(),
        name: r.name.clone(),
        pid: r.pid,
        tid: r.tid,
        policy: r.policy.as_str().into(),
        exclusive: g.exclusive,
        requested_ns: r.requested_ns,
        granted_ns,
        released_ns: None,
        wait_ms: g.wait_ms,
        steps: g.steps,
        gpu_temp_c_granted: g.gpu.map(|x| x.temp_c),
        sm_clock_mhz_granted: g.gpu.map(|x| x.sm_clock_mhz),
        gpu_temp_c_released: None,
        sm_clock_mhz_released: None,
        core: g.core,
        lease_ms: g.lease_ms,
        revoked: false,
        tainted: g.tainted,
    }
}
