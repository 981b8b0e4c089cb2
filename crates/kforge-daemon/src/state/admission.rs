//! Jobs: where a submitted job goes, when it starts (FIFO per device, within its concurrency and
//! policy, never while a region is held there, only when its memory fits: `memory`), and how it
//! ends (or, after a CUDA out-of-memory error beside siblings, runs again alone).

use super::memory::{JobMemory, MAX_PASSES};
use super::{ConnId, Daemon};
use crate::config::FreezeScope;
use crate::devices::DeviceKind;
use crate::effect::{Effect, JobLaunch, StoreWrite};
use crate::placement;
use kforge_freeze::JobTarget;
use kforge_proto::{ErrorCode, JobExit, Policy, Reply, SubmitSpec};
use kforge_store::JobRow;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub(super) enum JobState {
    Queued,
    /// Admitted: its process is being started or handed to a warm worker (answered within the
    /// same event).
    Starting,
    Running {
        pid: u32,
        cgroup: Option<PathBuf>,
    },
}

impl JobState {
    pub fn is_running(&self) -> bool {
        matches!(self, JobState::Running { .. })
    }

    pub fn pid(&self) -> Option<u32> {
        match self {
            JobState::Running { pid, .. } => Some(*pid),
            JobState::Queued | JobState::Starting => None,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Starting => "starting",
            JobState::Running { .. } => "running",
        }
    }
}

pub(super) struct Job {
    pub id: u64,
    pub device: usize,
    pub policy: Policy,
    pub spec: SubmitSpec,
    pub conn: Option<ConnId>,
    pub state: JobState,
    pub cancel_reason: Option<String>,
    /// What a warm worker runs (the command line without the interpreter); None = cold.
    pub warm_argv: Option<Vec<String>>,
    /// The warm worker running the job.
    pub worker: Option<u64>,
    /// Kill the job at this moment (time limit).
    pub deadline: Option<Instant>,
    /// Exit code a warm worker reported.
    /// A warm job's end as its worker reported it: exit code, or the signal that killed a
    /// forked job's child.
    pub warm_exit: Option<(Option<i32>, Option<i32>)>,
    pub warm_output_closed: bool,
    /// A warm job's stderr said CUDA ran out of memory.
    pub warm_oom: bool,
    pub memory: JobMemory,
    /// When its current run was started (None: queued).
    pub started_at: Option<Instant>,
}

/// Whether the head of a queue may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admit {
    Yes,
    /// Held back by concurrency, policy, a region or warm workers.
    Wait,
    /// Everything else allows it; its memory does not fit (yet).
    WaitMemory,
}

impl Job {
    /// What freezing or killing the job acts on (once it runs).
    pub fn target(&self) -> Option<JobTarget> {
        match &self.state {
            JobState::Running { pid, cgroup } => {
                Some(JobTarget { job: self.id, pgid: *pid as i32, cgroup: cgroup.clone() })
            }
            JobState::Queued | JobState::Starting => None,
        }
    }
}

