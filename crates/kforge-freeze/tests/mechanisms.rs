//! Tests with real processes, real cgroups and real signals, for every mechanism the host has.
//!
//! Each test uses its own subtree name (test pid + counter) and cleans up through guards, so
//! tests run in parallel and leave nothing behind even when an assertion fails. Conditions are
//! polled with deadlines; the only fixed wait is the measurement window of a frozen counter.

use kforge_freeze::*;
use std::fs;
use std::ops::Deref;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const FREEZE_TIMEOUT: Duration = Duration::from_secs(5);
const POLL_DEADLINE: Duration = Duration::from_secs(10);
const WINDOW: Duration = Duration::from_millis(200);
/// Above any pid_max (2^22), so never a process group.
const NO_SUCH_PGID: i32 = 0x3fff_ffff;

fn unique_name(tag: &str) -> String {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    format!("kforge-test-{}-{tag}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::SeqCst))
}

/// Poll `cond` until it holds; panic after [`POLL_DEADLINE`].
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + POLL_DEADLINE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A freezer that recovers (kills + removes) its subtree when dropped.
struct Subtree(Freezer);

impl Deref for Subtree {
    type Target = Freezer;
    fn deref(&self) -> &Freezer {
        &self.0
    }
}

impl Drop for Subtree {
    fn drop(&mut self) {
        let _ = self.0.recover();
    }
}

/// A freezer of `kind`, or `None` with a note when this host lacks the mechanism.
fn freezer(kind: MechanismKind, tag: &str) -> Option<Subtree> {
    match Freezer::detect(&unique_name(tag), Some(kind)) {
        Ok(f) => Some(Subtree(f)),
        Err(e @ FreezeError::Unavailable { .. }) => {
            eprintln!("note: host lacks {kind}, skipping it in {tag}: {e}");
            None
        }
        Err(e) => panic!("detect {kind}: {e}"),
    }
}

/// A `sh` loop writing an ever-increasing counter to a file, in its own process group and in
/// job `id`'s cgroup of every given freezer. Dropping it kills it through those freezers.
struct Job {
    id: u64,
    pgid: i32,
    child: Child,
    counter: PathBuf,
    freezers: Vec<Freezer>,
    _dir: tempfile::TempDir,
}

impl Job {
    fn spawn(freezers: &[&Freezer], id: u64, prelude: &str) -> Job {
        let dir = tempfile::tempdir().unwrap();
        let counter = dir.path().join("counter");
        let script = format!("{prelude} i=0; while :; do i=$((i+1)); echo $i > '{}'; done", counter.display());
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script).process_group(0);
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        for f in freezers {
            if let Some(procs) = f.create_job(id).unwrap() {
                join_cgroup_on_exec(&mut cmd, &procs).unwrap();
            }
        }
        let child = cmd.spawn().unwrap();
        let job = Job {
            id,
            pgid: child.id() as i32,
            child,
            counter,
            freezers: freezers.iter().map(|f| (*f).clone()).collect(),
            _dir: dir,
        };
        wait_for("counter to start", || job.count().is_some_and(|n| n > 1));
        job
    }

    fn target(&self, f: &Freezer) -> JobTarget {
        f.target(self.id, self.pgid)
    }

    fn raw(&self) -> String {
        fs::read_to_string(&self.counter).unwrap_or_default()
    }

    fn count(&self) -> Option<u64> {
        self.raw().trim().parse().ok()
    }

    /// Reap the child and assert it died of SIGKILL.
    fn assert_killed(&mut self) {
        let status = self.child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        wait_for("process group to be gone", || live_members(self.pgid).is_empty());
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            for f in &self.freezers {
                let _ = f.kill(&self.target(f));
            }
            let _ = self.child.wait();
        }
    }
}

/// Members of `pgid` that are not zombies (an orphaned zombie may wait for a lazy init).
fn live_members(pgid: i32) -> Vec<i32> {
    pgid_members(pgid)
        .into_iter()
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.rsplit(')').next().is_some_and(|r| !r.trim_start().starts_with('Z')))
        })
        .collect()
}

fn procs_of(dir: &Path) -> Vec<i32> {
    let text = fs::read_to_string(dir.join("cgroup.procs")).unwrap();
    text.lines().map(|l| l.parse().unwrap()).collect()
}

/// Assert the counter does not move for the measurement window.
fn assert_still(job: &Job) -> String {
    let frozen = job.raw();
    let end = Instant::now() + WINDOW;
    while Instant::now() < end {
        assert_eq!(job.raw(), frozen, "counter moved while frozen");
        std::thread::sleep(Duration::from_millis(5));
    }
    frozen
}

