//! `kforge verify` over the candidate corpus (tests/candidates/expect.json) on the CPU: every
//! honest candidate passes the gates that can run here, every cheat is rejected by the check
//! named for it; a candidate that crashes, exits or hangs is rejected naming the cause. Needs
//! python3 with torch, Triton and numpy (scripts/test installs them). Triton kernels run in the
//! interpreter on CPU tensors: `--device cpu` sets TRITON_INTERPRET=1 for the candidate process
//! itself, so these tests remove it from the environment rather than set it.

mod common;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/candidates")
}

fn torch_available() -> bool {
    Command::new("python3").args(["-c", "import torch, triton, numpy"]).status().map(|s| s.success()).unwrap_or(false)
}

fn verify(
    problem: &str,
    candidate: &str,
    policy: Option<&str>,
    kernel: Option<&str>,
    time_limit_s: u64,
    out: &std::path::Path,
) -> (Option<i32>, Value, String) {
    let c = corpus();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kforge"));
    cmd.arg("verify");
    if let Some(p) = policy {
        // A policy file of the corpus, or a preset by name (`strict-no-torch`).
        cmd.arg("--policy").arg(if p.ends_with(".toml") { c.join(p) } else { PathBuf::from(p) });
    }
    if let Some(k) = kernel {
        cmd.args(["--kernel", k]);
    }
    let o = cmd
        .args(["--device", "cpu", "--no-performance", "--time-limit-s", &time_limit_s.to_string(), "--json"])
        .arg(out)
        .arg(c.join(problem))
        .arg(c.join(candidate))
        .env_remove("TRITON_INTERPRET")
        // Native candidates (load_inline) build into the test's own directory, not ~/.cache.
        .env("TORCH_EXTENSIONS_DIR", out.parent().unwrap().join("torch_extensions"))
        .output()
        .unwrap();
    let v: Value = std::fs::read_to_string(out).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or(Value::Null);
    (o.status.code(), v, format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

#[test]
fn corpus_verdicts() {
    assert!(torch_available(), "python3 with torch, triton and numpy is needed (scripts/test installs them)");
    let expect: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(corpus().join("expect.json")).unwrap()).unwrap();
    assert!(expect.len() >= 20);
    let dir = tempfile::tempdir().unwrap();
    let queue = Arc::new(Mutex::new(expect.into_iter().enumerate().collect::<Vec<_>>()));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (queue, failures, dir) = (queue.clone(), failures.clone(), dir.path().to_path_buf());
            std::thread::spawn(move || loop {
                let Some((i, e)) = queue.lock().unwrap().pop() else { break };
                let (p, c) = (e["problem"].as_str().unwrap(), e["candidate"].as_str().unwrap());
                let kernel = e["kernel"].as_str();
                let limit = e["time_limit_s"].as_u64().unwrap_or(300);
                let (code, v, log) = verify(p, c, e["policy"].as_str(), kernel, limit, &dir.join(format!("{i}.json")));
                let by = v["rejected_by"].as_str().unwrap_or("").to_string();
                let static_reject =
                    e["rejected_by"].as_array().unwrap().iter().any(|w| w.as_str().unwrap().starts_with("static:"));
                let ok = match e["expect"].as_str().unwrap() {
                    // A replacement kernel runs inside the compiled problem, on a GPU only: here
                    // its static gate must pass, then it could not run.
                    _ if kernel.is_some() && !static_reject => {
                        code == Some(2)
                            && v["outcome"] == "could-not-run"
                            && log.contains("needs a CUDA GPU")
                            && v["gates"][0]["status"] == "passed"
                    }
                    // A GPU-only native candidate (`"device": "cuda"`, CUDA C++ built with nvcc):
                    // here its static gate must pass, then it could not run, the CUDA toolkit
                    // named (without one: CUDA_HOME unset; the H200 runs it for real).
                    _ if e["device"] == "cuda" => {
                        code == Some(2)
                            && v["outcome"] == "could-not-run"
                            && log.contains("CUDA_HOME")
                            && v["gates"][0]["status"] == "passed"
                    }
                    "pass" => code == Some(0) && v["outcome"] == "passed-without-performance",
                    _ => {
                        code == Some(1)
                            && v["outcome"] == "rejected"
                            && e["rejected_by"].as_array().unwrap().iter().any(|w| by.starts_with(w.as_str().unwrap()))
                    }
                } && cause_as_expected(&e, &v)
                    && evidence_as_expected(&e, &v);
                if !ok {
                    failures.lock().unwrap().push(format!(
                        "{c}: expected {} {}, got exit {code:?} {} by {by:?}\n{log}",
                        e["expect"], e["rejected_by"], v["outcome"]
                    ));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let f = failures.lock().unwrap();
    assert!(f.is_empty(), "{} corpus entries wrong:\n{}", f.len(), f.join("\n"));
}

/// Every field of the entry's `cause` (if it has one) is in the verdict's cause, and a
/// candidate-side cause names the check that was running.
fn cause_as_expected(e: &Value, v: &Value) -> bool {
    let Some(want) = e["cause"].as_object() else { return true };
    want.iter().all(|(k, w)| &v["cause"][k] == w)
        && (v["cause"]["side"] != "candidate" || v["cause"]["check"].is_string())
}

/// Every check named in the entry's `evidence` (`"gate:check": {...}`) is in the verdict with
/// at least that evidence: objects key by key, arrays element by element (each wanted element
/// somewhere in the array), `"*"` any value, other values equal.
fn evidence_as_expected(e: &Value, v: &Value) -> bool {
    let Some(want) = e["evidence"].as_object() else { return true };
    let checks: Vec<&Value> = v["gates"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["checks"].as_array().into_iter().flatten())
        .collect();
    want.iter().all(|(name, w)| {
        checks.iter().any(|c| {
            format!("{}:{}", c["gate"].as_str().unwrap_or(""), c["name"].as_str().unwrap_or("")) == *name
                && contains(&c["evidence"], w)
        })
    })
}

fn contains(got: &Value, want: &Value) -> bool {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => w.iter().all(|(k, wv)| g.get(k).is_some_and(|gv| contains(gv, wv))),
        (Value::Array(g), Value::Array(w)) => w.iter().all(|wv| g.iter().any(|gv| contains(gv, wv))),
        _ => want == "*" || got == want,
    }
}

#[test]
fn evidence_matching() {
    let got = serde_json::json!({"a": {"b": 1, "c": [1, 2, {"d": 3}]}, "e": "x"});
    assert!(contains(&got, &serde_json::json!({"a": {"c": [{"d": 3}, 1]}})));
    assert!(contains(&got, &serde_json::json!({})));
    assert!(!contains(&got, &serde_json::json!({"a": {"c": [4]}})));
    assert!(!contains(&got, &serde_json::json!({"e": "y"})));
    assert!(!contains(&got, &serde_json::json!({"f": 1})));
    assert!(contains(&got, &serde_json::json!({"a": {"b": "*"}})) && !contains(&got, &serde_json::json!({"g": "*"})));
}

/// The gates that passed before the process ended are kept in the verdict.
#[test]
fn a_hang_keeps_what_passed_and_names_the_check_running() {
    assert!(torch_available(), "python3 with torch, triton and numpy is needed (scripts/test installs them)");
    let dir = tempfile::tempdir().unwrap();
    let (code, v, log) =
        verify("problems/vector_add.py", "vector_add/crash_hang.py", None, None, 45, &dir.path().join("v.json"));
    assert_eq!(code, Some(1), "{log}");
    assert_eq!(v["rejected_by"], "correctness:timeout", "{log}");
    assert_eq!(v["gates"][1]["gate"], "dry-run");
    assert_eq!(v["gates"][1]["status"], "passed", "{log}");
    let c = &v["cause"];
    assert_eq!((c["side"].as_str(), c["stage"].as_str()), (Some("candidate"), Some("correctness")), "{log}");
    assert_eq!(c["check"], "seed-0-uniform", "the third call hangs: {log}");
    assert_eq!(c["limit"], "time limit of 45 s");
    assert!(log.contains("cause: the candidate's timeout"), "{log}");
}

#[test]
fn bad_input_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v.json");
    // A candidate without ModelNew cannot run: exit 2 and the reason.
    let nomodel = dir.path().join("nomodel.py");
    std::fs::write(&nomodel, "x = 1\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_kforge"))
        .args(["verify", "--device", "cpu", "--no-performance", "--json"])
        .arg(&out)
        .arg(corpus().join("problems/vector_add.py"))
        .arg(&nomodel)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    // The candidate's own failure: rejected, not retried.
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains("verdict: rejected by dry-run:interface"), "{text}");
    assert!(text.contains("no class ModelNew"), "{text}");
    // A candidate whose import raises: rejected by dry-run:import with the traceback's last lines.
    std::fs::write(&nomodel, "import torch\n\ndef boom():\n    raise ValueError('kaputt')\n\nboom()\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_kforge"))
        .args(["verify", "--device", "cpu", "--no-performance", "--json", "-"])
        .arg(corpus().join("problems/vector_add.py"))
        .arg(&nomodel)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains("verdict: rejected by dry-run:import") && text.contains("ValueError: kaputt"), "{text}");
    assert!(text.contains("in boom"), "the traceback's frames: {text}");
    // No GPU and no --device cpu: could not run, the fix named (never a rejection).
    let o = Command::new(env!("CARGO_BIN_EXE_kforge"))
        .args(["verify", "--no-performance"])
        .arg(corpus().join("problems/vector_add.py"))
        .arg(corpus().join("vector_add/honest.py"))
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(2), "{text}");
    assert!(
        text.contains("no CUDA GPU is visible") && text.contains("fix: ") && text.contains("--device cpu"),
        "{text}"
    );
    // A replacement kernel needs the compiled problem on a GPU.
    {
        let o = Command::new(env!("CARGO_BIN_EXE_kforge"))
            .args(["verify", "--device", "cpu", "--kernel", "triton_poi_fused_add_0"])
            .arg(corpus().join("problems/vector_add.py"))
            .arg(corpus().join("vector_add/honest.py"))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("needs a CUDA GPU"),
            "{}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
    // Syntax error in the candidate: rejected by static:syntax, line named, nothing executed.
    std::fs::write(&nomodel, "def f(:\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_kforge"))
        .args(["verify", "--device", "cpu"])
        .arg(corpus().join("problems/vector_add.py"))
        .arg(&nomodel)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("line 1") && text.contains("verdict: rejected by static:syntax"), "{text}");
    // Missing files, bad policy, bad device.
    let o = Command::new(env!("CARGO_BIN_EXE_kforge")).args(["verify", "nope.py", "nope2.py"]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("nope.py: no such file"));
    let pol = dir.path().join("p.toml");
    std::fs::write(&pol, "seeds = 1\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_kforge"))
        .args(["verify", "--policy"])
        .arg(&pol)
        .arg(corpus().join("problems/vector_add.py"))
        .arg(corpus().join("vector_add/honest.py"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("seeds must be at least 3"));
    let o = Command::new(env!("CARGO_BIN_EXE_kforge"))
        .args(["verify", "--device", "gpu0", "a.py", "b.py"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("--device must be"));
}

#[test]
fn time_limit_kills_the_candidate() {
    assert!(torch_available(), "python3 with torch, triton and numpy is needed (scripts/test installs them)");
    let dir = tempfile::tempdir().unwrap();
    let slow = dir.path().join("slow.py");
    // Blocks at import: the limit must end it (the static check passes this file). Its own
    // failure: rejected by dry-run:timeout (the import is the dry run's first step).
    std::fs::write(&slow, "while True:\n    pass\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_kforge"))
        .args(["verify", "--device", "cpu", "--time-limit-s", "20"])
        .arg(corpus().join("problems/vector_add.py"))
        .arg(&slow)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains("ran past the time limit of 20 s while running dry-run:import"), "{text}");
    assert!(text.contains("verdict: rejected by dry-run:timeout"), "{text}");
}