impl Daemon {
    /// The device a name means: `auto` is the least loaded GPU (the cpu device when there is
    /// none), for a job of a GPU group the group's GPU. Binds nothing.
    pub(super) fn resolve_device(&self, name: &str, gpu_group: Option<&str>) -> Option<usize> {
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

    pub(super) fn on_submit(&mut self, conn: ConnId, spec: SubmitSpec) {
        if spec.argv.is_empty() || spec.argv[0].is_empty() {
            return self.fail(conn, ErrorCode::BadRequest, "submit: the command is empty".into());
        }
        if spec.gpu_memory_bytes == Some(0) {
            return self.fail(conn, ErrorCode::BadRequest, "submit: gpu_memory_bytes must be positive".into());
        }
        if spec.expected_ms == Some(0) {
            return self.fail(conn, ErrorCode::BadRequest, "submit: expected_ms must be positive".into());
        }
        if self.stopping {
            return self.fail(conn, ErrorCode::ShuttingDown, "the daemon is shutting down".into());
        }
        if let Some(Err(why)) = spec.gpu_group.as_deref().map(placement::check_group) {
            return self.fail(conn, ErrorCode::BadRequest, format!("submit: {why}"));
        }
        let Some(device) = self.resolve_device(&spec.device, spec.gpu_group.as_deref()) else {
            let names: Vec<&str> = self.devices.iter().map(|d| d.info.name.as_str()).collect();
            let message = format!("no device {:?}; this daemon has: auto, {}", spec.device, names.join(", "));
            return self.fail(conn, ErrorCode::NoSuchDevice, message);
        };
        let warm_argv = match self.warm_argv_for(device, &spec) {
            Ok(a) => a,
            Err(message) => return self.fail(conn, ErrorCode::BadRequest, message),
        };
        let id = self.next_job;
        self.next_job += 1;
        let policy = spec.policy.unwrap_or(self.cfg.default_policy);
        self.store(StoreWrite::InsertJob(JobRow {
            id,
            label: spec.label.clone(),
            argv: spec.argv.clone(),
            cwd: spec.cwd.clone(),
            device: self.devices[device].info.name.clone(),
            policy: policy.as_str().into(),
            queued_ns: self.now.unix_ns,
            started_ns: None,
            ended_ns: None,
            pid: None,
            exit_code: None,
            signal: None,
            reason: None,
        }));
        // Accepted: the job's GPU group is bound to its GPU from now on.
        if let Some(g) = spec.gpu_group.as_deref().filter(|_| self.devices[device].info.kind == DeviceKind::Gpu) {
            self.placement.bind(g, device);
        }
        let gpu_group = spec.gpu_group.clone();
        let job = Job {
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
            warm_oom: false,
            memory: JobMemory::default(),
            started_at: None,
        };
        self.jobs.insert(id, job);
        self.devices[device].queue.push_back(id);
        if let Some(c) = self.conns.get_mut(&conn) {
            c.jobs.insert(id);
        }
        let position = self.devices[device].queue.len();
        let device_name = self.devices[device].info.name.clone();
        self.send(conn, Reply::JobQueued { job: id, device: device_name, policy, position, gpu_group });
        self.admit(device);
    }

    /// A region on the device (or the node) is held or being entered: new jobs wait, since they
    /// would only be frozen.
    fn region_busy(&self, device: usize) -> bool {
        self.cfg.freeze_scope != FreezeScope::None && self.lines[self.line_of(device)].holder.is_some()
    }

    pub(super) fn admit_all(&mut self) {
        for d in 0..self.devices.len() {
            self.admit(d);
        }
    }

    /// Start queued jobs of a device in FIFO order while its admission rules allow. A head that
    /// waits only for memory lets a later job that fits start before it, at most `MAX_PASSES`
    /// times (`memory`).
    pub(super) fn admit(&mut self, device: usize) {
        if self.stopping {
            return;
        }
        while let Some(&head) = self.devices[device].queue.front() {
            match self.may_start(device, head) {
                Admit::Yes => {
                    self.devices[device].queue.pop_front();
                    self.start_job(head);
                }
                Admit::Wait => break,
                Admit::WaitMemory => {
                    let Some(id) = self.passer(device, head) else { break };
                    self.devices[device].queue.retain(|&q| q != id);
                    self.start_job(id);
                }
            }
        }
    }

    /// A later job of the queue that starts before `head`, which waits for memory: one that
    /// fits and is expected to end before the device's running jobs do, while `head` waits to
    /// run alone (backfill: the device empties no later for it); else one that fits, while
    /// `head` has passes left (each start costs one, `MAX_PASSES`). In session 23 a job retried
    /// alone held its queue's front for minutes behind a long sibling, and short verify jobs
    /// behind it waited until the campaign's budget was spent.
    fn passer(&mut self, device: usize, head: u64) -> Option<u64> {
        if let Some(id) = self.backfill(device, head) {
            return Some(id);
        }
        let fits = |id: u64| self.may_start(device, id) == Admit::Yes;
        let queue = &self.devices[device].queue;
        if self.jobs[&head].memory.passed >= MAX_PASSES {
            return None;
        }
        let id = *queue.iter().skip(1).find(|&&id| fits(id))?;
        self.jobs.get_mut(&head).expect("the queue's head exists").memory.passed += 1;
        Some(id)
    }

    /// A later job of the queue that fits and would end before the device's running jobs are
    /// expected to, while `head` waits to run alone. Its length is what it declares or, when
    /// longer, the longest run of its command line (else its label) the daemon saw: a job
    /// that declares too short a length is not started beside them again and again, each
    /// time holding the device past the head's turn.
    fn backfill(&mut self, device: usize, head: u64) -> Option<u64> {
        if !self.starts_only_alone(device, head) {
            return None;
        }
        let end = self.running_end(device)?;
        let (id, len, source) = self.devices[device].queue.iter().skip(1).find_map(|&id| {
            let (len, source) = self.backfill_length(id)?;
            (self.now.at + len <= end && self.may_start(device, id) == Admit::Yes).then_some((id, len, source))
        })?;
        let by = end.saturating_duration_since(self.now.at).as_secs_f64();
        self.log(format!(
            "job {id}: started beside the running jobs while job {head} waits to run alone: \
             expected to end before them (within {by:.0} s; it runs {:.0} s, {source})",
            len.as_secs_f64()
        ));
        Some(id)
    }

    /// How long a queued job is expected to run when backfilled, and from what: its
    /// `expected_ms` (`declared`), or the longest run of its command line or label when longer
    /// (`learned`); `None` when it declared none.
    fn backfill_length(&self, id: u64) -> Option<(Duration, &'static str)> {
        let j = &self.jobs[&id];
        let declared = j.spec.expected_ms?;
        Some(match self.learned_lengths.get(&j.spec) {
            Some(ms) if ms > declared => (Duration::from_millis(ms), "learned"),
            _ => (Duration::from_millis(declared), "declared"),
        })
    }

    /// When a running job is expected to end: its start plus its `expected_ms`; `None` when it
    /// declared none.
    fn expected_end(&self, id: u64) -> Option<Instant> {
        let j = &self.jobs[&id];
        let expected = Duration::from_millis(j.spec.expected_ms?);
        Some(j.started_at.unwrap_or(self.now.at) + expected)
    }

    /// When the device's running jobs are expected to have ended: the latest expected end;
    /// `None` when none runs or one declared no expected length (it may run for any time).
    fn running_end(&self, device: usize) -> Option<Instant> {
        let running = &self.devices[device].running;
        running.iter().map(|&id| self.expected_end(id)).collect::<Option<Vec<_>>>()?.into_iter().max()
    }

    /// Whether a queued job of a device may start now.
    fn may_start(&self, device: usize, job: u64) -> Admit {
        let j = &self.jobs[&job];
        let d = &self.devices[device];
        let others_allow =
            if (j.warm_argv.is_some() && self.idle_worker(device).is_none()) || d.command_holder.is_some() {
                false
            } else if j.policy == Policy::Command {
                d.running.is_empty()
            } else {
                d.running.len() < d.max_concurrent && !self.region_busy(device)
            };
        if !others_allow {
            Admit::Wait
        } else if self.memory_fits(device, job) {
            Admit::Yes
        } else {
            Admit::WaitMemory
        }
    }

    /// A job or worker is being started (its pid is not known yet).
    pub(super) fn starting_any(&self) -> bool {
        self.jobs.values().any(|j| matches!(j.state, JobState::Starting))
            || self.workers.values().any(|w| w.pid.is_none())
    }

    /// The environment of a job or worker on a device: `base` without kforge's own variables,
    /// plus the `KFORGE_*` variables, CUDA_VISIBLE_DEVICES, PYTHONPATH and (GPU) the shim.
    pub(super) fn device_env(
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
            prepend(&mut env, "LD_PRELOAD", shim.display().to_string());
        }
        prepend(&mut env, "PYTHONPATH", self.python_dir.display().to_string());
        env
    }

