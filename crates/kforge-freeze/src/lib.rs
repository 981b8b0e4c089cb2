//! Freezing sibling jobs while one job runs a timed region.
//!
//! A [`Freezer`] owns one daemon subtree (`<hierarchy>/<name>/`) and one cgroup per job
//! (`<hierarchy>/<name>/job-<id>/`). Three mechanisms exist, picked by [`Freezer::detect`]:
//!
//! * [`MechanismKind::CgroupV2`]: `cgroup.freeze` / `cgroup.events` / `cgroup.kill` of a cgroup v2
//!   hierarchy (`/sys/fs/cgroup` on pure-v2 hosts, `/sys/fs/cgroup/unified` on hybrid ones).
//! * [`MechanismKind::CgroupV1`]: `freezer.state` of the v1 freezer at `/sys/fs/cgroup/freezer`.
//! * [`MechanismKind::Signals`]: `SIGSTOP`/`SIGCONT` to the job's process group. Weaker: a job
//!   can leave its process group, and stopped processes are visible to their parents.
//!
//! A job process joins its cgroup itself, between `fork` and `exec`, see
//! [`join_cgroup_on_exec`]. Every wait in this crate is bounded by a deadline.

mod procfs;

pub use procfs::{pgid_members, recover_pgids};

use std::ffi::CString;
use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;
const V1_FREEZER_ROOT: &str = "/sys/fs/cgroup/freezer";
const V2_ROOTS: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];
/// How long `remove_job`/`recover` retry `rmdir` of a cgroup that is still populated.
const RMDIR_PATIENCE: Duration = Duration::from_secs(2);

/// The freezing mechanism of a [`Freezer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MechanismKind {
    /// cgroup v2 `cgroup.freeze`.
    CgroupV2,
    /// cgroup v1 freezer controller.
    CgroupV1,
    /// `SIGSTOP`/`SIGCONT` to process groups.
    Signals,
}

impl MechanismKind {
    /// All mechanisms, in auto-detection order.
    pub const ALL: [MechanismKind; 3] = [Self::CgroupV2, Self::CgroupV1, Self::Signals];

    /// Stable name: `"cgroup2"`, `"cgroup1"` or `"signals"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CgroupV2 => "cgroup2",
            Self::CgroupV1 => "cgroup1",
            Self::Signals => "signals",
        }
    }

    /// Inverse of [`as_str`](Self::as_str); `None` for any other string.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for MechanismKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors of this crate. Each names the path, process group or job concerned.
#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    /// An argument was rejected before anything was touched.
    #[error("invalid {what}: {detail}")]
    Invalid { what: &'static str, detail: String },
    /// The requested mechanism cannot be used on this host.
    #[error("{kind} freezing unavailable: {reason}")]
    Unavailable { kind: MechanismKind, reason: String },
    /// A file-system operation on a cgroup file or directory failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The process group has no members (`kill` answered ESRCH).
    #[error("process group {pgid} does not exist")]
    NoSuchGroup { pgid: i32 },
    /// Sending a signal failed for a reason other than ESRCH.
    #[error("sending signal {signal} to {target}: {source}")]
    Signal {
        target: String,
        signal: i32,
        #[source]
        source: io::Error,
    },
    /// The job was not completely frozen before the deadline. The freeze request stays in
    /// effect (the job may be partly frozen); call [`Freezer::thaw`] to undo it.
    #[error("job {job} not frozen within {timeout:?}: {detail}")]
    Timeout { job: u64, timeout: Duration, detail: String },
    /// A cgroup directory could not be removed because it stayed populated.
    #[error("cgroup {} still populated after {waited:?}", path.display())]
    Busy { path: PathBuf, waited: Duration },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FreezeError + 'a {
    move |source| FreezeError::Io { op, path: path.to_path_buf(), source }
}

fn unavailable(kind: MechanismKind, reason: impl Into<String>) -> FreezeError {
    FreezeError::Unavailable { kind, reason: reason.into() }
}

/// One job as the freezer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobTarget {
    /// Job id, as given to [`Freezer::create_job`].
    pub job: u64,
    /// Process group of the job (its leader was spawned with `process_group(0)`). Required by
    /// the signals mechanism; cgroup mechanisms also SIGKILL it in [`Freezer::kill`] unless 0.
    pub pgid: i32,
    /// The job's cgroup directory; `None` means `<base>/job-<job>`. Ignored by signals.
    pub cgroup: Option<PathBuf>,
}

