//! The state machine without processes: events in, effects out. A [`Sim`] stands in for the
//! server: it answers spawns and hand-offs at once (pids from a counter) and keeps the clock.

use super::*;
use crate::effect::{RegionStep, StoreWrite};
use crate::event::{EnterReport, PendingProcess, RegionHost, WorkerMsg};
use kforge_cores::host::HostDelta;
use kforge_proto::{Grant, Policy, Reply, Request, SubmitSpec};
use kforge_store::RegionHostRow;
use std::collections::VecDeque;

const GPU0: usize = 1;
const GPU1: usize = 2;

struct Sim {
    d: Daemon,
    t0: Instant,
    elapsed: Duration,
    next_pid: u32,
    next_conn: ConnId,
    /// Answer spawns with a failure.
    fail_spawns: bool,
    /// Leave hand-offs to warm workers unanswered (the test answers them).
    hold_hand_offs: bool,
    /// The effects of the daemon's start (its warm workers' spawns among them).
    started: Vec<Effect>,
}

fn devices() -> Vec<DeviceSetup> {
    let dev = |name: &str, kind| DeviceSetup {
        info: DeviceInfo { name: name.into(), kind, description: format!("fake {name}"), cuda_visible: name.into() },
        gate_path: None,
    };
    vec![dev("cpu", DeviceKind::Cpu), dev("0", DeviceKind::Gpu), dev("1", DeviceKind::Gpu)]
}

impl Sim {
    /// A daemon with a cpu device and two fake GPUs, no warm workers unless `tune` says so.
    fn new(tune: impl FnOnce(&mut Config)) -> Sim {
        let mut cfg = Config::new("/run/kforge-test.sock".into());
        cfg.db = ":memory:".into();
        cfg.warm_workers = Some(0);
        tune(&mut cfg);
        let t0 = Instant::now();
        let parts = DaemonParts {
            cfg,
            freeze_mechanism: "test".into(),
            python_dir: "/kforge-test/python".into(),
            base_env: vec![],
            daemon_pid: 1,
            devices: devices(),
            reserved_cores: vec![],
            idle_siblings: vec![],
            shared_siblings: vec![],
            job_cores: vec![1],
            first_ids: (0, 0, 0),
            learned_peaks: vec![],
            learned_lengths: vec![],
        };
        let now = Now { at: t0, unix_ns: 1_000_000_000 };
        let mut sim = Sim {
            d: Daemon::new(parts, now),
            t0,
            elapsed: Duration::ZERO,
            next_pid: 1000,
            next_conn: 1,
            fail_spawns: false,
            hold_hand_offs: false,
            started: Vec::new(),
        };
        let effects = sim.d.start(now);
        sim.started = sim.carry(effects);
        sim
    }

    fn now(&self) -> Now {
        Now { at: self.t0 + self.elapsed, unix_ns: 1_000_000_000 + self.elapsed.as_nanos() as i64 }
    }

    fn advance(&mut self, ms: u64) {
        self.elapsed += Duration::from_millis(ms);
    }

    fn status(&self) -> StatusReport {
        self.d.status(self.now().at)
    }

    /// Handle an event as the server does; every effect, in the order carried out.
    fn handle(&mut self, ev: Event) -> Vec<Effect> {
        let effects = self.d.handle(ev, self.now());
        self.carry(effects)
    }

    fn carry(&mut self, effects: Vec<Effect>) -> Vec<Effect> {
        let mut done = Vec::new();
        let mut pending: VecDeque<Effect> = effects.into();
        while let Some(e) = pending.pop_front() {
            let answer = self.answer(&e);
            done.push(e);
            if let Some(a) = answer {
                for e in self.d.handle(a, self.now()).into_iter().rev() {
                    pending.push_front(e);
                }
            }
        }
        done
    }

    fn answer(&mut self, e: &Effect) -> Option<Event> {
        self.next_pid += 1;
        let pid = self.next_pid;
        match e {
            Effect::SpawnJob(l) if self.fail_spawns => {
                Some(Event::JobSpawnFailed { job: l.job, error: "No such file or directory".into() })
            }
            Effect::SpawnJob(l) => Some(Event::JobSpawned { job: l.job, pid, cgroup: None }),
            Effect::SpawnWorker(l) => Some(Event::WorkerSpawned { worker: l.worker, pid, cgroup: None }),
            Effect::HandToWorker(_) if self.hold_hand_offs => None,
            Effect::HandToWorker(l) => Some(Event::HandedToWorker { worker: l.worker, job: l.job, result: Ok(()) }),
            _ => None,
        }
    }

    /// A greeted connection.
    fn connect(&mut self) -> ConnId {
        let conn = self.next_conn;
        self.next_conn += 1;
        self.handle(Event::Connected { conn });
        let welcome = self.request(conn, Request::Hello { protocol: PROTOCOL_VERSION, client: "test".into() });
        assert!(matches!(replies(&welcome, conn)[..], [Reply::Welcome { .. }]), "{welcome:?}");
        conn
    }

    fn request(&mut self, conn: ConnId, req: Request) -> Vec<Effect> {
        self.handle(Event::Request { conn, req })
    }

    /// Submit a command; its job id.
    fn submit(&mut self, conn: ConnId, device: &str, policy: Policy) -> u64 {
        let spec = SubmitSpec {
            argv: vec!["bench".into()],
            cwd: "/".into(),
            device: device.into(),
            policy: Some(policy),
            ..SubmitSpec::default()
        };
        self.submit_spec(conn, spec).0
    }

    fn submit_spec(&mut self, conn: ConnId, spec: SubmitSpec) -> (u64, Vec<Effect>) {
        let effects = self.request(conn, Request::Submit(spec));
        let job = replies(&effects, conn)
            .iter()
            .find_map(|r| match r {
                Reply::JobQueued { job, .. } => Some(*job),
                _ => None,
            })
            .unwrap_or_else(|| panic!("not queued: {effects:?}"));
        (job, effects)
    }

    fn enter(&mut self, conn: ConnId, job: Option<u64>, device: &str, lease_ms: Option<u64>) -> Vec<Effect> {
        let device = job.is_none().then(|| device.to_string());
        let req = Request::RegionEnter { job, device, name: "r".into(), pid: 100 + conn as u32, tid: 7, lease_ms };
        self.request(conn, req)
    }

    /// The device thread entered `region` (nothing tainted, nothing failed).
    fn entered(&mut self, region: u64) -> Vec<Effect> {
        self.handle(Event::RegionEntered { region, report: EnterReport::default() })
    }

    fn left(&mut self, region: u64) -> Vec<Effect> {
        self.handle(Event::RegionLeft { region, gpu: None, host: None })
    }
}

/// Replies sent to `conn`, in order.
fn replies(effects: &[Effect], conn: ConnId) -> Vec<&Reply> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send { conn: c, reply } if *c == conn => Some(reply),
            _ => None,
        })
        .collect()
}

/// (device, region, jobs to freeze) of every region the device threads are asked to enter.
fn enters(effects: &[Effect]) -> Vec<(usize, u64, Vec<u64>)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Step { device, step: RegionStep::Enter { region, targets, .. } } => {
                Some((*device, *region, targets.iter().map(|t| t.job).collect()))
            }
            _ => None,
        })
        .collect()
}

fn leaves(effects: &[Effect]) -> Vec<u64> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Step { step: RegionStep::Leave { region }, .. } => Some(*region),
            _ => None,
        })
        .collect()
}

fn spawned(effects: &[Effect]) -> Vec<u64> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::SpawnJob(l) => Some(l.job),
            _ => None,
        })
        .collect()
}

fn grant_to(effects: &[Effect], conn: ConnId) -> Option<Grant> {
    replies(effects, conn).into_iter().find_map(|r| match r {
        Reply::RegionGranted(g) => Some(g.clone()),
        _ => None,
    })
}

fn released_to(effects: &[Effect], conn: ConnId) -> Option<(u64, bool, bool)> {
    replies(effects, conn).into_iter().find_map(|r| match r {
        Reply::RegionReleased { region, valid, revoked, .. } => Some((*region, *valid, *revoked)),
        _ => None,
    })
}

fn queue_of(s: &StatusReport, device: usize) -> (Option<u64>, Vec<u64>) {
    let d = &s.devices[device];
    (d.region_holder.as_ref().map(|r| r.region), d.region_queue.iter().map(|r| r.region).collect())
}

fn frozen(s: &StatusReport) -> Vec<u64> {
    s.jobs.iter().filter(|j| j.frozen).map(|j| j.job).collect()
}

#[test]
fn regions_are_granted_in_request_order_one_per_device() {
    let mut s = Sim::new(|_| {});
    let (a, b, c, e) = (s.connect(), s.connect(), s.connect(), s.connect());
    let ea = s.enter(a, None, "0", None);
    let [(GPU0, ra, _)] = enters(&ea)[..] else { panic!("{ea:?}") };
    assert!(enters(&s.enter(b, None, "0", None)).is_empty(), "a region of GPU 0 is entering");
    assert!(enters(&s.enter(c, None, "0", None)).is_empty());
    // Another device's line is its own.
    let ee = s.enter(e, None, "1", None);
    assert!(matches!(enters(&ee)[..], [(GPU1, _, _)]), "{ee:?}");
    let (holder, waiting) = queue_of(&s.status(), GPU0);
    assert_eq!(holder, Some(ra));
    let [rb, rc] = waiting[..] else { panic!("{waiting:?}") };
    assert!(ra < rb && rb < rc);

    let ga = s.entered(ra);
    assert_eq!(grant_to(&ga, a).map(|g| g.region), Some(ra));
    assert!(enters(&ga).is_empty(), "still held");
    let xa = s.request(a, Request::RegionExit { region: ra });
    assert_eq!(leaves(&xa), vec![ra]);
    assert!(enters(&xa).is_empty(), "not before the device thread has left");
    let la = s.left(ra);
    assert_eq!(released_to(&la, a), Some((ra, true, false)));
    assert_eq!(enters(&la).iter().map(|e| e.1).collect::<Vec<_>>(), vec![rb], "b asked before c");
    assert_eq!(queue_of(&s.status(), GPU0), (Some(rb), vec![rc]));
}

