//! Regions: a region's life as one enum ([`RegionState`]), the line each waits in, and the
//! handlers that move regions along (enter, grant, exit, revoke, leave).

use super::{ms, ConnId, Daemon};
use crate::config::FreezeScope;
use crate::effect::{Effect, RegionStep, StoreWrite};
use crate::event::{EnterReport, RegionHost};
use kforge_freeze::JobTarget;
use kforge_gate::Straggler;
use kforge_proto::{ErrorCode, GpuSample, Grant, Policy, RegionStatus, Reply};
use kforge_store::{RegionHostRow, RegionRow};
use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// A gate participant that a drain timed out waiting for: the drains after it do not wait for
/// it while it is still behind on that drain (`kforge_gate::Gate::wait_acks_skipping`).
#[derive(Debug, Clone)]
pub(super) struct Behind {
    /// Its pid and the epoch of the drain that timed out.
    straggler: Straggler,
    /// That drain's region.
    region: u64,
    /// Drains since that did not wait for it.
    skips: u32,
}

impl Behind {
    pub(super) fn status(&self) -> kforge_proto::StragglerStatus {
        kforge_proto::StragglerStatus { pid: self.straggler.pid, since_region: self.region, skipped: self.skips }
    }
}

/// Where a region is in its life. The transitions, and no others:
///
/// ```text
///  region_enter (policy region) ──► Queued ──(its turn; nothing being started)──► Entering
///  Entering ──entered──► Held ──region_exit──► Leaving(Exit)
///  Entering ──hang-up──► Entering { abandoned } ──entered──► Leaving(Abandoned)
///  region_enter (policy none or command: nothing to make exclusive) ──► Held
///  Held ──lease ran out──► Leaving(Revoked) ──region_exit──► Leaving(Revoked { exit_requested })
///  Held ──hang-up──► Leaving(Abandoned)        Held ──shutdown──► Leaving(Shutdown)
///  Queued ──hang-up or shutdown──► dropped (it never held anything)
///  Leaving ──left──► released: a [`Released`] record (revoked? an exit still owed?)
/// ```
///
/// At most one region per line is `Entering`, `Held` or `Leaving` under the `region` policy: the
/// line's holder.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum RegionState {
    Queued,
    /// The device thread is closing the gate, draining, freezing and pinning.
    Entering {
        abandoned: bool,
    },
    /// Granted: the client measures until it exits or the lease runs out.
    Held {
        granted: Instant,
        deadline: Instant,
    },
    /// The device thread undoes the steps (immediate for the none and command policies).
    Leaving {
        granted: Option<Instant>,
        why: Leave,
    },
}

/// Why a region is being left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Leave {
    /// The client asked (it waits for `region_released`).
    Exit,
    /// Its lease ran out; `exit_requested` once the client asked to exit too.
    Revoked { exit_requested: bool },
    /// Its connection went away.
    Abandoned,
    /// The daemon is shutting down.
    Shutdown,
}

/// A region already left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Released {
    pub conn: ConnId,
    pub revoked: bool,
    /// Revoked and left before its client asked to exit: that exit is still to be answered.
    pub exit_owed: bool,
}

/// What a client asks for in `region_enter`.
pub(super) struct EnterRequest {
    pub job: Option<u64>,
    pub device: Option<String>,
    pub name: String,
    pub pid: u32,
    pub tid: u32,
    pub lease_ms: Option<u64>,
}

pub(super) struct Region {
    pub id: u64,
    pub conn: ConnId,
    pub job: Option<u64>,
    pub device: usize,
    name: String,
    pid: u32,
    tid: u32,
    policy: Policy,
    lease: Duration,
    requested: Instant,
    requested_ns: i64,
    pub state: RegionState,
    /// The reserved core taken for the measuring thread (from entering on).
    core: Option<u32>,
    /// Jobs this region froze (what `status` reports as frozen while held).
    pub frozen: Vec<u64>,
    tainted: bool,
}

impl Region {
    pub fn is_queued(&self) -> bool {
        self.state == RegionState::Queued
    }

    pub fn is_held(&self) -> bool {
        matches!(self.state, RegionState::Held { .. })
    }

