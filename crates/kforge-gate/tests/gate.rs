//! Behavioural tests of the gate segment and protocol.
//!
//! Cross-process tests re-execute this test binary with
//! `--exact submitter_child`; that test is a no-op unless
//! `KFORGE_GATE_TEST_SUBMITTER` is set.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use kforge_gate::*;

const ENV_GATE: &str = "KFORGE_GATE_TEST_SUBMITTER";
const ENV_LOG: &str = "KFORGE_GATE_TEST_SUBMITTER_LOG";
const ENV_COUNT: &str = "KFORGE_GATE_TEST_SUBMITTER_COUNT";
const ENV_IN_FLIGHT_US: &str = "KFORGE_GATE_TEST_SUBMITTER_IN_FLIGHT_US";

/// Entry point of the child submitter process; no-op in a normal test run.
#[test]
fn submitter_child() {
    let Some(gate) = std::env::var_os(ENV_GATE) else { return };
    let log = std::env::var_os(ENV_LOG).expect("log path");
    let count: u64 = std::env::var(ENV_COUNT).map(|s| s.parse().unwrap()).unwrap_or(0);
    let in_flight: u64 = std::env::var(ENV_IN_FLIGHT_US).map(|s| s.parse().unwrap()).unwrap_or(1000);
    run_test_submitter(Path::new(&gate), Path::new(&log), count, Duration::from_micros(in_flight)).unwrap();
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn shm_path(tag: &str) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    PathBuf::from(format!("/dev/shm/kforge-gate-test-{}-{}-{}", std::process::id(), n, tag))
}

/// Removes a file on drop (for hand-crafted, non-owner segments).
struct RmOnDrop(PathBuf);
impl Drop for RmOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Kills and reaps a child on drop (if a test fails midway).
struct KillOnDrop(Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn poll_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn my_pid() -> u32 {
    std::process::id()
}

fn gettid() -> i64 {
    unsafe { libc::syscall(libc::SYS_gettid) }
}

/// Whether a thread of this process is in interruptible sleep (blocked in
/// a syscall such as FUTEX_WAIT).
fn thread_sleeping(tid: i64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else { return false };
    // state is the field after the ")" closing the command name
    stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()) == Some('S')
}

#[test]
fn create_and_open_share_state() {
    let p = shm_path("share");
    let d = Gate::create(&p, 8).unwrap();
    assert!(d.is_owner());
    assert_eq!(d.path(), p.as_path());
    assert_eq!(d.slots(), 8);
    let meta = std::fs::metadata(&p).unwrap();
    assert_eq!(meta.len(), segment_size(8) as u64);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let raw = std::fs::read(&p).unwrap();
    assert_eq!(&raw[0..8], b"KFGATE01");
    assert_eq!(u32::from_ne_bytes(raw[8..12].try_into().unwrap()), 1);
    assert_eq!(u32::from_ne_bytes(raw[12..16].try_into().unwrap()), 8);

    let c = Gate::open(&p).unwrap();
    assert!(!c.is_owner());
    assert_eq!(c.slots(), 8);
    assert!(!c.is_closed());
    assert_eq!(c.epoch(), 0);
    assert_eq!(c.holder(), 0);
    assert!(c.registered_pids().is_empty());

    let e = d.close(4242);
    assert_eq!(e, 1);
    assert!(c.is_closed());
    assert_eq!(c.epoch(), 1);
    assert_eq!(c.holder(), 4242);
    let slot = c.register(my_pid()).unwrap();
    assert_eq!(d.registered_pids(), vec![my_pid()]);
    assert_eq!(d.slot_acked_epoch(slot), 1, "newcomer starts at the current epoch");
    d.open_gate();
    assert!(!c.is_closed());
    assert_eq!(c.holder(), 0);
    c.unregister(slot);
    assert!(d.registered_pids().is_empty());

    // Participant drop does not unlink; owner drop does.
    drop(c);
    assert!(p.exists());
    drop(d);
    assert!(!p.exists());
}

#[test]
fn create_rejects_existing_file_and_bad_slot_counts() {
    let p = shm_path("exists");
    let d = Gate::create(&p, 2).unwrap();
    assert!(matches!(Gate::create(&p, 2), Err(GateError::AlreadyExists(_))));
    drop(d);
    assert!(matches!(Gate::create(&shm_path("zero"), 0), Err(GateError::InvalidSlots(0))));
    assert!(matches!(Gate::open(&shm_path("missing")), Err(GateError::Io { op: "open", .. })));
}