fn freeze_thaw_kill_cycle(kind: MechanismKind) {
    let Some(f) = freezer(kind, "cycle") else {
        return;
    };
    let mut job = Job::spawn(&[&f], 1, "");
    let t = job.target(&f);
    if let Some(dir) = f.job_dir(1) {
        assert_eq!(procs_of(&dir), vec![job.pgid], "child joined its cgroup before exec");
    }

    f.freeze(&t, FREEZE_TIMEOUT).unwrap();
    let frozen = assert_still(&job);
    f.thaw(&t).unwrap();
    wait_for("counter to move after thaw", || job.raw() != frozen && job.count().is_some());
    // Freezing and thawing again works the same way.
    f.freeze(&t, FREEZE_TIMEOUT).unwrap();
    assert_still(&job);
    f.thaw(&t).unwrap();

    f.kill(&t).unwrap();
    job.assert_killed();
    f.remove_job(1).unwrap();
    if let Some(dir) = f.job_dir(1) {
        assert!(!dir.exists());
    }
    f.remove_job(1).unwrap(); // already gone: fine
}

fn kill_frozen_job(kind: MechanismKind) {
    let Some(f) = freezer(kind, "killfrozen") else {
        return;
    };
    // A background grandchild must die too.
    let mut job = Job::spawn(&[&f], 2, "sleep 1000 &");
    assert_eq!(live_members(job.pgid).len(), 2);
    let t = job.target(&f);
    f.freeze(&t, FREEZE_TIMEOUT).unwrap();
    f.kill(&t).unwrap();
    job.assert_killed();
    f.remove_job(2).unwrap();
    f.kill(&t).unwrap(); // idempotent on a gone job
}

fn recover_frozen_jobs(kind: MechanismKind) {
    let Some(f) = freezer(kind, "recover") else {
        return;
    };
    let mut a = Job::spawn(&[&f], 7, "");
    let mut b = Job::spawn(&[&f], 8, "sleep 1000 &");
    f.freeze(&a.target(&f), FREEZE_TIMEOUT).unwrap();
    f.freeze(&b.target(&f), FREEZE_TIMEOUT).unwrap();
    let Some(base) = f.base() else {
        // Signals: the daemon's guardian remembers process groups instead.
        assert_eq!(recover_pgids(&[a.pgid, b.pgid, NO_SUCH_PGID, 1, 0]), 2);
        a.assert_killed();
        b.assert_killed();
        return;
    };
    // A fresh freezer with the same name, as built by a restarted daemon or its guardian.
    let name = base.file_name().unwrap().to_str().unwrap();
    let again = Freezer::with_root(kind, base.parent().unwrap(), name).unwrap();
    let report = again.recover().unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!((report.cgroups, report.thawed, report.removed), (2, 2, 3), "{report:?}");
    assert!(report.killed >= 3, "{report:?}");
    assert!(!base.exists());
    a.assert_killed();
    b.assert_killed();
    // Recovering an absent base is a no-op, and jobs can be created again afterwards.
    assert_eq!(again.recover().unwrap().cgroups, 0);
    assert!(again.create_job(9).unwrap().is_some());
    again.remove_job(9).unwrap();
}