    pub fn revoked(&self) -> bool {
        matches!(self.state, RegionState::Leaving { why: Leave::Revoked { .. }, .. })
    }

    fn granted(&self) -> Option<Instant> {
        match self.state {
            RegionState::Held { granted, .. } => Some(granted),
            RegionState::Leaving { granted, .. } => granted,
            RegionState::Queued | RegionState::Entering { .. } => None,
        }
    }

    /// When a held region's lease runs out.
    pub fn lease_deadline(&self) -> Option<Instant> {
        match self.state {
            RegionState::Held { deadline, .. } => Some(deadline),
            _ => None,
        }
    }

    /// Queued → Entering, with the core and the jobs it takes.
    fn begin_entering(&mut self, core: Option<u32>, frozen: Vec<u64>) -> bool {
        if self.state != RegionState::Queued {
            return false;
        }
        self.state = RegionState::Entering { abandoned: false };
        self.core = core;
        self.frozen = frozen;
        true
    }

    /// Queued (nothing to make exclusive) or Entering → Held at `now`.
    fn hold(&mut self, now: Instant) -> bool {
        match self.state {
            RegionState::Queued | RegionState::Entering { abandoned: false } => {
                self.state = RegionState::Held { granted: now, deadline: now + self.lease };
                true
            }
            _ => false,
        }
    }

    /// Held (or an abandoned Entering, once entered) → Leaving.
    fn begin_leaving(&mut self, why: Leave) -> bool {
        match self.state {
            RegionState::Held { .. } | RegionState::Entering { abandoned: true } => {
                self.state = RegionState::Leaving { granted: self.granted(), why };
                true
            }
            _ => false,
        }
    }

    pub fn status(&self, now: Instant) -> RegionStatus {
        RegionStatus {
            region: self.id,
            name: self.name.clone(),
            job: self.job,
            pid: self.pid,
            since_ms: ms(now.saturating_duration_since(self.granted().unwrap_or(self.requested))),
        }
    }

