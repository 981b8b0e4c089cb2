//! The daemon's state machine. One thread owns [`Daemon`] and feeds it [`Event`]s; it is the only
//! code that changes job, region and connection state. It does nothing itself: every handler
//! returns [`Effect`]s (replies, store writes, device-thread steps, spawns, kills) that the server
//! carries out; where an effect's outcome matters (a spawned pid, a failed hand-off) the server
//! answers with an event. The machine reads no clock (each event comes with its [`Now`]) and holds
//! no sockets, channels or descriptors, so it is unit-tested without processes (`tests`).
//!
//! - `region`: a region's life (one enum) and the handlers that move it; the grant order.
//! - `admission`: jobs: where a job goes, when it starts, how it ends.
//! - `memory`: GPU-memory-aware admission (expected peaks, learned peaks, the OOM retry).
//! - `learned`: what earlier jobs showed, by command line and label (peaks, run lengths).
//! - `warm_pool`: the warm worker pools and the hand-off of jobs to workers.
//! - this module: the `Daemon`, the dispatch of events, connections and requests, `status`.

mod admission;
mod learned;
mod memory;
pub use learned::LEARNED_CAPACITY;
mod region;
#[cfg(test)]
mod tests;
mod warm_pool;

pub use crate::effect::Effect;
pub use crate::event::{ConnId, Event, Now, Outgoing};

use crate::config::{Config, FreezeScope};
use crate::devices::{DeviceInfo, DeviceKind};
use crate::effect::{RegionTimeQuery, StoreWrite};
use admission::{Job, JobState};
use kforge_proto::{DeviceStatus, ErrorCode, JobStatus, PoolStatus, Reply, Request, StatusReport, PROTOCOL_VERSION};
use kforge_store::MeasurementRow;
use region::{Region, RegionLine, Released};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use warm_pool::WarmWorker;

struct Conn {
    greeted: bool,
    /// Jobs submitted on this connection: cancelled if it goes away.
    jobs: BTreeSet<u64>,
    /// The region this connection holds or waits for.
    region: Option<u64>,
}

struct Device {
    info: DeviceInfo,
    max_concurrent: usize,
    /// Jobs started (being started or running).
    running: BTreeSet<u64>,
    queue: VecDeque<u64>,
    command_holder: Option<u64>,
    gate_path: Option<PathBuf>,
    pool: PoolStatus,
    /// Workers that died before becoming ready, in a row.
    pool_start_failures: u32,
    /// The latest memory sample (None: never sampled; admission then ignores memory).
    memory: Option<crate::event::MemorySample>,
    /// Gate participants an earlier drain here timed out waiting for, still behind on it.
    stragglers: Vec<region::Behind>,
}

/// A device as the daemon starts with it.
pub struct DeviceSetup {
    pub info: DeviceInfo,
    /// Its gate segment (handed to jobs as `KFORGE_GATE`).
    pub gate_path: Option<PathBuf>,
}

pub struct DaemonParts {
    pub cfg: Config,
    /// How jobs are frozen (for `status`).
    pub freeze_mechanism: String,
    /// Where the embedded Python package was written (jobs' PYTHONPATH).
    pub python_dir: PathBuf,
    /// The daemon's own environment, which warm workers start from.
    pub base_env: Vec<(String, String)>,
    pub daemon_pid: u32,
    pub devices: Vec<DeviceSetup>,
    pub reserved_cores: Vec<u32>,
    /// The reserved cores' SMT siblings, given to nobody.
    pub idle_siblings: Vec<u32>,
    /// The reserved cores' SMT siblings that jobs run on (too few cores to keep them idle).
    pub shared_siblings: Vec<u32>,
    pub job_cores: Vec<u32>,
    /// The largest job, region and measurement ids in the store.
    pub first_ids: (u64, u64, u64),
    /// Peaks of the store's most recent jobs, oldest first (admission's learned peaks).
    pub learned_peaks: Vec<kforge_store::LearnedValue>,
    /// Run lengths of the store's most recent ended jobs, oldest first (backfill's learned lengths).
    pub learned_lengths: Vec<kforge_store::LearnedValue>,
}