/// What [`Freezer::recover`] did.
#[derive(Debug, Default)]
pub struct RecoverReport {
    /// Job cgroups found under the base (nested cgroups included).
    pub cgroups: usize,
    /// Cgroups that were frozen (or freezing) and got thawed.
    pub thawed: usize,
    /// Processes found in the job cgroups, all sent SIGKILL.
    pub killed: usize,
    /// Cgroup directories removed (the base included).
    pub removed: usize,
    /// Failures that did not stop the recovery (e.g. a cgroup that stayed populated).
    pub errors: Vec<FreezeError>,
}

impl RecoverReport {
    /// True when nothing went wrong.
    pub fn is_clean(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Freezes, thaws and kills jobs of one daemon through one [`MechanismKind`].
#[derive(Debug, Clone)]
pub struct Freezer {
    kind: MechanismKind,
    base: Option<PathBuf>,
}

fn validate_name(name: &str) -> Result<(), FreezeError> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(FreezeError::Invalid {
            what: "subtree name",
            detail: format!("{name:?} (must be one non-empty path component)"),
        });
    }
    Ok(())
}

/// `statfs(2)` file-system magic of `path`.
fn fs_magic(path: &Path) -> io::Result<i64> {
    let c = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: statfs only writes into `st`, which is plain old data.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    Ok(st.f_type as i64)
}

fn read_trimmed(path: &Path) -> Result<String, FreezeError> {
    fs::read_to_string(path).map(|s| s.trim().to_string()).map_err(io_err("read", path))
}

/// Write `data` to an existing (cgroup) file without creating or truncating it.
fn write_file(path: &Path, data: &str) -> Result<(), FreezeError> {
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(data.as_bytes()))
        .map_err(io_err("write", path))
}

fn is_not_found(e: &FreezeError) -> bool {
    matches!(e, FreezeError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
}

/// Pids listed in `<dir>/cgroup.procs`; empty if the cgroup is gone.
fn cgroup_pids(dir: &Path) -> Result<Vec<i32>, FreezeError> {
    match read_trimmed(&dir.join("cgroup.procs")) {
        Ok(s) => Ok(s.lines().filter_map(|l| l.trim().parse().ok()).collect()),
        Err(e) if is_not_found(&e) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// `dir` and every cgroup below it, children before parents.
fn cgroup_tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(cgroup_tree(&e.path()));
            }
        }
    }
    out.push(dir.to_path_buf());
    out
}

/// `rmdir` a cgroup, retrying for `patience` while it is busy (still populated). A missing
/// directory counts as removed; returns whether this call removed it.
fn rmdir_retry(dir: &Path, patience: Duration) -> Result<bool, FreezeError> {
    let start = Instant::now();
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                if start.elapsed() >= patience {
                    return Err(FreezeError::Busy { path: dir.to_path_buf(), waited: patience });
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(io_err("rmdir", dir)(e)),
        }
    }
}

/// Call `check` until it reports completion (`None`) or `timeout` has passed since `start`;
/// `pending` (`Some(description)`) ends up in the timeout error. Between checks `wait(d)` blocks
/// for at most `d` (growing from 100 µs to 10 ms).
fn wait_until(
    job: u64,
    start: Instant,
    timeout: Duration,
    mut check: impl FnMut() -> Result<Option<String>, FreezeError>,
    mut wait: impl FnMut(Duration),
) -> Result<(), FreezeError> {
    let deadline = start + timeout;
    let mut nap = Duration::from_micros(100);
    loop {
        let Some(pending) = check()? else {
            return Ok(());
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(FreezeError::Timeout { job, timeout, detail: pending });
        }
        wait(nap.min(deadline - now));
        nap = (nap * 2).min(Duration::from_millis(10));
    }
}