/// Writes a copy of a valid segment with `edit` applied and opens it.
fn open_edited(tag: &str, edit: impl FnOnce(&mut Vec<u8>)) -> (RmOnDrop, Result<Gate, GateError>) {
    let src = shm_path(&format!("{tag}-src"));
    let d = Gate::create(&src, 4).unwrap();
    let mut bytes = std::fs::read(&src).unwrap();
    drop(d);
    edit(&mut bytes);
    let p = shm_path(tag);
    std::fs::write(&p, &bytes).unwrap();
    let r = Gate::open(&p);
    (RmOnDrop(p), r)
}

#[test]
fn open_validates_magic_version_and_size() {
    let (_g, r) = open_edited("ok", |_| {});
    assert_eq!(r.unwrap().slots(), 4);

    let (_g, r) = open_edited("magic", |b| b[0..8].copy_from_slice(b"NOTAGATE"));
    match r {
        Err(GateError::BadMagic { found, .. }) => assert_eq!(found.to_le_bytes(), *b"NOTAGATE"),
        other => panic!("expected BadMagic, got {other:?}"),
    }

    let (_g, r) = open_edited("version", |b| b[8..12].copy_from_slice(&2u32.to_ne_bytes()));
    assert!(matches!(r, Err(GateError::BadVersion { found: 2, .. })), "{r:?}");

    // Header intact, slot table cut short.
    let (_g, r) = open_edited("short", |b| b.truncate(segment_size(4) - 1));
    match r {
        Err(GateError::Truncated { expected, actual, .. }) => {
            assert_eq!(expected, segment_size(4) as u64);
            assert_eq!(actual, segment_size(4) as u64 - 1);
        }
        other => panic!("expected Truncated, got {other:?}"),
    }

    // Not even a header.
    let (_g, r) = open_edited("tiny", |b| b.truncate(10));
    assert!(matches!(r, Err(GateError::Truncated { expected: 40, actual: 10, .. })), "{r:?}");

    // Slot count claims more than the file holds.
    let (_g, r) = open_edited("slots", |b| b[12..16].copy_from_slice(&100u32.to_ne_bytes()));
    assert!(matches!(r, Err(GateError::Truncated { .. })), "{r:?}");
}

#[test]
fn pass_blocks_while_closed_and_resumes_on_open() {
    let p = shm_path("block");
    let d = Gate::create(&p, 4).unwrap();
    let c = Arc::new(Gate::open(&p).unwrap()); // a second, independent mapping

    // Open gate: pass returns at once.
    c.pass(7);

    let participant_pid = 0x7fff_0001; // not the holder
    let e = d.close(my_pid());
    assert_eq!(e, 1);

    let returned = Arc::new(AtomicBool::new(false));
    let returned_at = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::channel();
    let t = {
        let (c, returned, returned_at) = (c.clone(), returned.clone(), returned_at.clone());
        std::thread::spawn(move || {
            tx.send(gettid()).unwrap();
            c.pass(participant_pid);
            returned_at.store(monotonic_ns(), Ordering::SeqCst);
            returned.store(true, Ordering::SeqCst);
        })
    };
    let tid = rx.recv().unwrap();
    // Wait until the thread is actually asleep (in FUTEX_WAIT).
    poll_until("passer to block", Duration::from_secs(10), || thread_sleeping(tid));
    assert!(!returned.load(Ordering::SeqCst), "pass() returned while the gate was closed");
    // A re-close with another holder wakes the waiter, which must block again.
    d.close(my_pid());
    poll_until("passer to block again", Duration::from_secs(10), || thread_sleeping(tid));
    assert!(!returned.load(Ordering::SeqCst), "pass() returned while the gate was closed");
    assert!(!c.pass_timeout(participant_pid, Duration::from_millis(20)));

    let opened_at = monotonic_ns();
    d.open_gate();
    t.join().unwrap();
    assert!(returned.load(Ordering::SeqCst));
    assert!(returned_at.load(Ordering::SeqCst) >= opened_at, "pass() returned before the gate was opened");
}

