//! Integration tests of `libkforge_shim.so` against the fake libcuda
//! (`kforge-fakecuda`), without a GPU.
//!
//! Artifacts: the test driver comes from `CARGO_BIN_EXE_kforge-shim-testdriver`
//! (cargo builds it for this package's integration tests); the two cdylibs
//! are looked up next to it (`target/<profile>/`) and in `deps/`, newest
//! first. Cargo builds `libkforge_shim.so` as this package's lib target and
//! `libkforge_fakecuda.so` because kforge-fakecuda is a dev-dependency. The
//! fake is symlinked as `libcuda.so.1` into a temp dir put on
//! `LD_LIBRARY_PATH`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kforge_gate::{monotonic_ns, Gate};

#[allow(dead_code, unused_macros)]
#[macro_use]
mod symbols {
    include!("../src/symbols.rs");
}

const DRIVER: &str = env!("CARGO_BIN_EXE_kforge-shim-testdriver");

fn find_artifact(file: &str) -> PathBuf {
    let dir = Path::new(DRIVER).parent().expect("driver dir").to_path_buf();
    let mut cands: Vec<PathBuf> =
        [dir.join(file), dir.join("deps").join(file)].into_iter().filter(|p| p.exists()).collect();
    cands.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    cands.pop().unwrap_or_else(|| panic!("{file} not found next to {DRIVER} (build the workspace first)"))
}

struct Env {
    dir: tempfile::TempDir,
    shim: PathBuf,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let fake = find_artifact("libkforge_fakecuda.so");
        std::os::unix::fs::symlink(&fake, dir.path().join("libcuda.so.1")).unwrap();
        Env { dir, shim: find_artifact("libkforge_shim.so") }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    /// A command with the shim preloaded and the fake libcuda on the path.
    fn cmd(&self, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new(program);
        c.args(args)
            .env("LD_PRELOAD", &self.shim)
            .env("LD_LIBRARY_PATH", self.dir.path())
            .env("KFORGE_TEST_SHIM", &self.shim)
            .env_remove("KFORGE_GATE")
            .env_remove("KFORGE_SHIM_STATS")
            .env_remove("KFORGE_SHIM_DEBUG")
            .env_remove("FAKECUDA_LOG")
            .env_remove("FAKECUDA_SYNC_US");
        c
    }
    fn driver(&self, args: &[&str]) -> Command {
        self.cmd(DRIVER, args)
    }
}

fn run_ok(mut c: Command) -> (BTreeMap<String, String>, String) {
    let out: Output = c.output().expect("spawn");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "status {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (kv(&stdout), stdout)
}

fn kv(s: &str) -> BTreeMap<String, String> {
    s.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.split_whitespace().next().unwrap_or("").to_string()))
        .collect()
}

fn stats(path: &Path) -> serde_json::Value {
    let s = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("stats {}: {e}", path.display()));
    serde_json::from_str(&s).unwrap()
}

fn call_count(st: &serde_json::Value, name: &str) -> u64 {
    st["calls"][name].as_u64().unwrap_or(0)
}

#[test]
fn dlsym_on_libcuda_handle_is_wrapped() {
    let env = Env::new();
    let st = env.path("stats.json");
    let mut c = env.driver(&["dlsym-handle"]);
    c.env("KFORGE_SHIM_STATS", &st);
    let (m, out) = run_ok(c);
    assert_eq!(m["cuLaunchKernel"], "shim:cuLaunchKernel", "{out}");
    assert_eq!(m["cuLaunchKernelEx"], "shim:cuLaunchKernelEx");
    assert_eq!(m["cuMemcpyHtoDAsync_v2"], "shim:cuMemcpyHtoDAsync_v2");
    // cuGetExportTable passes through untouched; missing names stay null.
    assert_eq!(m["cuGetExportTable"], "fake:cuGetExportTable");
    assert_eq!(m["missing"], "null");
    assert_eq!(m["fake.cuLaunchKernel"], "3");
    assert_eq!(m["fake.cuLaunchKernelEx"], "2");
    assert_eq!(m["fake.cuMemcpyHtoDAsync_v2"], "1");
    assert_eq!(m["fake.cuGetExportTable"], "1");
    let s = stats(&st);
    assert_eq!(call_count(&s, "cuLaunchKernel"), 3);
    assert_eq!(call_count(&s, "cuLaunchKernelEx"), 2);
    assert_eq!(call_count(&s, "cuMemcpyHtoDAsync_v2"), 1);
    assert_eq!(s["launches"], 5);
    assert_eq!(s["unwrapped"], 0);
    assert_eq!(s["state"], "passthrough"); // no KFORGE_GATE
    assert!(s["pid"].as_u64().is_some());
}