#[test]
fn memory_limit_kills_the_candidate() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.py");
    // 3 GB written at import (resident, not lazily mapped), over a 1 GiB limit.
    std::fs::write(&big, "hog = b'x' * 3_000_000_000\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_kforge"))
        .args(["verify", "--device", "cpu", "--memory-limit-gib", "1", "--json", "-"])
        .arg(corpus().join("problems/vector_add.py"))
        .arg(&big)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains("ran past the memory limit of 1 GiB"), "{text}");
    let v: Value = serde_json::from_str(&text[..text.rfind('}').unwrap() + 1]).unwrap();
    assert_eq!(v["rejected_by"], "dry-run:memory-limit");
    assert_eq!((v["cause"]["side"].as_str(), v["cause"]["check"].as_str()), (Some("candidate"), Some("import")));
}

#[test]
fn through_the_daemon_the_candidate_is_a_job() {
    if !torch_available() {
        panic!("python3 with torch, triton and numpy is needed (scripts/test installs them)");
    }
    let mut d = common::TestDaemon::start(&[]);
    let out = d.path("v.json");
    let run = |cand: &str| {
        Command::new(env!("CARGO_BIN_EXE_kforge"))
            .arg("--socket")
            .arg(&d.socket)
            .args(["verify", "--daemon", "--device", "cpu", "--no-performance", "--json"])
            .arg(&out)
            .arg(corpus().join("problems/mse.py"))
            .arg(corpus().join(cand))
            .env_remove("TRITON_INTERPRET")
            .output()
            .unwrap()
    };
    let o = run("mse/honest.py");
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{text}\n{}", d.log());
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(v["outcome"], "passed-without-performance");
    assert_eq!(v["limits"]["via_daemon"], true);
    assert!(text.contains("correctness  seed-0-normal"), "progress streamed back: {text}");
    let started = String::from_utf8_lossy(&o.stderr);
    assert!(
        started.lines().any(|l| l.starts_with("kforge verify: the daemon started job ") && l.ends_with(" s in the daemon's queue")),
        "the job's start is said on stderr (kforge optimize reads it): {started}"
    );
    let o = run("mse/cheat_distribution.py");
    assert_eq!(o.status.code(), Some(1));
    // The daemon ran both as jobs labelled "verify:PROBLEM:SIZE".
    let jobs = d.report().jobs;
    assert_eq!(
        jobs.iter()
            .filter(|j| j.label.as_deref().is_some_and(|l| l.starts_with("verify:") && l.ends_with(":default")))
            .count(),
        2
    );
    d.shutdown();
}

