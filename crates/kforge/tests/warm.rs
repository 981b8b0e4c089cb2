//! Warm workers through the real daemon: Python jobs run inside persistent worker processes.

mod common;
use common::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn warm_daemon(workers: usize, extra: &[&str]) -> TestDaemon {
    let n = workers.to_string();
    let mut args = vec!["--warm-workers", n.as_str(), "--worker-preload", ""];
    args.extend_from_slice(extra);
    let d = TestDaemon::start(&args);
    wait_for("warm workers", T, || (d.status().devices[0].pool.warm == workers).then_some(()));
    d
}

fn run(d: &TestDaemon, args: &[&str]) -> (i32, String, String) {
    let mut v = vec!["--device", "cpu", "--warm"];
    v.extend_from_slice(args);
    let o = d.run_cmd(&v).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn warm_jobs_see_argv_cwd_env_and_exit_codes() {
    let d = warm_daemon(2, &[]);
    let script = d.path("s.py");
    std::fs::write(&script, "import os, sys\nprint(sys.argv[1:], os.getcwd() == os.environ['WANT_CWD'], os.environ['KFORGE_JOB'], os.getpid())\nprint('to stderr', file=sys.stderr)\nsys.exit(int(sys.argv[1]))\n").unwrap();
    let cwd = d.dir.path().to_str().unwrap().to_string();
    let mut pids = Vec::new();
    for code in ["0", "3"] {
        let o = d
            .run_cmd(&["--device", "cpu", "--warm", "--", "python3", script.to_str().unwrap(), code, "b c"])
            .env("WANT_CWD", &cwd)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(code.parse().unwrap()), "{out}");
        assert!(out.starts_with(&format!("['{code}', 'b c'] True ")), "{out}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("to stderr"));
        pids.push(out.split_whitespace().last().unwrap().to_string());
    }
    let st = d.status();
    let served = st.devices[0].pool.jobs_served;
    assert_eq!(served, 2);
    // Both ran in warm workers, not in fresh interpreters started for them.
    let worker_pids: Vec<String> = std::fs::read_dir(format!("{}.d", d.socket.display()))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("worker-"))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(worker_pids.len() >= 2, "worker logs exist: {worker_pids:?}");
    for p in &pids {
        let cmdline = std::fs::read_to_string(format!("/proc/{p}/cmdline")).unwrap_or_default();
        assert!(cmdline.contains("kforge.worker"), "job ran in pid {p} whose command line is {cmdline:?}");
    }
}

#[test]
fn uncaught_exception_prints_traceback_and_fails() {
    let d = warm_daemon(2, &[]);
    let (code, _, err) = run(&d, &["--", "python3", "-c", "def f():\n    raise ValueError('boom')\nf()"]);
    assert_eq!(code, 1);
    assert!(err.contains("Traceback (most recent call last)") && err.contains("ValueError: boom"), "{err}");
}

#[test]
fn fresh_main_namespace_and_module_reimport_after_edit() {
    let d = warm_daemon(1, &[]);
    let dir = d.dir.path();
    std::fs::write(dir.join("cand.py"), "def value():\n    return 1\n").unwrap();
    let main =
        "import sys\nsys.path.insert(0, '.')\nprint('leak' in globals())\nleak = 1\nimport cand\nprint(cand.value())\n";
    let (c1, o1, e1) = run(&d, &["--", "python3", "-c", main]);
    assert_eq!(c1, 0, "{e1}");
    assert_eq!(o1.lines().collect::<Vec<_>>(), vec!["False", "1"]);
    std::fs::write(dir.join("cand.py"), "def value():\n    return 22  # edited\n").unwrap();
    let (c2, o2, e2) = run(&d, &["--", "python3", "-c", main]);
    assert_eq!(c2, 0, "{e2}");
    assert_eq!(o2.lines().collect::<Vec<_>>(), vec!["False", "22"], "fresh __main__ and the edited module");
}

#[test]
fn patched_timer_recycles_the_worker_and_the_next_job_sees_the_original() {
    let d = warm_daemon(1, &[]);
    let (c, _, e) = run(&d, &["--", "python3", "-c", "import time\ntime.perf_counter = lambda: 0.0"]);
    assert_eq!(c, 0, "{e}");
    wait_for("recycle recorded", T, || {
        let p = d.status().devices[0].pool.clone();
        p.recycled.keys().any(|k| k.contains("time.perf_counter")).then_some(())
    });
    let (c, o, e) = run(
        &d,
        &["--", "python3", "-c", "import time\nprint(type(time.perf_counter).__name__, time.perf_counter() > 0)"],
    );
    assert_eq!(c, 0, "{e}");
    assert_eq!(o.trim(), "builtin_function_or_method True");
}

#[test]
fn a_job_that_kills_its_worker_fails_alone_and_the_worker_is_replaced() {
    let d = warm_daemon(1, &[]);
    let (c, _, e) = run(&d, &["--", "python3", "-c", "import os\nos._exit(7)"]);
    assert_eq!(c, 7);
    assert!(e.contains("warm worker") && e.contains("exited with code 7"), "{e}");
    let (c, _, e) = run(&d, &["--", "python3", "-c", "import ctypes\nctypes.string_at(0)"]);
    assert_eq!(c, 128 + 11, "{e}");
    assert!(e.contains("signal 11"), "{e}");
    let (c, o, _) = run(&d, &["--", "python3", "-c", "print('still fine')"]);
    assert_eq!((c, o.trim()), (0, "still fine"));
    let p = d.status().devices[0].pool.clone();
    assert_eq!(p.recycled.get("job killed its worker"), Some(&2), "{p:?}");
}

