//! GPU-memory-aware admission: a job starts on a device only when its expected peak fits beside
//! what runs there, and a job that ran out of CUDA memory while other processes held memory on
//! its device runs once more, alone.
//!
//! - **Samples** (`Event::GpuMemory`, from the sampler thread: NVML, or the `--debug-gpu-memory`
//!   file) give a device's free/total memory and each process's use. A device without samples
//!   (the cpu device, a GPU whose NVML fails) is admitted on its other rules only.
//! - **Expected peak** of a job: declared (`SubmitSpec::gpu_memory_bytes`), else learned (the
//!   highest use of the last [`super::learned::LEARNED_RECENT`] runs of an earlier job with the same command line (temporary paths left out),
//!   else the same label: the
//!   [`super::learned::LEARNED_CAPACITY`] most recently used, filled at start from the store's `job_memory`
//!   rows), else the default: a quarter of the
//!   device's total memory ([`DEFAULT_SHARE`]).
//! - **Fit**: expected peak ≤ free − reserved, where reserved is, over the device's started jobs,
//!   what each may still grow to (expected − its current use): two jobs admitted in one event do
//!   not both count on the same free memory. Warm workers' use is in the sample (their real
//!   footprint); a warm job's own use is its worker's above what the worker held when handed it.
//!   A job whose peak exceeds the whole device starts only alone (a log line says so).
//! - **No starvation**: the queue is FIFO per device; while the head waits for memory, a later
//!   job that fits may start before it at most [`MAX_PASSES`] times; then the queue waits for
//!   the head. While the head waits to run alone, a later job expected to end before the
//!   running ones (`SubmitSpec::expected_ms`, or its command's longest run when longer:
//!   `learned`) starts without using a pass (backfill).
//! - **OOM retry**: a job whose stderr says CUDA ran out of memory, that did not exit 0, was not
//!   cancelled, and beside which other processes held memory on its device (in a sample while it
//!   ran, or the latest one when it ended), is queued again at the front, to start only when
//!   nothing else runs on the device; while it runs no other job starts there.
//!   Its client gets `job_retried`, then the second run's output and exit; the store's job row
//!   keeps the first run's reason (`reason` column). Once only: a second OOM is the job's own.

use super::admission::Job;
use super::Daemon;
use crate::event::MemorySample;
use kforge_proto::{DeviceMemoryStatus, JobMemoryStatus};
use kforge_store::JobMemoryRow;

/// An unknown job is expected to peak at the device's total memory divided by this.
pub(super) const DEFAULT_SHARE: u64 = kforge_proto::DEFAULT_GPU_MEMORY_SHARE;
/// How many later jobs may start before a queue head that waits for memory.
pub(super) const MAX_PASSES: u32 = 4;

const GIB: f64 = (1u64 << 30) as f64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PeakSource {
    Declared,
    Learned,
    Default,
}

impl PeakSource {
    pub fn as_str(self) -> &'static str {
        match self {
            PeakSource::Declared => "declared",
            PeakSource::Learned => "learned",
            PeakSource::Default => "default",
        }
    }
}

/// A job's memory bookkeeping.
#[derive(Debug, Default)]
pub(super) struct JobMemory {
    /// What admission counted with when it started (None: queued, or no sample of its device).
    pub expected: Option<(u64, PeakSource)>,
    /// Its use in the latest sample.
    pub current: u64,
    pub observed_peak: u64,
    /// The most other processes used on its device in one sample while it ran.
    pub siblings_peak: u64,
    /// A warm job: its worker's use when the job was handed over.
    pub baseline: u64,
    /// Why its first run is being retried alone (Some: this is, or will be, the second run).
    pub retried: Option<String>,
    /// Later jobs that started before it while it waited for memory at the head of the queue.
    pub passed: u32,
    /// The oversized-job log line was written.
    pub oversized_logged: bool,
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / GIB)
}

/// What a job uses in a sample: its process group's use (a warm job's: its worker's, above the
/// baseline).
fn use_in(j: &Job, s: &MemorySample) -> u64 {
    let Some(pgid) = j.state.pid().map(|p| p as i32) else { return 0 };
    let used = s.used_by(pgid);
    used.saturating_sub(j.memory.baseline)
}