/// `verify --daemon --warm`: with a daemon whose warm workers fork (`--worker-fork`, torch
/// preloaded: on the cpu device Triton must be imported after `TRITON_INTERPRET=1`, so it is not
/// preloaded), each candidate's runner is a child its worker forked for it: the honest
/// candidate passes, the cheat is rejected by the check that catches it, as cold. Workers that
/// run jobs in-process never get it: `--warm` is refused at submission, naming the fix (the
/// environment's failure), and a plain `--daemon` that `--warm-python` would route there runs cold.
#[test]
fn through_a_forking_warm_worker_each_candidate_runs_in_a_child_of_its_own() {
    if !torch_available() {
        panic!("python3 with torch, triton and numpy is needed (scripts/test installs them)");
    }
    let verify_how = |d: &common::TestDaemon, cand: &str, how: &[&str]| {
        let out = d.path("v.json");
        let o = Command::new(env!("CARGO_BIN_EXE_kforge"))
            .arg("--socket")
            .arg(&d.socket)
            .args(["verify", "--device", "cpu", "--no-performance"])
            .args(how)
            .arg("--json")
            .arg(&out)
            .arg(corpus().join("problems/mse.py"))
            .arg(corpus().join(cand))
            .env_remove("TRITON_INTERPRET")
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap_or_default()).unwrap_or_default();
        (o.status.code(), v, text)
    };
    let verify = |d: &common::TestDaemon, cand: &str| verify_how(d, cand, &["--daemon", "--warm"]);
    let pool = |d: &common::TestDaemon| d.status().devices[0].pool.clone();
    let mut d = common::TestDaemon::start(&["--warm-workers", "1", "--worker-fork", "--worker-preload", "torch"]);
    common::wait_for("a warm worker", Duration::from_secs(120), || (pool(&d).warm == 1).then_some(()));
    let (code, v, text) = verify(&d, "mse/honest.py");
    assert_eq!((code, v["outcome"].as_str()), (Some(0), Some("passed-without-performance")), "{text}\n{}", d.log());
    let (code, v, text) = verify(&d, "mse/cheat_distribution.py");
    assert_eq!((code, v["rejected_by"].as_str()), (Some(1), Some("correctness:seed-0-normal")), "{text}");
    assert_eq!(pool(&d).jobs_served, 2, "both ran in the warm worker");
    d.shutdown();

    let mut d = common::TestDaemon::start(&["--warm-workers", "1", "--warm-python", "--worker-preload", ""]);
    common::wait_for("a warm worker", Duration::from_secs(60), || (pool(&d).warm == 1).then_some(()));
    let (code, v, text) = verify(&d, "mse/honest.py");
    assert_eq!(code, Some(2), "could not run: {text}");
    assert_eq!(v["outcome"], "could-not-run", "{text}");
    assert!(text.contains("start the daemon with --worker-fork"), "the fix is named: {text}");
    let (code, v, text) = verify_how(&d, "mse/honest.py", &["--daemon"]);
    assert_eq!((code, v["outcome"].as_str()), (Some(0), Some("passed-without-performance")), "{text}\n{}", d.log());
    assert_eq!(pool(&d).jobs_served, 0, "neither reached the in-process worker");
    d.shutdown();
}

