//! Warm workers: persistent Python processes per device (torch/triton preloaded, CUDA context
//! initialized) that run Python jobs in-process, skipping interpreter, import and context
//! start-up. The Python side is `python/kforge/worker.py`; this module starts workers, talks to
//! them over an inherited `SOCK_SEQPACKET` socket (fd 3 in the worker: one JSON object per
//! message, the job's stdout/stderr pipe ends passed with `SCM_RIGHTS`), and reports what they
//! say as [`Event`]s. Which worker runs what is the state machine's (`state::warm_pool`).

use crate::event::{Event, Inbound, Outgoing, WorkerMsg};
use kforge_proto::Stream;
use serde::Serialize;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ToWorker<'a> {
    Run { job: u64, argv: &'a [String], cwd: &'a str, env: &'a [(String, String)] },
}

pub struct WorkerSpawn {
    pub id: u64,
    pub python: String,
    pub env: Vec<(String, String)>,
    pub cgroup_procs: Option<PathBuf>,
    pub cpus: Vec<u32>,
    pub log: PathBuf,
}

/// A started worker process: its pid and the daemon's end of the control socket.
pub struct WorkerHandle {
    pub pid: u32,
    pub control: Arc<OwnedFd>,
}

fn cvt(r: libc::c_int) -> std::io::Result<libc::c_int> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Start a worker. Its messages arrive as [`Event::Worker`], its exit as [`Event::WorkerExited`].
pub fn spawn(w: WorkerSpawn, events: Sender<Inbound>) -> std::io::Result<WorkerHandle> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is a valid array of two ints.
    cvt(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) })?;
    // SAFETY: socketpair returned two fresh descriptors we now own.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&w.log)?;
    let mut cmd = Command::new(&w.python);
    cmd.args(["-m", "kforge.worker"])
        .env_clear()
        .envs(w.env.iter().map(|(k, v)| (k, v)))
        .env("KFORGE_WORKER_FD", "3")
        .env("KFORGE_WORKER_ID", w.id.to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0);
    crate::jobs::confine(&mut cmd, w.cgroup_procs.as_deref(), &w.cpus, Some(theirs.as_raw_fd()))?;
    let mut child = cmd.spawn()?;
    drop(theirs);
    let pid = child.id();
    let id = w.id;
    let control = Arc::new(ours);
    let reader = control.clone();
    let ev = events.clone();
    std::thread::Builder::new().name(format!("kforge-worker-r{id}")).spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        loop {
            // SAFETY: buf is valid for its length.
            let n = unsafe { libc::recv(reader.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n <= 0 {
                if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                break;
            }
            match serde_json::from_slice::<WorkerMsg>(&buf[..n as usize]) {
                Ok(msg) => {
                    if ev.send(Event::Worker { worker: id, msg }.into()).is_err() {
                        break;
                    }
                }
                Err(e) => eprintln!("kforge daemon: worker {id} sent an unreadable message: {e}"),
            }
        }
    })?;
    std::thread::Builder::new().name(format!("kforge-worker-w{id}")).spawn(move || {
        let (code, signal) = match child.wait() {
            Ok(s) => (s.code(), s.signal()),
            Err(_) => (None, None),
        };
        let _ = events.send(Event::WorkerExited { worker: id, code, signal }.into());
    })?;
    Ok(WorkerHandle { pid, control })
}

/// Hand a job to an idle worker: make its stdout/stderr pipes, send the write ends with the run
/// message, and pump the read ends to `out`. `Event::WarmOutputClosed` follows once the job (and
/// anything it left holding its output) closed both pipes.
pub fn start_job(
    control: &OwnedFd,
    job: u64,
    argv: &[String],
    cwd: &str,
    env: &[(String, String)],
    out: Sender<Outgoing>,
    events: Sender<Inbound>,
) -> std::io::Result<()> {
    let mut pipes: Vec<(OwnedFd, OwnedFd)> = Vec::new();
    for _ in 0..2 {
        let mut p = [0 as RawFd; 2];
        // SAFETY: p is a valid array of two ints.
        cvt(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) })?;
        // SAFETY: fresh descriptors we own.
        pipes.push(unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) });
    }
    let msg = serde_json::to_vec(&ToWorker::Run { job, argv, cwd, env }).map_err(std::io::Error::other)?;
    send_with_fds(control.as_raw_fd(), &msg, &[pipes[0].1.as_raw_fd(), pipes[1].1.as_raw_fd()])?;
    let mut pumps = Vec::new();
    let oom = Arc::new(AtomicBool::new(false));
    for ((read, write), stream) in pipes.into_iter().zip([Stream::Stdout, Stream::Stderr]) {
        drop(write); // the worker holds its copy now
        let out = out.clone();
        let f = Box::new(std::fs::File::from(read));
        let flag = (stream == Stream::Stderr).then(|| oom.clone());
        pumps.push(
            std::thread::Builder::new()
                .name(format!("kforge-wpump-{job}"))
                .spawn(move || crate::jobs::pump_output(f, job, stream, out, flag.as_deref()))?,
        );
    }
    std::thread::Builder::new().name(format!("kforge-wjoin-{job}")).spawn(move || {
        for p in pumps {
            let _ = p.join();
        }
        let oom = oom.load(Ordering::SeqCst);
        let _ = events.send(Event::WarmOutputClosed { job, oom }.into());
    })?;
    Ok(())
}

fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() };
    // SAFETY: msghdr is plain data; every pointer set below outlives the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer holds one header plus the descriptors (CMSG_SPACE above).
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(c), fd_bytes);
    }
    loop {
        // SAFETY: msg is fully initialized.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