#[test]
fn get_proc_address_v2_honours_version_and_per_thread_flag() {
    let env = Env::new();
    let st = env.path("stats.json");
    let mut c = env.driver(&["procaddr"]);
    c.env("KFORGE_SHIM_STATS", &st);
    let (m, out) = run_ok(c);
    assert_eq!(m["cuGetProcAddress_v2"], "shim:cuGetProcAddress_v2", "{out}");
    for v in ["11030", "12000", "13000"] {
        assert_eq!(m[&format!("gpa.cuLaunchKernel.{v}.0")], "shim:cuLaunchKernel", "{out}");
        assert_eq!(m[&format!("gpa.cuLaunchKernel.{v}.2")], "shim:cuLaunchKernel_ptsz", "{out}");
    }
    assert_eq!(m["gpa.cuMemcpyHtoDAsync.1000.0"], "shim:cuMemcpyHtoDAsync");
    assert_eq!(m["gpa.cuMemcpyHtoDAsync.1000.2"], "shim:cuMemcpyHtoDAsync");
    assert_eq!(m["gpa.cuMemcpyHtoDAsync.3020.0"], "shim:cuMemcpyHtoDAsync_v2");
    assert_eq!(m["gpa.cuMemcpyHtoDAsync.3020.2"], "shim:cuMemcpyHtoDAsync_v2_ptsz");
    assert_eq!(m["gpa.cuMemcpyHtoDAsync.12000.2"], "shim:cuMemcpyHtoDAsync_v2_ptsz");
    assert_eq!(m["gpa.cuGraphLaunch.12000.2"], "shim:cuGraphLaunch_ptsz");
    // Not hooked: returned as the driver gave it.
    assert_eq!(m["gpa.cuInit"], "fake:cuInit");
    // Calling the _ptsz wrapper reached the fake's _ptsz variant.
    assert_eq!(m["fake.cuLaunchKernel"], "3");
    assert_eq!(m["fake.cuLaunchKernel_ptsz"], "3");
    let s = stats(&st);
    assert_eq!(call_count(&s, "cuLaunchKernel"), 3);
    assert_eq!(call_count(&s, "cuLaunchKernel_ptsz"), 3);
    assert_eq!(call_count(&s, "cuGetProcAddress_v2"), 15);
    assert_eq!(s["unwrapped"], 0);
}

#[test]
fn get_proc_address_for_itself_returns_wrappers() {
    let env = Env::new();
    let st = env.path("stats.json");
    let mut c = env.driver(&["procaddr-self"]);
    c.env("KFORGE_SHIM_STATS", &st);
    let (m, out) = run_ok(c);
    assert_eq!(m["self.12000"], "shim:cuGetProcAddress_v2", "{out}");
    assert_eq!(m["self.11030"], "shim:cuGetProcAddress");
    assert_eq!(m["via_v2.cuLaunchKernel"], "shim:cuLaunchKernel_ptsz");
    assert_eq!(m["via_v1.cuGraphLaunch"], "shim:cuGraphLaunch");
    assert_eq!(m["fake.cuLaunchKernel_ptsz"], "1");
    assert_eq!(m["fake.cuGraphLaunch"], "1");
    assert_eq!(m["fake.cuGetProcAddress"], "1");
    let s = stats(&st);
    assert_eq!(call_count(&s, "cuLaunchKernel_ptsz"), 1);
    assert_eq!(call_count(&s, "cuGraphLaunch"), 1);
    assert_eq!(call_count(&s, "cuGetProcAddress"), 1);
    assert_eq!(s["launches"], 2);
}