    /// A job submitted with `auto_regions`: `KFORGE_AUTO_REGIONS=1` (read by the bootstrap of a
    /// cold job's interpreters and by a warm worker) and the bootstrap directory first on
    /// PYTHONPATH (so the job's Python subprocesses get the hooks too).
    pub(super) fn auto_regions_env(&self, env: &mut Vec<(String, String)>) {
        env.push(("KFORGE_AUTO_REGIONS".into(), "1".into()));
        prepend(env, "PYTHONPATH", kforge_python::auto_regions_dir(&self.python_dir).display().to_string());
    }

    /// Admit a job: it counts as running from now on; its process is started (or it is handed
    /// to a warm worker) by the effect emitted here.
    fn start_job(&mut self, id: u64) {
        let limit = self.jobs[&id].spec.timeout_ms.map(Duration::from_millis).or(self.cfg.job_timeout);
        let now = self.now.at;
        let j = self.jobs.get_mut(&id).expect("a queued job exists");
        j.deadline = limit.map(|l| now + l);
        j.started_at = Some(now);
        j.state = JobState::Starting;
        let (device, policy, conn, warm) = (j.device, j.policy, j.conn, j.warm_argv.is_some());
        let d = &mut self.devices[device];
        d.running.insert(id);
        if policy == Policy::Command {
            d.command_holder = Some(id);
        }
        if warm {
            self.start_warm_job(id);
            return self.memory_on_start(id);
        }
        self.memory_on_start(id);
        let spec = &self.jobs[&id].spec;
        let mut env = self.device_env(device, &spec.env, Some(id), policy);
        if spec.auto_regions {
            self.auto_regions_env(&mut env);
        }
        let launch = JobLaunch {
            job: id,
            argv: spec.argv.clone(),
            cwd: spec.cwd.clone(),
            env,
            cpus: self.job_cores.clone(),
            conn,
        };
        self.emit(Effect::SpawnJob(launch));
    }