pub struct Daemon {
    cfg: Config,
    freeze_mechanism: String,
    python_dir: PathBuf,
    base_env: Vec<(String, String)>,
    daemon_pid: u32,
    devices: Vec<Device>,
    lines: Vec<RegionLine>,
    conns: HashMap<ConnId, Conn>,
    jobs: BTreeMap<u64, Job>,
    regions: BTreeMap<u64, Region>,
    /// Regions already released (for measurements reported after release, and exits owed).
    released: HashMap<u64, Released>,
    reserved_cores: Vec<u32>,
    idle_siblings: Vec<u32>,
    shared_siblings: Vec<u32>,
    job_cores: Vec<u32>,
    busy_cores: BTreeSet<u32>,
    workers: BTreeMap<u64, WarmWorker>,
    next_job: u64,
    next_region: u64,
    next_measurement: u64,
    next_worker: u64,
    /// GPU groups and the GPU each was placed on (`SubmitSpec::gpu_group`).
    placement: crate::placement::Placement,
    /// Peaks seen of earlier jobs, in bytes (admission's expected peak of a job that declares none).
    learned_peaks: learned::Learned,
    /// Run lengths of earlier jobs, in ms (a backfilled job is expected to run at least that long).
    learned_lengths: learned::Learned,
    stopping: bool,
    /// The moment of the event being handled.
    now: Now,
    /// Effects of the event being handled, in order.
    out: Vec<Effect>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Daemon {
    pub fn new(p: DaemonParts, now: Now) -> Daemon {
        let scope = p.cfg.freeze_scope;
        let ndev = p.devices.len();
        let devices: Vec<Device> = p
            .devices
            .into_iter()
            .map(|DeviceSetup { info, gate_path }| {
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
                    gate_path,
                    pool,
                    pool_start_failures: 0,
                    memory: None,
                    stragglers: Vec::new(),
                }
            })
            .collect();
        let nlines = if scope == FreezeScope::Node { 1 } else { ndev };
        Daemon {
            cfg: p.cfg,
            freeze_mechanism: p.freeze_mechanism,
            python_dir: p.python_dir,
            base_env: p.base_env,
            daemon_pid: p.daemon_pid,
            devices,
            lines: (0..nlines).map(|_| RegionLine::default()).collect(),
            conns: HashMap::new(),
            jobs: BTreeMap::new(),
            regions: BTreeMap::new(),
            released: HashMap::new(),
            reserved_cores: p.reserved_cores,
            idle_siblings: p.idle_siblings,
            shared_siblings: p.shared_siblings,
            job_cores: p.job_cores,
            busy_cores: BTreeSet::new(),
            workers: BTreeMap::new(),
            next_worker: 1,
            placement: Default::default(),
            learned_peaks: learned::Learned::replayed(&p.learned_peaks),
            learned_lengths: learned::Learned::replayed(&p.learned_lengths),
            next_job: p.first_ids.0 + 1,
            next_region: p.first_ids.1 + 1,
            next_measurement: p.first_ids.2 + 1,
            stopping: false,
            now,
            out: Vec::new(),
        }
    }

    pub fn stopping(&self) -> bool {
        self.stopping
    }

    /// Nothing left to wait for after a shutdown began.
    pub fn quiescent(&self) -> bool {
        self.jobs.is_empty() && self.regions.values().all(Region::is_queued)
    }

    /// The earliest lease or time-limit deadline, for the event loop's timeout.
    pub fn next_deadline(&self) -> Option<Instant> {
        let leases = self.regions.values().filter_map(Region::lease_deadline);
        let limits = self.jobs.values().filter(|j| j.cancel_reason.is_none()).filter_map(|j| j.deadline);
        leases.chain(limits).min()
    }

    /// Start the warm worker pools (at daemon start).
    pub fn start(&mut self, now: Now) -> Vec<Effect> {
        self.now = now;
        for d in 0..self.devices.len() {
            self.fill_pool(d);
        }
        std::mem::take(&mut self.out)
    }

    /// Handle one event at `now`; what to do about it, in order.
    pub fn handle(&mut self, ev: Event, now: Now) -> Vec<Effect> {
        self.now = now;
        match ev {
            Event::Connected { conn } => self.on_connected(conn),
            Event::Request { conn, req } => self.on_request(conn, req),
            Event::BadFrame { conn, code, message } => self.fail(conn, code, message),
            Event::Hangup { conn } => self.on_hangup(conn),
            Event::JobSpawned { job, pid, cgroup } => self.on_job_spawned(job, pid, cgroup),
            Event::JobSpawnFailed { job, error } => self.on_job_spawn_failed(job, &error),
            Event::JobExited { job, code, signal, oom } => self.on_job_exited(job, code, signal, oom),
            Event::RegionEntered { region, report } => self.on_region_entered(region, report),
            Event::RegionLeft { region, gpu, host } => self.on_region_left(region, gpu, host),
            Event::WorkerSpawned { worker, pid, cgroup } => self.on_worker_spawned(worker, pid, cgroup),
            Event::WorkerSpawnFailed { worker, error } => self.on_worker_spawn_failed(worker, &error),
            Event::HandedToWorker { worker, job, result } => self.on_handed_to_worker(worker, job, result),
            Event::Worker { worker, msg } => self.on_worker_msg(worker, msg),
            Event::WorkerExited { worker, code, signal } => self.on_worker_exited(worker, code, signal),
            Event::WarmOutputClosed { job, oom } => self.on_warm_output_closed(job, oom),
            Event::GpuMemory { device, sample } => self.on_gpu_memory(device, sample),
            Event::Tick => self.on_tick(),
            Event::Shutdown => self.begin_shutdown(),
        }
        #[cfg(debug_assertions)]
        self.check_job_tables();
        std::mem::take(&mut self.out)
    }