#[test]
fn holder_passes_while_closed() {
    let p = shm_path("holder");
    let d = Gate::create(&p, 4).unwrap();
    let c = Arc::new(Gate::open(&p).unwrap());
    let holder = 0x7fff_0002;
    d.close(holder);
    assert_eq!(c.holder(), holder);

    let (tx, rx) = mpsc::channel();
    let c2 = c.clone();
    std::thread::spawn(move || {
        c2.pass(holder);
        tx.send(()).unwrap();
    });
    rx.recv_timeout(Duration::from_secs(10)).expect("holder blocked at a closed gate");
    assert!(c.pass_timeout(holder, Duration::ZERO));
    assert!(!c.pass_timeout(holder + 1, Duration::ZERO));
    assert!(!c.pass_timeout(0, Duration::ZERO), "pid 0 never matches 'no holder'");

    let tracker = LaunchTracker::new();
    {
        let _g = tracker.enter(&c, holder);
        assert_eq!(tracker.active(), 1);
    }
    assert_eq!(tracker.active(), 0);

    // The holder also acknowledges, but is not waited for.
    let slot = c.register(holder).unwrap();
    let out = d.wait_acks(d.epoch(), Duration::from_secs(5));
    assert!(!out.timed_out && out.pending_pids.is_empty() && out.acked == 0, "{out:?}");
    assert_eq!(d.slot_pid(slot), holder, "holder's slot must not be cleared");
}

#[test]
fn drain_helper_acks_each_close_with_its_epoch() {
    let p = shm_path("acks");
    let d = Gate::create(&p, 4).unwrap();
    let c = Arc::new(Gate::open(&p).unwrap());
    let slot = c.register(my_pid()).unwrap();
    assert_eq!(c.slot_acked_epoch(slot), 0);

    let (tx, rx) = mpsc::channel();
    let closed_during_drain = Arc::new(AtomicBool::new(true));
    let helper = {
        let (c, closed) = (c.clone(), closed_during_drain.clone());
        spawn_drain_helper_with(c.clone(), slot, move |epoch| {
            if !c.is_closed() {
                closed.store(false, Ordering::SeqCst);
            }
            tx.send(epoch).unwrap();
        })
    };
    assert!(helper.is_running());

    let e1 = d.close(0);
    let out = d.wait_acks(e1, Duration::from_secs(10));
    assert!(!out.timed_out, "{out:?}");
    assert_eq!(out.acked, 1);
    assert!(out.pending_pids.is_empty());
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), e1);
    assert_eq!(d.slot_acked_epoch(slot), e1);
    d.open_gate();

    let e2 = d.close(0);
    assert_eq!(e2, e1 + 1);
    let out = d.wait_acks(e2, Duration::from_secs(10));
    assert!(!out.timed_out && out.acked == 1, "{out:?}");
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), e2);
    assert_eq!(d.slot_acked_epoch(slot), e2);

    // Re-close without opening: a new epoch, acknowledged too.
    let e3 = d.close(0);
    let out = d.wait_acks(e3, Duration::from_secs(10));
    assert!(!out.timed_out && out.acked == 1, "{out:?}");
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), e3);
    d.open_gate();

    // Exactly one drain per close.
    helper.stop();
    assert!(rx.try_recv().is_err(), "extra drain");
    assert!(closed_during_drain.load(Ordering::SeqCst));
    c.unregister(slot);
}

#[test]
fn helper_acks_a_close_that_raced_registration() {
    let p = shm_path("race");
    let d = Gate::create(&p, 4).unwrap();
    let c = Arc::new(Gate::open(&p).unwrap());
    let slot = c.register(my_pid()).unwrap();
    // Close after registration but before the helper starts.
    let e = d.close(0);
    let helper = spawn_drain_helper(c.clone(), slot, || {});
    let out = d.wait_acks(e, Duration::from_secs(10));
    assert!(!out.timed_out && out.acked == 1, "{out:?}");
    drop(helper);
}

#[test]
fn wait_acks_times_out_listing_the_silent_participant() {
    let p = shm_path("silent");
    let d = Gate::create(&p, 4).unwrap();
    let c = Gate::open(&p).unwrap();
    let slot = c.register(my_pid()).unwrap(); // alive, but nobody acks
    let e = d.close(0);
    let timeout = Duration::from_millis(150);
    let out = d.wait_acks(e, timeout);
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.pending_pids, vec![my_pid()]);
    assert_eq!(out.acked, 0);
    assert!(out.elapsed >= timeout);
    assert!(out.elapsed < timeout + Duration::from_secs(5));
    // A manual ack satisfies it.
    c.ack(slot, e);
    let out = d.wait_acks(e, Duration::from_secs(5));
    assert!(!out.timed_out && out.acked == 1 && out.pending_pids.is_empty(), "{out:?}");
    assert_eq!(d.registered_pids(), vec![my_pid()]);
}