/// Make `cmd` write `"0"` into the cgroup `procs` file (as returned by
/// [`Freezer::create_job`]) in the child, after `fork` and before `exec`, so the job runs
/// inside its cgroup from its first instruction. Uses only `open`/`write`/`close` in the child;
/// if joining fails, `spawn` fails with that error. Can be called several times (for several
/// hierarchies). Errors only if `procs` contains a NUL byte.
pub fn join_cgroup_on_exec(cmd: &mut Command, procs: &Path) -> Result<(), FreezeError> {
    let path = CString::new(procs.as_os_str().as_bytes()).map_err(|_| FreezeError::Invalid {
        what: "cgroup.procs path",
        detail: format!("{} contains a NUL byte", procs.display()),
    })?;
    // SAFETY: the closure only makes async-signal-safe syscalls and does not allocate.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = libc::write(fd, b"0".as_ptr().cast(), 1);
            let err = io::Error::last_os_error();
            libc::close(fd);
            if n == 1 {
                Ok(())
            } else {
                Err(err)
            }
        })
    };
    Ok(())
}

impl Freezer {
    /// Pick a mechanism for daemon subtree `name` (one path component, e.g. `"kforge-1234"`).
    ///
    /// `prefer = None`: cgroup v2 if a writable v2 hierarchy exists (`/sys/fs/cgroup` when it is
    /// cgroup2, else `/sys/fs/cgroup/unified`), else the v1 freezer at `/sys/fs/cgroup/freezer`,
    /// else signals (always available). `prefer = Some(kind)` forces `kind` and fails with
    /// [`FreezeError::Unavailable`] if it cannot be used. Cgroup mechanisms create
    /// `<hierarchy>/<name>/` (existing directories are reused, e.g. one left by a dead daemon).
    /// A bad `name` gives [`FreezeError::Invalid`].
    pub fn detect(name: &str, prefer: Option<MechanismKind>) -> Result<Freezer, FreezeError> {
        validate_name(name)?;
        let v2 = || {
            let root = V2_ROOTS
                .into_iter()
                .map(Path::new)
                .find(|p| fs_magic(p).is_ok_and(|m| m == CGROUP2_SUPER_MAGIC))
                .ok_or_else(|| unavailable(MechanismKind::CgroupV2, format!("no cgroup2 mount at {V2_ROOTS:?}")))?;
            Self::with_root(MechanismKind::CgroupV2, root, name)
        };
        let v1 = || Self::with_root(MechanismKind::CgroupV1, Path::new(V1_FREEZER_ROOT), name);
        let signals = || Self::with_root(MechanismKind::Signals, Path::new("/"), name);
        match prefer {
            Some(MechanismKind::CgroupV2) => v2(),
            Some(MechanismKind::CgroupV1) => v1(),
            Some(MechanismKind::Signals) => signals(),
            None => v2().or_else(|_| v1()).or_else(|_| signals()),
        }
    }

    /// Like [`detect`](Self::detect) with an explicit hierarchy `root` (ignored for signals).
    ///
    /// Fails with [`FreezeError::Unavailable`] if `root` is not a mount of the right cgroup
    /// version, `<root>/<name>` cannot be created, or it lacks the freezer files
    /// (`cgroup.freeze` for v2, `freezer.state` for v1). Nothing is left behind on failure.
    pub fn with_root(kind: MechanismKind, root: &Path, name: &str) -> Result<Freezer, FreezeError> {
        validate_name(name)?;
        let (magic, probe) = match kind {
            MechanismKind::Signals => return Ok(Freezer { kind, base: None }),
            MechanismKind::CgroupV2 => (CGROUP2_SUPER_MAGIC, "cgroup.freeze"),
            MechanismKind::CgroupV1 => (CGROUP_SUPER_MAGIC, "freezer.state"),
        };
        let found = fs_magic(root).map_err(|e| unavailable(kind, format!("{}: {e}", root.display())))?;
        if found != magic {
            return Err(unavailable(kind, format!("{} is not a {kind} hierarchy", root.display())));
        }
        let base = root.join(name);
        let existed = base.is_dir();
        fs::create_dir_all(&base).map_err(|e| unavailable(kind, format!("cannot create {}: {e}", base.display())))?;
        if !base.join(probe).exists() {
            if !existed {
                let _ = fs::remove_dir(&base);
            }
            return Err(unavailable(kind, format!("{} has no {probe}", base.display())));
        }
        Ok(Freezer { kind, base: Some(base) })
    }

    /// The mechanism in use.
    pub fn kind(&self) -> MechanismKind {
        self.kind
    }

    /// Human-readable description, e.g. `"cgroup2 at /sys/fs/cgroup/unified/kforge-1234"`.
    pub fn describe(&self) -> String {
        match &self.base {
            Some(base) => format!("{} at {}", self.kind, base.display()),
            None => format!("{} (process groups)", self.kind),
        }
    }

