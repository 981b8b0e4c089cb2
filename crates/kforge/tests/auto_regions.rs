//! `kforge run --auto-regions` through the real daemon: an unmodified benchmark script that
//! times with `triton.testing.do_bench` and with CUDA events (fake `triton` and `torch` packages
//! on its PYTHONPATH: no GPU here) gets its timed calls inside regions, cold and warm, and the
//! same script without the flag gets none.

mod common;
use common::*;
use std::path::Path;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// A KernelBench-style harness that knows nothing of kforge: two do_bench calls, one CUDA-event
/// interval around a loop, one Python subprocess that calls do_bench once.
const SCRIPT: &str = r#"
import subprocess, sys
import torch
import triton.testing

def kernel():
    return sum(range(1000))

for _ in range(2):
    triton.testing.do_bench(kernel)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
plain = torch.cuda.Event()
plain.record()
start.record()
for _ in range(5):
    kernel()
end.record()
torch.cuda.synchronize()
print("elapsed", start.elapsed_time(end))
subprocess.run([sys.executable, "-c", "import triton.testing; triton.testing.do_bench(lambda: None)"], check=True)
"#;

const FAKE_TORCH_CUDA: &str = r#"
import time

class Event:
    def __new__(cls, enable_timing=False, blocking=False, interprocess=False):
        return super().__new__(cls)

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3

class Stream:
    def synchronize(self):
        pass

def synchronize(device=None):
    pass
"#;

/// Fake `triton.testing` and `torch.cuda` with the shapes the hooks patch.
fn write_fakes(dir: &Path) {
    let w = |rel: &str, body: &str| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    };
    w("triton/__init__.py", "");
    w(
        "triton/testing.py",
        "def do_bench(fn, warmup=2, rep=3):\n    for _ in range(warmup + rep):\n        fn()\n    return 0.25\n",
    );
    w("torch/__init__.py", "from . import cuda\n");
    w("torch/cuda/__init__.py", FAKE_TORCH_CUDA);
}

/// Run the script as a job labelled `label`; return the names of the regions its job entered.
fn run_script(d: &TestDaemon, label: &str, flags: &[&str]) -> Vec<String> {
    let fakes = d.path("fakes");
    write_fakes(&fakes);
    let script = d.path("kb_eval.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let mut args = vec!["--device", "cpu", "--label", label];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--", "python3", script.to_str().unwrap()]);
    let t0 = std::time::Instant::now();
    let o = d.run_cmd(&args).env("PYTHONPATH", &fakes).output().unwrap();
    // The subprocess's do_bench region is queued behind the event region, which lingers after
    // its interval while the script waits for the subprocess: it must be exited after the grace
    // period (the reaper thread), not at its lease (60 s).
    assert!(t0.elapsed() < Duration::from_secs(30), "the job took {:?}", t0.elapsed());
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "stdout: {out}\nstderr: {err}\ndaemon: {}", d.log());
    assert!(out.contains("elapsed"), "{out}");
    let rep = d.report();
    let jobs: Vec<u64> = rep.jobs.iter().filter(|j| j.label.as_deref() == Some(label)).map(|j| j.id).collect();
    assert_eq!(jobs.len(), 1, "{:?}", rep.jobs);
    let mut regions: Vec<_> = rep.regions.iter().filter(|r| r.job == Some(jobs[0])).collect();
    regions.sort_by_key(|r| r.id);
    assert!(regions.iter().all(|r| r.released_ns.is_some() && !r.revoked), "{regions:?}");
    regions.iter().map(|r| r.name.clone()).collect()
}

const EXPECTED: [&str; 4] = ["auto:do_bench", "auto:do_bench", "auto:cuda-event", "auto:do_bench"];

#[test]
fn an_unmodified_script_gets_regions_only_with_the_flag() {
    let d = TestDaemon::start(&[]);
    assert_eq!(run_script(&d, "plain", &[]), Vec::<String>::new(), "no regions without --auto-regions");
    assert_eq!(run_script(&d, "auto", &["--auto-regions"]), EXPECTED);
}

#[test]
fn a_warm_job_gets_the_same_regions_and_leaves_its_worker_clean() {
    let d = TestDaemon::start(&["--warm-workers", "1", "--worker-preload", ""]);
    wait_for("a warm worker", T, || (d.status().devices[0].pool.warm == 1).then_some(()));
    assert_eq!(run_script(&d, "warm-auto", &["--warm", "--auto-regions"]), EXPECTED);
    // The worker restored what it patched: the next warm job, without the flag, gets none.
    assert_eq!(run_script(&d, "warm-plain", &["--warm"]), Vec::<String>::new());
    let pool = d.status().devices[0].pool.clone();
    assert_eq!(pool.jobs_served, 2, "{pool:?}");
    assert!(pool.recycled.is_empty(), "no hygiene finding: {pool:?}");
}