#[test]
fn time_limits_kill_warm_and_cold_jobs() {
    let d = warm_daemon(1, &[]);
    let (c, _, e) = run(&d, &["--timeout", "0.5", "--", "python3", "-c", "import time\ntime.sleep(60)"]);
    assert_eq!(c, 137, "{e}");
    assert!(e.contains("time limit of 0.500 s exceeded"), "{e}");
    let o = d.run_cmd(&["--device", "cpu", "--timeout", "0.3", "--", "sleep", "60"]).output().unwrap();
    assert_eq!(o.status.code(), Some(137));
    assert!(String::from_utf8_lossy(&o.stderr).contains("time limit"));
    let (c, o, _) = run(&d, &["--", "python3", "-c", "print(1)"]);
    assert_eq!((c, o.trim()), (0, "1"), "the pool recovered");
}

#[test]
fn regions_work_inside_warm_jobs() {
    let d = warm_daemon(2, &[]);
    let (c, o, e) = run(
        &d,
        &[
            "--",
            "python3",
            "-c",
            "import kforge\nms = kforge.do_bench(lambda: sum(range(1000)), warmup=1, rep=5)\nprint(ms > 0)",
        ],
    );
    assert_eq!(c, 0, "{e}");
    assert_eq!(o.trim(), "True");
    let rep = d.report();
    assert_eq!(rep.regions.len(), 1);
    assert_eq!(rep.regions[0].job, Some(rep.jobs[0].id));
    assert!(rep.regions[0].exclusive);
    assert_eq!(rep.measurements.len(), 1);
}

#[test]
fn warm_needs_python_and_a_pool() {
    let d = TestDaemon::start(&[]);
    let o = d.run_cmd(&["--device", "cpu", "--warm", "--", "python3", "-c", "pass"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("has no warm workers"));
    let o = d.run_cmd(&["--device", "cpu", "--warm", "--", "sh", "-c", "true"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Python commands only"));
}

#[test]
fn warm_python_setting_routes_python_commands() {
    let d = warm_daemon(1, &["--warm-python"]);
    let o = d.run_cmd(&["--device", "cpu", "--", "python3", "-c", "import os; c = open(f'/proc/{os.getpid()}/cmdline').read().split(chr(0)); print(int(c[1:3] == ['-m', 'kforge' + '.worker']))"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "1");
    // A command line a worker cannot run falls back to a real interpreter.
    let o = d.run_cmd(&["--device", "cpu", "--", "python3", "-X", "dev", "-c", "import os; c = open(f'/proc/{os.getpid()}/cmdline').read().split(chr(0)); print(int(c[1:3] == ['-m', 'kforge' + '.worker']))"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "0");
}

/// `--worker-fork` through the real daemon: each job runs in a child its worker forks for it
/// (its parent the worker, a pid of its own), a patched timer does not reach the next job and
/// recycles nothing, a child killed by a signal fails alone with that signal while its worker
/// serves on, and the time limit still ends a job.
#[test]
fn forking_workers_isolate_jobs_and_survive_them() {
    let d = warm_daemon(1, &["--worker-fork"]);
    let who = "import os\nprint(os.getpid(), os.getppid())";
    let (c, o, e) = run(&d, &["--", "python3", "-c", who]);
    assert_eq!(c, 0, "{e}");
    let (pid, parent) = o.trim().split_once(' ').unwrap();
    let cmdline = std::fs::read_to_string(format!("/proc/{parent}/cmdline")).unwrap_or_default();
    assert!(cmdline.contains("kforge.worker") && pid != parent, "job {pid} forked by {parent}: {cmdline:?}");
    let (c, _, e) = run(&d, &["--", "python3", "-c", "import time\ntime.perf_counter = lambda: 0.0"]);
    assert_eq!(c, 0, "{e}");
    let (c, o, e) = run(&d, &["--", "python3", "-c", "import time, os\nprint(time.perf_counter() > 0, os.getppid())"]);
    assert_eq!((c, o.trim().to_string()), (0, format!("True {parent}")), "{e}");
    let (c, _, e) = run(&d, &["--", "python3", "-c", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"]);
    assert_eq!(c, 128 + 9, "{e}");
    let (c, o, e) = run(
        &d,
        &["--timeout", "1", "--", "python3", "-c", "import os, time\nprint(os.getppid(), flush=True)\ntime.sleep(60)"],
    );
    assert_ne!(c, 0, "{e}");
    assert!(e.contains("time limit"), "{e}");
    assert_eq!(o.trim(), parent, "the same worker until the time limit");
    let (c, o, _) = run(&d, &["--", "python3", "-c", "print('still fine')"]);
    assert_eq!((c, o.trim()), (0, "still fine"));
    let p = d.status().devices[0].pool.clone();
    assert_eq!(p.jobs_served, 5, "{p:?}");
    assert!(!p.recycled.keys().any(|k| k.contains("time.perf_counter")), "nothing to recycle: {p:?}");
}