    /// The daemon subtree directory; `None` for signals.
    pub fn base(&self) -> Option<&Path> {
        self.base.as_deref()
    }

    /// The cgroup directory of job `job` (`<base>/job-<job>`); `None` for signals.
    pub fn job_dir(&self, job: u64) -> Option<PathBuf> {
        self.base.as_ref().map(|b| b.join(format!("job-{job}")))
    }

    /// A [`JobTarget`] for `job` with process group `pgid` and the default cgroup directory.
    pub fn target(&self, job: u64, pgid: i32) -> JobTarget {
        JobTarget { job, pgid, cgroup: self.job_dir(job) }
    }

    /// Create the cgroup of `job` (and the base, if [`recover`](Self::recover) removed it).
    /// Returns the `cgroup.procs` file the job's first process must write `"0"` into before
    /// `exec` (see [`join_cgroup_on_exec`]), or `None` for signals. An existing directory is
    /// reused. Fails with [`FreezeError::Io`] if the directory cannot be created.
    pub fn create_job(&self, job: u64) -> Result<Option<PathBuf>, FreezeError> {
        let Some(dir) = self.job_dir(job) else {
            return Ok(None);
        };
        fs::create_dir_all(&dir).map_err(io_err("mkdir", &dir))?;
        Ok(Some(dir.join("cgroup.procs")))
    }

    /// The cgroup directory of `t`, which must be a job directory directly under the base.
    fn cgroup_of(&self, t: &JobTarget) -> Result<PathBuf, FreezeError> {
        let base = self.base.as_deref().expect("cgroup mechanisms always have a base");
        match &t.cgroup {
            None => Ok(base.join(format!("job-{}", t.job))),
            Some(p) if p.parent() == Some(base) && p.file_name().is_some() => Ok(p.clone()),
            Some(p) => Err(FreezeError::Invalid {
                what: "job cgroup",
                detail: format!("{} is not a job cgroup under {}", p.display(), base.display()),
            }),
        }
    }

    /// Freeze job `t` and wait until it is really frozen, for at most `timeout`.
    ///
    /// * cgroup2: writes `1` to `cgroup.freeze`, then waits (poll(2) on `cgroup.events`) for
    ///   `frozen 1`.
    /// * cgroup1: writes `FROZEN` to `freezer.state`, then polls until it reads `FROZEN`.
    /// * signals: `kill(-pgid, SIGSTOP)`, then polls `/proc` until every thread of every
    ///   member of the group is stopped (`T`/`t`) or dead, re-sending SIGSTOP meanwhile.
    ///
    /// Errors: [`FreezeError::Timeout`] if not frozen in time (the request stays in effect),
    /// [`FreezeError::Io`] (e.g. NotFound for a job cgroup that does not exist),
    /// [`FreezeError::NoSuchGroup`] / [`FreezeError::Invalid`] for a bad process group
    /// (signals) or a cgroup path outside the base.
    pub fn freeze(&self, t: &JobTarget, timeout: Duration) -> Result<(), FreezeError> {
        let start = Instant::now();
        self.request_freeze(t)?;
        self.wait_frozen(t, start, timeout)
    }

    /// Freeze several jobs at once: every freeze is requested first, then each is waited for,
    /// so the kernel freezes them in parallel and the total wait is about the slowest one's,
    /// not the sum. Returns one result per target, in order (errors as for
    /// [`freeze`](Self::freeze)); a target whose request failed is not waited for.
    pub fn freeze_many(&self, targets: &[JobTarget], timeout: Duration) -> Vec<Result<(), FreezeError>> {
        let start = Instant::now();
        let requested: Vec<Result<(), FreezeError>> = targets.iter().map(|t| self.request_freeze(t)).collect();
        targets.iter().zip(requested).map(|(t, r)| r.and_then(|()| self.wait_frozen(t, start, timeout))).collect()
    }

    /// Ask for `t` to be frozen without waiting.
    fn request_freeze(&self, t: &JobTarget) -> Result<(), FreezeError> {
        match self.kind {
            MechanismKind::CgroupV2 => write_file(&self.cgroup_of(t)?.join("cgroup.freeze"), "1"),
            MechanismKind::CgroupV1 => write_file(&self.cgroup_of(t)?.join("freezer.state"), "FROZEN"),
            MechanismKind::Signals => procfs::signal_group(procfs::check_pgid(t.pgid)?, libc::SIGSTOP),
        }
    }

