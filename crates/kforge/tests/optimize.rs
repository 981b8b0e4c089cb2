//! `kforge optimize` on the CPU (Inductor's CPU backend): the dispatch agent measured, the
//! winner's standalone result file written and verified under its policy, the report; bad input
//! named before anything runs. Needs python3 with torch and Triton (scripts/test installs them).

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn optimize(args: &[&str], out: &std::path::Path) -> (Option<i32>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_kforge"))
        .arg("optimize")
        .args(args)
        .arg("--out")
        .arg(out)
        .current_dir(repo())
        .env("KFORGE_SOCKET", out.with_extension("no-daemon.sock"))
        .env_remove("TRITON_INTERPRET")
        .output()
        .unwrap();
    (o.status.code(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

#[test]
fn a_problem_is_optimized_end_to_end_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let (code, text) = optimize(
        &[
            "tests/candidates/problems/row_softmax.py",
            "--device",
            "cpu",
            "--baseline",
            "default",
            "--agents",
            "dispatch,inductor",
            "--rounds",
            "3",
        ],
        &out,
    );
    assert_eq!(code, Some(0), "{text}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(r["baseline"], "default");
    assert_eq!(r["agents"], serde_json::json!(["dispatch", "inductor"]));
    let m = &r["measurement"];
    // The dispatch agent's modes and the inductor agent's knobs on the baseline's mode.
    for mode in ["default", "eager", "max-autotune-no-cudagraphs", "default+freezing", "default+aggressive-fusion"] {
        assert!(m["prepared"][mode]["ok"].as_bool().unwrap(), "{mode}: {m}");
    }
    assert!(m["modes"]["eager"]["ci95"][0].as_f64().unwrap() <= m["modes"]["eager"]["speedup"].as_f64().unwrap());
    let result = std::fs::read_to_string(out.join("model_new.py")).unwrap();
    assert!(result.contains("class ModelNew(Reference)"), "{result}");
    let policy = std::fs::read_to_string(out.join("policy.toml")).unwrap();
    assert!(policy.contains("torch_policy = \"reference-ops\"") && policy.contains("baseline_mode = \"default\""));
    match r["decision"]["kind"].as_str() {
        // Improved only with a verified result file; its mode was beyond noise.
        Some("improved") => {
            assert_eq!(r["verified"], "passed-without-performance", "{r}");
            let mode = r["decision"]["mode"].as_str().unwrap();
            assert_eq!(m["modes"][mode]["beyond_noise"], true);
            let agent = if mode.contains('+') { "inductor" } else { "dispatch" };
            assert_eq!(r["decision"]["agent"], agent);
            assert!(text.contains(&format!("result: {mode} ({agent})")), "{text}");
        }
        // Kept: the result file is the baseline's own (compiled in the baseline mode).
        Some("fallback") => {
            assert!(result.contains("mode='default'"), "{result}");
            assert!(text.contains("result: the baseline kept"), "{text}");
        }
        k => panic!("decision {k:?}: {r}"),
    }
}

#[test]
fn bad_input_is_named_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_problem = dir.path().join("helper.py");
    std::fs::write(&not_a_problem, "def helper():\n    return 1\n").unwrap();
    let p = not_a_problem.to_str().unwrap();
    for (args, why) in [
        (vec![p, "--device", "cpu"], "not a problem file: no Model, get_inputs, get_init_inputs"),
        (vec!["tests/candidates/problems/row_softmax.py", "--agents", "dispatch,oracle"], "unknown agent \"oracle\""),
        (vec!["tests/candidates/problems/row_softmax.py", "--rounds", "1"], "--rounds must be at least 2"),
        (
            vec!["tests/candidates/problems/row_softmax.py", "--device", "gpu0"],
            "--device must be auto, cpu or a GPU index",
        ),
        (vec!["tests/candidates/problems/row_softmax.py", "--baseline", "eager"], "invalid value 'eager'"),
        (vec!["no/such/problem.py", "--device", "cpu"], "reading no/such/problem.py"),
    ] {
        let out = dir.path().join("o");
        let (code, text) = optimize(&args, &out);
        assert_eq!(code, Some(2), "{args:?}: {text}");
        assert!(text.contains(why), "{args:?}: {text}");
        assert!(!out.join("dispatch.json").exists(), "{args:?}: nothing ran");
    }
}

/// A directory is a campaign: every problem below it (other Python files are not problems), one
/// output folder each, a summary per level; `--resume` takes the earlier reports that answer the
/// same question and runs again those that do not.
#[test]
fn a_campaign_summarizes_per_level_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let problems = dir.path().join("problems");
    for (level, name) in [("level1", "row_softmax.py"), ("level2", "vector_add.py")] {
        std::fs::create_dir_all(problems.join(level)).unwrap();
        std::fs::copy(repo().join("tests/candidates/problems").join(name), problems.join(level).join(name)).unwrap();
    }
    std::fs::write(problems.join("level2/helpers.py"), "def helper():\n    return 1\n").unwrap();
    let out = dir.path().join("o");
    let p = problems.to_str().unwrap();
    let args = [p, "--device", "cpu", "--baseline", "default", "--rounds", "2"];
    let (code, text) = optimize(&args, &out);
    assert_eq!(code, Some(0), "{text}");
    let campaign = |out: &std::path::Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(out.join("campaign.json")).unwrap()).unwrap()
    };
    let c = campaign(&out);
    let names: Vec<&str> = c["problems"].as_array().unwrap().iter().map(|p| p["problem"].as_str().unwrap()).collect();
    assert_eq!(names, ["level1/row_softmax.py", "level2/vector_add.py"], "helpers.py is not a problem");
    let levels: Vec<&str> = c["summary"].as_array().unwrap().iter().map(|s| s["level"].as_str().unwrap()).collect();
    assert_eq!(levels, ["level1", "level2", "all"]);
    let all = &c["summary"][2];
    assert_eq!(all["problems"], 2);
    assert_eq!(all["optimized"].as_u64().unwrap() + all["fallbacks"].as_u64().unwrap(), 2);
    assert!(all["geomean"].as_f64().unwrap() >= 1.0, "fallbacks count as 1.0, winners were beyond noise: {all}");
    assert!(
        out.join("level1/row_softmax/report.json").is_file() && out.join("level2/vector_add/model_new.py").is_file()
    );
    assert!(text.contains("GEOMEAN"), "{text}");
    // Resumed: the same question, nothing runs again.
    let (code, text) = optimize(&[&args[..], &["--resume"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(campaign(&out)["problems"].as_array().unwrap().iter().all(|p| p["resumed"] == true), "{text}");
    // Another question (more rounds) for one problem: it runs again.
    let single = out.join("level1/row_softmax");
    let (code, text) = optimize(
        &[
            problems.join("level1/row_softmax.py").to_str().unwrap(),
            "--device",
            "cpu",
            "--baseline",
            "default",
            "--rounds",
            "3",
            "--resume",
        ],
        &single,
    );
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains("resumed from"), "{text}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(single.join("report.json")).unwrap()).unwrap();
    assert_eq!(r["rounds"], 3);
}

/// The rewrite agent beside the dispatch agent: a rule fires on diag_scale.py (diag-matmul), its
/// variants `eager~rewrite` and `default~rewrite` are measured in the same rounds, the report
/// names the rules; a rewrite winner is credited to the rewrite agent and its result file (the
/// rewritten forward) passed verification under the policy beside it.
#[test]
fn the_rewrite_agent_is_measured_and_credited_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let args = [
        "tests/candidates/problems/diag_scale.py",
        "--agents",
        "dispatch,rewrite",
        "--device",
        "cpu",
        "--baseline",
        "default",
        "--rounds",
        "3",
    ];
    let (code, text) = optimize(&args, &out);
    assert_eq!(code, Some(0), "{text}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(r["agents"], serde_json::json!(["dispatch", "rewrite"]));
    let m = &r["measurement"];
    assert_eq!(m["rewrite"]["fired"], true, "{m}");
    assert_eq!(m["rewrite"]["rules"][0]["rule"], "diag-matmul");
    for variant in ["eager", "eager~rewrite", "default~rewrite"] {
        assert!(m["modes"][variant]["speedup"].as_f64().unwrap() > 0.0, "{variant}: {m}");
    }
    assert_eq!(m["prepared"]["default~rewrite"]["exactness"], "exact");
    assert!(text.contains("rewrite: diag-matmul (exact)") && text.contains("eager~rewrite"), "{text}");
    let result = std::fs::read_to_string(out.join("model_new.py")).unwrap();
    let policy = std::fs::read_to_string(out.join("policy.toml")).unwrap();
    match (r["decision"]["kind"].as_str(), r["decision"]["mode"].as_str()) {
        (Some("improved"), Some(mode)) if mode.ends_with("~rewrite") => {
            assert_eq!(
                (r["decision"]["agent"].as_str(), r["verified"].as_str()),
                (Some("rewrite"), Some("passed-without-performance"))
            );
            assert!(result.contains("(agent rewrite)") && !result.contains("torch.diag"), "{result}");
            assert!(policy.contains("allowed_aten_ops = [\"mul\", \"unsqueeze\"]"), "{policy}");
            assert!(text.contains(&format!("result: {mode} (rewrite)")), "{text}");
        }
        (Some("improved"), Some(mode)) => assert_eq!(r["decision"]["agent"], "dispatch", "{mode}"),
        (Some("fallback"), _) => assert!(result.contains("mode='default'"), "{result}"),
        k => panic!("decision {k:?}: {r}"),
    }
}