#[test]
fn a_released_regions_host_counters_are_stored_after_its_release_and_a_region_never_granted_has_none() {
    let mut s = Sim::new(|_| {});
    let (a, b) = (s.connect(), s.connect());
    let ra = enters(&s.enter(a, None, "0", None))[0].1;
    let rb = {
        s.enter(b, None, "0", None);
        queue_of(&s.status(), GPU0).1[0]
    };
    assert!(grant_to(&s.entered(ra), a).is_some());
    s.request(a, Request::RegionExit { region: ra });
    let delta = HostDelta { steal_ms: Some(30.0), irq_ms: Some(0.0), run_delay_ms: Some(2.5) };
    let l = s.handle(Event::RegionLeft { region: ra, gpu: None, host: Some(RegionHost { cpu: Some(3), delta }) });
    let stored: Vec<&StoreWrite> = l
        .iter()
        .filter_map(|e| match e {
            Effect::Store(w) => Some(w),
            _ => None,
        })
        .collect();
    let row =
        RegionHostRow { region: ra, cpu: Some(3), steal_ms: Some(30.0), irq_ms: Some(0.0), run_delay_ms: Some(2.5) };
    assert!(
        matches!(stored[..], [StoreWrite::RegionReleased { id, .. }, StoreWrite::RegionHost(ref h)] if *id == ra && *h == row),
        "{stored:?}"
    );
    // b dies while its region is entering: left once entered, never granted, nothing stored.
    assert_eq!(enters(&l)[0].1, rb);
    s.handle(Event::Hangup { conn: b });
    s.entered(rb);
    let l = s.handle(Event::RegionLeft { region: rb, gpu: None, host: Some(RegionHost { cpu: None, delta }) });
    assert!(!l.iter().any(|e| matches!(e, Effect::Store(_))), "{l:?}");
}

#[test]
fn a_region_held_past_its_lease_is_revoked_and_the_next_granted() {
    let mut s = Sim::new(|_| {});
    let (a, b) = (s.connect(), s.connect());
    let ra = enters(&s.enter(a, None, "0", Some(100)))[0].1;
    s.enter(b, None, "0", None);
    assert!(grant_to(&s.entered(ra), a).is_some());
    assert_eq!(s.d.next_deadline(), Some(s.now().at + Duration::from_millis(100)));
    s.advance(99);
    assert!(s.handle(Event::Tick).is_empty(), "the lease has 1 ms left");
    s.advance(1);
    let t = s.handle(Event::Tick);
    assert!(matches!(replies(&t, a)[..], [Reply::RegionRevoked { region, .. }] if *region == ra), "{t:?}");
    assert_eq!(leaves(&t), vec![ra]);
    let l = s.left(ra);
    assert!(replies(&l, a).is_empty(), "a did not ask to exit yet");
    assert!(l.contains(&Effect::Store(StoreWrite::RegionReleased {
        id: ra,
        ns: s.now().unix_ns,
        revoked: true,
        tainted: false,
        gpu: None
    })));
    let rb = enters(&l)[0].1;
    assert_eq!(queue_of(&s.status(), GPU0), (Some(rb), vec![]));
    // a's exit, after the fact, is answered; its measurements are invalid.
    let x = s.request(a, Request::RegionExit { region: ra });
    assert_eq!(released_to(&x, a), Some((ra, false, true)));
    let m = s.request(a, Request::Measurement { region: Some(ra), job: None, name: "t".into(), samples_ms: vec![1.0] });
    assert!(matches!(replies(&m, a)[..], [Reply::Recorded { valid: false, .. }]), "{m:?}");
}

#[test]
fn an_exit_during_the_revocation_is_answered_once_left() {
    let mut s = Sim::new(|_| {});
    let a = s.connect();
    let ra = enters(&s.enter(a, None, "0", Some(10)))[0].1;
    s.entered(ra);
    s.advance(10);
    s.handle(Event::Tick);
    assert!(replies(&s.request(a, Request::RegionExit { region: ra }), a).is_empty(), "still leaving");
    let l = s.left(ra);
    assert_eq!(released_to(&l, a), Some((ra, false, true)));
}

#[test]
fn client_death_mid_region_releases_it_and_the_queue_moves() {
    let mut s = Sim::new(|_| {});
    let (a, b) = (s.connect(), s.connect());
    let ja = s.submit(a, "0", Policy::Region);
    let ra = enters(&s.enter(a, Some(ja), "", None))[0].1;
    s.enter(b, None, "0", None);
    s.entered(ra);
    let h = s.handle(Event::Hangup { conn: a });
    assert!(h.iter().any(|e| matches!(e, Effect::KillJob(t) if t.job == ja)), "its job is cancelled: {h:?}");
    assert_eq!(leaves(&h), vec![ra]);
    let l = s.left(ra);
    assert!(replies(&l, a).is_empty(), "nobody to tell");
    let rb = enters(&l)[0].1;
    assert_eq!(queue_of(&s.status(), GPU0), (Some(rb), vec![]));
    let x = s.handle(Event::JobExited { job: ja, code: None, signal: Some(9), oom: false });
    assert!(
        x.iter().any(|e| matches!(e,
        Effect::Store(StoreWrite::JobEnded { id, reason: Some(r), .. }) if *id == ja && r == "client connection lost"))
    );
}

#[test]
fn client_death_while_entering_leaves_once_entered_without_a_grant() {
    let mut s = Sim::new(|_| {});
    let (a, b) = (s.connect(), s.connect());
    let ra = enters(&s.enter(a, None, "0", None))[0].1;
    s.enter(b, None, "0", None);
    assert!(leaves(&s.handle(Event::Hangup { conn: a })).is_empty(), "the device thread is still entering");
    let e = s.entered(ra);
    assert_eq!(leaves(&e), vec![ra]);
    assert!(!e.iter().any(|e| matches!(e, Effect::Store(StoreWrite::InsertRegion(_)) | Effect::Send { .. })));
    let l = s.left(ra);
    assert!(!l.iter().any(|e| matches!(e, Effect::Store(StoreWrite::RegionReleased { .. }))), "never granted");
    assert_eq!(enters(&l).len(), 1, "b's turn");
}

#[test]
fn a_waiting_client_that_dies_loses_its_place() {
    let mut s = Sim::new(|_| {});
    let (a, b, c) = (s.connect(), s.connect(), s.connect());
    let ra = enters(&s.enter(a, None, "0", None))[0].1;
    s.enter(b, None, "0", None);
    s.enter(c, None, "0", None);
    let (_, waiting) = queue_of(&s.status(), GPU0);
    s.handle(Event::Hangup { conn: b });
    assert_eq!(queue_of(&s.status(), GPU0), (Some(ra), vec![waiting[1]]));
    s.entered(ra);
    s.request(a, Request::RegionExit { region: ra });
    assert_eq!(enters(&s.left(ra))[0].1, waiting[1]);
}

#[test]
fn a_job_that_exits_while_frozen_leaves_nothing_frozen() {
    let mut s = Sim::new(|_| {});
    let (a, b) = (s.connect(), s.connect());
    let ja = s.submit(a, "0", Policy::Region);
    let jb = s.submit(b, "0", Policy::Region);
    let e = s.enter(b, Some(jb), "", None);
    let [(GPU0, rb, ref targets)] = enters(&e)[..] else { panic!("{e:?}") };
    assert_eq!(targets, &vec![ja], "the sibling on the device is frozen, not the holder");
    s.entered(rb);
    assert_eq!(frozen(&s.status()), vec![ja]);
    // The frozen job is killed (cancelled here) and exits while frozen.
    s.request(a, Request::Cancel { job: ja });
    let x = s.handle(Event::JobExited { job: ja, code: None, signal: Some(9), oom: false });
    assert!(x.contains(&Effect::RemoveCgroup { id: ja }));
    assert!(matches!(replies(&x, a)[..], [Reply::JobEnded { job, .. }] if *job == ja));
    assert!(frozen(&s.status()).is_empty());
    s.request(b, Request::RegionExit { region: rb });
    s.left(rb);
    let st = s.status();
    assert!(frozen(&st).is_empty());
    assert_eq!(queue_of(&st, GPU0), (None, vec![]));
}