    /// Wait until `t`, whose freeze was requested at `start`, is frozen.
    fn wait_frozen(&self, t: &JobTarget, start: Instant, timeout: Duration) -> Result<(), FreezeError> {
        match self.kind {
            MechanismKind::CgroupV2 => {
                let dir = self.cgroup_of(t)?;
                let events_path = dir.join("cgroup.events");
                let events = fs::File::open(&events_path).map_err(io_err("open", &events_path))?;
                let mut buf = [0u8; 256];
                let check = || {
                    let n = events.read_at(&mut buf, 0).map_err(io_err("read", &events_path))?;
                    let text = String::from_utf8_lossy(&buf[..n]);
                    Ok((!text.lines().any(|l| l.trim() == "frozen 1"))
                        .then(|| format!("cgroup.events: {}", text.trim().replace('\n', ", "))))
                };
                // kernfs signals POLLPRI (and POLLERR) when cgroup.events changes.
                let wait = |d: Duration| {
                    let mut pfd = libc::pollfd { fd: events.as_raw_fd(), events: libc::POLLPRI, revents: 0 };
                    let ms = d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
                    // SAFETY: one valid pollfd for the duration of the call.
                    unsafe { libc::poll(&mut pfd, 1, ms) };
                };
                wait_until(t.job, start, timeout, check, wait)
            }
            MechanismKind::CgroupV1 => {
                let state = self.cgroup_of(t)?.join("freezer.state");
                let check = || {
                    let s = read_trimmed(&state)?;
                    Ok((s != "FROZEN").then(|| format!("freezer.state is {s}")))
                };
                wait_until(t.job, start, timeout, check, std::thread::sleep)
            }
            MechanismKind::Signals => {
                let pgid = procfs::check_pgid(t.pgid)?;
                let check = || {
                    let running = procfs::running_members(pgid);
                    if running.is_empty() {
                        return Ok(None);
                    }
                    // Catch members forked while the first SIGSTOP was being delivered.
                    let _ = procfs::signal_group(pgid, libc::SIGSTOP);
                    Ok(Some(format!("processes not stopped: {running:?}")))
                };
                wait_until(t.job, start, timeout, check, std::thread::sleep)
            }
        }
    }

    /// Thaw job `t`: cgroup2 writes `0` to `cgroup.freeze`, cgroup1 writes `THAWED` to
    /// `freezer.state`, signals sends SIGCONT to the process group. Does not wait.
    /// Errors as for [`freeze`](Self::freeze), without the timeout.
    pub fn thaw(&self, t: &JobTarget) -> Result<(), FreezeError> {
        match self.kind {
            MechanismKind::CgroupV2 => write_file(&self.cgroup_of(t)?.join("cgroup.freeze"), "0"),
            MechanismKind::CgroupV1 => write_file(&self.cgroup_of(t)?.join("freezer.state"), "THAWED"),
            MechanismKind::Signals => procfs::signal_group(procfs::check_pgid(t.pgid)?, libc::SIGCONT),
        }
    }

    /// Kill every process of job `t`: thaw it first (a frozen v1 task does not die until
    /// thawed), then SIGKILL — cgroup2 through `cgroup.kill` when present plus each pid in
    /// `cgroup.procs`, cgroup1 each pid in `cgroup.procs` — and always `kill(-pgid, SIGKILL)`
    /// (cgroup mechanisms skip that when `pgid` is 0).
    ///
    /// Idempotent: a job that is already gone (no cgroup, no process group) is not an error.
    /// Does not wait for the processes to exit (their parent reaps them). Fails with
    /// [`FreezeError::Invalid`] for a forbidden process group (`<= 1`, the caller's own) or a
    /// cgroup outside the base, and [`FreezeError::Io`] / [`FreezeError::Signal`] for
    /// unexpected failures. With cgroup1 a process forking at that very moment may escape the
    /// per-pid SIGKILL; the process-group kill usually still reaches it.
    pub fn kill(&self, t: &JobTarget) -> Result<(), FreezeError> {
        let pgid = match (self.kind, t.pgid) {
            (MechanismKind::CgroupV2 | MechanismKind::CgroupV1, 0) => None,
            (_, pgid) => Some(procfs::check_pgid(pgid)?),
        };
        if self.kind != MechanismKind::Signals {
            let dir = self.cgroup_of(t)?;
            match self.thaw(t) {
                Err(e) if !is_not_found(&e) => return Err(e),
                _ => {}
            }
            self.kill_cgroup(&dir)?;
        } else if let Some(pgid) = pgid {
            let _ = procfs::signal_group(pgid, libc::SIGCONT);
        }
        match pgid.map(|g| procfs::signal_group(g, libc::SIGKILL)) {
            Some(Err(FreezeError::NoSuchGroup { .. })) | Some(Ok(())) | None => Ok(()),
            Some(Err(e)) => Err(e),
        }
    }