#[test]
fn directly_linked_symbols_resolve_to_wrappers() {
    let env = Env::new();
    let st = env.path("stats.json");
    let mut c = env.driver(&["direct"]);
    c.env("KFORGE_SHIM_STATS", &st);
    let (m, out) = run_ok(c);
    assert_eq!(m["direct.cuLaunchKernel"], "shim:cuLaunchKernel", "{out}");
    assert_eq!(m["direct.cuMemsetD32_v2"], "shim:cuMemsetD32_v2");
    assert_eq!(m["fake.cuLaunchKernel"], "2");
    assert_eq!(m["fake.cuMemsetD32_v2"], "1");
    let s = stats(&st);
    assert_eq!(call_count(&s, "cuLaunchKernel"), 2);
    assert_eq!(call_count(&s, "cuMemsetD32_v2"), 1);
}

/// A pointer the shim cannot attribute to a known variant is returned
/// unchanged (fail open) and counted as unwrapped.
#[test]
fn unknown_proc_address_result_fails_open() {
    let env = Env::new();
    let st = env.path("stats.json");
    let mut c = env.driver(&["procaddr"]);
    c.env("KFORGE_SHIM_STATS", &st).env("FAKECUDA_GPA_FOREIGN", "1");
    let (m, out) = run_ok(c);
    assert_eq!(m["gpa.cuLaunchKernel.12000.2"], "unknown", "{out}");
    assert_eq!(m["gpa.cuMemcpyHtoDAsync.3020.2"], "shim:cuMemcpyHtoDAsync_v2_ptsz");
    // The foreign function still ran (it counts as the fake's cuLaunchKernel).
    assert_eq!(m["fake.cuLaunchKernel"], "6");
    let s = stats(&st);
    assert_eq!(s["unwrapped"], 6, "{s}");
    assert_eq!(s["unwrapped_symbols"]["cuLaunchKernel"], 6);
    assert_eq!(call_count(&s, "cuLaunchKernel"), 0);
}

/// Without the shim the same driver sees the fake's own functions (the
/// assertions above are not vacuous).
#[test]
fn without_preload_the_fake_is_reached_directly() {
    let env = Env::new();
    let mut c = env.driver(&["direct"]);
    c.env_remove("LD_PRELOAD");
    let (m, _) = run_ok(c);
    assert_eq!(m["direct.cuLaunchKernel"], "fake:cuLaunchKernel");
}

/// The single symbol table agrees with the shim's exports, its dlsym
/// redirection, its cuGetProcAddress variant mapping and the fake's exports.
#[test]
fn symbol_table_is_consistent_with_shim_and_fake() {
    macro_rules! count {
        ($($name:ident => $base:ident, $kind:ident, ($($arg:ident : $ty:ty),* $(,)?);)*) => {
            [$(stringify!($name)),*].len()
        };
    }
    let gated = gated_symbols!(count);
    let observed = observed_symbols!(count);
    let env = Env::new();
    let (m, out) = run_ok(env.driver(&["table"]));
    assert_eq!(m["table.fails"], "0", "{out}");
    assert_eq!(m["table.gated"], gated.to_string());
    assert_eq!(m["table.entries"], (gated + observed).to_string());
}

#[test]
fn non_cu_dlsym_lookups_are_unaffected() {
    let env = Env::new();
    let st = env.path("stats.json");
    let mut c = env.driver(&["other"]);
    c.env("KFORGE_SHIM_STATS", &st);
    let (m, out) = run_ok(c);
    assert_eq!(m["malloc_found"], "true", "{out}");
    assert_eq!(m["malloc_works"], "true");
    assert_eq!(m["rtld_next_dlsym_matches"], "true", "RTLD_NEXT must stay relative to the caller");
    assert_eq!(m["rtld_next_getpid"], "true");
    assert_eq!(m["cuda_runtime_name_null"], "true");
    assert_eq!(m["unknown_cu_null"], "true");
    assert!(!st.exists(), "no CUDA used: no stats");
}

