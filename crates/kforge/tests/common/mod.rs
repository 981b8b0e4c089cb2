//! Test harness: a real `kforge daemon` process on a private socket, and small helpers.
#![allow(dead_code)]

use kforge_client::Client;
use kforge_proto::{Reply, Request, StatusReport};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const KFORGE: &str = env!("CARGO_BIN_EXE_kforge");

pub struct TestDaemon {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub db: PathBuf,
    pub child: Child,
}

impl TestDaemon {
    /// Start a daemon with extra flags; None if it refused to start (e.g. a mechanism the host lacks).
    pub fn try_start(extra: &[&str]) -> Result<TestDaemon, String> {
        let dir = tempfile::Builder::new().prefix("kforge-test-").tempdir().unwrap();
        let socket = dir.path().join("k.sock");
        let db = dir.path().join("k.db");
        let log = std::fs::File::create(dir.path().join("daemon.log")).unwrap();
        let child = Command::new(KFORGE)
            .arg("--socket")
            .arg(&socket)
            .arg("daemon")
            .arg("--db")
            .arg(&db)
            .arg("--gpus")
            .arg("none")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut d = TestDaemon { dir, socket, db, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if Client::connect(&d.socket).is_ok() {
                return Ok(d);
            }
            if let Ok(Some(_)) = d.child.try_wait() {
                return Err(d.log());
            }
            assert!(Instant::now() < deadline, "daemon did not start: {}", d.log());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn start(extra: &[&str]) -> TestDaemon {
        Self::try_start(extra).unwrap_or_else(|log| panic!("daemon failed to start: {log}"))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.socket).unwrap()
    }

    pub fn status(&self) -> StatusReport {
        match self.client().request(&Request::Status).unwrap() {
            Reply::Status(s) => s,
            other => panic!("unexpected {other:?}"),
        }
    }

    pub fn report(&self) -> kforge_store::Report {
        kforge_store::Report::from_parts(self.client().report_parts(None).unwrap()).unwrap()
    }

    /// `kforge run` as a child process, in the daemon's directory.
    pub fn run_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(KFORGE);
        c.arg("--socket").arg(&self.socket).arg("run").args(args).current_dir(self.dir.path());
        c
    }

    /// Start a job in the background (stdout/stderr to files named after `tag`).
    pub fn spawn_job(&self, tag: &str, args: &[&str]) -> Child {
        let out = std::fs::File::create(self.path(&format!("{tag}.out"))).unwrap();
        let err = std::fs::File::create(self.path(&format!("{tag}.err"))).unwrap();
        self.run_cmd(args).stdout(out).stderr(err).spawn().unwrap()
    }

    pub fn shutdown(&mut self) {
        if let Ok(mut c) = Client::connect(&self.socket) {
            let _ = c.request(&Request::Shutdown);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Poll `f` until it returns Some or the deadline passes (a condition wait, not a sleep).
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn read_json(p: &Path) -> Option<serde_json::Value> {
    let s = std::fs::read_to_string(p).ok()?;
    serde_json::from_str(&s).ok()
}

/// A Python region holder: enters a region, writes `<tag>.in` (grant, pid, tid, monotonic ns),
/// waits for `<tag>.release` to exist, leaves, and writes `<tag>.done`.
pub const HOLDER: &str = r#"
import json, os, sys, time, threading, kforge
tag = sys.argv[1]
lease = float(sys.argv[2]) if len(sys.argv) > 2 else None
try:
    with kforge.region(name=tag, lease_s=lease) as r:
        info = dict(r.grant, pid=os.getpid(), tid=threading.get_native_id(), t_in=time.monotonic_ns())
        with open(tag + ".in.tmp", "w") as f:
            json.dump(info, f)
        os.rename(tag + ".in.tmp", tag + ".in")
        while not os.path.exists(tag + ".release"):
            time.sleep(0.002)
        kforge.report_measurement(tag, [1.0, 2.0], region=r)
        t_out = time.monotonic_ns()
    result = dict(valid=r.valid, revoked=r.revoked, t_out=t_out)
except kforge.RegionRevoked as e:
    result = dict(valid=False, revoked=True, error=str(e))
with open(tag + ".done", "w") as f:
    json.dump(result, f)
"#;

/// A sibling that counts as fast as it can into `<tag>.count` (one fixed-width pwrite per
/// step, so a reader never sees a torn or empty file, frozen or not).
pub const COUNTER: &str = r#"
import os, sys
fd = os.open(sys.argv[1] + ".count", os.O_RDWR | os.O_CREAT, 0o600)
i = 0
while True:
    i += 1
    os.pwrite(fd, b"%020d" % i, 0)
"#;

pub fn read_count(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

pub fn pid_alive(pid: i32) -> bool {
    // A zombie is dead for our purposes.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

/// Process state letter from /proc (R, S, T, ...).
pub fn proc_state(pid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit(')').next()?.trim_start().chars().next()
}

pub fn cpus_allowed(pid: i32, tid: i32) -> Vec<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap_or_default();
    let line = s.lines().find(|l| l.starts_with("Cpus_allowed_list:")).unwrap_or("Cpus_allowed_list:");
    kforge_cores::parse_cpu_list(line.split(':').nth(1).unwrap_or("").trim()).unwrap_or_default()
}

/// All descendants of `pid` (children, grandchildren, ...), from /proc.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut out = vec![];
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        let Ok(dir) = std::fs::read_dir("/proc") else { break };
        for e in dir.flatten() {
            let Ok(c) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{c}/stat")) else { continue };
            let ppid =
                stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(1)).and_then(|v| v.parse::<i32>().ok());
            if ppid == Some(p) {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

/// Write the `--debug-gpu-memory` file in one step (the daemon re-reads it at every sample): the
/// `cpu` device of 80 GiB with `free_gib` free, and `processes` as (pid, GiB used).
pub fn write_memory(path: &Path, free_gib: u64, processes: &[(u32, u64)]) {
    const G: u64 = 1 << 30;
    let procs: Vec<serde_json::Value> =
        processes.iter().map(|&(pid, used)| serde_json::json!({"pid": pid, "used": used * G})).collect();
    let v = serde_json::json!({"cpu": {"total": 80 * G, "free": free_gib * G, "processes": procs}});
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, v.to_string()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}