    pub(super) fn on_job_spawned(&mut self, id: u64, pid: u32, cgroup: Option<PathBuf>) {
        if let Some(j) = self.jobs.get_mut(&id) {
            j.state = JobState::Running { pid, cgroup };
            self.job_running(id);
            self.write_ledger();
        }
        self.grant_all();
    }

    /// A job's process runs (cold or warm): record it and tell its client.
    pub(super) fn job_running(&mut self, id: u64) {
        let j = &self.jobs[&id];
        let (Some(pid), conn) = (j.state.pid(), j.conn) else { return };
        // Cancelled while it was being started.
        if let (Some(t), Some(_)) = (j.target(), &j.cancel_reason) {
            self.emit(Effect::KillJob(t));
        }
        let ns = self.now.unix_ns;
        self.store(StoreWrite::JobStarted { id, pid, ns });
        if let Some(c) = conn {
            self.send(c, Reply::JobStarted { job: id, pid });
        }
    }

    pub(super) fn on_job_spawn_failed(&mut self, id: u64, error: &str) {
        if let Some(j) = self.jobs.get(&id) {
            let reason = format!("could not start {:?} in {}: {error}", j.spec.argv[0], j.spec.cwd);
            self.emit(Effect::RemoveCgroup { id });
            self.finish_job(id, Some(127), None, Some(reason));
        }
        self.grant_all();
    }

    /// Rewrite the guardian's ledger with every running job and worker.
    pub(super) fn write_ledger(&mut self) {
        let pgids: Vec<(u64, i32)> = self
            .jobs
            .values()
            .filter_map(|j| j.state.pid().map(|pid| (j.id, pid as i32)))
            .chain(self.workers.values().filter_map(|w| w.pid.map(|pid| (w.cgroup_id(), pid as i32))))
            .collect();
        self.emit(Effect::WriteLedger(pgids));
    }

    /// Process groups of every managed job and worker.
    pub(super) fn managed_pgids(&self) -> Vec<i32> {
        let jobs = self.jobs.values().filter_map(|j| j.target()).map(|t| t.pgid);
        jobs.chain(self.workers.values().filter_map(|w| w.pid.map(|p| p as i32))).collect()
    }

    pub(super) fn cancel_job(&mut self, id: u64, reason: &str) {
        let Some(j) = self.jobs.get_mut(&id) else { return };
        match j.state {
            JobState::Queued => {
                let device = j.device;
                self.devices[device].queue.retain(|&q| q != id);
                self.finish_job(id, None, None, Some(reason.to_string()));
            }
            JobState::Starting | JobState::Running { .. } => {
                j.cancel_reason.get_or_insert_with(|| reason.to_string());
                if let Some(t) = j.target() {
                    self.emit(Effect::KillJob(t));
                }
            }
        }
    }