#[test]
fn processes_that_never_use_cuda_are_unaffected() {
    let env = Env::new();
    let gate_path = env.path("gate");
    let gate = Gate::create(&gate_path, 8).unwrap();
    let acks_before = gate.ack_count();
    let st = env.path("stats.json");
    let mut progs: Vec<(&str, Vec<&str>)> =
        vec![("/bin/true", vec![]), ("sh", vec!["-c", "echo hi; ls / >/dev/null; echo $((1+2))"])];
    let have_python = Command::new("python3")
        .arg("-c")
        .arg("1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if have_python {
        progs.push((
            "python3",
            vec!["-c", "import ctypes, json; print(json.dumps({'a': 1})); print(ctypes.CDLL(None).getpid() > 0)"],
        ));
    }
    for (p, args) in progs {
        let plain = Command::new(p).args(&args).output().unwrap();
        let mut c = env.cmd(p, &args);
        c.env("KFORGE_GATE", &gate_path).env("KFORGE_SHIM_STATS", &st).env("KFORGE_SHIM_DEBUG", "1");
        let shimmed = c.output().unwrap();
        assert_eq!(plain.status.code(), shimmed.status.code(), "{p}");
        assert_eq!(plain.stdout, shimmed.stdout, "{p}");
        assert_eq!(plain.stderr, shimmed.stderr, "{p}: the shim printed something");
        assert!(!st.exists(), "{p}: stats written without CUDA use");
    }
    assert_eq!(gate.ack_count(), acks_before, "a slot was registered");
    assert!(gate.registered_pids().is_empty());
}

#[test]
fn missing_gate_is_pass_through_with_one_warning() {
    let env = Env::new();
    let st = env.path("stats.json");
    let mut c = env.driver(&["dlsym-handle"]);
    c.env("KFORGE_GATE", env.path("no-such-gate")).env("KFORGE_SHIM_DEBUG", "1").env("KFORGE_SHIM_STATS", &st);
    let out = c.output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().filter(|l| l.contains("kforge-shim")).count(), 1, "{err}");
    assert!(err.contains("pass-through"), "{err}");
    assert_eq!(stats(&st)["state"], "passthrough");
}

// ---------------------------------------------------------------------------
// Gate behaviour

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// `(ns, symbol, ctx)` lines of the fake's log.
fn read_log(p: &Path) -> Vec<(u64, String, Option<String>)> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.parse().ok()?, it.next()?.to_string(), it.next().map(str::to_string)))
        })
        .collect()
}

fn launches(log: &[(u64, String, Option<String>)]) -> Vec<u64> {
    log.iter().filter(|e| e.1 == "cuLaunchKernel").map(|e| e.0).collect()
}

struct Looper {
    child: std::process::Child,
    stop: PathBuf,
    log: PathBuf,
    stats: PathBuf,
}

impl Looper {
    fn start(env: &Env, gate_path: &Path, sync_us: u64) -> Looper {
        let stop = env.path("stop");
        let log = env.path("fake.log");
        let stats = env.path("stats.json");
        let mut c = env.driver(&["loop", "1000000", "300", stop.to_str().unwrap()]);
        c.env("KFORGE_GATE", gate_path)
            .env("FAKECUDA_LOG", &log)
            .env("FAKECUDA_SYNC_US", sync_us.to_string())
            .env("KFORGE_SHIM_STATS", &stats)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Looper { child: c.spawn().unwrap(), stop, log, stats }
    }
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn finish(mut self) -> (String, serde_json::Value) {
        std::fs::write(&self.stop, b"").unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "driver failed: {st:?}");
                break;
            }
            assert!(Instant::now() < deadline, "driver did not stop");
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut out = String::new();
        use std::io::Read;
        self.child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        (out, stats(&self.stats))
    }
}