#[test]
fn memory_limit_counts_the_candidates_children() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("forker.py");
    // The candidate stays small; a child it starts takes 3 GB and keeps it. (The process start is
    // hidden from the static check on purpose: this tests the watchdog, not gate 1.)
    std::fs::write(
        &big,
        "import shutil, sys\nrun = getattr(shutil.os, 'sys' + 'tem')\nrun(sys.executable + ' -c \"hog = bytes(1) * 3_000_000_000; import time; time.sleep(60)\"')\n",
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_kforge"))
        .args(["verify", "--device", "cpu", "--memory-limit-gib", "1", "--time-limit-s", "120"])
        .arg(corpus().join("problems/vector_add.py"))
        .arg(&big)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains("ran past the memory limit of 1 GiB"), "{text}");
}

#[test]
fn leftovers_in_the_candidates_group_do_not_outlive_it() {
    // The candidate starts a background process and ends (no ModelNew: rejected). kforge
    // must neither wait for the background process nor leave it running.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bg.py");
    std::fs::write(&f, "import shutil\nrun = getattr(shutil.os, 'sys' + 'tem')\nrun('sleep 41.5 &')\n").unwrap();
    let t = std::time::Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_kforge"))
        .args(["verify", "--device", "cpu", "--time-limit-s", "60"])
        .arg(corpus().join("problems/vector_add.py"))
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stdout));
    assert!(t.elapsed() < std::time::Duration::from_secs(30), "kforge waited for the background process");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let alive = Command::new("pgrep").args(["-f", "sleep 41.5"]).output().unwrap().status.success();
        if !alive {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the candidate's background process survived");
        std::thread::yield_now();
    }
}