    /// The store row of a region just granted: the grant's figures plus who asked and when.
    fn row(&self, g: &Grant, granted_ns: i64) -> RegionRow {
        RegionRow {
            id: g.region,
            job: self.job,
            device: g.device.clone(),
            name: self.name.clone(),
            pid: self.pid,
            tid: self.tid,
            policy: self.policy.as_str().into(),
            exclusive: g.exclusive,
            requested_ns: self.requested_ns,
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
}

/// Exclusive regions queue per device, or one queue for the node under `--freeze node`.
#[derive(Default)]
pub(super) struct RegionLine {
    /// The region entering, held or leaving.
    pub holder: Option<u64>,
    /// Regions waiting, in request order.
    pub waiting: VecDeque<u64>,
}

impl Daemon {
    pub(super) fn on_region_enter(&mut self, conn: ConnId, req: EnterRequest) {
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
        let Some((dev, policy)) = self.region_device(conn, req.job, req.device.as_deref()) else { return };
        if req.lease_ms == Some(0) {
            return self.fail(conn, ErrorCode::BadRequest, "region_enter: lease_ms must be positive".into());
        }
        let lease = req.lease_ms.map(Duration::from_millis).unwrap_or(self.cfg.lease);
        let id = self.next_region;
        self.next_region += 1;
        let region = Region {
            id,
            conn,
            job: req.job,
            device: dev,
            name: req.name,
            pid: req.pid,
            tid: req.tid,
            policy,
            lease,
            requested: self.now.at,
            requested_ns: self.now.unix_ns,
            state: RegionState::Queued,
            core: None,
            frozen: Vec::new(),
            tainted: false,
        };
        self.regions.insert(id, region);
        if let Some(c) = self.conns.get_mut(&conn) {
            c.region = Some(id);
        }
        if policy == Policy::Region {
            let line = self.line_of(dev);
            self.lines[line].waiting.push_back(id);
            self.grant_next(line);
        } else {
            // none: nothing is made exclusive; command: the job already holds the device.
            self.grant(id, EnterReport::default());
        }
    }

    /// The device and policy of a region: its running job's, or a device named (not `auto`).
    /// None after failing the request.
    fn region_device(&mut self, conn: ConnId, job: Option<u64>, device: Option<&str>) -> Option<(usize, Policy)> {
        match job {
            Some(j) => match self.jobs.get(&j) {
                Some(jj) if jj.state.is_running() => Some((jj.device, jj.policy)),
                _ => {
                    self.fail(
                        conn,
                        ErrorCode::NoSuchJob,
                        format!("region_enter: job {j} is not running under this daemon"),
                    );
                    None
                }
            },
            None => {
                let Some(name) = device else {
                    self.fail(conn, ErrorCode::BadRequest, "region_enter needs a job or a device".into());
                    return None;
                };
                match self.resolve_device(name, None) {
                    Some(d) if name != "auto" => Some((d, self.cfg.default_policy)),
                    _ => {
                        self.fail(conn, ErrorCode::NoSuchDevice, format!("region_enter: no device {name:?}"));
                        None
                    }
                }
            }
        }
    }

    /// Try every line (after a process being started got its pid, or could not start).
    pub(super) fn grant_all(&mut self) {
        for line in 0..self.lines.len() {
            self.grant_next(line);
        }
    }

    /// Start entering the next waiting region of a line if none is held. Not while a job or worker
    /// is being started: the freeze targets and the taint check need every process's group (its
    /// start is answered within the same event, so this only orders the two).
    fn grant_next(&mut self, line: usize) {
        if self.lines[line].holder.is_some() || self.stopping || self.starting_any() {
            return;
        }
        let Some(id) = self.lines[line].waiting.pop_front() else { return };
        self.lines[line].holder = Some(id);
        let (dev, job, pid, tid) = {
            let r = &self.regions[&id];
            (r.device, r.job, r.pid, r.tid)
        };
        let targets = self.freeze_targets(dev, job);
        let core = self.take_core();
        let managed_pgids = self.managed_pgids();
        let stragglers = self.devices[dev].stragglers.iter().map(|b| b.straggler).collect();
        let r = self.regions.get_mut(&id).expect("a waiting region exists");
        r.begin_entering(core, targets.iter().map(|t| t.job).collect());
        self.emit(Effect::Step {
            device: dev,
            step: RegionStep::Enter { region: id, holder_pid: pid, tid, targets, core, managed_pgids, stragglers },
        });
    }

    /// The jobs a region of `job` on `device` freezes: the other jobs on the device (the node).
    fn freeze_targets(&self, device: usize, job: Option<u64>) -> Vec<JobTarget> {
        match self.cfg.freeze_scope {
            FreezeScope::None => vec![],
            scope => self
                .jobs
                .values()
                .filter(|j| Some(j.id) != job && (scope == FreezeScope::Node || j.device == device))
                .filter_map(|j| j.target())
                .collect(),
        }
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

    pub(super) fn on_region_entered(&mut self, id: u64, report: EnterReport) {
        for e in &report.freeze_errors {
            self.log(format!("region {id}: freeze failed: {e}"));
        }
        if report.timings.drain_timed_out {
            let line = self.drain_timeout_line(id, &report);
            self.log(line);
        }
        if !report.unmanaged_pids.is_empty() {
            self.log(format!("region {id}: tainted: unmanaged GPU processes {:?}", report.unmanaged_pids));
        }
        if let Some(dev) = self.regions.get(&id).map(|r| r.device) {
            self.track_stragglers(id, dev, &report);
        }
        let Some(r) = self.regions.get_mut(&id) else { return };
        // Not exclusive either: a sibling's GPU work may still run beside it.
        r.tainted |= report.tainted || report.timings.drain_timed_out || !report.skipped.is_empty();
        if r.state == (RegionState::Entering { abandoned: true }) {
            return self.start_leave(id, Leave::Abandoned);
        }
        self.grant(id, report);
    }

    /// The device's stragglers after region `id`'s drain: those it skipped (still behind on the
    /// drain that timed out waiting for them; the first skip logged), then those it timed out
    /// waiting for, at its epoch. One that caught up is waited for again (logged with how many
    /// drains skipped it).
    fn track_stragglers(&mut self, id: u64, dev: usize, report: &EnterReport) {
        let mut lines = Vec::new();
        let mut kept = Vec::new();
        for mut b in std::mem::take(&mut self.devices[dev].stragglers) {
            let pid = b.straggler.pid;
            if !report.skipped.contains(&pid) {
                if b.skips > 0 {
                    lines.push(format!(
                        "region {id}: pid {} is no longer behind on region {}'s drain (acknowledged, or gone); \
                         {} drain(s) did not wait for it",
                        pid, b.region, b.skips
                    ));
                }
                continue;
            }
            if b.skips == 0 {
                lines.push(format!(
                    "region {id}: drain did not wait for pid {}: still behind on region {}'s drain, which timed out \
                     waiting for it (its GPU work then still runs; regions are not exclusive until it catches up)",
                    pid, b.region
                ));
            }
            b.skips += 1;
            kept.push(b);
        }
        if let (true, Some(epoch)) = (report.timings.drain_timed_out, report.drain_epoch) {
            let behind = report.pending.iter().map(|p| Straggler { pid: p.pid, epoch });
            kept.extend(behind.map(|straggler| Behind { straggler, region: id, skips: 0 }));
        }
        self.devices[dev].stragglers = kept;
        lines.into_iter().for_each(|l| self.log(l));
    }

    /// What a drain that timed out waited for: each process that had not acknowledged the
    /// gate's close, named by its job when it leads one, and its command line.
    fn drain_timeout_line(&self, id: u64, report: &EnterReport) -> String {
        let who: Vec<String> = report
            .pending
            .iter()
            .map(|p| {
                let job = self.jobs.values().find(|j| j.state.pid().is_some_and(|leader| p.pgid == Some(leader)));
                let of = job.map_or_else(|| "no job's".to_string(), |j| format!("job {}'s", j.id));
                format!("pid {} ({of}: {})", p.pid, if p.command.is_empty() { "gone" } else { &p.command })
            })
            .collect();
        format!(
            "region {id}: drain timed out after {:.0} ms; not acknowledged by {}",
            report.timings.drain_ms,
            if who.is_empty() { "(no process named)".to_string() } else { who.join(", ") }
        )
    }

    /// Hand the region to its client.
    fn grant(&mut self, id: u64, report: EnterReport) {
        let now = self.now;
        let Some(r) = self.regions.get_mut(&id) else { return };
        if !r.hold(now.at) {
            return;
        }
        let grant = Grant {
            region: id,
            device: self.devices[r.device].info.name.clone(),
            exclusive: r.policy != Policy::None,
            wait_ms: ms(now.at.saturating_duration_since(r.requested)),
            steps: report.timings,
            gpu: report.gpu,
            core: if report.pinned { r.core } else { None },
            tainted: r.tainted,
            lease_ms: r.lease.as_millis() as u64,
        };
        let row = r.row(&grant, now.unix_ns);
        let conn = r.conn;
        self.store(StoreWrite::InsertRegion(Box::new(row)));
        self.send(conn, Reply::RegionGranted(grant));
    }

    pub(super) fn on_region_exit(&mut self, conn: ConnId, id: u64) {
        if let Some(rel) = self.released.get_mut(&id).filter(|rel| rel.conn == conn && rel.exit_owed) {
            rel.exit_owed = false;
            let reply = Reply::RegionReleased { region: id, valid: false, revoked: true, tainted: false, held_ms: 0.0 };
            return self.send(conn, reply);
        }
        let Some(r) = self.regions.get_mut(&id).filter(|r| r.conn == conn) else {
            return self.fail(
                conn,
                ErrorCode::NoSuchRegion,
                format!("region_exit: region {id} is not held on this connection"),
            );
        };
        match &mut r.state {
            RegionState::Held { .. } => self.start_leave(id, Leave::Exit),
            // Revoked while the client was still measuring: its leave is under way.
            RegionState::Leaving { why: Leave::Revoked { exit_requested }, .. } => *exit_requested = true,
            _ => self.fail(conn, ErrorCode::OutOfOrder, format!("region_exit: region {id} was not granted yet")),
        }
    }

    /// Revoke the held regions whose lease ran out.
    pub(super) fn revoke_expired(&mut self) {
        let now = self.now.at;
        let expired: Vec<u64> =
            self.regions.values().filter(|r| r.lease_deadline().is_some_and(|d| d <= now)).map(|r| r.id).collect();
        for id in expired {
            let (conn, lease) = {
                let r = &self.regions[&id];
                (r.conn, r.lease)
            };
            let reason = format!("lease of {} ms ran out; its measurements are invalid", lease.as_millis());
            self.send(conn, Reply::RegionRevoked { region: id, reason });
            self.start_leave(id, Leave::Revoked { exit_requested: false });
        }
    }

    fn start_leave(&mut self, id: u64, why: Leave) {
        let Some(r) = self.regions.get_mut(&id) else { return };
        if !r.begin_leaving(why) {
            return;
        }
        if r.policy == Policy::Region {
            let device = r.device;
            self.emit(Effect::Step { device, step: RegionStep::Leave { region: id } });
        } else {
            self.on_region_left(id, None, None);
        }
    }

    pub(super) fn on_region_left(&mut self, id: u64, gpu: Option<GpuSample>, host: Option<RegionHost>) {
        let Some(RegionState::Leaving { granted, why }) = self.regions.get(&id).map(|r| r.state) else { return };
        let r = self.regions.remove(&id).expect("checked above");
        let revoked = matches!(why, Leave::Revoked { .. });
        if granted.is_some() {
            self.store(StoreWrite::RegionReleased {
                id,
                ns: self.now.unix_ns,
                revoked,
                tainted: r.tainted,
                gpu: gpu.map(|g| (g.temp_c, g.sm_clock_mhz)),
            });
            if let Some(RegionHost { cpu, delta: d }) = host {
                let row = RegionHostRow {
                    region: id,
                    cpu,
                    steal_ms: d.steal_ms,
                    irq_ms: d.irq_ms,
                    run_delay_ms: d.run_delay_ms,
                };
                self.store(StoreWrite::RegionHost(row));
            }
        }
        if let Some(core) = r.core {
            self.busy_cores.remove(&core);
        }
        let conn_open = match self.conns.get_mut(&r.conn) {
            Some(c) => {
                if c.region == Some(id) {
                    c.region = None;
                }
                true
            }
            None => false,
        };
        // Revoked while the client still measures: answer its exit when it comes.
        let exit_owed = conn_open && why == Leave::Revoked { exit_requested: false };
        self.released.insert(id, Released { conn: r.conn, revoked, exit_owed });
        let exit_asked = matches!(why, Leave::Exit | Leave::Revoked { exit_requested: true });
        if let (Some(g), true) = (granted, exit_asked) {
            let held_ms = ms(self.now.at.saturating_duration_since(g));
            let reply = Reply::RegionReleased { region: id, valid: !revoked, revoked, tainted: r.tainted, held_ms };
            self.send(r.conn, reply);
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

    /// The region's connection is gone: drop it if it waits, leave it once entered.
    pub(super) fn abandon_region(&mut self, id: u64) {
        let Some(r) = self.regions.get_mut(&id) else { return };
        match r.state {
            RegionState::Queued => {
                let device = r.device;
                let line = self.line_of(device);
                self.lines[line].waiting.retain(|&w| w != id);
                self.regions.remove(&id);
            }
            RegionState::Entering { .. } => r.state = RegionState::Entering { abandoned: true },
            RegionState::Held { .. } => self.start_leave(id, Leave::Abandoned),
            RegionState::Leaving { .. } => {}
        }
    }

    /// At shutdown: drop waiting regions, leave held ones.
    pub(super) fn leave_all_regions(&mut self) {
        for line in &mut self.lines {
            for id in line.waiting.drain(..) {
                self.regions.remove(&id);
            }
        }
        let held: Vec<u64> = self.regions.values().filter(|r| r.is_held()).map(|r| r.id).collect();
        for id in held {
            self.start_leave(id, Leave::Shutdown);
        }
    }

    /// Jobs frozen now: those of the regions held.
    pub(super) fn frozen_jobs(&self) -> BTreeSet<u64> {
        self.lines
            .iter()
            .filter_map(|l| l.holder)
            .filter_map(|h| self.regions.get(&h))
            .filter(|r| r.is_held())
            .flat_map(|r| r.frozen.iter().copied())
            .collect()
    }
}
