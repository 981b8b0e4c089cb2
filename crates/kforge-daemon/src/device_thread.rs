//! Device threads: one thread per device carries out the slow steps of entering a region
//! (close the gate, drain, freeze siblings, isolate the measuring thread) and of leaving it (the
//! same in reverse), then reports to the state machine. The state machine never blocks on them.
//! ("Worker" means a warm worker process only: see `warm`.)

use crate::effect::RegionStep;
use crate::event::{EnterReport, Event, Inbound, PendingProcess, RegionHost};
use kforge_cores::host::{self, HostCounters};
use kforge_freeze::{Freezer, JobTarget};
use kforge_gate::{Gate, Straggler};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct DeviceThreadConfig {
    pub gate: Option<Arc<Gate>>,
    pub freezer: Arc<Freezer>,
    pub drain_timeout: Duration,
    pub drain: bool,
    pub freeze_timeout: Duration,
    /// NVML index of the device's GPU (None for the cpu device): enables the taint check and
    /// the settle step.
    pub nvml_index: Option<u32>,
    /// Longest wait for throttling to clear (zero: no settle step).
    pub settle_timeout: Duration,
    /// Settle also until the GPU's averaged power draw is at most this fraction of its limit.
    pub settle_power_fraction: f64,
    /// True from the first step of entering a region to the last of leaving it: the memory
    /// sampler makes no NVML query on this device meanwhile (`memory::SampledDevice`).
    pub in_region: Arc<AtomicBool>,
}

/// A region to enter: whose, where its measuring thread goes, and whom its drain skips.
struct Entering<'a> {
    region: u64,
    holder_pid: u32,
    tid: u32,
    core: Option<u32>,
    stragglers: &'a [Straggler],
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Start the thread of one device.
pub fn spawn(name: String, cfg: DeviceThreadConfig, events: Sender<Inbound>) -> Sender<RegionStep> {
    let (tx, rx) = channel::<RegionStep>();
    std::thread::Builder::new()
        .name(format!("kforge-dev-{name}"))
        .spawn(move || {
            let mut device = DeviceThread {
                cfg,
                events,
                frozen: Vec::new(),
                pinned: None,
                gate_closed: false,
                nvml: None,
                host_at_grant: None,
            };
            for op in rx {
                match op {
                    RegionStep::Enter { region, holder_pid, tid, targets, core, managed_pgids, stragglers } => {
                        let entering = Entering { region, holder_pid, tid, core, stragglers: &stragglers };
                        device.enter_region(entering, targets, &managed_pgids)
                    }
                    RegionStep::Leave { region } => device.leave_region(region),
                }
            }
            device.undo_on_shutdown();
        })
        .expect("spawn device thread");
    tx
}

/// The state of one device thread between its steps.
struct DeviceThread {
    cfg: DeviceThreadConfig,
    events: Sender<Inbound>,
    // What the current region changed, to undo on leave.
    frozen: Vec<JobTarget>,
    pinned: Option<(i32, Vec<u32>)>,
    gate_closed: bool,
    /// NVML, initialised on the first region of a GPU device (inner None: it failed to start).
    nvml: Option<Option<nvml_wrapper::Nvml>>,
    /// The host counters of the current region's measuring thread at its grant.
    host_at_grant: Option<HostWatch>,
}

/// Whose host counters a region reads at grant and release (`kforge_cores::host`): the
/// measuring thread's core (`None`: all cpus, not pinned) and the thread, and what they were.
struct HostWatch {
    cpu: Option<u32>,
    pid: u32,
    tid: u32,
    at_grant: HostCounters,
}

impl HostWatch {
    fn start(cpu: Option<u32>, pid: u32, tid: u32) -> HostWatch {
        HostWatch { cpu, pid, tid, at_grant: host::read(cpu, pid, tid) }
    }

    fn at_release(&self) -> RegionHost {
        let delta = host::read(self.cpu, self.pid, self.tid).since(&self.at_grant, host::ms_per_tick());
        RegionHost { cpu: self.cpu, delta }
    }
}

impl DeviceThread {
    fn nvml(&self) -> Option<&nvml_wrapper::Nvml> {
        self.nvml.as_ref().and_then(Option::as_ref)
    }

