//! Every command README.md shows in a shell code block is either run here, as written, or named
//! in `NOT_RUN` with the reason; a command added to the README that is neither fails this test.
//! The commands run with the built `kforge` first on PATH, from the repository root, and without
//! TRITON_INTERPRET in the environment (what a user types is what CI runs).

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Commands (their start, as written) not run in CI, and why.
const NOT_RUN: &[(&str, &str)] = &[
    ("cargo run --release -p kforge -- demo", "a release build and the 40-command demo: minutes on CI's 2 cores"),
    ("scripts/test", "runs every test, this one included: it would recurse"),
    ("kforge daemon", "starts a long-lived daemon in the background"),
    ("kforge run", "needs a running daemon and the user's bench.py / cand3.py"),
    ("kforge status", "needs a running daemon"),
    ("kforge report --json > run.json", "needs a running daemon's store"),
    ("kforge bench-runtime", "a benchmark (starts a daemon, thousands of regions)"),
    ("kforge workload truth", "runs the generated GPU workload"),
    ("kforge workload run", "runs the generated GPU workload"),
    ("kforge report eval/", "reads the runs of the GPU workload"),
    ("kforge inspect", "compiles and profiles on a GPU (--from-capture reads the capture the GPU run wrote)"),
    ("kforge profile problems/", "runs Nsight Compute on a GPU (crates/kforge/tests/profile.rs runs it against a stand-in ncu)"),
    ("kforge optimize", "compiles and times every mode (a GPU, or Inductor's CPU backend): crates/kforge/tests/optimize.rs runs it on the CPU"),
    ("kforge verify problems/level1/001_matmul_square_fp32.py my_candidate.py", "my_candidate.py is the user's file"),
    ("kforge scripted-endpoint", "a server that runs until killed: crates/kforge/tests/optimize_llm.rs starts it and runs the search against it"),
    ("bash scripts/device/", "device scripts: need an NVIDIA GPU"),
    ("python3 scripts/device/", "device scripts: need an NVIDIA GPU"),
];

/// Commands run as written; each must exit 0 (`true`: run in a scratch directory instead of the root,
/// for commands that write files).
const RUN: &[(&str, bool)] = &[
    (
        "kforge verify tests/candidates/problems/vector_add.py tests/candidates/vector_add/honest.py --device cpu --no-performance",
        false,
    ),
    ("kforge profile crates/kforge-ncu/tests/data/raw.csv --from-csv", false),
    ("kforge workload gen --profile gpu --out eval/w.jsonl --per-bucket 50 --seed 1", true),
];

/// The commands of README.md's ```sh blocks, one per line, comments and prompts kept as written.
fn readme_commands() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut out = Vec::new();
    let mut in_sh = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_sh = !in_sh && line.trim() == "```sh";
            continue;
        }
        if in_sh && !line.trim().is_empty() && !line.trim_start().starts_with('#') {
            out.push(line.trim().to_string());
        }
    }
    out
}

#[test]
fn every_readme_command_is_run_or_excused() {
    let cmds = readme_commands();
    assert!(cmds.len() >= 10, "README's shell blocks: {cmds:?}");
    let unclassified: Vec<&String> = cmds
        .iter()
        .filter(|c| !RUN.iter().any(|(r, _)| c.starts_with(r)) && !NOT_RUN.iter().any(|(n, _)| c.starts_with(n)))
        .collect();
    assert!(unclassified.is_empty(), "README commands neither run nor excused in NOT_RUN: {unclassified:?}");
    for (r, _) in RUN {
        assert!(cmds.iter().any(|c| c.starts_with(r)), "{r:?} is no longer in the README");
    }
}

#[test]
fn readme_commands_run_as_written() {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_kforge"));
    let path = format!("{}:{}", bin.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let cmds = readme_commands();
    for (prefix, scratch) in RUN {
        let line = cmds.iter().find(|c| c.starts_with(prefix)).expect("in the README (checked above)");
        let dir = tempfile::tempdir().unwrap();
        let cwd = if *scratch { dir.path().to_path_buf() } else { root() };
        let o = Command::new("sh")
            .args(["-c", line])
            .current_dir(&cwd)
            .env("PATH", &path)
            .env_remove("TRITON_INTERPRET")
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "README command failed: {line}\n{text}");
        if line.starts_with("kforge verify") {
            assert!(text.contains("verdict: passed-without-performance"), "{line}\n{text}");
        }
    }
}