    /// SIGKILL everything in cgroup `dir` (not its children); returns the number of processes
    /// it held. A missing cgroup counts as empty.
    fn kill_cgroup(&self, dir: &Path) -> Result<usize, FreezeError> {
        let pids = cgroup_pids(dir)?;
        if self.kind == MechanismKind::CgroupV2 {
            let kill_file = dir.join("cgroup.kill");
            match write_file(&kill_file, "1") {
                Err(e) if !is_not_found(&e) => return Err(e),
                _ => {}
            }
        }
        // Also catches processes that were still joining when cgroup.kill ran.
        for pid in cgroup_pids(dir)? {
            procfs::kill_pid(pid);
        }
        Ok(pids.len())
    }

    /// Remove job `job`'s cgroup directory (and any cgroups its processes created below it),
    /// retrying for up to 2 s while it is still populated. A missing directory is fine; a
    /// no-op for signals. Fails with [`FreezeError::Busy`] if processes remain, or
    /// [`FreezeError::Io`].
    pub fn remove_job(&self, job: u64) -> Result<(), FreezeError> {
        let Some(dir) = self.job_dir(job) else {
            return Ok(());
        };
        for cg in cgroup_tree(&dir) {
            rmdir_retry(&cg, RMDIR_PATIENCE)?;
        }
        Ok(())
    }

    /// Recovery after a daemon death (or at start-up): for every `job-*` cgroup under the base
    /// (and cgroups nested in it), thaw it, SIGKILL all its processes and remove it, then
    /// remove the base itself. Works on a base left by a dead daemon when constructed with the
    /// same name. Best effort: per-cgroup failures are collected in
    /// [`RecoverReport::errors`]; only an unreadable base is an `Err`. A missing base and the
    /// signals mechanism give an empty report (use [`recover_pgids`] for signals).
    pub fn recover(&self) -> Result<RecoverReport, FreezeError> {
        let mut report = RecoverReport::default();
        let Some(base) = self.base.as_deref() else {
            return Ok(report);
        };
        let entries = match fs::read_dir(base) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(report),
            r => r.map_err(io_err("read directory", base))?,
        };
        let mut jobs: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().as_bytes().starts_with(b"job-"))
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        jobs.sort();
        for cg in jobs.iter().flat_map(|j| cgroup_tree(j)) {
            report.cgroups += 1;
            match self.thaw_dir(&cg) {
                Ok(true) => report.thawed += 1,
                Ok(false) => {}
                Err(e) => report.errors.push(e),
            }
            match self.kill_cgroup(&cg) {
                Ok(n) => report.killed += n,
                Err(e) => report.errors.push(e),
            }
        }
        // Children were listed before parents, so each rmdir sees its children gone.
        for cg in jobs.iter().flat_map(|j| cgroup_tree(j)) {
            match rmdir_retry(&cg, RMDIR_PATIENCE) {
                Ok(removed) => report.removed += usize::from(removed),
                Err(e) => report.errors.push(e),
            }
        }
        match fs::remove_dir(base) {
            Ok(()) => report.removed += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => report.errors.push(io_err("rmdir", base)(e)),
        }
        Ok(report)
    }

    /// Thaw cgroup `dir` if it is frozen; returns whether it was.
    fn thaw_dir(&self, dir: &Path) -> Result<bool, FreezeError> {
        let (file, thawed, thaw) = match self.kind {
            MechanismKind::CgroupV2 => ("cgroup.freeze", "0", "0"),
            _ => ("freezer.state", "THAWED", "THAWED"),
        };
        let path = dir.join(file);
        let frozen = read_trimmed(&path)? != thawed;
        if frozen {
            write_file(&path, thaw)?;
        }
        Ok(frozen)
    }
}
