//! The evaluation pipeline end to end on the cpu device: generate, ground truth, runs, report.

mod common;
use common::KFORGE;
use std::process::Command;

fn kforge(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    let o = Command::new(KFORGE).args(args).current_dir(dir).output().unwrap();
    assert!(
        o.status.success(),
        "kforge {args:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

#[test]
fn cpu_workload_runs_end_to_end_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    kforge(d, &["workload", "gen", "--profile", "cpu", "--out", "w/w.jsonl", "--per-bucket", "2", "--seed", "9"]);
    let lines = std::fs::read_to_string(d.join("w/w.jsonl")).unwrap();
    let n = lines.lines().count();
    assert!(n >= 8);
    // Same seed, same workload.
    kforge(d, &["workload", "gen", "--profile", "cpu", "--out", "w2/w.jsonl", "--per-bucket", "2", "--seed", "9"]);
    assert_eq!(lines, std::fs::read_to_string(d.join("w2/w.jsonl")).unwrap());

    kforge(d, &["workload", "truth", "w/w.jsonl", "--device", "cpu"]);
    for policy in ["command", "region", "none"] {
        kforge(d, &["workload", "run", "w/w.jsonl", "--policy", policy, "--concurrency", "3", "--device", "cpu"]);
    }
    kforge(
        d,
        &[
            "workload",
            "run",
            "w/w.jsonl",
            "--policy",
            "region",
            "--ablation",
            "gate",
            "--concurrency",
            "3",
            "--device",
            "cpu",
        ],
    );
    let runs = ["truth", "command", "region-isolate", "none", "region-gate"].map(|r| format!("w/{r}.run.json"));
    let mut args = vec!["report"];
    args.extend(runs.iter().map(String::as_str));
    args.extend(["--json", "r.json", "--html", "r.html"]);
    let out = kforge(d, &args);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.lines().next().unwrap().starts_with("RUN"), "{table}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(d.join("r.json")).unwrap()).unwrap();
    assert_eq!(r["isolated_commands"].as_u64().unwrap() as usize, n);
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    for run in runs {
        assert_eq!(run["commands"].as_u64().unwrap() as usize, n);
        assert_eq!(run["failed"], 0);
        let total: u64 = run["inflation"].as_array().unwrap().iter().map(|b| b["n"].as_u64().unwrap()).sum();
        assert_eq!(total as usize, n, "every command has an inflation value in some bucket");
        assert_eq!(run["regions"]["count"].as_u64().unwrap() as usize, n);
    }
    let by_name = |name: &str| runs.iter().find(|x| x["name"] == name).unwrap();
    assert_eq!(by_name("command")["throughput_ratio_vs_command"], 1.0);
    assert_eq!(by_name("region-isolate")["regions"]["overlapping_pairs"], 0);
    assert_eq!(by_name("command")["regions"]["overlapping_pairs"], 0);
    let html = std::fs::read_to_string(d.join("r.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains("<svg") && !html.contains("<script"));
    // --device all: every GPU (none here: the cpu device), --concurrency on each; never the truth.
    kforge(
        d,
        &[
            "workload",
            "run",
            "w/w.jsonl",
            "--policy",
            "region",
            "--concurrency",
            "2",
            "--device",
            "all",
            "--name",
            "all-devices",
            "--limit",
            "3",
        ],
    );
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("w/all-devices.run.json")).unwrap()).unwrap();
    assert_eq!((m["commands"].as_u64(), m["concurrency"].as_u64()), (Some(3), Some(2)));
    assert!(m["device"].as_str().unwrap().starts_with("cpu"), "{m}");
    assert!(m["failed"].as_array().unwrap().is_empty());
    let o = Command::new(KFORGE)
        .args(["workload", "truth", "w/w.jsonl", "--device", "all"])
        .current_dir(d)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--device all is for runs"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A warm truth beside the cold one: its own manifest; a report given both is refused, naming why.
    kforge(d, &["workload", "truth", "w/w.jsonl", "--device", "cpu", "--warm", "--limit", "2"]);
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("w/truth-warm-0.run.json")).unwrap()).unwrap();
    assert_eq!((m["kind"].as_str(), m["commands"].as_u64(), m["warm"].as_bool()), (Some("truth"), Some(2), Some(true)));
    // A warm truth beside the cold one is a repeat row: the idle device measured twice.
    let o = kforge(
        d,
        &[
            "report",
            "w/truth.run.json",
            "w/truth-warm-0.run.json",
            "w/command.run.json",
            "--json",
            "-",
            "--min-gap",
            "5",
        ],
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["resolved_min_gap"], 0.05);
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(
        (runs[0]["name"].as_str(), runs[0]["repeat_of_truth"].as_bool(), runs[0]["commands"].as_u64()),
        (Some("truth-warm"), Some(true), Some(2))
    );
    assert_eq!(runs[0]["inflation_all"]["n"], 2);
    assert!(runs[0]["throughput_ratio_vs_command"].is_null());
    // Two parts of one truth that overlap are refused, and so is a negative --min-gap.
    let o = Command::new(KFORGE)
        .args(["report", "w/truth.run.json", "w/truth.run.json", "w/command.run.json"])
        .current_dir(d)
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("in two ground-truth parts of one GPU"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = Command::new(KFORGE)
        .args(["report", "w/truth.run.json", "w/command.run.json", "--min-gap=-1"])
        .current_dir(d)
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--min-gap is a percentage"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A report without ground truth is refused with a clear error.
    let o = Command::new(KFORGE).args(["report", "w/command.run.json"]).current_dir(d).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no ground-truth run"));
}