    fn enter_region(&mut self, e: Entering<'_>, targets: Vec<JobTarget>, managed_pgids: &[i32]) {
        self.cfg.in_region.store(true, Ordering::Release);
        let mut s = EnterReport::default();
        self.check_unmanaged(&mut s, managed_pgids);
        self.close_gate_and_drain(&mut s, e.holder_pid, e.stragglers);
        self.freeze_siblings(&mut s, targets);
        self.settle_gpu(&mut s);
        self.isolate_thread(&mut s, e.tid, e.core);
        let pinned_to = if s.pinned { e.core } else { None };
        let region = e.region;
        if let (Some(idx), Some(n)) = (self.cfg.nvml_index, self.nvml()) {
            s.gpu = sample(n, idx);
        }
        let _ = self.events.send(Event::RegionEntered { region, report: s }.into());
        // After the grant is on its way: /proc reads never delay the hand-over.
        self.host_at_grant = Some(HostWatch::start(pinned_to, e.holder_pid, e.tid));
    }

    /// The taint check: processes on the GPU that no managed job owns.
    fn check_unmanaged(&mut self, s: &mut EnterReport, managed_pgids: &[i32]) {
        if let Some(idx) = self.cfg.nvml_index {
            let nvml = self.nvml.get_or_insert_with(|| nvml_wrapper::Nvml::init().ok());
            if let Some(n) = nvml.as_ref() {
                s.unmanaged_pids = unmanaged_gpu_pids(n, idx, managed_pgids);
                s.tainted = !s.unmanaged_pids.is_empty();
            }
        }
    }

    /// a. Close the gate; b. drain: wait (bounded) until every gate participant has acknowledged
    /// the close, but a straggler still behind on an earlier drain that timed out.
    fn close_gate_and_drain(&mut self, s: &mut EnterReport, holder_pid: u32, stragglers: &[Straggler]) {
        let cfg = &self.cfg;
        // a. close the gate
        let t = Instant::now();
        let epoch = cfg.gate.as_ref().map(|g| g.close(holder_pid));
        self.gate_closed = epoch.is_some();
        s.timings.gate_ms = ms(t.elapsed());
        // b. drain
        if let (Some(g), Some(epoch), true) = (&cfg.gate, epoch, cfg.drain) {
            let d = g.wait_acks_skipping(epoch, cfg.drain_timeout, stragglers);
            s.drain_epoch = Some(epoch);
            s.skipped = d.skipped_pids;
            s.timings.drain_ms = ms(d.elapsed);
            s.timings.drain_timed_out = d.timed_out;
            s.pending = d.pending_pids.into_iter().map(pending_process).collect();
        }
    }

    /// c. Freeze the sibling jobs.
    fn freeze_siblings(&mut self, s: &mut EnterReport, targets: Vec<JobTarget>) {
        let t = Instant::now();
        for (target, r) in targets.iter().zip(self.cfg.freezer.freeze_many(&targets, self.cfg.freeze_timeout)) {
            match r {
                Ok(()) => s.timings.frozen_jobs += 1,
                Err(e) => s.freeze_errors.push(format!("job {}: {e}", target.job)),
            }
        }
        // Thaw even a partial freeze on leave.
        self.frozen.extend(targets);
        s.timings.freeze_ms = ms(t.elapsed());
    }

    /// Settle: competitors' load can leave the GPU power-capped or thermally
    /// throttled for a while after they stop; wait (bounded) until it clears.
    fn settle_gpu(&self, s: &mut EnterReport) {
        let cfg = &self.cfg;
        if let (Some(idx), false) = (cfg.nvml_index, cfg.settle_timeout.is_zero()) {
            if let Some(n) = self.nvml() {
                let (waited, timed_out) = settle(n, idx, cfg.settle_timeout, cfg.settle_power_fraction);
                s.timings.settle_ms = ms(waited);
                s.timings.settle_timed_out = timed_out;
            }
        }
    }

    /// d. Isolate the measuring thread on a reserved core.
    fn isolate_thread(&mut self, s: &mut EnterReport, tid: u32, core: Option<u32>) {
        let t = Instant::now();
        if let Some(core) = core {
            let tid = tid as i32;
            if let Ok(before) = kforge_cores::affinity(tid) {
                if kforge_cores::set_affinity(tid, &[core]).is_ok() {
                    self.pinned = Some((tid, before));
                    s.pinned = true;
                }
            }
        }
        s.timings.isolate_ms = ms(t.elapsed());
    }

    /// Undo what entering did, in reverse: unpin, thaw, open the gate.
    fn leave_region(&mut self, region: u64) {
        if let Some((tid, before)) = self.pinned.take() {
            let _ = kforge_cores::set_affinity(tid, &before);
        }
        for target in self.frozen.drain(..).rev() {
            let _ = self.cfg.freezer.thaw(&target);
        }
        if self.gate_closed {
            if let Some(g) = &self.cfg.gate {
                g.open_gate();
            }
            self.gate_closed = false;
        }
        // The siblings thawed and the gate open first: /proc reads never delay them.
        let host = self.host_at_grant.take().map(|w| w.at_release());
        let gpu = match (self.cfg.nvml_index, self.nvml()) {
            (Some(idx), Some(n)) => sample(n, idx),
            _ => None,
        };
        self.cfg.in_region.store(false, Ordering::Release);
        let _ = self.events.send(Event::RegionLeft { region, gpu, host }.into());
    }

