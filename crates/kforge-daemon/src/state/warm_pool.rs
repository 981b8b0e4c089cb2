//! The warm worker pools: one per device, kept at its size; jobs handed to idle workers; workers
//! recycled on any hygiene finding and replaced; a pool that cannot start workers disabled.
//! (The processes themselves are `crate::warm`'s; this is the bookkeeping.)

use super::Daemon;
use crate::effect::{Effect, WarmLaunch, WorkerLaunch, WORKER_CGROUP_BASE};
use crate::event::WorkerMsg;
use kforge_freeze::JobTarget;
use kforge_proto::{PoolStatus, SubmitSpec};
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WorkerState {
    /// Started (or being started), not ready yet.
    Starting,
    Idle,
    Busy(u64),
    /// Asked to go (recycled); its exit is expected.
    Stopping,
}

pub(super) struct WarmWorker {
    pub id: u64,
    pub device: usize,
    /// None while its process is being started.
    pub pid: Option<u32>,
    pub cgroup: Option<PathBuf>,
    pub state: WorkerState,
}

impl WarmWorker {
    /// The id of its cgroup (and its ledger entry).
    pub fn cgroup_id(&self) -> u64 {
        WORKER_CGROUP_BASE + self.id
    }

    fn target(&self) -> Option<JobTarget> {
        self.pid.map(|pid| JobTarget { job: self.cgroup_id(), pgid: pid as i32, cgroup: self.cgroup.clone() })
    }
}

impl Daemon {
    pub(super) fn idle_worker(&self, device: usize) -> Option<u64> {
        self.workers.values().find(|w| w.device == device && w.state == WorkerState::Idle).map(|w| w.id)
    }

    /// What a warm worker would run of a submitted command: None runs it cold; an error refuses
    /// the submission (an explicit `--warm` that cannot be honoured).
    pub(super) fn warm_argv_for(&self, device: usize, spec: &SubmitSpec) -> Result<Option<Vec<String>>, String> {
        let python = is_python(&spec.argv[0]);
        if !(spec.warm || (self.cfg.warm_python && python)) {
            return Ok(None);
        }
        let explicit = spec.warm;
        if !python {
            return Err(format!("--warm runs Python commands only; {:?} is not a Python interpreter", spec.argv[0]));
        }
        if spec.own_process && !self.cfg.worker_fork {
            if !explicit {
                return Ok(None); // routed by --warm-python: cold, in a process of its own
            }
            return Err("this command needs a process of its own, and the warm workers run each job inside \
                 the worker's process: start the daemon with --worker-fork, or run it without --warm"
                .into());
        }
        let d = &self.devices[device];
        match warm_argv(&spec.argv) {
            Ok(_) if d.pool.size == 0 && explicit => {
                Err(format!("device {} has no warm workers (start the daemon with --warm-workers N)", d.info.name))
            }
            Ok(_) if d.pool.disabled.is_some() && explicit => {
                let why = d.pool.disabled.clone().unwrap_or_default();
                Err(format!("the warm pool of device {} is disabled: {why}", d.info.name))
            }
            Ok(a) if d.pool.size > 0 && d.pool.disabled.is_none() => Ok(Some(a)),
            Ok(_) => Ok(None),
            Err(e) if explicit => Err(format!("cannot run warm: {e}")),
            Err(_) => Ok(None), // routed by --warm-python: this command line needs a real interpreter
        }
    }

    /// Hand an admitted warm job to an idle worker of its device.
    pub(super) fn start_warm_job(&mut self, id: u64) {
        let j = &self.jobs[&id];
        let (device, policy, conn) = (j.device, j.policy, j.conn);
        let Some(wid) = self.idle_worker(device) else {
            // admit() checked; a worker cannot vanish in between (single thread).
            return self.finish_job(id, Some(1), None, Some("no warm worker was free".into()));
        };
        let mut env = self.device_env(device, &j.spec.env, Some(id), policy);
        if j.spec.auto_regions {
            self.auto_regions_env(&mut env);
        }
        let launch = WarmLaunch {
            worker: wid,
            job: id,
            argv: j.warm_argv.clone().unwrap_or_default(),
            cwd: j.spec.cwd.clone(),
            env,
            conn,
        };
        self.workers.get_mut(&wid).expect("idle worker exists").state = WorkerState::Busy(id);
        self.jobs.get_mut(&id).expect("job exists").worker = Some(wid);
        self.emit(Effect::HandToWorker(launch));
    }

