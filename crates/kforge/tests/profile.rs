//! `kforge profile` without a GPU: ncu's saved CSVs read back (`--from-csv`), and ncu itself
//! replaced by `tests/ncu/fake-ncu`, which writes a saved output to the log file kforge names and
//! either ends as told or runs the real profiled program (which, with no GPU, says so).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn data(name: &str) -> PathBuf {
    root().join("crates/kforge-ncu/tests/data").join(name)
}

fn kforge(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kforge"));
    c.args(["profile"]).args(args).env_remove("KFORGE_NCU");
    c
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn fake(args: &[&str], log: &str) -> Command {
    let mut c = kforge(args);
    c.arg("--ncu").arg(root().join("tests/ncu/fake-ncu")).env("FAKE_NCU_LOG", data(log));
    c
}

#[test]
fn a_saved_csv_gives_a_table_with_tiers_and_parseable_json() {
    let raw = data("raw.csv");
    let o = kforge(&[raw.to_str().unwrap(), "--from-csv"]).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let first = out.lines().nth(1).unwrap();
    assert!(first.starts_with("sm90_xmma_gemm") && first.ends_with("near-optimal"), "most time first: {out}");
    assert!(out.contains("triton_poi_fused_add_mul_0") && out.contains("2 kernels, 8806.4 us in all"), "{out}");
    let details = data("details.csv");
    let o = kforge(&[details.to_str().unwrap(), "--from-csv", "--json", "-"]).output().unwrap();
    let (out, err) = text(&o);
    let v: Value = serde_json::from_str(&out).expect("--json - leaves standard output to the JSON");
    assert_eq!(v["kernels"].as_array().unwrap().len(), 2);
    assert_eq!(v["kernels"][0]["time_ns"], 12500.0);
    assert!(err.contains("memory-bound") && err.contains("under-utilized"), "the table went to stderr: {err}");
}

#[test]
fn ncu_runs_the_profile_program_and_its_csv_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let (argv, json) = (dir.path().join("argv"), dir.path().join("p.json"));
    let problem = root().join("problems/level1/016_silu_bf16.py");
    let mut c = fake(&[problem.to_str().unwrap(), "--mode", "max-autotune", "--forwards", "2"], "raw.csv");
    let o = c.arg("--json").arg(&json).env("FAKE_NCU_ARGV", &argv).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("near-optimal"), "{out}");
    let args: Vec<String> = std::fs::read_to_string(&argv).unwrap().lines().map(String::from).collect();
    let want = ["-m", "kforge.inspect.profile", problem.to_str().unwrap(), "--mode", "max-autotune"];
    assert_eq!(&args[1..6], want, "{args:?}");
    assert_eq!(&args[6..11], ["--size", "default", "--forwards", "2", "--peaks-out"]);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!((v["mode"].as_str(), v["forwards"].as_u64()), (Some("max-autotune"), Some(2)));
    assert_eq!(v["kernels"][0]["launches"], 2);
    assert_eq!(v["metrics"].as_array().unwrap().len(), 14, "the base four, DRAM bytes, nine FLOP counters");
    assert_eq!(v["peaks"], Value::Null, "the program did not run: no peak");
}

#[test]
fn achieved_bandwidth_is_shown_against_the_measured_peak_and_refused_counters_fall_back() {
    let problem = root().join("problems/level1/016_silu_bf16.py");
    let o = fake(&[problem.to_str().unwrap()], "raw.csv").env("FAKE_NCU_PEAK", "4e12").output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("copy peak 4000 GB/s (measured)"), "{out}");
    // 805,306,368 bytes in 3,686.4 us: 218 GB/s, 5 % of the peak.
    let row = out.lines().find(|l| l.starts_with("triton_poi_fused_add_mul_0")).unwrap();
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cols[7..9], ["218", "5"], "{row}");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("p.json");
    let mut c = fake(&[problem.to_str().unwrap(), "--json", json.to_str().unwrap()], "raw.csv");
    let o = c.env("FAKE_NCU_REFUSE", "dram__bytes.sum").output().unwrap();
    let (_, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("Failed to find metric dram__bytes.sum") && err.contains("with the base metrics"), "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["metrics"].as_array().unwrap().len(), 4);
}

#[test]
fn without_a_gpu_the_profiled_program_says_why() {
    let problem = root().join("problems/level1/016_silu_bf16.py");
    let mut c = fake(&[problem.to_str().unwrap()], "no-kernels.txt");
    let o = c.env("FAKE_NCU_RUN", "1").env("CUDA_VISIBLE_DEVICES", "").output().unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("no CUDA GPU visible") || err.contains("torch is not importable"), "{err}");
    assert!(err.contains("failed (reason above)"), "{err}");
}

#[test]
fn ncus_own_failure_is_reported_with_its_messages() {
    let problem = root().join("problems/level1/016_silu_bf16.py");
    let o = fake(&[problem.to_str().unwrap()], "no-counters.txt").env("FAKE_NCU_STATUS", "1").output().unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(err.contains("ended with exit status: 1") && err.contains("LibraryNotLoaded"), "{err}");
    // ncu ended well but profiled nothing: the table is missing, and ncu's warning says why.
    let o = fake(&[problem.to_str().unwrap()], "no-kernels.txt").output().unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(err.contains("No kernels were profiled"), "{err}");
}

#[test]
fn a_table_is_read_after_a_crash_at_teardown_and_a_hang_is_killed() {
    let problem = root().join("problems/level1/016_silu_bf16.py");
    let o = fake(&[problem.to_str().unwrap()], "raw.csv").env("FAKE_NCU_STATUS", "139").output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("warning") && err.contains("ended with exit status: 139"), "{err}");
    assert!(out.contains("2 kernels"), "{out}");
    let o =
        fake(&[problem.to_str().unwrap(), "--timeout-s", "1"], "raw.csv").env("FAKE_NCU_HANG", "60").output().unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(err.contains("ran past --timeout-s 1: killed"), "{err}");
}

#[test]
fn bad_input_is_named() {
    let problem = root().join("problems/level1/016_silu_bf16.py");
    let p = problem.to_str().unwrap();
    let cases: [(&[&str], &str); 7] = [
        (&[p, "--cache-control", "warm"], "--cache-control must be all or none"),
        (&[p, "--timeout-s", "0"], "--timeout-s must be at least 1"),
        (&[p, "--mode", "fast"], "--mode must be one of"),
        (&[p, "--size", "huge"], "--size must be one of"),
        (&[p, "--forwards", "0"], "--forwards must be at least 1"),
        (&["/nonexistent/p.py"], "no such file"),
        (&[p, "--ncu", "/nonexistent/ncu"], "/nonexistent/ncu not found"),
    ];
    for (args, want) in cases {
        let o = kforge(args).output().unwrap();
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
