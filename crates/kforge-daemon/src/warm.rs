//! Warm workers: persistent Python processes per device (torch/triton preloaded, CUDA context
//! initialized) that run Python jobs in-process, skipping interpreter, import and context
//! start-up. The Python side is `python/kforge/worker.py`; this module starts workers, talks to
//! them over an inherited `SOCK_SEQPACKET` socket (fd 3 in the worker: one JSON object per
//! message, the job's stdout/stderr pipe ends passed with `SCM_RIGHTS`), and reports what they
//! say as [`Event`]s.

use crate::state::{Event, Outgoing};
use kforge_proto::{b64, Reply, Stream};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc::Sender;
use std::sync::Arc;

/// Worker ids live in their own range of cgroup names (`job-<WORKER_CGROUP_BASE + id>`).
pub const WORKER_CGROUP_BASE: u64 = 1 << 40;

/// Messages a worker sends.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerMsg {
    Ready {
        pid: u32,
        #[serde(default)]
        preloaded: Vec<String>,
        #[serde(default)]
        cuda: bool,
        #[serde(default)]
        startup_ms: f64,
        #[serde(default)]
        error: Option<String>,
    },
    Done {
        job: u64,
        exit_code: i32,
        #[serde(default)]
        recycle: Vec<String>,
    },
}

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
pub fn spawn(w: WorkerSpawn, events: Sender<Event>) -> std::io::Result<WorkerHandle> {
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
                    if ev.send(Event::Worker { worker: id, msg }).is_err() {
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
        let _ = events.send(Event::WorkerExited { worker: id, code, signal });
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
    events: Sender<Event>,
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
    for ((read, write), stream) in pipes.into_iter().zip([Stream::Stdout, Stream::Stderr]) {
        drop(write); // the worker holds its copy now
        let out = out.clone();
        let mut f = std::fs::File::from(read);
        pumps.push(std::thread::Builder::new().name(format!("kforge-wpump-{job}")).spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match f.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let _ = out.send(Outgoing::Msg(Reply::Output { job, stream, data: b64::encode(&buf[..n]) }));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        })?);
    }
    std::thread::Builder::new().name(format!("kforge-wjoin-{job}")).spawn(move || {
        for p in pumps {
            let _ = p.join();
        }
        let _ = events.send(Event::WarmOutputClosed { job });
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