    pub(super) fn on_handed_to_worker(&mut self, wid: u64, job: u64, result: Result<(), String>) {
        self.answer_hand_off(wid, job, result);
        // Whatever the answer, no job or worker of this hand-off is still being started: regions
        // held back by `starting_any` may be entered now.
        self.grant_all();
    }

    fn answer_hand_off(&mut self, wid: u64, job: u64, result: Result<(), String>) {
        let Some(w) = self.workers.get_mut(&wid) else {
            // The worker is gone (nothing removes one between the hand-off and its answer today):
            // the job must not stay `Starting`, which would hold every region back.
            if self.jobs.contains_key(&job) {
                let reason = format!("warm worker {wid} was gone when job {job} was handed to it");
                self.finish_job(job, Some(1), None, Some(reason));
            }
            return;
        };
        match result {
            Ok(()) => {
                let (pid, cgroup) = (w.pid.unwrap_or(0), w.cgroup.clone());
                if let Some(j) = self.jobs.get_mut(&job) {
                    j.state = super::JobState::Running { pid, cgroup };
                    self.job_running(job);
                }
            }
            Err(e) => {
                // The worker is unusable: replace it; the job fails with the reason.
                w.state = WorkerState::Stopping;
                if let Some(t) = w.target() {
                    self.emit(Effect::KillWorker(t));
                }
                if let Some(j) = self.jobs.get_mut(&job) {
                    j.worker = None;
                }
                let reason = format!("could not hand the job to warm worker {wid}: {e}");
                self.finish_job(job, Some(1), None, Some(reason));
            }
        }
    }

    /// Start a worker if the device's pool is short of its size (not counting ones on their way
    /// out), one at a time: the next once this one has started.
    pub(super) fn fill_pool(&mut self, device: usize) {
        if self.stopping || self.devices[device].pool.disabled.is_some() {
            return;
        }
        let mine = || self.workers.values().filter(|w| w.device == device);
        if mine().any(|w| w.pid.is_none()) {
            return;
        }
        let alive = mine().filter(|w| w.state != WorkerState::Stopping).count();
        if alive < self.devices[device].pool.size {
            self.spawn_worker(device);
        }
    }

    fn spawn_worker(&mut self, device: usize) {
        let id = self.next_worker;
        self.next_worker += 1;
        let mut env = self.device_env(device, &self.base_env, None, self.cfg.default_policy);
        env.push(("KFORGE_WORKER_PRELOAD".into(), self.cfg.worker_preload.clone()));
        env.push(("KFORGE_WORKER_MAX_JOBS".into(), self.cfg.worker_max_jobs.to_string()));
        env.push(("KFORGE_WORKER_MAX_RSS_MB".into(), self.cfg.worker_max_rss_mb.to_string()));
        if self.cfg.worker_fork {
            env.push(("KFORGE_WORKER_ISOLATION".into(), "fork".into()));
        }
        let log = self.python_dir.parent().unwrap_or(&self.python_dir).join(format!("worker-{id}.log"));
        let launch =
            WorkerLaunch { worker: id, python: self.cfg.worker_python.clone(), env, cpus: self.job_cores.clone(), log };
        self.workers.insert(id, WarmWorker { id, device, pid: None, cgroup: None, state: WorkerState::Starting });
        self.emit(Effect::SpawnWorker(launch));
    }

    pub(super) fn on_worker_spawned(&mut self, wid: u64, pid: u32, cgroup: Option<PathBuf>) {
        if let Some(w) = self.workers.get_mut(&wid) {
            w.pid = Some(pid);
            w.cgroup = cgroup;
            let device = w.device;
            self.write_ledger();
            self.fill_pool(device);
        }
        self.grant_all();
    }

    pub(super) fn on_worker_spawn_failed(&mut self, wid: u64, error: &str) {
        if let Some(w) = self.workers.remove(&wid) {
            let why = format!("cannot start {}: {error}", self.cfg.worker_python);
            self.log(format!("warm pool of device {}: {why}", self.devices[w.device].info.name));
            self.disable_pool(w.device, why);
        }
        self.grant_all();
    }

    fn disable_pool(&mut self, device: usize, why: String) {
        self.devices[device].pool.disabled = Some(why.clone());
        // Warm jobs waiting for a worker of this pool would wait forever: fail them.
        let waiting: Vec<u64> =
            self.devices[device].queue.iter().copied().filter(|j| self.jobs[j].warm_argv.is_some()).collect();
        self.devices[device].queue.retain(|j| !waiting.contains(j));
        let reason = format!("warm pool of device {} disabled: {why}", self.devices[device].info.name);
        for j in waiting {
            self.finish_job(j, Some(1), None, Some(reason.clone()));
        }
    }