/// What processes other than the job's use in a sample. Processes this pid namespace cannot see
/// (NVML reporting a container's host pids) cannot be told apart: they count as others only
/// when other managed processes (`others_managed`) share the device.
fn others_in(j: &Job, s: &MemorySample, others_managed: bool) -> u64 {
    let pgid = j.state.pid().map(|p| p as i32);
    s.processes
        .iter()
        .filter(|p| match p.pgid {
            Some(g) => Some(g) != pgid,
            None => others_managed,
        })
        .map(|p| p.used)
        .sum()
}

impl Daemon {
    /// A job's expected peak on its device (None: the device has no sample).
    pub(super) fn expected_peak(&self, j: &Job) -> Option<(u64, PeakSource)> {
        let s = self.devices[j.device].memory.as_ref()?;
        Some(match (j.spec.gpu_memory_bytes, self.learned_peaks.get(&j.spec)) {
            (Some(b), _) => (b, PeakSource::Declared),
            (None, Some(b)) => (b, PeakSource::Learned),
            (None, None) => (s.total / DEFAULT_SHARE, PeakSource::Default),
        })
    }

    /// Memory held back for the device's started jobs that have not reached their peak.
    pub(super) fn reserved(&self, device: usize) -> u64 {
        self.devices[device]
            .running
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .filter_map(|j| j.memory.expected.map(|(peak, _)| peak.saturating_sub(j.memory.current)))
            .sum()
    }

    /// Whether a queued job starts only with nothing else running on its device: it is run
    /// again alone after an out-of-memory error, or its expected peak exceeds the device.
    pub(super) fn starts_only_alone(&self, device: usize, id: u64) -> bool {
        let j = &self.jobs[&id];
        if j.memory.retried.is_some() {
            return true;
        }
        let total = self.devices[device].memory.as_ref().map(|s| s.total);
        matches!((self.expected_peak(j), total), (Some((peak, _)), Some(t)) if peak > t)
    }

    /// Whether a queued job's memory allows it to start now.
    pub(super) fn memory_fits(&self, device: usize, id: u64) -> bool {
        let j = &self.jobs[&id];
        let d = &self.devices[device];
        let alone = d.running.is_empty();
        if j.memory.retried.is_some() {
            return alone;
        }
        // A job run again alone stays alone.
        if d.running.iter().filter_map(|r| self.jobs.get(r)).any(|r| r.memory.retried.is_some()) {
            return false;
        }
        let (Some(s), Some((peak, _))) = (self.devices[device].memory.as_ref(), self.expected_peak(j)) else {
            return true;
        };
        if peak > s.total {
            return alone;
        }
        peak <= s.free.saturating_sub(self.reserved(device))
    }

    /// A job starts: fix the peak admission counts with (and a warm job's baseline).
    pub(super) fn memory_on_start(&mut self, id: u64) {
        let Some(j) = self.jobs.get(&id) else { return };
        let expected = self.expected_peak(j);
        let total = self.devices[j.device].memory.as_ref().map(|s| s.total);
        let worker_use = j.worker.and_then(|w| self.workers.get(&w)).and_then(|w| w.pid).map(|pid| {
            let s = self.devices[j.device].memory.as_ref();
            s.map_or(0, |s| s.used_by(pid as i32))
        });
        let oversized = matches!((expected, total), (Some((peak, _)), Some(t)) if peak > t);
        let name = self.devices[j.device].info.name.clone();
        let j = self.jobs.get_mut(&id).expect("the job exists");
        j.memory.expected = expected;
        j.memory.current = 0;
        j.memory.baseline = worker_use.unwrap_or(0);
        if oversized && !j.memory.oversized_logged {
            j.memory.oversized_logged = true;
            let (peak, t) = (expected.map_or(0, |e| e.0), total.unwrap_or(0));
            self.log(format!(
                "job {id}: expected peak {} exceeds device {name}'s {} of memory: started alone",
                gib(peak),
                gib(t)
            ));
        }
    }

    /// A sample of a device: update the use of its jobs, then admit what fits now.
    pub(super) fn on_gpu_memory(&mut self, device: usize, sample: MemorySample) {
        if device >= self.devices.len() {
            return;
        }
        let running: Vec<u64> = self.devices[device].running.iter().copied().collect();
        let others_managed: Vec<u64> = running.iter().copied().filter(|&id| self.others_managed(id)).collect();
        let first = self.devices[device].memory.is_none();
        self.devices[device].memory = Some(sample);
        for id in running {
            let expected = if first { self.jobs.get(&id).and_then(|j| self.expected_peak(j)) } else { None };
            let s = self.devices[device].memory.as_ref().expect("just set");
            let Some(j) = self.jobs.get_mut(&id) else { continue };
            let (used, others) = (use_in(j, s), others_in(j, s, others_managed.contains(&id)));
            if j.state.is_running() {
                let m = &mut j.memory;
                m.current = used;
                m.observed_peak = m.observed_peak.max(used);
                m.siblings_peak = m.siblings_peak.max(others);
            }
            if j.memory.expected.is_none() {
                j.memory.expected = expected;
            }
        }
        self.admit(device);
    }