    pub(super) fn on_job_exited(&mut self, id: u64, code: Option<i32>, signal: Option<i32>, oom: bool) {
        let reason = self.jobs.get(&id).and_then(|j| j.cancel_reason.clone());
        self.emit(Effect::RemoveCgroup { id });
        self.memory_released(id);
        self.run_ended(id, code, signal, reason, oom);
        self.write_ledger();
    }

    /// A run of a job ended (cold or warm): the job ends, or runs again alone after a CUDA
    /// out-of-memory error beside siblings (`memory`).
    pub(super) fn run_ended(
        &mut self,
        id: u64,
        code: Option<i32>,
        signal: Option<i32>,
        reason: Option<String>,
        oom: bool,
    ) {
        match self.oom_retry_reason(id, code, oom) {
            Some(why) => self.retry_alone(id, why),
            None => self.finish_job(id, code, signal, reason),
        }
    }

    /// Queue a job again, first on its device, to start when nothing else runs there.
    fn retry_alone(&mut self, id: u64, why: String) {
        let Some(j) = self.jobs.get_mut(&id) else { return };
        j.state = JobState::Queued;
        j.worker = None;
        j.deadline = None;
        j.warm_exit = None;
        j.warm_output_closed = false;
        j.warm_oom = false;
        j.memory.expected = None;
        j.memory.current = 0;
        j.memory.retried = Some(why.clone());
        j.started_at = None;
        let (device, conn) = (j.device, j.conn);
        // The first run's peak is not learned: it was cut short by the out-of-memory error, and
        // a low figure would let the command's next runs in beside siblings again.
        let d = &mut self.devices[device];
        d.running.remove(&id);
        if d.command_holder == Some(id) {
            d.command_holder = None;
        }
        d.queue.push_front(id);
        self.log(format!("job {id}: {why}"));
        if let Some(c) = conn {
            self.send(c, Reply::JobRetried { job: id, reason: why });
        }
        self.admit(device);
    }

    /// Record the end of a job, tell its client, and let others in.
    pub(super) fn finish_job(&mut self, id: u64, code: Option<i32>, signal: Option<i32>, reason: Option<String>) {
        let Some(j) = self.jobs.remove(&id) else { return };
        self.learned_peaks.record(&j.spec, j.memory.observed_peak);
        if let Some(started) = j.started_at {
            let ms = self.now.at.saturating_duration_since(started).as_millis();
            self.learned_lengths.record(&j.spec, u64::try_from(ms).unwrap_or(u64::MAX));
        }
        let d = &mut self.devices[j.device];
        d.running.remove(&id);
        if d.command_holder == Some(id) {
            d.command_holder = None;
        }
        let ns = self.now.unix_ns;
        // The store keeps that this was a second run (the client was told by `job_retried`).
        let stored = match (&j.memory.retried, &reason) {
            (Some(why), Some(r)) => Some(format!("{r} (second run, alone: {why})")),
            (Some(why), None) => Some(format!("second run, alone: {why}")),
            (None, r) => r.clone(),
        };
        self.store(StoreWrite::JobEnded { id, ns, code, signal, reason: stored });
        if let Some(row) = self.job_memory_row(&j) {
            self.store(StoreWrite::JobMemory(row));
        }
        if let Some(c) = j.conn {
            let gpu_memory_peak_bytes = (j.memory.observed_peak > 0).then_some(j.memory.observed_peak);
            self.send(c, Reply::JobEnded { job: id, exit: JobExit { code, signal, reason, gpu_memory_peak_bytes } });
            if let Some(conn) = self.conns.get_mut(&c) {
                conn.jobs.remove(&id);
            }
        }
        self.admit(j.device);
    }
}

/// Put `value` first in the `:`-separated list variable `key`.
fn prepend(env: &mut Vec<(String, String)>, key: &str, value: String) {
    match env.iter_mut().find(|(k, _)| k == key) {
        Some((_, v)) if !v.is_empty() => *v = format!("{value}:{v}"),
        Some((_, v)) => *v = value,
        None => env.push((key.into(), value)),
    }
}