    pub(super) fn on_worker_msg(&mut self, wid: u64, msg: WorkerMsg) {
        let Some(w) = self.workers.get(&wid) else { return };
        let device = w.device;
        match msg {
            WorkerMsg::Ready { pid: _, preloaded, cuda, startup_ms, error } => {
                let w = self.workers.get_mut(&wid).expect("checked above");
                if w.state == WorkerState::Starting {
                    w.state = WorkerState::Idle;
                }
                self.devices[device].pool_start_failures = 0;
                if let Some(e) = error {
                    self.log(format!("warm worker {wid}: {e}"));
                }
                let name = &self.devices[device].info.name;
                let line = format!(
                    "warm worker {wid} ready on device {name} in {startup_ms:.0} ms (preloaded {preloaded:?}, cuda {cuda})"
                );
                self.log(line);
                self.admit(device);
            }
            WorkerMsg::Done { job, exit_code, signal, recycle } => {
                // A forked job's child killed by a signal ends as a job killed by it.
                let end = if signal.is_some() { (None, signal) } else { (Some(exit_code), None) };
                self.on_worker_done(wid, job, end, recycle)
            }
        }
    }

    fn on_worker_done(&mut self, wid: u64, job: u64, end: (Option<i32>, Option<i32>), recycle: Vec<String>) {
        let w = self.workers.get_mut(&wid).expect("the caller checked");
        let device = w.device;
        if w.state != WorkerState::Busy(job) {
            return self.log(format!("warm worker {wid} reported job {job}, which it was not running"));
        }
        self.devices[device].pool.jobs_served += 1;
        if recycle.is_empty() {
            w.state = WorkerState::Idle;
        } else {
            // The worker exits by itself after a recycle finding; replace it now.
            w.state = WorkerState::Stopping;
            for r in recycle {
                self.log(format!("warm worker {wid} recycled after job {job}: {r}"));
                // Count by kind ("thread left running"), not by the detail after the colon.
                let kind = r.split(':').next().unwrap_or(&r).trim().to_string();
                *self.devices[device].pool.recycled.entry(kind).or_insert(0) += 1;
            }
            self.fill_pool(device);
        }
        if let Some(j) = self.jobs.get_mut(&job) {
            j.warm_exit = Some(end);
            j.worker = None;
        }
        self.maybe_finish_warm(job);
        self.admit(device);
    }