/// A drain that timed out is logged with what it waited for: each process that had not
/// acknowledged the gate's close, named by the job whose process group it is in (a child of a
/// job's process, like Inductor's autotune subprocess, too) and by its command line.
#[test]
fn a_drain_that_timed_out_names_the_processes_it_waited_for() {
    let mut s = Sim::new(|_| {});
    let (a, b) = (s.connect(), s.connect());
    let ja = s.submit(a, "0", Policy::Region);
    let jb = s.submit(b, "0", Policy::Region);
    let leader = s.status().jobs.iter().find(|j| j.job == ja).and_then(|j| j.pid).expect("ja runs");
    let rb = enters(&s.enter(b, Some(jb), "", None))[0].1;
    let child = PendingProcess { pid: leader + 50, pgid: Some(leader), command: "python3 -m autotune".into() };
    let gone = PendingProcess { pid: 4242, pgid: None, command: String::new() };
    let mut report = EnterReport { pending: vec![child, gone], ..EnterReport::default() };
    report.timings.drain_ms = 2001.0;
    report.timings.drain_timed_out = true;
    let x = s.handle(Event::RegionEntered { region: rb, report });
    let want = format!(
        "region {rb}: drain timed out after 2001 ms; not acknowledged by pid {} (job {ja}'s: python3 -m autotune), \
         pid 4242 (no job's: gone)",
        leader + 50
    );
    assert_eq!(logs(&x), [want.as_str()], "{x:?}");
    let grant = grant_to(&x, b).expect("granted all the same");
    assert!(grant.tainted, "not exclusive: a sibling's work may still run beside it");
    // A drain in time logs nothing.
    s.request(b, Request::RegionExit { region: rb });
    s.left(rb);
    let rb = enters(&s.enter(b, Some(jb), "", None))[0].1;
    let x = s.entered(rb);
    assert!(!x.iter().any(|e| matches!(e, Effect::Log(_))), "{x:?}");
    assert!(!grant_to(&x, b).expect("granted").tainted);
}

/// The stragglers a region's drain is told to skip while behind (pid, epoch).
fn stragglers(effects: &[Effect]) -> Vec<(u32, u64)> {
    effects
        .iter()
        .find_map(|e| match e {
            Effect::Step { step: RegionStep::Enter { stragglers, .. }, .. } => {
                Some(stragglers.iter().map(|s| (s.pid, s.epoch)).collect())
            }
            _ => None,
        })
        .expect("a region entered")
}

fn logs(effects: &[Effect]) -> Vec<&str> {
    effects.iter().filter_map(|e| if let Effect::Log(l) = e { Some(l.as_str()) } else { None }).collect()
}

#[test]
fn a_participant_a_drain_timed_out_on_is_not_waited_for_again_until_it_catches_up() {
    let mut s = Sim::new(|_| {});
    let (a, b) = (s.connect(), s.connect());
    s.submit(a, "0", Policy::Region);
    let jb = s.submit(b, "0", Policy::Region);
    let e = s.enter(b, Some(jb), "", None);
    assert!(stragglers(&e).is_empty(), "no drain has timed out yet");
    let r1 = enters(&e)[0].1;
    let slow = PendingProcess { pid: 777, pgid: None, command: "python3 autotune".into() };
    let mut report = EnterReport { pending: vec![slow], drain_epoch: Some(5), ..EnterReport::default() };
    report.timings.drain_timed_out = true;
    s.handle(Event::RegionEntered { region: r1, report });
    s.request(b, Request::RegionExit { region: r1 });
    s.left(r1);
    // The next drain is told to skip it while it is behind on epoch 5; it still is.
    let e = s.enter(b, Some(jb), "", None);
    assert_eq!(stragglers(&e), vec![(777, 5)]);
    let r2 = enters(&e)[0].1;
    let report = EnterReport { skipped: vec![777], drain_epoch: Some(6), ..EnterReport::default() };
    let x = s.handle(Event::RegionEntered { region: r2, report });
    assert_eq!(logs(&x).len(), 1, "{x:?}");
    let want = format!("drain did not wait for pid 777: still behind on region {r1}'s drain, which timed out waiting");
    assert!(logs(&x)[0].contains(&want), "{x:?}");
    assert!(grant_to(&x, b).expect("granted").tainted, "its GPU work may still run beside the region");
    let behind = kforge_proto::StragglerStatus { pid: 777, since_region: r1, skipped: 1 };
    assert_eq!(s.status().devices[GPU0].stragglers, vec![behind], "status shows it");
    s.request(b, Request::RegionExit { region: r2 });
    s.left(r2);
    // Skipped again: not logged again.
    let e = s.enter(b, Some(jb), "", None);
    assert_eq!(stragglers(&e), vec![(777, 5)]);
    let r3 = enters(&e)[0].1;
    let x = s.handle(Event::RegionEntered {
        region: r3,
        report: EnterReport { skipped: vec![777], drain_epoch: Some(7), ..EnterReport::default() },
    });
    assert!(logs(&x).is_empty(), "{x:?}");
    s.request(b, Request::RegionExit { region: r3 });
    s.left(r3);
    // It caught up (the drain waited for it and it acknowledged): waited for from then on.
    let e = s.enter(b, Some(jb), "", None);
    let r4 = enters(&e)[0].1;
    let x = s.handle(Event::RegionEntered {
        region: r4,
        report: EnterReport { drain_epoch: Some(8), ..EnterReport::default() },
    });
    assert_eq!(logs(&x).len(), 1, "{x:?}");
    assert!(logs(&x)[0].contains("pid 777 is no longer behind") && logs(&x)[0].contains("2 drain(s) did not wait"));
    assert!(!grant_to(&x, b).expect("granted").tainted);
    assert!(s.status().devices[GPU0].stragglers.is_empty());
    s.request(b, Request::RegionExit { region: r4 });
    s.left(r4);
    assert!(stragglers(&s.enter(b, Some(jb), "", None)).is_empty());
}

#[test]
fn the_holder_job_exiting_releases_its_region_and_thaws_the_device() {
    let mut s = Sim::new(|_| {});
    let (a, b, c) = (s.connect(), s.connect(), s.connect());
    let ja = s.submit(a, "0", Policy::Region);
    let jb = s.submit(b, "0", Policy::Region);
    let rb = enters(&s.enter(b, Some(jb), "", None))[0].1;
    s.entered(rb);
    let jc = s.submit(c, "0", Policy::Region);
    assert_eq!(s.status().devices[GPU0].queued, vec![jc], "waits for the region");
    // The holder's process dies: its job exits and its connection hangs up.
    s.handle(Event::JobExited { job: jb, code: Some(1), signal: None, oom: false });
    let h = s.handle(Event::Hangup { conn: b });
    assert_eq!(leaves(&h), vec![rb]);
    let l = s.left(rb);
    assert_eq!(spawned(&l), vec![jc]);
    let st = s.status();
    assert!(frozen(&st).is_empty());
    assert_eq!(st.devices[GPU0].running, vec![ja, jc]);
}

#[test]
fn no_job_is_admitted_on_a_device_while_a_region_is_held_there() {
    let mut s = Sim::new(|_| {});
    let (a, b, c, e) = (s.connect(), s.connect(), s.connect(), s.connect());
    let ra = enters(&s.enter(a, None, "0", None))[0].1;
    let (jb, q) = s.submit_spec(b, spec("0"));
    assert!(spawned(&q).is_empty(), "it would only be frozen");
    let (jc, q) = s.submit_spec(c, spec("1"));
    assert_eq!(spawned(&q), vec![jc], "another device is free");
    s.enter(e, None, "0", None);
    s.entered(ra);
    s.request(a, Request::RegionExit { region: ra });
    let l = s.left(ra);
    // The waiting job starts first, then the next region is entered, freezing it.
    let spawn_at = l.iter().position(|x| matches!(x, Effect::SpawnJob(j) if j.job == jb)).expect("jb starts");
    let enter_at = l.iter().position(|x| matches!(x, Effect::Step { step: RegionStep::Enter { .. }, .. })).unwrap();
    assert!(spawn_at < enter_at, "{l:?}");
    assert_eq!(enters(&l)[0].2, vec![jb]);
}

#[test]
fn under_freeze_none_jobs_start_beside_a_held_region() {
    let mut s = Sim::new(|c| c.freeze_scope = crate::config::FreezeScope::None);
    let (a, b) = (s.connect(), s.connect());
    let ra = enters(&s.enter(a, None, "0", None))[0].1;
    s.entered(ra);
    let (jb, q) = s.submit_spec(b, spec("0"));
    assert_eq!(spawned(&q), vec![jb]);
}

#[test]
fn under_freeze_node_one_region_at_a_time_node_wide_freezing_every_other_job() {
    let mut s = Sim::new(|c| c.freeze_scope = crate::config::FreezeScope::Node);
    let (a, b, c) = (s.connect(), s.connect(), s.connect());
    let ja = s.submit(a, "0", Policy::Region);
    let jc = s.submit(c, "cpu", Policy::Region);
    let e = s.enter(a, Some(ja), "", None);
    let [(GPU0, ra, ref targets)] = enters(&e)[..] else { panic!("{e:?}") };
    assert_eq!(targets, &vec![jc], "the cpu job too");
    assert!(enters(&s.enter(b, None, "1", None)).is_empty(), "GPU 1 waits in the node's line");
    s.entered(ra);
    s.request(a, Request::RegionExit { region: ra });
    assert_eq!(enters(&s.left(ra)).iter().map(|e| e.0).collect::<Vec<_>>(), vec![GPU1]);
}

#[test]
fn regions_of_none_and_command_jobs_are_granted_at_once_and_left_without_the_device_thread() {
    let mut s = Sim::new(|_| {});
    let (a, b) = (s.connect(), s.connect());
    let ja = s.submit(a, "0", Policy::Command);
    let jb = s.submit(b, "1", Policy::None);
    for (conn, job, exclusive) in [(a, ja, true), (b, jb, false)] {
        let e = s.enter(conn, Some(job), "", None);
        assert!(enters(&e).is_empty(), "{e:?}");
        let g = grant_to(&e, conn).expect("granted at once");
        assert_eq!(g.exclusive, exclusive);
        let x = s.request(conn, Request::RegionExit { region: g.region });
        assert!(leaves(&x).is_empty());
        assert_eq!(released_to(&x, conn), Some((g.region, true, false)));
    }
    // A command job holds its device: nothing else starts there while it runs.
    let (jc, q) = s.submit_spec(b, spec("0"));
    assert!(spawned(&q).is_empty());
    assert_eq!(spawned(&s.handle(Event::JobExited { job: ja, code: Some(0), signal: None, oom: false })), vec![jc]);
}