    /// Debug builds (every test) check after each event that no job is lost: a job is in its
    /// device's queue (queued) or running set (starting, running), exactly once, and nowhere else;
    /// both hold only known jobs; a job with a client is on that client's connection, so that
    /// `finish_job` tells it. A job leaves `jobs` only through `finish_job`, which sends
    /// `job_ended` to that connection.
    #[cfg(debug_assertions)]
    fn check_job_tables(&self) {
        for (i, d) in self.devices.iter().enumerate() {
            for id in d.queue.iter().chain(d.running.iter()) {
                let j = self.jobs.get(id).unwrap_or_else(|| panic!("device {i} lists job {id}, which is gone"));
                assert_eq!(j.device, i, "job {id} is listed on device {i}, not its own");
            }
        }
        for j in self.jobs.values() {
            let d = &self.devices[j.device];
            let queued = d.queue.iter().filter(|&&q| q == j.id).count();
            let running = d.running.contains(&j.id);
            let placed = match j.state {
                JobState::Queued => queued == 1 && !running,
                JobState::Starting | JobState::Running { .. } => queued == 0 && running,
            };
            assert!(placed, "job {} ({}) is queued {queued} times, running {running}", j.id, j.state.as_str());
            if let Some(c) = j.conn {
                let on_conn = self.conns.get(&c).is_some_and(|c| c.jobs.contains(&j.id));
                assert!(
                    on_conn,
                    "job {} belongs to connection {c}, which does not know it: its end would be lost",
                    j.id
                );
            }
        }
    }

    fn emit(&mut self, e: Effect) {
        self.out.push(e);
    }

    fn log(&mut self, line: String) {
        self.out.push(Effect::Log(line));
    }

    fn store(&mut self, w: StoreWrite) {
        self.out.push(Effect::Store(w));
    }

    fn line_of(&self, device: usize) -> usize {
        if self.cfg.freeze_scope == FreezeScope::Node {
            0
        } else {
            device
        }
    }

    /// Reply on a connection that is still open.
    fn send(&mut self, conn: ConnId, reply: Reply) {
        if self.conns.contains_key(&conn) {
            self.out.push(Effect::Send { conn, reply });
        }
    }

    /// Reply with an error and close the connection (every error closes: see docs/protocol.md).
    fn fail(&mut self, conn: ConnId, code: ErrorCode, message: String) {
        if self.conns.contains_key(&conn) {
            self.out.push(Effect::Send { conn, reply: Reply::Error { code, message } });
            self.out.push(Effect::Close { conn });
        }
    }

    fn on_connected(&mut self, conn: ConnId) {
        if self.stopping {
            let reply = Reply::Error { code: ErrorCode::ShuttingDown, message: "the daemon is shutting down".into() };
            self.out.push(Effect::Send { conn, reply });
            self.out.push(Effect::Close { conn });
            return;
        }
        self.conns.insert(conn, Conn { greeted: false, jobs: BTreeSet::new(), region: None });
    }

    fn on_request(&mut self, conn: ConnId, req: Request) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        if !c.greeted {
            match req {
                Request::Hello { protocol, client: _ } if protocol == PROTOCOL_VERSION => {
                    c.greeted = true;
                    let reply = Reply::Welcome { protocol: PROTOCOL_VERSION, daemon_pid: self.daemon_pid };
                    self.send(conn, reply);
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
                let s = self.status(self.now.at);
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
                self.on_region_enter(conn, region::EnterRequest { job, device, name, pid, tid, lease_ms })
            }
            Request::RegionExit { region } => self.on_region_exit(conn, region),
            Request::Measurement { region, job, name, samples_ms } => {
                self.on_measurement(conn, region, job, name, samples_ms)
            }
            Request::Report { label } => self.emit(Effect::Report { conn, label }),
            Request::RegionTime { label, job, since_ns } => {
                self.emit(Effect::RegionTime { conn, query: RegionTimeQuery { label, job, since_ns } })
            }
            Request::Shutdown => {
                self.send(conn, Reply::Ok);
                self.begin_shutdown();
            }
        }
    }

