//! `kforge inspect` end to end without a GPU: a capture assembled from a wrapper fixture (the
//! shape `python3 -m kforge.inspect.capture` writes), and the errors for bad input.

mod common;
use serde_json::{json, Value};
use std::process::Command;

fn kforge() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kforge"))
}

fn wrapper() -> String {
    let p =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kforge-inductor/tests/fixtures/mlp_softmax_t210.py");
    std::fs::read_to_string(p).unwrap()
}

fn capture() -> Value {
    let it = json!([
        {"name": "sm90_xmma_gemm", "dur_us": 100.0},
        {"name": "triton_poi_fused_addmm_relu_0", "dur_us": 20.0},
        {"name": "nvjet_gemm", "dur_us": 70.0},
        {"name": "triton_per_fused__softmax_1", "dur_us": 10.0}
    ]);
    json!({
        "kforge_capture": 1, "source": "problems/level3/mlp.py", "kind": "problem", "mode": "default",
        "torch": "2.11.0", "triton": "3.6.0", "device": "synthetic",
        "wrappers": [wrapper()], "iterations": [it.clone(), it],
        "check": {"max_abs_diff_vs_eager": 0.0},
        "replay": [{"kernel": "triton_poi_fused_addmm_relu_0", "ok": true}, {"kernel": "triton_per_fused__softmax_1", "ok": false}],
        "restitch": {"kernels_replaced": 2, "identical": true, "baseline_ms": 0.2, "restitched_ms": 0.2,
                     "ratio": 1.0012, "ratio_ci95": [0.9981, 1.0043], "noise_floor": 1.0047, "within_noise": true,
                     "per_round": [{}, {}, {}, {}, {}, {}], "plan": {"rounds": 6, "calls": 480}}
    })
}

#[test]
fn report_from_a_capture() {
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("c.json");
    std::fs::write(&cap, capture().to_string()).unwrap();
    let out = dir.path().join("r.json");
    let o = kforge().args(["inspect", "--from-capture"]).arg(&cap).arg("--json").arg(&out).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        stdout.contains("2 Triton kernels (0 templates), 2 vendor/fallback calls, 200.0 µs GPU per run"),
        "{stdout}"
    );
    assert!(stdout.contains("replay: 1/2 kernels"), "{stdout}");
    assert!(
        stdout.contains(
            "T/T0 1.0012 (0.9981–1.0043), within noise; noise floor 1.0047 over 6 rounds of 480 calls a side"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("replaceable Triton share of GPU time: 15.0%"), "{stdout}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let l = &r["attribution"]["launches"];
    assert_eq!(l.as_array().unwrap().len(), 4);
    assert_eq!(l[0]["label"], "extern_kernels.mm");
    assert_eq!(l[0]["gpu_us"], 100.0);
    assert_eq!(l[1]["replaceable"], true);
    assert_eq!(l[2]["gpu_us"], 70.0);
    assert_eq!(r["inventory"]["kernels"][1]["category"], "PersistentReduction");
    // A capture from before --size existed is of the default preset; a large one says so.
    assert_eq!(r["size"], "default");
    let mut large = capture();
    large["size"] = "large".into();
    std::fs::write(&cap, large.to_string()).unwrap();
    let o = kforge().args(["inspect", "--from-capture"]).arg(&cap).arg("--json").arg(&out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(r["size"], "large");
    assert!(String::from_utf8_lossy(&o.stdout).contains("noise floor 1.0047"));
    // A round trip that was not timed (its timing skipped): no timing line.
    let mut untimed = capture();
    untimed["restitch"]["ratio"] = Value::Null;
    std::fs::write(&cap, untimed.to_string()).unwrap();
    let o = kforge().args(["inspect", "--from-capture"]).arg(&cap).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && stdout.contains("re-stitch round trip:") && !stdout.contains("T/T0"), "{stdout}");
}

#[test]
fn the_roofline_of_a_capture_is_a_column_and_a_line() {
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("c.json");
    let run = |c: &Value| {
        std::fs::write(&cap, c.to_string()).unwrap();
        let o = kforge().args(["inspect", "--from-capture"]).arg(&cap).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let before = run(&capture());
    assert!(!before.contains("roofline:"), "a capture from before the roofline has no line: {before}");
    // As python/kforge/inspect/roofline.py `roofline_summary` writes it: one kernel with a
    // roofline, one within the L2 (a rate, but no ceiling).
    let mut c = capture();
    c["roofline"] = json!({
        "peak_bytes_per_s": 2.9e12, "copy_bytes_per_s": 2.9e12, "read_bytes_per_s": 2.7e12, "l2_bytes": 52428800,
        "ceiling": 1.1,
        "kernels": {
            "triton_poi_fused_addmm_relu_0": {"kind": "pointwise", "bytes": 6.4e9, "of_peak": 0.934, "ceiling": 1.0707},
            "triton_per_fused__softmax_1": {"kind": "persistent_reduction", "bytes": 1.0e6, "of_peak": 0.2,
                                            "why": "its traffic (1.0 MB a launch) is within 4x the L2 (52 MB)"}
        }
    });
    let t = run(&c);
    let row = |name: &str| t.lines().find(|l| l.contains(name)).unwrap_or_else(|| panic!("{name} in {t}")).to_string();
    assert!(t.contains("SHARE    BW%  REPLACEABLE"), "{t}");
    assert!(row("triton_poi_fused_addmm_relu_0").contains("   93%  yes"), "{t}");
    assert!(row("triton_per_fused__softmax_1").contains("     -  yes"), "{t}");
    assert!(row("extern_kernels.mm").contains("     -  no"), "{t}");
    assert!(
        t.contains(
            "roofline: device bandwidth 2.90 TB/s; 1 of 2 kernels with a roofline (BW%: the rate of their least \
             traffic against it); every generated kernel at its roof: at most 1.100x"
        ),
        "{t}"
    );
    c["roofline"] = json!({"peak_bytes_per_s": null, "kernels": {}, "ceiling": null,
                           "why": "no bandwidth measured: OutOfMemoryError: x"});
    assert!(run(&c).contains("roofline: none (no bandwidth measured: OutOfMemoryError: x)"));
}

#[test]
fn an_unknown_size_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("p.py");
    std::fs::write(&f, "x = 1\n").unwrap();
    let o = kforge().args(["inspect", "--size", "huge"]).arg(&f).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--size must be one of default, large, got \"huge\""), "{err}");
    assert!(!err.contains("capture of"), "refused before the capture ran: {err}");
}