    /// Whether other jobs or warm workers than the job (and its worker) are on its device.
    fn others_managed(&self, id: u64) -> bool {
        let Some(j) = self.jobs.get(&id) else { return false };
        let d = &self.devices[j.device];
        d.running.iter().any(|&r| r != id)
            || self.workers.values().any(|w| w.device == j.device && Some(w.id) != j.worker && w.pid.is_some())
    }

    /// Why a job's run that just ended should run again alone (None: it ends).
    pub(super) fn oom_retry_reason(&mut self, id: u64, code: Option<i32>, oom: bool) -> Option<String> {
        // Other processes' use in the latest sample counts too: a run shorter than the sampling
        // interval may have seen no sample of its own.
        let others_managed = self.others_managed(id);
        let j = self.jobs.get(&id)?;
        let latest = self.devices[j.device].memory.as_ref().map_or(0, |s| others_in(j, s, others_managed));
        let j = self.jobs.get_mut(&id)?;
        j.memory.siblings_peak = j.memory.siblings_peak.max(latest);
        let j = &self.jobs[&id];
        let siblings = j.memory.siblings_peak;
        let retry = oom
            && code != Some(0)
            && !self.stopping
            && j.cancel_reason.is_none()
            && j.memory.retried.is_none()
            && siblings > 0;
        retry.then(|| {
            format!(
                "CUDA out of memory while other processes held up to {} on device {}: run again, alone",
                gib(siblings),
                self.devices[j.device].info.name
            )
        })
    }

    /// A cold job's processes are gone: what they used is free again (before the next sample).
    pub(super) fn memory_released(&mut self, id: u64) {
        let Some(j) = self.jobs.get(&id) else { return };
        let (Some(pgid), false) = (j.state.pid().map(|p| p as i32), j.warm_argv.is_some()) else { return };
        if let Some(s) = self.devices[j.device].memory.as_mut() {
            let freed = s.used_by(pgid);
            s.processes.retain(|p| p.pgid != Some(pgid));
            s.free = (s.free + freed).min(s.total);
        }
    }

    /// The store row of an ending job's memory (None: its device never had a sample).
    pub(super) fn job_memory_row(&self, j: &Job) -> Option<JobMemoryRow> {
        let m = &j.memory;
        if self.devices[j.device].memory.is_none() && m.expected.is_none() && m.observed_peak == 0 {
            return None;
        }
        Some(JobMemoryRow {
            job: j.id,
            expected_bytes: m.expected.map(|e| e.0),
            source: m.expected.map(|e| e.1.as_str().to_string()),
            peak_bytes: m.observed_peak,
            siblings_peak_bytes: m.siblings_peak,
            retried: m.retried.is_some(),
        })
    }

    pub(super) fn device_memory_status(&self, device: usize) -> Option<DeviceMemoryStatus> {
        let s = self.devices[device].memory.as_ref()?;
        let managed = self.managed_pgids();
        let managed_bytes =
            s.processes.iter().filter(|p| p.pgid.is_some_and(|g| managed.contains(&g))).map(|p| p.used).sum();
        Some(DeviceMemoryStatus {
            total_bytes: s.total,
            free_bytes: s.free,
            reserved_bytes: self.reserved(device),
            managed_bytes,
        })
    }

    pub(super) fn job_memory_status(&self, j: &Job) -> Option<JobMemoryStatus> {
        let expected = j.memory.expected.or_else(|| self.expected_peak(j));
        let declared = j.spec.gpu_memory_bytes.map(|b| (b, PeakSource::Declared));
        if expected.is_none() && declared.is_none() && j.memory.retried.is_none() {
            return None;
        }
        let shown = expected.or(declared);
        Some(JobMemoryStatus {
            expected_bytes: shown.map(|e| e.0),
            source: shown.map_or("", |e| e.1.as_str()).into(),
            observed_peak_bytes: j.memory.observed_peak,
            retried: j.memory.retried.is_some(),
        })
    }
}