    fn on_measurement(
        &mut self,
        conn: ConnId,
        region: Option<u64>,
        job: Option<u64>,
        name: String,
        samples_ms: Vec<f64>,
    ) {
        if samples_ms.iter().any(|s| !s.is_finite()) {
            return self.fail(
                conn,
                ErrorCode::BadRequest,
                format!("measurement {name:?}: samples must be finite numbers"),
            );
        }
        let valid = match region {
            None => true,
            Some(r) => match (self.regions.get(&r), self.released.get(&r)) {
                (Some(reg), _) => !reg.revoked(),
                (None, Some(rel)) => !rel.revoked,
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
        let recorded_ns = self.now.unix_ns;
        self.store(StoreWrite::InsertMeasurement(MeasurementRow {
            id,
            job,
            region,
            name,
            recorded_ns,
            samples_ms,
            valid,
        }));
        self.send(conn, Reply::Recorded { measurement: id, valid });
    }

    /// Cancel a lost client's jobs and let go of its region.
    fn on_hangup(&mut self, conn: ConnId) {
        let Some(c) = self.conns.remove(&conn) else { return };
        for job in c.jobs {
            if let Some(j) = self.jobs.get_mut(&job) {
                j.conn = None;
            }
            self.cancel_job(job, "client connection lost");
        }
        if let Some(id) = c.region {
            self.abandon_region(id);
        }
    }

    /// Revoke regions whose lease ran out and cancel jobs past their time limit.
    fn on_tick(&mut self) {
        let now = self.now.at;
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
        self.revoke_expired();
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
        self.leave_all_regions();
        self.stop_workers();
    }

    pub fn status(&self, now: Instant) -> StatusReport {
        let devices = (0..self.devices.len()).map(|i| self.device_status(i, now)).collect();
        let frozen_jobs = self.frozen_jobs();
        StatusReport {
            daemon_pid: self.daemon_pid,
            protocol: PROTOCOL_VERSION,
            socket: self.cfg.socket.display().to_string(),
            db: self.cfg.db.display().to_string(),
            default_policy: self.cfg.default_policy,
            freeze_mechanism: self.freeze_mechanism.clone(),
            freeze_scope: self.cfg.freeze_scope.as_str().into(),
            isolation: if self.reserved_cores.is_empty() {
                "off (no reserved cores)".into()
            } else {
                let idle = match (self.idle_siblings.is_empty(), self.shared_siblings.is_empty()) {
                    (false, _) => {
                        format!(", their SMT siblings {} idle", kforge_cores::format_cpu_list(&self.idle_siblings))
                    }
                    (true, false) => format!(
                        ", their SMT siblings {} shared with jobs (too few cores to keep them idle)",
                        kforge_cores::format_cpu_list(&self.shared_siblings)
                    ),
                    (true, true) => String::new(),
                };
                format!(
                    "sched_setaffinity: region holders on {}{idle}, jobs on {}",
                    kforge_cores::format_cpu_list(&self.reserved_cores),
                    kforge_cores::format_cpu_list(&self.job_cores)
                )
            },
            gate_shim: self.cfg.shim.as_ref().map(|p| p.display().to_string()),
            reserved_cores: self.reserved_cores.clone(),
            idle_siblings: self.idle_siblings.clone(),
            job_cores: self.job_cores.clone(),
            devices,
            jobs: self
                .jobs
                .values()
                .map(|j| JobStatus {
                    job: j.id,
                    device: self.devices[j.device].info.name.clone(),
                    policy: j.policy,
                    state: j.state.as_str().into(),
                    pid: j.state.pid(),
                    argv: j.spec.argv.clone(),
                    frozen: frozen_jobs.contains(&j.id),
                    memory: self.job_memory_status(j),
                })
                .collect(),
        }
    }

    fn device_status(&self, i: usize, now: Instant) -> DeviceStatus {
        let d = &self.devices[i];
        let line = &self.lines[self.line_of(i)];
        let on_dev = |id: &u64| self.regions.get(id).is_some_and(|r| r.device == i);
        let region_status = |id: u64| self.regions[&id].status(now);
        DeviceStatus {
            name: d.info.name.clone(),
            kind: d.info.kind.as_str().into(),
            description: d.info.description.clone(),
            running: d.running.iter().copied().collect(),
            queued: d.queue.iter().copied().collect(),
            region_holder: line.holder.filter(on_dev).map(region_status),
            region_queue: line.waiting.iter().filter(|id| on_dev(id)).map(|&id| region_status(id)).collect(),
            max_concurrent: d.max_concurrent,
            pool: self.pool_status(i),
            gpu_groups: self.placement.bound_to(i),
            memory: self.device_memory_status(i),
            stragglers: d.stragglers.iter().map(region::Behind::status).collect(),
        }
    }
}