#[test]
fn bad_input_is_named() {
    let dir = tempfile::tempdir().unwrap();
    // Not JSON.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "nope").unwrap();
    let o = kforge().args(["inspect", "--from-capture"]).arg(&bad).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is not a kforge capture"));
    // Another capture version.
    let mut c = capture();
    c["kforge_capture"] = json!(99);
    std::fs::write(&bad, c.to_string()).unwrap();
    let o = kforge().args(["inspect", "--from-capture"]).arg(&bad).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("capture format 99"), "{}", String::from_utf8_lossy(&o.stderr));
    // A wrapper that does not parse: the error names the wrapper and the line.
    let mut c = capture();
    c["wrappers"] = json!(["def call(args):\n    x = (\n"]);
    std::fs::write(&bad, c.to_string()).unwrap();
    let o = kforge().args(["inspect", "--from-capture"]).arg(&bad).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("wrapper 0 of the capture") && err.contains("line"), "{err}");
    // Missing problem file, unknown mode.
    let o = kforge().args(["inspect"]).arg(dir.path().join("none.py")).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("none.py: no such file"));
    let o = kforge().args(["inspect", "--mode", "fast"]).arg(&bad).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("--mode must be one of"));
}

#[test]
fn a_file_that_is_no_problem_is_refused_by_the_capture() {
    // Runs the embedded capture module with the machine's python3; the file is rejected before
    // torch is needed, with the file named.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("notaproblem.py");
    std::fs::write(&f, "x = 1\n").unwrap();
    let o = kforge().arg("inspect").arg(&f).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("notaproblem.py: no get_inputs()"), "{err}");
    assert!(err.contains("capture of"), "{err}");
}

#[test]
fn capture_as_a_daemon_job_reports_the_cause() {
    let mut d = common::TestDaemon::start(&[]);
    let f = d.path("notaproblem.py");
    std::fs::write(&f, "x = 1\n").unwrap();
    let o = kforge()
        .arg("--socket")
        .arg(&d.socket)
        .args(["inspect", "--daemon", "--device", "cpu"])
        .arg(&f)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("notaproblem.py: no get_inputs()"), "{err}");
    assert!(err.contains("as a daemon job"), "{err}");
    let jobs = d.report().jobs;
    assert_eq!(
        jobs.iter()
            .filter(|j| j
                .label
                .as_deref()
                .is_some_and(|l| l.starts_with("inspect:") && l.ends_with(":default:default")))
            .count(),
        1
    );
    d.shutdown();
}

#[test]
fn standalone_triton_file_lists_its_kernels_by_time() {
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("c.json");
    let it = json!([{"name": "my_kernel", "dur_us": 30.0}, {"name": "helper_kernel", "dur_us": 10.0}]);
    let c = json!({"kforge_capture": 1, "source": "k.py", "kind": "triton", "mode": "none", "wrappers": [], "iterations": [it]});
    std::fs::write(&cap, c.to_string()).unwrap();
    let o = kforge().args(["inspect", "--from-capture"]).arg(&cap).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("standalone Triton file"), "{out}");
    let my = out.find("my_kernel").unwrap();
    let helper = out.find("helper_kernel").unwrap();
    assert!(my < helper, "sorted by time: {out}");
    assert!(out.contains("75.0%"), "{out}");
}
