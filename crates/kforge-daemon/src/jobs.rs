//! Starting a job's command: its own process group and cgroup, its cores, its environment, and
//! threads that pump its output to the submitting connection and report its exit.

use crate::event::{Event, Inbound, Outgoing};
use crate::memory::OomScanner;
use kforge_freeze::{Freezer, JobTarget};
use kforge_proto::{b64, Reply, Stream};
use std::ffi::CString;
use std::io::Read;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::JoinHandle;

pub struct SpawnSpec {
    pub job: u64,
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: Vec<(String, String)>,
    /// File the child writes "0" into to join its cgroup before exec.
    pub cgroup_procs: Option<PathBuf>,
    /// Cores the job may run on.
    pub cpus: Vec<u32>,
}

/// Set up a managed child before it runs (in the forked child, before exec): join the cgroup
/// whose `cgroup.procs` is given, restrict it to `cpus`, die with the daemon (parent-death
/// signal), and optionally make `fd3` its descriptor 3 (the warm workers' control socket).
/// Give a child process (between fork and exec) the default signal mask: nothing blocked.
/// Only async-signal-safe calls (sigemptyset, sigprocmask).
/// Mark every descriptor from `first` up close-on-exec (between fork and exec): a job must not
/// inherit what the daemon inherited from whoever started it (a capture pipe held open by a job
/// keeps its reader waiting after the daemon is gone). Marked, not closed: the pipe through which
/// the spawning code learns of a failed exec must stay open until the exec.
/// close_range(2) with CLOSE_RANGE_CLOEXEC where the kernel has it (5.11+), else fcntl(2) over the
/// usual range; both async-signal-safe.
pub(crate) fn close_inherited(first: libc::c_int) {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: plain system calls on descriptor numbers.
    unsafe {
        if libc::syscall(libc::SYS_close_range, first as libc::c_uint, libc::c_uint::MAX, CLOSE_RANGE_CLOEXEC) != 0 {
            for fd in first..4096 {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
    }
}

pub(crate) fn unblock_signals() {
    // SAFETY: sigset_t is plain data, initialized by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

pub(crate) fn confine(
    cmd: &mut Command,
    cgroup_procs: Option<&Path>,
    cpus: &[u32],
    fd3: Option<RawFd>,
) -> std::io::Result<()> {
    let procs = match cgroup_procs {
        Some(p) => Some(CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other)?),
        None => None,
    };
    // SAFETY: cpu_set_t is plain data; CPU_SET only writes into it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        unsafe { libc::CPU_SET(c as usize, &mut set) };
    }
    let pin = !cpus.is_empty();
    // SAFETY: the closure only makes async-signal-safe system calls on data prepared before fork.
    unsafe {
        cmd.pre_exec(move || {
            // The daemon blocks SIGINT/SIGTERM in all its threads (a signal thread takes them);
            // a blocked mask survives exec, so a job would never see SIGTERM or Ctrl-C.
            unblock_signals();
            if let Some(p) = &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let r = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if r != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if pin && libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // dup2 clears close-on-exec on the new descriptor: the child inherits fd 3.
            if let Some(fd) = fd3 {
                if libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            close_inherited(if fd3.is_some() { 4 } else { 3 });
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
            Ok(())
        });
    }
    Ok(())
}

/// Start the command. On success returns its pid (= its process group id); the exit arrives
/// later as [`Event::JobExited`], after all its output was sent.
pub fn spawn(
    spec: SpawnSpec,
    out: Sender<Outgoing>,
    events: Sender<Inbound>,
    freezer: Arc<Freezer>,
    cgroup: Option<PathBuf>,
) -> std::io::Result<u32> {
    let mut child = job_command(&spec)?.spawn()?;
    let pid = child.id();
    let job = spec.job;
    let oom = Arc::new(AtomicBool::new(false));
    let pumps = spawn_output_pumps(&mut child, job, &out, &oom);
    spawn_waiter(child, JobTarget { job, pgid: pid as i32, cgroup }, pumps, oom, freezer, events);
    Ok(pid)
}

/// The job's command: its own process group, only the given environment, no stdin, piped
/// output, confined to its cgroup and cores.
fn job_command(spec: &SpawnSpec) -> std::io::Result<Command> {
    let Some((prog, args)) = spec.argv.split_first() else {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command"));
    };
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    confine(&mut cmd, spec.cgroup_procs.as_deref(), &spec.cpus, None)?;
    Ok(cmd)
}

/// One thread per output pipe of `child`, sending what it reads to `out`; `oom` is set when its
/// stderr says CUDA ran out of memory.
fn spawn_output_pumps(
    child: &mut Child,
    job: u64,
    out: &Sender<Outgoing>,
    oom: &Arc<AtomicBool>,
) -> Vec<JoinHandle<()>> {
    [
        (child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>), Stream::Stdout),
        (child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>), Stream::Stderr),
    ]
    .into_iter()
    .filter_map(|(r, stream)| r.map(|r| (r, stream)))
    .map(|(r, stream)| {
        let out = out.clone();
        let oom = (stream == Stream::Stderr).then(|| oom.clone());
        std::thread::Builder::new()
            .name(format!("kforge-pump-{job}"))
            .spawn(move || pump_output(r, job, stream, out, oom.as_deref()))
            .expect("spawn pump thread")
    })
    .collect()
}

/// Send everything read from `r` as the job's `stream` output until the pipe closes; with `oom`,
/// set it once the stream says CUDA ran out of memory.
pub(crate) fn pump_output(
    mut r: Box<dyn Read + Send>,
    job: u64,
    stream: Stream,
    out: Sender<Outgoing>,
    oom: Option<&AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut scan = OomScanner::default();
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if let Some(flag) = oom {
                    scan.feed(&buf[..n]);
                    if scan.seen() {
                        flag.store(true, Ordering::SeqCst);
                    }
                }
                // A gone client must not block the job: keep draining the pipe.
                let _ = out.send(Outgoing::Msg(Reply::Output { job, stream, data: b64::encode(&buf[..n]) }));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
}

/// The thread that waits for the command, kills what it left behind, waits for its output to be
/// sent, and reports its exit.
fn spawn_waiter(
    mut child: Child,
    target: JobTarget,
    pumps: Vec<JoinHandle<()>>,
    oom: Arc<AtomicBool>,
    freezer: Arc<Freezer>,
    events: Sender<Inbound>,
) {
    let job = target.job;
    std::thread::Builder::new()
        .name(format!("kforge-wait-{job}"))
        .spawn(move || {
            let status = child.wait();
            // The command is done: whatever it left behind in its group or cgroup goes too,
            // so that background processes cannot escape management or hold the output pipes.
            let _ = freezer.kill(&target);
            for p in pumps {
                let _ = p.join();
            }
            let (code, signal) = match status {
                Ok(s) => (s.code(), s.signal()),
                Err(_) => (None, None),
            };
            let oom = oom.load(Ordering::SeqCst);
            let _ = events.send(Event::JobExited { job, code, signal, oom }.into());
        })
        .expect("spawn waiter thread");
}