impl Drop for Looper {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.stop, b"");
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn closed_gate_blocks_launches_and_drain_is_acknowledged() {
    let env = Env::new();
    let gate_path = env.path("gate");
    let gate = Gate::create(&gate_path, 8).unwrap();
    // cuCtxSynchronize takes 20 ms: models queued work that must finish
    // before the acknowledgement.
    let looper = Looper::start(&env, &gate_path, 20_000);
    let pid = looper.pid();
    wait_until("registration and launches", Duration::from_secs(20), || {
        gate.registered_pids().contains(&pid) && launches(&read_log(&looper.log)).len() >= 5
    });

    for round in 1..=2u64 {
        let t_close = monotonic_ns();
        let epoch = gate.close(0);
        assert_eq!(epoch, round);
        let outcome = gate.wait_acks(epoch, Duration::from_secs(10));
        let t_acked = monotonic_ns();
        assert!(!outcome.timed_out, "round {round}: {outcome:?}");
        assert_eq!(outcome.acked, 1);
        let slot = (0..8).find(|&s| gate.slot_pid(s) == pid).expect("slot");
        assert_eq!(gate.slot_acked_epoch(slot), epoch);
        // Hold the region for a while (an observation window, not a
        // synchronization): the launching thread must stay blocked.
        let hold_until = Instant::now() + Duration::from_millis(150);
        while Instant::now() < hold_until {
            std::thread::sleep(Duration::from_millis(10));
        }
        let t_open = monotonic_ns();
        gate.open_gate();
        wait_until("launches to resume", Duration::from_secs(10), || {
            launches(&read_log(&looper.log)).iter().any(|&t| t > t_open)
        });

        let log = read_log(&looper.log);
        let l = launches(&log);
        let blocked: Vec<_> = l.iter().filter(|&&t| t > t_acked && t < t_open).collect();
        assert!(blocked.is_empty(), "round {round}: launches while the gate was closed and drained: {blocked:?}");
        // The drain synchronized the recorded context after the last launch
        // that got through, and before the acknowledgement.
        let ctx_created = log.iter().find(|e| e.1 == "cuDevicePrimaryCtxRetain").and_then(|e| e.2.clone()).unwrap();
        let syncs: Vec<u64> = log
            .iter()
            .filter(|e| e.1 == "cuCtxSynchronize" && e.2.as_deref() == Some(ctx_created.as_str()))
            .map(|e| e.0)
            .filter(|&t| t > t_close && t < t_acked)
            .collect();
        assert_eq!(syncs.len(), 1, "round {round}: one sync of {ctx_created} between close and ack: {log:?}");
        let last_before = l.iter().filter(|&&t| t < t_open).max().copied().unwrap();
        assert!(last_before < syncs[0], "round {round}: a launch after the drain's sync");
    }
    assert!(gate.registered_pids().contains(&pid));
    let (out, s) = looper.finish();
    assert!(out.contains("ctx=0x1000"), "{out}");
    assert_eq!(s["state"], "gated");
    assert!(s["gate_waits"].as_u64().unwrap() >= 2, "{s}");
    assert!(s["drains"].as_u64().unwrap() >= 2, "{s}");
    assert_eq!(s["contexts"], 1);
    assert_eq!(s["launches"], call_count(&s, "cuLaunchKernel"));
    // Unregistered at exit.
    assert!(!gate.registered_pids().contains(&pid));
}

#[test]
fn region_holder_passes_and_still_acknowledges() {
    let env = Env::new();
    let gate_path = env.path("gate");
    let gate = Gate::create(&gate_path, 8).unwrap();
    let looper = Looper::start(&env, &gate_path, 0);
    let pid = looper.pid();
    wait_until("registration and launches", Duration::from_secs(20), || {
        gate.registered_pids().contains(&pid) && launches(&read_log(&looper.log)).len() >= 3
    });
    let t_close = monotonic_ns();
    let epoch = gate.close(pid);
    let slot = (0..8).find(|&s| gate.slot_pid(s) == pid).expect("slot");
    // The holder's own launches keep going while the gate is closed.
    wait_until("holder launches while closed", Duration::from_secs(10), || {
        launches(&read_log(&looper.log)).iter().filter(|&&t| t > t_close).count() >= 5
    });
    // Its helper acknowledges too (the daemon just does not wait for it).
    wait_until("holder ack", Duration::from_secs(10), || gate.slot_acked_epoch(slot) >= epoch);
    let outcome = gate.wait_acks(epoch, Duration::from_secs(1));
    assert!(!outcome.timed_out);
    gate.open_gate();
    let (_, s) = looper.finish();
    assert_eq!(s["gate_waits"], 0, "{s}");
}