fn bad_targets_give_typed_errors(kind: MechanismKind) {
    let Some(f) = freezer(kind, "bad") else {
        return;
    };
    let t = |pgid: i32| f.target(99, pgid);
    let short = Duration::from_millis(100);
    if kind == MechanismKind::Signals {
        let missing = t(NO_SUCH_PGID);
        assert!(matches!(f.freeze(&missing, short), Err(FreezeError::NoSuchGroup { pgid: NO_SUCH_PGID })));
        assert!(matches!(f.thaw(&missing), Err(FreezeError::NoSuchGroup { .. })));
        f.kill(&missing).unwrap(); // nothing to kill is not an error
                                   // SAFETY: getpgrp has no preconditions.
        let own = unsafe { libc::getpgrp() };
        for pgid in [0, 1, -5, own] {
            assert!(matches!(f.freeze(&t(pgid), short), Err(FreezeError::Invalid { .. })), "{pgid}");
            assert!(matches!(f.kill(&t(pgid)), Err(FreezeError::Invalid { .. })), "{pgid}");
        }
    } else {
        // Job 99 was never created.
        let err = f.freeze(&t(NO_SUCH_PGID), short).unwrap_err();
        assert!(
            matches!(&err, FreezeError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "{err}"
        );
        assert!(err.to_string().contains("job-99"), "{err}");
        assert!(matches!(f.thaw(&t(0)), Err(FreezeError::Io { .. })));
        f.kill(&t(0)).unwrap();
        f.kill(&t(NO_SUCH_PGID)).unwrap();
        assert!(matches!(f.kill(&t(1)), Err(FreezeError::Invalid { .. })));
        let foreign = JobTarget { job: 99, pgid: 0, cgroup: Some(PathBuf::from("/sys/fs/cgroup")) };
        assert!(matches!(f.freeze(&foreign, short), Err(FreezeError::Invalid { .. })));
        assert!(matches!(f.kill(&foreign), Err(FreezeError::Invalid { .. })));
        f.remove_job(99).unwrap();
    }
}

macro_rules! per_mechanism {
    ($($test:ident),*) => {
        mod cgroup2 { $( #[test] fn $test() { super::$test(kforge_freeze::MechanismKind::CgroupV2) } )* }
        mod cgroup1 { $( #[test] fn $test() { super::$test(kforge_freeze::MechanismKind::CgroupV1) } )* }
        mod signals { $( #[test] fn $test() { super::$test(kforge_freeze::MechanismKind::Signals) } )* }
    };
}

per_mechanism!(freeze_thaw_kill_cycle, kill_frozen_job, recover_frozen_jobs, bad_targets_give_typed_errors);

#[test]
fn kind_names_round_trip() {
    for k in MechanismKind::ALL {
        assert_eq!(MechanismKind::parse(k.as_str()), Some(k));
    }
    assert_eq!(MechanismKind::parse("cgroup3"), None);
    assert_eq!(MechanismKind::parse(""), None);
}

#[test]
fn unavailable_mechanisms_and_bad_names_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    for kind in [MechanismKind::CgroupV2, MechanismKind::CgroupV1] {
        let err = Freezer::with_root(kind, dir.path(), "kforge-x").unwrap_err();
        assert!(matches!(err, FreezeError::Unavailable { kind: k, .. } if k == kind), "{err}");
        let missing = dir.path().join("missing");
        assert!(matches!(Freezer::with_root(kind, &missing, "x"), Err(FreezeError::Unavailable { .. })));
    }
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "nothing created on failure");
    // A forced mechanism is either usable or reported unavailable, never something else.
    for kind in MechanismKind::ALL {
        match Freezer::detect(&unique_name("probe"), Some(kind)) {
            Ok(f) => {
                assert_eq!(f.kind(), kind);
                assert!(f.describe().starts_with(kind.as_str()));
                assert_eq!(f.base().is_some(), kind != MechanismKind::Signals);
                assert!(f.recover().unwrap().is_clean());
            }
            Err(e) => assert!(matches!(e, FreezeError::Unavailable { .. }), "{e}"),
        }
    }
    let auto = Subtree(Freezer::detect(&unique_name("auto"), None).unwrap());
    eprintln!("auto-detected: {}", auto.describe());
    for name in ["", ".", "..", "a/b", "nul\0"] {
        assert!(matches!(Freezer::detect(name, None), Err(FreezeError::Invalid { .. })), "{name:?}");
    }
}

/// A cgroup-frozen process never takes SIGSTOP, so a signals freeze must time out.
#[test]
fn freeze_timeout_is_reported() {
    let Some(cg) = freezer(MechanismKind::CgroupV2, "timeout").or_else(|| freezer(MechanismKind::CgroupV1, "timeout"))
    else {
        return;
    };
    let signals = Freezer::detect("unused", Some(MechanismKind::Signals)).unwrap();
    let job = Job::spawn(&[&cg], 3, "");
    cg.freeze(&job.target(&cg), FREEZE_TIMEOUT).unwrap();
    let timeout = Duration::from_millis(200);
    let start = Instant::now();
    let err = signals.freeze(&job.target(&signals), timeout).unwrap_err();
    assert!(matches!(err, FreezeError::Timeout { job: 3, .. }), "{err}");
    assert!(start.elapsed() >= timeout);
    assert!(err.to_string().contains(&job.pgid.to_string()), "{err}");
}

/// On hybrid hosts: a task frozen by the v1 freezer never reaches the v2 frozen state.
#[test]
fn cgroup2_freeze_timeout_is_reported() {
    let (Some(v2), Some(v1)) =
        (freezer(MechanismKind::CgroupV2, "timeout2"), freezer(MechanismKind::CgroupV1, "timeout2"))
    else {
        return;
    };
    let job = Job::spawn(&[&v2, &v1], 4, "");
    v1.freeze(&job.target(&v1), FREEZE_TIMEOUT).unwrap();
    let err = v2.freeze(&job.target(&v2), Duration::from_millis(200)).unwrap_err();
    assert!(matches!(err, FreezeError::Timeout { job: 4, .. }), "{err}");
    assert!(err.to_string().contains("frozen 0"), "{err}");
}