    pub(super) fn on_worker_exited(&mut self, wid: u64, code: Option<i32>, signal: Option<i32>) {
        let Some(w) = self.workers.remove(&wid) else { return };
        let device = w.device;
        // Whatever the worker or its job left behind goes with it.
        if let Some(t) = w.target() {
            self.emit(Effect::KillWorker(t));
        }
        self.emit(Effect::RemoveCgroup { id: w.cgroup_id() });
        let how = match (code, signal) {
            (_, Some(sig)) => format!("killed by signal {sig}"),
            (Some(c), None) => format!("exited with code {c}"),
            _ => "ended".into(),
        };
        match w.state {
            WorkerState::Busy(job) => self.busy_worker_died(wid, device, job, code, signal, &how),
            WorkerState::Starting => {
                let d = &mut self.devices[device];
                d.pool_start_failures += 1;
                *d.pool.recycled.entry("failed to start".into()).or_insert(0) += 1;
                let failures = d.pool_start_failures;
                self.log(format!("warm worker {wid} {how} before it was ready (see its log)"));
                if failures >= 3 {
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

    /// A worker died running a job: the job ends with the worker's status and the reason.
    fn busy_worker_died(
        &mut self,
        wid: u64,
        device: usize,
        job: u64,
        code: Option<i32>,
        signal: Option<i32>,
        how: &str,
    ) {
        let reason = self.jobs.get(&job).and_then(|j| j.cancel_reason.clone());
        let key = reason
            .clone()
            .map(|r| if r.starts_with("time limit") { "time limit".to_string() } else { r })
            .unwrap_or_else(|| "job killed its worker".into());
        *self.devices[device].pool.recycled.entry(key).or_insert(0) += 1;
        if let Some(j) = self.jobs.get_mut(&job) {
            j.warm_exit = Some((Some(code.unwrap_or(128 + signal.unwrap_or(0))), None));
            j.worker = None;
            j.cancel_reason = Some(reason.unwrap_or_else(|| format!("the job's warm worker {wid} {how}")));
            // Its output pipes were closed with the worker's descriptors.
        }
        self.maybe_finish_warm(job);
    }

    pub(super) fn on_warm_output_closed(&mut self, job: u64, oom: bool) {
        if let Some(j) = self.jobs.get_mut(&job) {
            j.warm_output_closed = true;
            j.warm_oom = oom;
        }
        self.maybe_finish_warm(job);
    }

    /// A warm job ends when its worker reported (or died) and its output is fully sent.
    fn maybe_finish_warm(&mut self, job: u64) {
        let Some(j) = self.jobs.get(&job) else { return };
        if let (Some((code, signal)), true) = (j.warm_exit, j.warm_output_closed) {
            let (reason, oom) = (j.cancel_reason.clone(), j.warm_oom);
            self.run_ended(job, code, signal, reason, oom);
        }
    }

    /// At shutdown: every worker goes.
    pub(super) fn stop_workers(&mut self) {
        let targets: Vec<JobTarget> = self
            .workers
            .values_mut()
            .filter_map(|w| {
                w.state = WorkerState::Stopping;
                w.target()
            })
            .collect();
        for t in targets {
            self.emit(Effect::KillWorker(t));
        }
    }

    pub(super) fn pool_status(&self, device: usize) -> PoolStatus {
        let mut p = self.devices[device].pool.clone();
        for w in self.workers.values().filter(|w| w.device == device) {
            match w.state {
                WorkerState::Starting => p.starting += 1,
                WorkerState::Idle => p.warm += 1,
                WorkerState::Busy(_) => p.busy += 1,
                WorkerState::Stopping => {}
            }
        }
        p
    }
}

/// Is `argv[0]` a Python interpreter (`python`, `python3`, `python3.12`, or a path to one)?
pub fn is_python(argv0: &str) -> bool {
    let name = std::path::Path::new(argv0).file_name().and_then(|n| n.to_str()).unwrap_or("");
    let Some(rest) = name.strip_prefix("python") else { return false };
    rest.is_empty() || rest.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The part of a Python command line a warm worker can run: `SCRIPT args…`, `-c CODE args…`,
/// `-m MODULE args…`, optionally after `-u`. Other interpreter options need a real interpreter.
pub fn warm_argv(argv: &[String]) -> Result<Vec<String>, String> {
    let rest = &argv[1..];
    let (unbuf, rest) = match rest.first().map(String::as_str) {
        Some("-u") => (true, &rest[1..]),
        _ => (false, rest),
    };
    match rest.first().map(String::as_str) {
        None => Err("no script given (an interactive interpreter cannot run warm)".into()),
        Some("-c") | Some("-m") if rest.len() < 2 => Err(format!("{} needs an argument", rest[0])),
        Some("-c") | Some("-m") => Ok(with_u(unbuf, rest)),
        Some(o) if o.starts_with('-') => Err(format!("interpreter option {o} is not supported by warm workers")),
        Some(_) => Ok(with_u(unbuf, rest)),
    }
}

fn with_u(unbuf: bool, rest: &[String]) -> Vec<String> {
    let mut v = Vec::with_capacity(rest.len() + 1);
    if unbuf {
        v.push("-u".to_string());
    }
    v.extend_from_slice(rest);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }
    #[test]
    fn python_names() {
        for ok in ["python", "python3", "python3.12", "/usr/bin/python3.12", "./venv/bin/python"] {
            assert!(is_python(ok), "{ok}");
        }
        for no in ["pythonx", "python3.", "ipython", "sh", "/usr/bin/python-config", ""] {
            assert!(!is_python(no), "{no}");
        }
    }
    #[test]
    fn warm_argv_forms() {
        assert_eq!(warm_argv(&s(&["python", "a.py", "1"])).unwrap(), s(&["a.py", "1"]));
        assert_eq!(warm_argv(&s(&["python", "-u", "-c", "x", "y"])).unwrap(), s(&["-u", "-c", "x", "y"]));
        assert_eq!(warm_argv(&s(&["python3", "-m", "mod"])).unwrap(), s(&["-m", "mod"]));
        assert!(warm_argv(&s(&["python3"])).is_err());
        assert!(warm_argv(&s(&["python3", "-c"])).is_err());
        assert!(warm_argv(&s(&["python3", "-X", "dev", "a.py"])).unwrap_err().contains("-X"));
    }
}