#[test]
fn a_job_past_its_time_limit_is_killed_on_the_tick() {
    let mut s = Sim::new(|_| {});
    let a = s.connect();
    let (j, _) = s.submit_spec(a, SubmitSpec { timeout_ms: Some(50), ..spec("cpu") });
    assert_eq!(s.d.next_deadline(), Some(s.now().at + Duration::from_millis(50)));
    s.advance(50);
    let t = s.handle(Event::Tick);
    assert!(matches!(t[..], [Effect::KillJob(ref target)] if target.job == j), "{t:?}");
    assert_eq!(s.d.next_deadline(), None, "killed once");
    let x = s.handle(Event::JobExited { job: j, code: None, signal: Some(9), oom: false });
    assert!(
        matches!(replies(&x, a)[..], [Reply::JobEnded { exit, .. }]
        if exit.reason.as_deref() == Some("time limit of 0.050 s exceeded")),
        "{x:?}"
    );
}

#[test]
fn a_command_that_cannot_start_ends_with_127() {
    let mut s = Sim::new(|_| {});
    s.fail_spawns = true;
    let a = s.connect();
    let (j, q) = s.submit_spec(a, spec("cpu"));
    assert!(q.contains(&Effect::RemoveCgroup { id: j }));
    let ended = replies(&q, a).into_iter().find_map(|r| match r {
        Reply::JobEnded { exit, .. } => Some(exit.clone()),
        _ => None,
    });
    let exit = ended.expect("the job ended");
    assert_eq!(exit.code, Some(127));
    assert!(exit.reason.unwrap_or_default().contains("could not start \"bench\""));
    assert!(!replies(&q, a).iter().any(|r| matches!(r, Reply::JobStarted { .. })));
    assert!(s.status().jobs.is_empty());
}