#[test]
fn a_straggler_still_behind_on_a_timed_out_drain_is_skipped_until_it_catches_up() {
    let p = shm_path("straggler");
    let d = Gate::create(&p, 4).unwrap();
    let c = Gate::open(&p).unwrap();
    let slot = c.register(my_pid()).unwrap(); // alive; acks only by hand
    let first = d.close(0);
    let out = d.wait_acks(first, Duration::from_millis(50));
    assert!(out.timed_out && out.pending_pids == vec![my_pid()], "{out:?}");
    d.open_gate();
    let behind = [Straggler { pid: my_pid(), epoch: first }];
    // Still behind on the first drain: the second does not wait for it.
    let second = d.close(0);
    let out = d.wait_acks_skipping(second, Duration::from_secs(30), &behind);
    assert!(!out.timed_out && out.pending_pids.is_empty(), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(5), "{out:?}");
    assert_eq!((out.skipped_pids, out.acked), (vec![my_pid()], 0));
    // Caught up on the first drain (its late ack), it is waited for again.
    c.ack(slot, first);
    let out = d.wait_acks_skipping(second, Duration::from_millis(50), &behind);
    assert!(out.timed_out && out.skipped_pids.is_empty() && out.pending_pids == vec![my_pid()], "{out:?}");
    c.ack(slot, second);
    let out = d.wait_acks_skipping(second, Duration::from_secs(5), &behind);
    assert!(!out.timed_out && out.acked == 1 && out.skipped_pids.is_empty(), "{out:?}");
    // Another pid's entry skips nobody.
    let third = d.close(0);
    let other = [Straggler { pid: my_pid() + 1, epoch: third + 1 }];
    let out = d.wait_acks_skipping(third, Duration::from_millis(50), &other);
    assert!(out.timed_out && out.pending_pids == vec![my_pid()] && out.skipped_pids.is_empty(), "{out:?}");
}

#[test]
fn wait_acks_clears_slots_of_dead_processes() {
    let p = shm_path("dead");
    let d = Gate::create(&p, 4).unwrap();
    let mut child = Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap(); // exited and reaped: kill(pid, 0) -> ESRCH
    assert!(!process_alive(dead_pid));
    let slot = d.register(dead_pid).unwrap();
    assert_eq!(d.registered_pids(), vec![dead_pid]);

    let e = d.close(0);
    let out = d.wait_acks(e, Duration::from_secs(10));
    assert!(!out.timed_out, "{out:?}");
    assert!(out.pending_pids.is_empty());
    assert_eq!(out.acked, 0);
    assert!(out.elapsed < Duration::from_secs(5));
    assert_eq!(d.slot_pid(slot), 0, "dead slot cleared");
    assert!(d.registered_pids().is_empty());
}

/// A participant that exited but was never reaped (a zombie: `kill(pid, 0)` still finds it)
/// cannot acknowledge: its slot is cleared at once instead of making every drain wait out its
/// timeout.
#[test]
fn wait_acks_clears_slots_of_zombies() {
    let p = shm_path("zombie");
    let d = Gate::create(&p, 4).unwrap();
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    child.kill().unwrap(); // not reaped until the end of the test: a zombie
    let stat = || std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while !stat().contains(") Z ") && std::time::Instant::now() < until {
        std::thread::yield_now();
    }
    assert!(stat().contains(") Z "), "a zombie: {}", stat());
    assert!(!process_alive(pid));
    let slot = d.register(pid).unwrap();
    let e = d.close(0);
    let out = d.wait_acks(e, Duration::from_secs(10));
    assert!(!out.timed_out && out.pending_pids.is_empty(), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(5), "{out:?}");
    assert_eq!(d.slot_pid(slot), 0, "the zombie's slot cleared");
    child.wait().unwrap();
}