#[test]
fn no_daemon_is_the_environments_failure_with_a_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v.json");
    let o = Command::new(env!("CARGO_BIN_EXE_kforge"))
        .arg("--socket")
        .arg(dir.path().join("nobody.sock"))
        .args(["verify", "--daemon", "--device", "cpu", "--no-performance", "--json"])
        .arg(&out)
        .arg(corpus().join("problems/vector_add.py"))
        .arg(corpus().join("vector_add/honest.py"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stdout));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!((v["outcome"].as_str(), v["cause"]["side"].as_str()), (Some("could-not-run"), Some("environment")));
    assert_eq!(v["cause"]["kind"], "daemon");
    assert!(v["cause"]["fix"].as_str().unwrap().contains("kforge daemon"));
}

/// `kforge verify --size`: an unknown preset is refused before anything runs; `default` leaves
/// a corpus verdict as it was (and records the size); `large` applies the problem's LARGE dict
/// before get_inputs() (a problem that refuses its default N passes only there), and a problem
/// without LARGE cannot run at `large`, naming the file.
#[test]
fn size_presets() {
    let dir = tempfile::tempdir().unwrap();
    let c = corpus();
    let run = |size: &str, problem: &std::path::Path| {
        let out = dir.path().join(format!("{size}.json"));
        let o = Command::new(env!("CARGO_BIN_EXE_kforge"))
            .args(["verify", "--device", "cpu", "--no-performance", "--size", size, "--json"])
            .arg(&out)
            .arg("--policy")
            .arg(c.join("problems/vector_add.toml"))
            .arg(problem)
            .arg(c.join("vector_add/honest.py"))
            .env_remove("TRITON_INTERPRET")
            .output()
            .unwrap();
        let v: Value =
            std::fs::read_to_string(&out).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or(Value::Null);
        let _ = std::fs::remove_file(&out);
        (o.status.code(), v, format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    };
    let vector_add = c.join("problems/vector_add.py");

    let (code, v, text) = run("bogus", &vector_add);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("--size must be one of default, large, got \"bogus\""), "{text}");
    assert_eq!(v, Value::Null, "no verdict for a refused command: {text}");

    assert!(torch_available(), "python3 with torch, triton and numpy is needed (scripts/test installs them)");
    let (code, v, text) = run("default", &vector_add);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(v["outcome"], "passed-without-performance", "{text}");
    assert_eq!(v["size"], "default", "{text}");

    let sized = dir.path().join("vector_add_sized.py");
    let src = std::fs::read_to_string(&vector_add).unwrap();
    std::fs::write(
        &sized,
        src.replace("N = 4096\n", "N = 4096\nLARGE = {\"N\": 8192}\n")
            // The policy's ragged sizes (N = 4000) still apply at the large preset; only 4096 is refused.
            .replace(
                "def get_inputs():\n",
                "def get_inputs():\n    assert N != 4096, \"the large preset was not applied\"\n",
            ),
    )
    .unwrap();
    let (code, v, text) = run("large", &sized);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(v["outcome"], "passed-without-performance", "{text}");
    assert_eq!(v["size"], "large", "{text}");
    let (code, v, text) = run("default", &sized);
    assert_ne!(v["outcome"], "passed-without-performance", "the default preset must leave N = 4096: {code:?} {text}");

    let (code, _, text) = run("large", &vector_add);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("vector_add.py: no LARGE dict"), "{text}");
}