#[test]
fn warm_jobs_go_to_an_idle_worker_one_at_a_time() {
    let mut s = Sim::new(|c| c.warm_workers = Some(1));
    // One worker per device, started one at a time at daemon start.
    let pool = |s: &Sim| s.status().devices[GPU0].pool.clone();
    assert_eq!(pool(&s).starting, 1);
    let worker = 2; // cpu's is 1, GPU 0's is 2
    s.handle(Event::Worker {
        worker,
        msg: WorkerMsg::Ready { pid: 0, preloaded: vec![], cuda: true, startup_ms: 1.0, error: None },
    });
    assert_eq!(pool(&s).warm, 1);
    let a = s.connect();
    let warm = SubmitSpec { argv: vec!["python3".into(), "a.py".into()], warm: true, ..spec("0") };
    let (j1, q) = s.submit_spec(a, warm.clone());
    let handed: Vec<(u64, u64, Vec<String>)> = q
        .iter()
        .filter_map(|e| match e {
            Effect::HandToWorker(l) => Some((l.worker, l.job, l.argv.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(handed, vec![(worker, j1, vec!["a.py".to_string()])]);
    assert!(matches!(replies(&q, a)[..], [Reply::JobQueued { .. }, Reply::JobStarted { .. }]), "{q:?}");
    let (j2, q) = s.submit_spec(a, warm);
    assert!(!q.iter().any(|e| matches!(e, Effect::HandToWorker(_))), "the worker is busy");
    let done = s.handle(Event::Worker {
        worker,
        msg: WorkerMsg::Done { job: j1, exit_code: 0, signal: None, recycle: vec![] },
    });
    assert!(!replies(&done, a).iter().any(|r| matches!(r, Reply::JobEnded { .. })), "its output is still open");
    assert!(done.iter().any(|e| matches!(e, Effect::HandToWorker(l) if l.job == j2 && l.worker == worker)));
    let closed = s.handle(Event::WarmOutputClosed { job: j1, oom: false });
    assert!(matches!(replies(&closed, a)[..],
        [Reply::JobEnded { job, exit }] if *job == j1 && exit.code == Some(0)));
    assert_eq!(pool(&s).jobs_served, 1);
}

#[test]
fn a_hand_off_answered_for_a_worker_that_is_gone_fails_the_job_and_frees_the_regions() {
    let mut s = Sim::new(|c| c.warm_workers = Some(1));
    s.hold_hand_offs = true;
    let worker = 2;
    s.handle(Event::Worker {
        worker,
        msg: WorkerMsg::Ready { pid: 0, preloaded: vec![], cuda: true, startup_ms: 1.0, error: None },
    });
    let (a, b) = (s.connect(), s.connect());
    let warm = SubmitSpec { argv: vec!["python3".into(), "a.py".into()], warm: true, ..spec("0") };
    let (j, _) = s.submit_spec(a, warm);
    // The job is being handed off: no region may be entered until that is answered.
    assert!(enters(&s.enter(b, None, "0", None)).is_empty());
    let answer = s.handle(Event::HandedToWorker { worker: 999, job: j, result: Ok(()) });
    assert!(
        matches!(replies(&answer, a)[..], [Reply::JobEnded { job, exit }] if *job == j && exit.code == Some(1)),
        "{answer:?}"
    );
    assert_eq!(enters(&answer).len(), 1, "the waiting region is entered: {answer:?}");
}

#[test]
fn a_recycled_worker_is_replaced() {
    let (mut s, worker) = Sim::with_ready_gpu_worker();
    let a = s.connect();
    let warm = SubmitSpec { argv: vec!["python3".into(), "a.py".into()], warm: true, ..spec("0") };
    let (j, _) = s.submit_spec(a, warm);
    let recycle = vec!["thread left running: t".to_string()];
    let done = s.handle(Event::Worker { worker, msg: WorkerMsg::Done { job: j, exit_code: 0, signal: None, recycle } });
    assert!(done.iter().any(|e| matches!(e, Effect::SpawnWorker(l) if l.worker == 4)), "{done:?}");
    let p = s.status().devices[GPU0].pool.clone();
    assert_eq!(p.recycled.get("thread left running"), Some(&1));
    assert_eq!(p.starting, 1, "the replacement");
    s.handle(Event::WorkerExited { worker, code: Some(0), signal: None });
    assert_eq!(s.status().devices[GPU0].pool.recycled.len(), 1, "an expected exit");
}

#[test]
fn shutdown_refuses_newcomers_and_leaves_held_regions() {
    let mut s = Sim::new(|_| {});
    let (a, b) = (s.connect(), s.connect());
    let ra = enters(&s.enter(a, None, "0", None))[0].1;
    s.enter(b, None, "0", None);
    s.entered(ra);
    let sd = s.request(a, Request::Shutdown);
    assert_eq!(leaves(&sd), vec![ra]);
    assert!(!s.d.quiescent());
    let l = s.left(ra);
    assert!(enters(&l).is_empty(), "nothing is granted while stopping");
    assert!(s.d.quiescent());
    let late = s.handle(Event::Connected { conn: 99 });
    assert!(matches!(replies(&late, 99)[..], [Reply::Error { code: ErrorCode::ShuttingDown, .. }]));
    assert!(late.contains(&Effect::Close { conn: 99 }));
}

impl Sim {
    /// A daemon with a pool of one warm worker per device; GPU 0's (worker 2) has said it is ready.
    fn with_ready_gpu_worker() -> (Sim, u64) {
        let mut s = Sim::new(|c| c.warm_workers = Some(1));
        let worker = 2; // cpu's is 1, GPU 0's is 2
        s.handle(Event::Worker {
            worker,
            msg: WorkerMsg::Ready { pid: 0, preloaded: vec![], cuda: true, startup_ms: 1.0, error: None },
        });
        (s, worker)
    }
}

fn spec(device: &str) -> SubmitSpec {
    SubmitSpec { argv: vec!["bench".into()], cwd: "/".into(), device: device.into(), ..SubmitSpec::default() }
}

// GPU-memory-aware admission (`state/memory.rs`).

const GIB: u64 = 1 << 30;

impl Sim {
    /// A memory sample of `device`: `total` and `free` GiB, and (pid, GiB used) per process.
    fn memory(&mut self, device: usize, total: u64, free: u64, procs: &[(u32, u64)]) -> Vec<Effect> {
        let processes = procs
            .iter()
            .map(|&(pid, used)| crate::event::ProcessMemory { pid, pgid: Some(pid as i32), used: used * GIB })
            .collect();
        let sample = crate::event::MemorySample { total: total * GIB, free: free * GIB, processes };
        self.handle(Event::GpuMemory { device, sample })
    }

    fn pid_of(&self, job: u64) -> u32 {
        self.status().jobs.iter().find(|j| j.job == job).and_then(|j| j.pid).expect("the job runs")
    }

    fn job_memory(&self, job: u64) -> kforge_proto::JobMemoryStatus {
        self.status().jobs.into_iter().find(|j| j.job == job).and_then(|j| j.memory).expect("memory status")
    }

    /// Submit a command needing `gib` GiB (None: undeclared) on `device`.
    fn submit_mem(&mut self, conn: ConnId, device: &str, gib: Option<u64>) -> (u64, Vec<Effect>) {
        let spec = SubmitSpec { gpu_memory_bytes: gib.map(|g| g * GIB), ..spec(device) };
        self.submit_spec(conn, spec)
    }

    fn exit(&mut self, job: u64, code: i32, oom: bool) -> Vec<Effect> {
        self.handle(Event::JobExited { job, code: Some(code), signal: None, oom })
    }
}

fn retried_to(effects: &[Effect], conn: ConnId) -> Vec<u64> {
    replies(effects, conn)
        .into_iter()
        .filter_map(|r| match r {
            Reply::JobRetried { job, .. } => Some(*job),
            _ => None,
        })
        .collect()
}

fn ended_to(effects: &[Effect], conn: ConnId) -> Vec<(u64, Option<i32>)> {
    replies(effects, conn)
        .into_iter()
        .filter_map(|r| match r {
            Reply::JobEnded { job, exit } => Some((*job, exit.code)),
            _ => None,
        })
        .collect()
}

fn stored_end_reason(effects: &[Effect], job: u64) -> Option<Option<String>> {
    effects.iter().find_map(|e| match e {
        Effect::Store(StoreWrite::JobEnded { id, reason, .. }) if *id == job => Some(reason.clone()),
        _ => None,
    })
}

#[test]
fn a_job_waits_for_memory_and_starts_when_a_sample_shows_it_freed() {
    let mut s = Sim::new(|_| {});
    let a = s.connect();
    s.memory(GPU0, 80, 10, &[]);
    let (j, q) = s.submit_mem(a, "0", Some(20));
    assert!(spawned(&q).is_empty(), "20 GiB do not fit in 10: {q:?}");
    assert_eq!(s.status().devices[GPU0].queued, vec![j]);
    assert!(spawned(&s.memory(GPU0, 80, 19, &[])).is_empty());
    assert_eq!(spawned(&s.memory(GPU0, 80, 30, &[])), vec![j], "freed: it starts");
    let m = s.job_memory(j);
    assert_eq!((m.expected_bytes, m.source.as_str()), (Some(20 * GIB), "declared"));
    // A device without samples (the cpu device here) admits on its other rules only.
    let (c, q) = s.submit_mem(a, "cpu", Some(1000));
    assert_eq!(spawned(&q), vec![c]);
}

#[test]
fn two_jobs_admitted_in_one_event_do_not_count_on_the_same_free_memory() {
    let mut s = Sim::new(|_| {});
    let a = s.connect();
    s.memory(GPU0, 80, 0, &[]);
    let (j1, _) = s.submit_mem(a, "0", Some(20));
    let (j2, _) = s.submit_mem(a, "0", Some(20));
    // One sample frees 30 GiB: room for one of them, not both.
    assert_eq!(spawned(&s.memory(GPU0, 80, 30, &[])), vec![j1]);
    assert_eq!(s.status().devices[GPU0].memory.as_ref().map(|m| m.reserved_bytes), Some(20 * GIB));
    // j1 reaches its peak: free drops by what it uses, its reservation by as much; still no room.
    let p1 = s.pid_of(j1);
    assert!(spawned(&s.memory(GPU0, 80, 10, &[(p1, 20)])).is_empty());
    assert_eq!(s.status().devices[GPU0].memory.as_ref().map(|m| m.reserved_bytes), Some(0));
    assert_eq!(s.job_memory(j1).observed_peak_bytes, 20 * GIB);
    // j1 ends: its memory counts as free at once (before the next sample).
    let ended = s.exit(j1, 0, false);
    assert_eq!(spawned(&ended), vec![j2]);
    let told = replies(&ended, a).into_iter().find_map(|r| match r {
        Reply::JobEnded { job, exit } if *job == j1 => Some(exit.clone()),
        _ => None,
    });
    assert_eq!(told.map(|e| e.gpu_memory_peak_bytes), Some(Some(20 * GIB)), "its client is told what it used");
    // j2 never sampled: nothing said.
    let told = replies(&s.exit(j2, 0, false), a).into_iter().find_map(|r| match r {
        Reply::JobEnded { job, exit } if *job == j2 => Some(exit.gpu_memory_peak_bytes),
        _ => None,
    });
    assert_eq!(told, Some(None));
}

#[test]
fn an_undeclared_job_counts_with_a_default_share_and_a_later_small_job_passes_a_waiting_one() {
    let mut s = Sim::new(|_| {});
    let a = s.connect();
    s.memory(GPU0, 80, 15, &[]);
    let (big, q) = s.submit_mem(a, "0", None);
    assert!(spawned(&q).is_empty(), "a quarter of 80 GiB does not fit in 15");
    let m = s.job_memory(big);
    assert_eq!((m.expected_bytes, m.source.as_str()), (Some(20 * GIB), "default"));
    let (small, q) = s.submit_mem(a, "0", Some(10));
    assert_eq!(spawned(&q), vec![small], "it fits: it passes the waiting head");
    assert_eq!(s.status().devices[GPU0].queued, vec![big]);
}

#[test]
fn later_jobs_pass_a_head_waiting_for_memory_only_a_bounded_number_of_times() {
    let mut s = Sim::new(|c| c.max_concurrent = Some(16));
    let a = s.connect();
    s.memory(GPU0, 80, 40, &[]);
    let (head, _) = s.submit_mem(a, "0", Some(50));
    let small: Vec<u64> = (0..super::memory::MAX_PASSES + 2).map(|_| s.submit_mem(a, "0", Some(1)).0).collect();
    let started = s.status().devices[GPU0].running.clone();
    assert_eq!(started, small[..super::memory::MAX_PASSES as usize].to_vec());
    assert_eq!(s.status().devices[GPU0].queued[0], head, "FIFO again: the rest wait behind the head");
    assert_eq!(s.status().devices[GPU0].queued.len(), 3);
}

#[test]
fn a_job_larger_than_the_device_starts_alone_with_a_log_line() {
    let mut s = Sim::new(|_| {});
    let a = s.connect();
    s.memory(GPU0, 80, 79, &[]);
    let (small, _) = s.submit_mem(a, "0", Some(1));
    let (huge, q) = s.submit_mem(a, "0", Some(100));
    assert!(spawned(&q).is_empty(), "not beside another job");
    let x = s.exit(small, 0, false);
    assert_eq!(spawned(&x), vec![huge], "alone, rather than never");
    assert!(x.iter().any(|e| matches!(e, Effect::Log(l) if l.contains("exceeds device 0"))), "{x:?}");
}

#[test]
fn an_oom_beside_siblings_runs_again_alone_and_the_client_gets_one_job_ended() {
    let mut s = Sim::new(|_| {});
    let (a, b) = (s.connect(), s.connect());
    s.memory(GPU0, 80, 80, &[]);
    let (ja, _) = s.submit_mem(a, "0", Some(10));
    let (jb, _) = s.submit_mem(b, "0", Some(10));
    let (pa, pb) = (s.pid_of(ja), s.pid_of(jb));
    s.memory(GPU0, 80, 20, &[(pa, 55), (pb, 5)]);
    let x = s.exit(jb, 1, true);
    assert_eq!(retried_to(&x, b), vec![jb]);
    assert!(ended_to(&x, b).is_empty(), "the first run's exit is not the job's: {x:?}");
    assert!(stored_end_reason(&x, jb).is_none(), "the job row stays open");
    assert!(spawned(&x).is_empty(), "not beside the sibling");
    assert_eq!(s.status().devices[GPU0].queued, vec![jb]);
    assert!(s.job_memory(jb).retried);
    // The sibling ends: the job runs again, alone, and its client sees that run's end only.
    let x = s.exit(ja, 0, false);
    assert_eq!(spawned(&x), vec![jb]);
    // While it runs alone, nothing starts beside it.
    let (jc, q) = s.submit_mem(a, "0", Some(1));
    assert!(spawned(&q).is_empty());
    let x = s.exit(jb, 0, false);
    assert_eq!(ended_to(&x, b), vec![(jb, Some(0))]);
    assert_eq!(spawned(&x), vec![jc]);
    let reason = stored_end_reason(&x, jb).flatten().unwrap_or_default();
    assert!(reason.contains("second run, alone") && reason.contains("CUDA out of memory"), "{reason}");
}

#[test]
fn a_submit_with_a_zero_peak_or_a_zero_length_is_refused_naming_the_field() {
    let mut s = Sim::new(|_| {});
    for (spec, field) in [
        (SubmitSpec { gpu_memory_bytes: Some(0), ..spec("0") }, "gpu_memory_bytes must be positive"),
        (SubmitSpec { expected_ms: Some(0), ..spec("0") }, "expected_ms must be positive"),
    ] {
        let c = s.connect();
        let q = s.request(c, Request::Submit(spec));
        let refused =
            |r: &&Reply| matches!(r, Reply::Error { code: ErrorCode::BadRequest, message } if message.contains(field));
        assert!(replies(&q, c).first().is_some_and(refused), "{field}: {q:?}");
        assert!(spawned(&q).is_empty(), "{q:?}");
    }
}

/// Submit a command needing `gib` GiB on GPU 0, expected to run `secs` seconds (None: not said).
fn submit_expected(s: &mut Sim, conn: ConnId, gib: u64, secs: Option<u64>) -> (u64, Vec<Effect>) {
    let spec = SubmitSpec { gpu_memory_bytes: Some(gib * GIB), expected_ms: secs.map(|t| t * 1000), ..spec("0") };
    s.submit_spec(conn, spec)
}

/// While a job retried alone waits at its queue's front, a later job expected to end before the
/// running ones starts beside them (backfill), without using up the head's passes; one expected
/// to end later, or one that says nothing, waits once the passes are spent; and no job is
/// backfilled beside a running job of unknown length.
#[test]
fn a_job_expected_to_end_before_the_running_ones_starts_while_the_head_waits_to_run_alone() {
    let mut s = Sim::new(|c| c.max_concurrent = Some(16));
    let (a, b) = (s.connect(), s.connect());
    s.memory(GPU0, 80, 80, &[]);
    let (long, _) = submit_expected(&mut s, a, 10, Some(100));
    let (oom, _) = submit_expected(&mut s, b, 10, Some(50));
    let (pl, po) = (s.pid_of(long), s.pid_of(oom));
    s.memory(GPU0, 80, 60, &[(pl, 15), (po, 5)]);
    assert_eq!(retried_to(&s.exit(oom, 1, true), b), vec![oom]);
    // Each ends after the running ones (at 150, 160, ... s): the head's passes, then FIFO.
    let passing: Vec<u64> = (0..super::memory::MAX_PASSES as u64 + 1)
        .map(|i| submit_expected(&mut s, a, 1, Some(150 + 10 * i)).0)
        .collect();
    let passes = super::memory::MAX_PASSES as usize;
    assert_eq!(s.status().devices[GPU0].running, [&[long][..], &passing[..passes]].concat());
    s.advance(10_000);
    let (short, q) = submit_expected(&mut s, a, 1, Some(30));
    assert_eq!(spawned(&q), vec![short], "ends at 40 s, before the running jobs' 180 s: backfilled");
    let said = format!("job {short}: started beside the running jobs while job {oom} waits to run alone");
    assert!(q.iter().any(|e| matches!(e, Effect::Log(l) if l.contains(&said) && l.contains("within 170 s"))), "{q:?}");
    let (longer, q) = submit_expected(&mut s, a, 1, Some(175));
    assert!(spawned(&q).is_empty(), "would end at 185 s, after the running jobs: waits");
    s.advance(130_000);
    let (late, q) = submit_expected(&mut s, a, 1, Some(45));
    assert!(spawned(&q).is_empty(), "at 140 s, it would end at 185 s: waits");
    assert_eq!(s.status().devices[GPU0].queued, vec![oom, passing[passes], longer, late], "the head keeps its place");
    // A running job of unknown length: nothing is expected to end before it, nothing backfills.
    let mut t = Sim::new(|c| c.max_concurrent = Some(16));
    let (a, b) = (t.connect(), t.connect());
    t.memory(GPU0, 80, 80, &[]);
    let (unknown, _) = t.submit_mem(a, "0", Some(10));
    let (oom, _) = submit_expected(&mut t, b, 10, Some(50));
    let (pu, po) = (t.pid_of(unknown), t.pid_of(oom));
    t.memory(GPU0, 80, 60, &[(pu, 15), (po, 5)]);
    assert_eq!(retried_to(&t.exit(oom, 1, true), b), vec![oom]);
    for _ in 0..super::memory::MAX_PASSES {
        t.submit_mem(a, "0", Some(1));
    }
    let (short, q) = submit_expected(&mut t, a, 1, Some(1));
    assert!(spawned(&q).is_empty(), "beside a job of unknown length: waits");
    assert!(t.status().devices[GPU0].queued.contains(&short));
}

/// A job whose command ran longer before than it declares now is backfilled by the longer
/// length: it waits when that one would end after the running jobs, and starts (the log naming
/// the learned length) when it fits in their time.
#[test]
fn a_backfilled_job_counts_with_the_longest_run_of_its_command_when_it_declares_less() {
    let mut s = Sim::new(|c| c.max_concurrent = Some(16));
    let (a, b) = (s.connect(), s.connect());
    s.memory(GPU0, 80, 80, &[]);
    let says_10_s = |cmd: &str| SubmitSpec {
        argv: vec![cmd.into(), "p.py".into()],
        gpu_memory_bytes: Some(GIB),
        expected_ms: Some(10_000),
        ..spec("0")
    };
    // Each command says 10 s; `verify` ran 60 s once, `check` 20 s.
    for (cmd, ran_ms) in [("verify", 60_000), ("check", 20_000)] {
        let (j, _) = s.submit_spec(a, says_10_s(cmd));
        s.advance(ran_ms);
        s.exit(j, 0, false);
    }
    // At 80 s: a job expected to end at 180 s runs, and one retried alone heads the queue.
    let (long, _) = submit_expected(&mut s, a, 10, Some(100));
    let (oom, _) = submit_expected(&mut s, b, 10, Some(50));
    let (pl, po) = (s.pid_of(long), s.pid_of(oom));
    s.memory(GPU0, 80, 60, &[(pl, 15), (po, 5)]);
    assert_eq!(retried_to(&s.exit(oom, 1, true), b), vec![oom]);
    // The head's passes spent by jobs that each end after the running ones, then ended.
    let passing: Vec<u64> =
        (0..super::memory::MAX_PASSES as u64).map(|i| submit_expected(&mut s, a, 1, Some(500 + 10 * i)).0).collect();
    assert_eq!(s.status().devices[GPU0].running.len(), 1 + passing.len());
    for p in passing {
        s.exit(p, 0, false);
    }
    s.advance(50_000);
    let backfilled = |q: &[Effect], id: u64, says: &str| {
        let line = format!("job {id}: started beside the running jobs while job {oom} waits to run alone");
        spawned(q) == vec![id] && q.iter().any(|e| matches!(e, Effect::Log(l) if l.contains(&line) && l.contains(says)))
    };
    let (waits, q) = s.submit_spec(a, says_10_s("verify"));
    assert!(spawned(&q).is_empty(), "its 60 s from 130 s end after the running job's 180 s: {q:?}");
    let (check, q) = s.submit_spec(a, says_10_s("check"));
    assert!(backfilled(&q, check, "(within 50 s; it runs 20 s, learned)"), "{q:?}");
    let (new, q) = s.submit_spec(a, says_10_s("new"));
    assert!(backfilled(&q, new, "it runs 10 s, declared)"), "a command never seen: {q:?}");
    assert_eq!(s.status().devices[GPU0].queued, vec![oom, waits], "the head keeps its place");
}

#[test]
fn the_cut_short_peak_of_a_run_that_ran_out_of_memory_is_not_learned() {
    let mut s = Sim::new(|_| {});
    let (a, b) = (s.connect(), s.connect());
    s.memory(GPU0, 80, 80, &[]);
    let (ja, _) = s.submit_mem(a, "0", Some(10));
    let (jb, _) = s.submit_mem(b, "0", None);
    let (pa, pb) = (s.pid_of(ja), s.pid_of(jb));
    // The undeclared job got 1 GiB before its allocation failed beside a 55 GiB sibling.
    s.memory(GPU0, 80, 20, &[(pa, 55), (pb, 1)]);
    assert_eq!(retried_to(&s.exit(jb, 1, true), b), vec![jb]);
    // The same command again: counted with the default share, not the 1 GiB of the cut-short run.
    let (jc, _) = s.submit_mem(a, "0", None);
    let m = s.job_memory(jc);
    assert_eq!(m.source, "default", "{m:?}");
    assert_eq!(m.expected_bytes, Some(20 * GIB), "a quarter of the 80 GiB device: {m:?}");
}

#[test]
fn an_oom_without_siblings_or_a_second_oom_is_the_jobs_own_failure() {
    let mut s = Sim::new(|_| {});
    let a = s.connect();
    s.memory(GPU0, 80, 80, &[]);
    let (j, _) = s.submit_mem(a, "0", Some(10));
    let p = s.pid_of(j);
    s.memory(GPU0, 80, 1, &[(p, 79)]);
    let x = s.exit(j, 1, true);
    assert!(retried_to(&x, a).is_empty());
    assert_eq!(ended_to(&x, a), vec![(j, Some(1))]);
    // Retried once, the second OOM ends it even beside siblings.
    let (j1, _) = s.submit_mem(a, "0", Some(10));
    let (j2, _) = s.submit_mem(a, "0", Some(10));
    let (p1, p2) = (s.pid_of(j1), s.pid_of(j2));
    s.memory(GPU0, 80, 10, &[(p1, 60), (p2, 10)]);
    assert_eq!(retried_to(&s.exit(j2, 1, true), a), vec![j2]);
    s.exit(j1, 0, false);
    let p2 = s.pid_of(j2);
    // Alone among jobs now; another process (not kforge's) holds memory.
    s.memory(GPU0, 80, 10, &[(p2, 60), (999, 10)]);
    let x = s.exit(j2, 1, true);
    assert!(retried_to(&x, a).is_empty());
    assert_eq!(ended_to(&x, a), vec![(j2, Some(1))]);
    // A cancelled job's OOM-looking exit is not retried either.
    let (j3, _) = s.submit_mem(a, "0", Some(1));
    let x = s.request(a, Request::Cancel { job: j3 });
    assert!(x.iter().any(|e| matches!(e, Effect::KillJob(_))));
    s.memory(GPU0, 80, 10, &[(s.pid_of(j3), 10), (999, 5)]);
    let x = s.handle(Event::JobExited { job: j3, code: None, signal: Some(9), oom: true });
    assert_eq!(ended_to(&x, a), vec![(j3, None)]);
}

#[test]
fn the_learned_peak_is_used_on_the_next_run_of_the_same_command() {
    let mut s = Sim::new(|_| {});
    let a = s.connect();
    s.memory(GPU0, 80, 80, &[]);
    let labelled = |argv: &str| SubmitSpec { argv: vec![argv.into()], label: Some("verify".into()), ..spec("0") };
    let (j, _) = s.submit_spec(a, labelled("bench-a"));
    assert_eq!(s.job_memory(j).source, "default");
    let p = s.pid_of(j);
    s.memory(GPU0, 80, 30, &[(p, 50)]);
    s.memory(GPU0, 80, 40, &[(p, 40)]);
    let x = s.exit(j, 0, false);
    let row = x.iter().find_map(|e| match e {
        Effect::Store(StoreWrite::JobMemory(m)) => Some(m.clone()),
        _ => None,
    });
    let row = row.expect("the job's memory is stored");
    assert_eq!(
        (row.job, row.peak_bytes, row.expected_bytes, row.source.as_deref()),
        (j, 50 * GIB, Some(20 * GIB), Some("default"))
    );
    s.memory(GPU0, 80, 80, &[]);
    let (again, _) = s.submit_spec(a, labelled("bench-a"));
    let m = s.job_memory(again);
    assert_eq!((m.expected_bytes, m.source.as_str()), (Some(50 * GIB), "learned"), "its highest use");
    // Another command of the same label learns from the label.
    let (other, _) = s.submit_spec(a, labelled("bench-b"));
    assert_eq!(s.job_memory(other).source, "learned");
    // Temporary paths (a result file) do not make it another command.
    let tmp_out = |dir: &str| SubmitSpec {
        argv: vec!["runner".into(), "p.py".into(), "--out".into(), format!("{dir}/result.json")],
        label: None,
        env: vec![("TMPDIR".into(), "/scratch/t".into())],
        ..spec("0")
    };
    let (t1, _) = s.submit_spec(a, tmp_out("/tmp/.tmpA1"));
    let pt = s.pid_of(t1);
    s.memory(GPU0, 80, 10, &[(pt, 7)]);
    s.exit(t1, 0, false);
    s.memory(GPU0, 80, 80, &[]);
    let (t2, _) = s.submit_spec(a, tmp_out("/scratch/t/.tmpB2"));
    assert_eq!(s.job_memory(t2).expected_bytes, Some(7 * GIB));
    // A declared peak wins.
    let (declared, _) = s.submit_spec(a, SubmitSpec { gpu_memory_bytes: Some(GIB), ..labelled("bench-a") });
    assert_eq!(s.job_memory(declared).source, "declared");
}

#[test]
fn learned_peaks_are_replayed_from_the_store_at_start() {
    let peak = |argv: &str, gib| kforge_store::LearnedValue { argv: vec![argv.into()], label: None, value: gib * GIB };
    let l = super::learned::Learned::replayed(&[peak("a", 3), peak("b", 5), peak("a", 2)]);
    let get = |argv: &str| l.get(&SubmitSpec { argv: vec![argv.into()], ..spec("0") });
    assert_eq!((get("a"), get("b"), get("c")), (Some(3 * GIB), Some(5 * GIB), None), "the highest of each");
}

#[test]
fn a_learned_value_is_the_most_of_the_recent_runs_so_an_outlier_is_forgotten() {
    let mut l = super::learned::Learned::default();
    let a = SubmitSpec { argv: vec!["a".into()], ..spec("0") };
    l.record(&a, 100 * GIB);
    for _ in 1..super::learned::LEARNED_RECENT {
        l.record(&a, GIB);
    }
    assert_eq!(l.get(&a), Some(100 * GIB), "still among the recent runs");
    l.record(&a, 2 * GIB);
    assert_eq!(l.get(&a), Some(2 * GIB), "the outlier is older than the recent runs");
}

#[test]
fn the_learned_table_is_bounded() {
    let mut l = super::learned::Learned::default();
    for i in 0..super::LEARNED_CAPACITY + 10 {
        l.record(&SubmitSpec { argv: vec![format!("cmd{i}")], ..spec("0") }, GIB);
    }
    assert_eq!(l.len(), super::LEARNED_CAPACITY);
    assert_eq!(l.get(&SubmitSpec { argv: vec!["cmd0".into()], ..spec("0") }), None, "the oldest went");
    let last = format!("cmd{}", super::LEARNED_CAPACITY + 9);
    assert_eq!(l.get(&SubmitSpec { argv: vec![last], ..spec("0") }), Some(GIB));
}

#[test]
fn warm_workers_count_with_their_real_footprint() {
    let (mut s, worker) = Sim::with_ready_gpu_worker();
    let a = s.connect();
    let wpid = s.d.workers[&worker].pid.expect("the worker runs");
    // The idle worker holds 60 GiB: a 30 GiB job does not fit beside it.
    s.memory(GPU0, 80, 20, &[(wpid, 60)]);
    let (cold, q) = s.submit_mem(a, "0", Some(30));
    assert!(spawned(&q).is_empty());
    assert_eq!(s.status().devices[GPU0].memory.as_ref().map(|m| m.managed_bytes), Some(60 * GIB));
    s.cancel_queued(a, cold);
    // A warm job's use is its worker's above what the worker held when it was handed the job.
    let warm = SubmitSpec {
        argv: vec!["python3".into(), "a.py".into()],
        warm: true,
        gpu_memory_bytes: Some(GIB),
        auto_regions: false,
        ..spec("0")
    };
    let (j, _) = s.submit_spec(a, warm);
    s.memory(GPU0, 80, 12, &[(wpid, 68)]);
    assert_eq!(s.job_memory(j).observed_peak_bytes, 8 * GIB);
}

impl Sim {
    fn cancel_queued(&mut self, conn: ConnId, job: u64) {
        let x = self.request(conn, Request::Cancel { job });
        assert_eq!(ended_to(&x, conn), vec![(job, None)]);
    }
}

#[test]
fn a_warm_jobs_oom_beside_siblings_is_handed_to_a_worker_again() {
    let (mut s, worker) = Sim::with_ready_gpu_worker();
    let a = s.connect();
    let wpid = s.d.workers[&worker].pid.expect("the worker runs");
    s.memory(GPU0, 80, 70, &[(wpid, 1)]);
    let warm = SubmitSpec { argv: vec!["python3".into(), "a.py".into()], warm: true, ..spec("0") };
    let (j, _) = s.submit_spec(a, warm);
    // Something else (not kforge's) holds 40 GiB on the GPU.
    s.memory(GPU0, 80, 10, &[(wpid, 30), (999, 40)]);
    s.handle(Event::Worker { worker, msg: WorkerMsg::Done { job: j, exit_code: 1, signal: None, recycle: vec![] } });
    let x = s.handle(Event::WarmOutputClosed { job: j, oom: true });
    assert_eq!(retried_to(&x, a), vec![j]);
    assert!(ended_to(&x, a).is_empty());
    assert!(x.iter().any(|e| matches!(e, Effect::HandToWorker(l) if l.job == j)), "alone: handed again at once: {x:?}");
    s.handle(Event::Worker { worker, msg: WorkerMsg::Done { job: j, exit_code: 0, signal: None, recycle: vec![] } });
    let x = s.handle(Event::WarmOutputClosed { job: j, oom: false });
    assert_eq!(ended_to(&x, a), vec![(j, Some(0))]);
    assert_eq!(s.status().devices[GPU0].pool.jobs_served, 2);
}

/// `--worker-fork`: the workers are started forking (`KFORGE_WORKER_ISOLATION=fork`), and a
/// job whose forked child a signal killed ends as killed by that signal, its worker still idle.
#[test]
fn a_forking_workers_job_killed_by_a_signal_ends_with_it() {
    let spawned_env = |q: &[Effect]| -> Vec<Vec<(String, String)>> {
        q.iter().filter_map(|e| if let Effect::SpawnWorker(l) = e { Some(l.env.clone()) } else { None }).collect()
    };
    let isolation = |env: &Vec<(String, String)>| env.iter().find(|(k, _)| k == "KFORGE_WORKER_ISOLATION").cloned();
    let plain = Sim::new(|c| c.warm_workers = Some(1));
    assert!(spawned_env(&plain.started).iter().all(|env| isolation(env).is_none()), "in-process by default");
    let mut s = Sim::new(|c| {
        c.warm_workers = Some(1);
        c.worker_fork = true;
    });
    let envs = spawned_env(&s.started);
    assert!(
        !envs.is_empty()
            && envs.iter().all(|env| isolation(env) == Some(("KFORGE_WORKER_ISOLATION".into(), "fork".into())))
    );
    let worker = 2;
    s.handle(Event::Worker {
        worker,
        msg: WorkerMsg::Ready { pid: 0, preloaded: vec![], cuda: false, startup_ms: 1.0, error: None },
    });
    let a = s.connect();
    let warm = SubmitSpec { argv: vec!["python3".into(), "a.py".into()], warm: true, ..spec("0") };
    let (j, _) = s.submit_spec(a, warm);
    s.handle(Event::Worker {
        worker,
        msg: WorkerMsg::Done { job: j, exit_code: 137, signal: Some(9), recycle: vec![] },
    });
    let x = s.handle(Event::WarmOutputClosed { job: j, oom: false });
    assert!(
        matches!(replies(&x, a)[..], [Reply::JobEnded { job, exit }] if *job == j && exit.code.is_none() && exit.signal == Some(9)),
        "{x:?}"
    );
    assert_eq!(s.status().devices[GPU0].pool.warm, 1, "the worker is idle again");
}

#[test]
fn processes_this_namespace_cannot_see_count_as_siblings_only_beside_other_jobs() {
    let mut s = Sim::new(|_| {});
    let a = s.connect();
    s.memory(GPU0, 80, 80, &[]);
    let unseen = |used| crate::event::MemorySample {
        total: 80 * GIB,
        free: 10 * GIB,
        processes: vec![crate::event::ProcessMemory { pid: 4242, pgid: None, used: used * GIB }],
    };
    // Alone: the unseen process may be the job itself; its OOM is its own.
    let (j, _) = s.submit_mem(a, "0", Some(1));
    s.handle(Event::GpuMemory { device: GPU0, sample: unseen(70) });
    assert!(retried_to(&s.exit(j, 1, true), a).is_empty());
    // Beside another job it cannot be told from a sibling: run again, alone.
    let (j1, _) = s.submit_mem(a, "0", Some(1));
    let (j2, _) = s.submit_mem(a, "0", Some(1));
    s.handle(Event::GpuMemory { device: GPU0, sample: unseen(70) });
    assert_eq!(retried_to(&s.exit(j2, 1, true), a), vec![j2]);
    assert_eq!(spawned(&s.exit(j1, 0, false)), vec![j2]);
}

/// Every client's replies in `effects`: how many `job_ended` each job got.
fn ends_per_job(effects: &[Effect]) -> BTreeMap<u64, usize> {
    let mut n = BTreeMap::new();
    for e in effects {
        if let Effect::Send { reply: Reply::JobEnded { job, .. }, .. } = e {
            *n.entry(*job).or_insert(0) += 1;
        }
    }
    n
}

#[test]
fn an_h200_round_beside_idle_warm_workers_ends_every_job_once_and_the_retry_alone() {
    // As on the H200 (scripts/device/memory_admission.sh, JOBS=4 GIB=45): 8 idle warm workers of
    // 710 MiB on the GPU, 4 undeclared cold jobs of one command, one OOM beside two siblings.
    let mut s = Sim::new(|c| {
        c.warm_workers = None;
        c.max_concurrent = Some(8);
    });
    let workers: Vec<u64> = s.d.workers.values().filter(|w| w.device == GPU0).map(|w| w.id).collect();
    assert_eq!(workers.len(), 8);
    for &worker in &workers {
        let msg = WorkerMsg::Ready { pid: 0, preloaded: vec![], cuda: true, startup_ms: 1.0, error: None };
        s.handle(Event::Worker { worker, msg });
    }
    let idle: Vec<(u32, u64)> = workers.iter().map(|w| (s.d.workers[w].pid.expect("spawned"), 710 << 20)).collect();
    let sample = |s: &mut Sim, jobs: &[(u32, u64)]| {
        let total = 140 * GIB;
        let procs: Vec<(u32, u64)> = idle.iter().chain(jobs).copied().collect();
        let used: u64 = procs.iter().map(|p| p.1).sum();
        let processes = procs
            .iter()
            .map(|&(pid, used)| crate::event::ProcessMemory { pid, pgid: Some(pid as i32), used })
            .collect();
        let sample = crate::event::MemorySample { total, free: total - used, processes };
        s.handle(Event::GpuMemory { device: GPU0, sample })
    };
    let mut all = sample(&mut s, &[]);
    let hold = SubmitSpec { argv: vec!["python3".into(), "hold_memory.py".into(), "45".into()], ..spec("0") };
    let conns: Vec<ConnId> = (0..4).map(|_| s.connect()).collect();
    let jobs: Vec<u64> = conns
        .iter()
        .map(|&c| {
            let (j, e) = s.submit_spec(c, hold.clone());
            all.extend(e);
            j
        })
        .collect();
    let st = s.status();
    assert_eq!((st.devices[GPU0].running.len(), st.devices[GPU0].queued.clone()), (3, vec![jobs[3]]));
    // Two jobs hold 45 GiB; the third has only its context when it runs out of memory.
    let (p0, p1, p2) = (s.pid_of(jobs[0]), s.pid_of(jobs[1]), s.pid_of(jobs[2]));
    let held = [(p0, 45 * GIB + (600 << 20)), (p2, 45 * GIB + (600 << 20))];
    all.extend(sample(&mut s, &[held[0], held[1], (p1, 518 << 20)]));
    let x = s.exit(jobs[1], 1, true);
    assert_eq!(retried_to(&x, conns[1]), vec![jobs[1]]);
    all.extend(x);
    all.extend(sample(&mut s, &held));
    // The rest end one by one (the sampler keeps sampling); the retry runs alone, then ends.
    for _ in 0..6 {
        let running: Vec<u64> = s.status().devices[GPU0].running.clone();
        if let Some(&j) = running.first() {
            if s.d.jobs[&j].memory.retried.is_some() {
                assert_eq!(running, vec![j], "the retry runs alone");
            }
            all.extend(s.exit(j, 0, false));
        }
        all.extend(sample(&mut s, &[]));
    }
    assert!(s.status().jobs.is_empty(), "{:?}", s.status().jobs);
    let ends = ends_per_job(&all);
    assert_eq!(ends, jobs.iter().map(|&j| (j, 1)).collect(), "every client gets one job_ended");
    for (&c, &j) in conns.iter().zip(&jobs) {
        assert_eq!(ended_to(&all, c), vec![(j, Some(0))], "job {j}'s client");
    }
}

#[test]
fn auto_regions_jobs_get_the_bootstrap_cold_and_warm_and_others_do_not() {
    let mut s = Sim::new(|c| c.warm_workers = Some(1));
    let worker = 2;
    s.handle(Event::Worker {
        worker,
        msg: WorkerMsg::Ready { pid: 0, preloaded: vec![], cuda: true, startup_ms: 1.0, error: None },
    });
    let a = s.connect();
    let boot = "/kforge-test/python/kforge-auto-regions:/kforge-test/python";
    let env_of = |effects: &[Effect]| -> Vec<(String, String)> {
        effects
            .iter()
            .find_map(|e| match e {
                Effect::SpawnJob(l) => Some(l.env.clone()),
                Effect::HandToWorker(l) => Some(l.env.clone()),
                _ => None,
            })
            .expect("the job started")
    };
    let get = |env: &[(String, String)], k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    // A user's own KFORGE_AUTO_REGIONS does not count: only the flag does.
    let user_env = vec![("KFORGE_AUTO_REGIONS".to_string(), "1".to_string()), ("PYTHONPATH".into(), "/mine".into())];
    let (_, q) = s.submit_spec(a, SubmitSpec { env: user_env.clone(), ..spec("cpu") });
    let plain = env_of(&q);
    assert_eq!(get(&plain, "KFORGE_AUTO_REGIONS"), None);
    assert_eq!(get(&plain, "PYTHONPATH").as_deref(), Some("/kforge-test/python:/mine"));
    let (_, q) = s.submit_spec(a, SubmitSpec { env: user_env.clone(), auto_regions: true, ..spec("cpu") });
    let cold = env_of(&q);
    assert_eq!(get(&cold, "KFORGE_AUTO_REGIONS").as_deref(), Some("1"));
    assert_eq!(get(&cold, "PYTHONPATH"), Some(format!("{boot}:/mine")));
    let warm = SubmitSpec {
        argv: vec!["python3".into(), "a.py".into()],
        warm: true,
        auto_regions: true,
        env: user_env,
        ..spec("0")
    };
    let (_, q) = s.submit_spec(a, warm);
    assert!(q.iter().any(|e| matches!(e, Effect::HandToWorker(_))), "{q:?}");
    let w = env_of(&q);
    assert_eq!(get(&w, "KFORGE_AUTO_REGIONS").as_deref(), Some("1"));
    assert_eq!(get(&w, "PYTHONPATH"), Some(format!("{boot}:/mine")));
}

#[test]
fn a_job_that_needs_its_own_process_runs_warm_only_in_a_forked_child() {
    let ready = |fork: bool| {
        let mut s = Sim::new(|c| {
            c.warm_workers = Some(1);
            c.warm_python = true;
            c.worker_fork = fork;
        });
        let msg = WorkerMsg::Ready { pid: 0, preloaded: vec![], cuda: true, startup_ms: 1.0, error: None };
        s.handle(Event::Worker { worker: 2, msg });
        s
    };
    let runner = SubmitSpec {
        argv: vec!["python3".into(), "-m".into(), "kforge.verify.runner".into()],
        own_process: true,
        expected_ms: None,
        ..spec("0")
    };
    let cold = |q: &[Effect]| q.iter().any(|e| matches!(e, Effect::SpawnJob(_)));
    let warm = |q: &[Effect]| q.iter().any(|e| matches!(e, Effect::HandToWorker(_)));
    // In-process workers: --warm-python leaves it cold; an explicit --warm is refused, the fix named.
    let mut s = ready(false);
    let a = s.connect();
    let (_, q) = s.submit_spec(a, runner.clone());
    assert!(cold(&q) && !warm(&q), "{q:?}");
    let b = s.connect();
    let q = s.request(b, Request::Submit(SubmitSpec { warm: true, ..runner.clone() }));
    assert!(!cold(&q) && !warm(&q), "{q:?}");
    let refused = |r: &&Reply| matches!(r, Reply::Error { code: ErrorCode::BadRequest, message } if message.contains("--worker-fork"));
    assert!(replies(&q, b).first().is_some_and(refused), "{q:?}");
    // Another Python command still goes to the in-process worker (once the runner is done).
    let plain = SubmitSpec { argv: vec!["python3".into(), "a.py".into()], ..spec("0") };
    let (_, q) = s.submit_spec(a, plain);
    assert!(warm(&q), "{q:?}");
    // Forking workers take it, routed or asked.
    let mut s = ready(true);
    let a = s.connect();
    let (_, q) = s.submit_spec(a, runner);
    assert!(warm(&q) && !cold(&q), "{q:?}");
}