#[test]
fn wait_acks_notices_a_participant_dying_mid_wait() {
    let p = shm_path("dies");
    let d = Gate::create(&p, 4).unwrap();
    let child = KillOnDrop(Command::new("sleep").arg("30").spawn().unwrap());
    let pid = child.0.id();
    d.register(pid).unwrap();
    let e = d.close(0);
    let out = d.wait_acks(e, Duration::from_millis(50));
    assert!(out.timed_out && out.pending_pids == vec![pid], "{out:?}");
    let killer = std::thread::spawn(move || drop(child)); // kill + reap
    let out = d.wait_acks(e, Duration::from_secs(20));
    killer.join().unwrap();
    assert!(!out.timed_out && out.pending_pids.is_empty(), "{out:?}");
    assert!(d.registered_pids().is_empty());
}

#[test]
fn full_slot_table_is_an_error() {
    let p = shm_path("full");
    let d = Gate::create(&p, 2).unwrap();
    let c = Gate::open(&p).unwrap();
    let a = c.register(my_pid()).unwrap();
    let b = c.register(my_pid()).unwrap();
    assert_ne!(a, b);
    assert!(matches!(c.register(my_pid()), Err(GateError::TableFull { slots: 2 })));
    assert!(matches!(c.register(0), Err(GateError::InvalidPid)));
    c.unregister(a);
    assert_eq!(c.register(my_pid()).unwrap(), a);
    c.unregister(99); // out of range: ignored
    assert_eq!(d.registered_pids().len(), 2);
}

#[test]
fn concurrent_registration_claims_distinct_slots() {
    let p = shm_path("concurrent");
    let d = Arc::new(Gate::create(&p, 64).unwrap());
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let d = d.clone();
            std::thread::spawn(move || (0..8).map(|i| d.register(1000 + t * 8 + i).unwrap()).collect::<Vec<_>>())
        })
        .collect();
    let mut all: Vec<usize> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    all.sort();
    assert_eq!(all, (0..64).collect::<Vec<_>>());
    assert!(matches!(d.register(1), Err(GateError::TableFull { .. })));
}

#[derive(Debug, Default)]
struct Log {
    submits: Vec<u64>,
    acks: Vec<(u64, u64)>, // (ns, epoch)
}

fn read_log(path: &Path) -> Log {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut log = Log::default();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(ts), Some(kind)) = (it.next(), it.next()) else { continue };
        let ts: u64 = ts.parse().unwrap();
        match kind {
            "submit" => log.submits.push(ts),
            "ack" => log.acks.push((ts, it.next().unwrap().parse().unwrap())),
            other => panic!("bad log line kind {other:?}"),
        }
    }
    log
}

fn spawn_submitter(gate: &Path, log: &Path, count: u64, in_flight_us: u64) -> KillOnDrop {
    let exe = std::env::current_exe().unwrap();
    let child = Command::new(exe)
        .args(["--exact", "submitter_child", "--nocapture", "--test-threads=1"])
        .env(ENV_GATE, gate)
        .env(ENV_LOG, log)
        .env(ENV_COUNT, count.to_string())
        .env(ENV_IN_FLIGHT_US, in_flight_us.to_string())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    KillOnDrop(child)
}