    /// Channel closed (daemon stopping): undo whatever is still in force.
    fn undo_on_shutdown(&mut self) {
        if let Some((tid, before)) = self.pinned.take() {
            let _ = kforge_cores::set_affinity(tid, &before);
        }
        for target in self.frozen.drain(..) {
            let _ = self.cfg.freezer.thaw(&target);
        }
        if let Some(g) = &self.cfg.gate {
            g.open_gate();
        }
        self.cfg.in_region.store(false, Ordering::Release);
    }
}

/// Processes NVML sees on the GPU that are not in a managed job's process group (nor this
/// daemon). Processes NVML names but this pid namespace cannot see (a container's host pids)
/// cannot be told apart and are not counted.
fn unmanaged_gpu_pids(nvml: &nvml_wrapper::Nvml, index: u32, managed_pgids: &[i32]) -> Vec<u32> {
    let Ok(dev) = nvml.device_by_index(index) else { return vec![] };
    let mut pids: Vec<u32> = Vec::new();
    for list in [dev.running_compute_processes(), dev.running_graphics_processes()].into_iter().flatten() {
        pids.extend(list.iter().map(|p| p.pid));
    }
    pids.sort_unstable();
    pids.dedup();
    let me = std::process::id();
    pids.into_iter()
        .filter(|&pid| pid != me)
        .filter(|&pid| match crate::memory::pgid_of(pid) {
            Some(g) => !managed_pgids.contains(&g),
            None => false,
        })
        .collect()
}

/// Clock-throttle reasons that make a timing unlike one on an idle, cool GPU.
fn throttled(d: &nvml_wrapper::Device) -> bool {
    use nvml_wrapper::bitmasks::device::ThrottleReasons as R;
    let bad =
        R::SW_POWER_CAP | R::HW_SLOWDOWN | R::SW_THERMAL_SLOWDOWN | R::HW_THERMAL_SLOWDOWN | R::HW_POWER_BRAKE_SLOWDOWN;
    d.current_throttle_reasons().map(|r| r.intersects(bad)).unwrap_or(false)
}

/// Wait until the GPU is neither throttled nor drawing more than `power_fraction` of its power
/// limit, polling every 2 ms, for at most `timeout`. The power condition: NVML's draw is a 1 s
/// average on Ampere and newer, and a power-bound kernel started while it still holds other
/// jobs' load runs into the power cap — on the H200 a bf16 matmul timed right after three
/// competing matmul loops stopped ran at ~1800 MHz instead of 1980 MHz although no throttle
/// reason was set at the grant. Unknown readings count as settled.
fn settle(n: &nvml_wrapper::Nvml, index: u32, timeout: Duration, power_fraction: f64) -> (Duration, bool) {
    let t = Instant::now();
    let Ok(d) = n.device_by_index(index) else { return (t.elapsed(), false) };
    // The enforced limit does not change while we wait: read it once.
    let cap_mw = match d.enforced_power_limit() {
        Ok(limit) if limit > 0 && power_fraction > 0.0 => Some(power_fraction * limit as f64),
        _ => None,
    };
    let power_high = |d: &nvml_wrapper::Device| cap_mw.is_some_and(|cap| d.power_usage().is_ok_and(|p| p as f64 > cap));
    while throttled(&d) || power_high(&d) {
        if t.elapsed() >= timeout {
            return (t.elapsed(), true);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    (t.elapsed(), false)
}

/// Temperature, SM clock and throttle reasons of a GPU, when NVML answers.
fn sample(n: &nvml_wrapper::Nvml, index: u32) -> Option<kforge_proto::GpuSample> {
    use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
    let d = n.device_by_index(index).ok()?;
    Some(kforge_proto::GpuSample {
        temp_c: d.temperature(TemperatureSensor::Gpu).ok()?,
        sm_clock_mhz: d.clock_info(Clock::SM).ok()?,
        throttle_reasons: d.current_throttle_reasons().map(|r| r.bits()).unwrap_or(0),
    })
}

/// A process that did not acknowledge a drain, as `/proc` has it: its process group
/// (`memory::pgid_of`) and its command line (arguments joined by spaces, at most 160 characters).
fn pending_process(pid: u32) -> PendingProcess {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let line = String::from_utf8_lossy(&raw).replace('\0', " ");
    let pgid = crate::memory::pgid_of(pid).and_then(|g| u32::try_from(g).ok());
    PendingProcess { pid, pgid, command: line.trim_end().chars().take(160).collect() }
}