/// The dispatch agent's result (`python3 -m kforge.optimize.dispatch`, then
/// `python3 -m kforge.optimize.result`) is torch code by design: verified with the policy written
/// beside it (`reference-ops`) it passes every gate that runs on the CPU; under the default policy
/// its torch call is `static:torch-compute`.
#[test]
fn a_dispatch_result_passes_with_the_policy_beside_it() {
    assert!(torch_available(), "python3 with torch, triton and numpy is needed (scripts/test installs them)");
    let dir = tempfile::tempdir().unwrap();
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../python");
    let problem = corpus().join("problems/row_softmax.py");
    let measured = dir.path().join("dispatch.json");
    let run = |args: &[&std::ffi::OsStr]| {
        let o = Command::new("python3")
            .args(args)
            .env("PYTHONPATH", &python)
            .env("KFORGE_SOCKET", dir.path().join("none.sock"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    run(&[
        "-m".as_ref(),
        "kforge.optimize.dispatch".as_ref(),
        problem.as_os_str(),
        "--out".as_ref(),
        measured.as_os_str(),
        "--device".as_ref(),
        "cpu".as_ref(),
        "--modes".as_ref(),
        "eager,default".as_ref(),
        "--baseline".as_ref(),
        "default".as_ref(),
        "--rounds".as_ref(),
        "2".as_ref(),
    ]);
    let m: Value = serde_json::from_str(&std::fs::read_to_string(&measured).unwrap()).unwrap();
    let winner = m["winner"].as_str().unwrap().to_string();
    assert!(winner == "eager" || winner == "default", "{m}");
    let out = dir.path().join("result");
    run(&[
        "-m".as_ref(),
        "kforge.optimize.result".as_ref(),
        problem.as_os_str(),
        measured.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
    ]);
    let source = std::fs::read_to_string(out.join("model_new.py")).unwrap();
    assert!(
        !source
            .lines()
            .any(|l| l.trim_start().starts_with("import kforge") || l.trim_start().starts_with("from kforge")),
        "the result imports no kforge: {source}"
    );
    let policy = out.join("policy.toml");
    let candidate = out.join("model_new.py");
    let (code, v, text) = verify(
        problem.to_str().unwrap(),
        candidate.to_str().unwrap(),
        Some(policy.to_str().unwrap()),
        None,
        300,
        &dir.path().join("v.json"),
    );
    assert_eq!((code, v["outcome"].as_str()), (Some(0), Some("passed-without-performance")), "{text}");
    assert_eq!(v["torch_policy"], "reference-ops");
    let (code, v, text) =
        verify(problem.to_str().unwrap(), candidate.to_str().unwrap(), None, None, 300, &dir.path().join("v2.json"));
    assert_eq!((code, v["rejected_by"].as_str()), (Some(1), Some("static:torch-compute")), "{text}");
}