#[test]
fn cross_process_submitter_is_silent_between_close_and_open() {
    let p = shm_path("xproc");
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("submitter.log");
    let d = Gate::create(&p, 8).unwrap();
    let in_flight = Duration::from_millis(3);
    let mut child = spawn_submitter(&p, &log_path, 0, in_flight.as_micros() as u64);
    let child_pid = child.0.id();

    poll_until("child to register and submit", Duration::from_secs(30), || {
        d.registered_pids().contains(&child_pid) && read_log(&log_path).submits.len() >= 3
    });

    let mut windows = Vec::new();
    for round in 0..2 {
        let t_close = monotonic_ns();
        let epoch = d.close(my_pid());
        let out = d.wait_acks(epoch, Duration::from_secs(20));
        let t_acked = monotonic_ns();
        assert!(!out.timed_out, "round {round}: {out:?}");
        assert_eq!(out.acked, 1, "round {round}: {out:?}");
        // Hold the region for a while; the child keeps trying to submit.
        std::thread::sleep(Duration::from_millis(60));
        let t_open = monotonic_ns();
        d.open_gate();
        windows.push((epoch, t_close, t_acked, t_open));
        // The child resumes after the open.
        poll_until("child to resume after open", Duration::from_secs(20), || {
            read_log(&log_path).submits.iter().any(|&s| s > t_open)
        });
    }

    // Kill the child: its slot is left behind and must be cleared.
    let _ = child.0.kill();
    let _ = child.0.wait();
    let e = d.close(my_pid());
    let out = d.wait_acks(e, Duration::from_secs(10));
    assert!(!out.timed_out && out.pending_pids.is_empty(), "{out:?}");
    assert!(!d.registered_pids().contains(&child_pid));
    d.open_gate();

    let log = read_log(&log_path);
    for (i, &(epoch, t_close, t_acked, t_open)) in windows.iter().enumerate() {
        let acks: Vec<_> = log.acks.iter().filter(|a| a.1 == epoch).collect();
        assert_eq!(acks.len(), 1, "round {i}: one ack line for epoch {epoch}: {:?}", log.acks);
        let ack_ts = acks[0].0;
        assert!(t_close <= ack_ts && ack_ts <= t_acked, "round {i}: ack at {ack_ts} outside [{t_close}, {t_acked}]");
        let during: Vec<_> = log.submits.iter().filter(|&&s| s >= ack_ts && s <= t_open).collect();
        assert!(during.is_empty(), "round {i}: submissions while the gate was closed: {during:?}");
        // The drain waited for the last submission to complete.
        let last_before =
            log.submits.iter().copied().filter(|&s| s < ack_ts).max().expect("a submission before the close");
        assert!(
            ack_ts >= last_before + in_flight.as_nanos() as u64,
            "round {i}: acked at {ack_ts} before the submission at {last_before} completed"
        );
        assert!(log.submits.iter().any(|&s| s > t_open), "round {i}: no submission after open");
    }
    // Epochs acknowledged by the child are exactly our two closes.
    let mut acked_epochs: Vec<u64> = log.acks.iter().map(|a| a.1).collect();
    acked_epochs.sort();
    assert_eq!(acked_epochs, windows.iter().map(|w| w.0).collect::<Vec<_>>());
}

#[test]
fn cross_process_submitter_with_count_exits_and_unregisters() {
    let p = shm_path("count");
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("submitter.log");
    let d = Gate::create(&p, 4).unwrap();
    let mut child = spawn_submitter(&p, &log_path, 5, 500);
    let status = child.0.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(read_log(&log_path).submits.len(), 5);
    assert!(d.registered_pids().is_empty(), "child unregistered on exit");
}

#[test]
fn threads_with_launch_tracker_never_submit_after_ack() {
    // In-process variant of the cross-process test, several launching threads.
    let p = shm_path("tracker");
    let d = Gate::create(&p, 4).unwrap();
    let c = Arc::new(Gate::open(&p).unwrap());
    let pid = my_pid();
    let slot = c.register(pid).unwrap();
    let tracker = Arc::new(LaunchTracker::new());
    let last_submit = Arc::new(AtomicU64::new(0));
    let acked_at = Arc::new(AtomicU64::new(0));
    let violations = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let helper = {
        let (tracker, acked_at) = (tracker.clone(), acked_at.clone());
        spawn_drain_helper(c.clone(), slot, move || {
            tracker.wait_idle();
            acked_at.store(monotonic_ns(), Ordering::SeqCst);
        })
    };
    let launchers: Vec<_> = (0..3)
        .map(|_| {
            let (c, tracker, last_submit, stop, violations, acked_at) =
                (c.clone(), tracker.clone(), last_submit.clone(), stop.clone(), violations.clone(), acked_at.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let _g = tracker.enter(&c, pid + 1); // never the holder
                                                         // Submitting after the drain acked, while closed, is a bug.
                    if c.is_closed() && acked_at.load(Ordering::SeqCst) != 0 {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    last_submit.store(monotonic_ns(), Ordering::SeqCst);
                    n += 1;
                }
                n
            })
        })
        .collect();
    for _ in 0..20 {
        acked_at.store(0, Ordering::SeqCst);
        let e = d.close(0); // holder must not be the registered participant
        let out = d.wait_acks(e, Duration::from_secs(10));
        assert!(!out.timed_out, "{out:?}");
        let acked = acked_at.load(Ordering::SeqCst);
        assert!(acked != 0);
        let t = monotonic_ns();
        poll_until("a few ms to pass", Duration::from_secs(5), || monotonic_ns() > t + 2_000_000);
        assert!(last_submit.load(Ordering::SeqCst) <= acked, "submission after the ack");
        d.open_gate();
    }
    stop.store(true, Ordering::SeqCst);
    let total: u64 = launchers.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(total > 0);
    assert_eq!(violations.load(Ordering::SeqCst), 0);
    drop(helper);
}
