//! `kforge optimize` on the CPU (Inductor's CPU backend): the dispatch agent measured, the
//! winner's standalone result file written and verified under its policy, the report; bad input
//! named before anything runs. Needs python3 with torch and Triton (scripts/test installs them).

mod common;

use serde_json::Value;
use std::io::BufRead;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn command(args: &[&str], out: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kforge"));
    c.arg("optimize")
        .args(args)
        .arg("--out")
        .arg(out)
        .current_dir(repo())
        .env("KFORGE_SOCKET", out.with_extension("no-daemon.sock"))
        .env_remove("TRITON_INTERPRET");
    c
}

fn optimize(args: &[&str], out: &Path) -> (Option<i32>, String) {
    let o = command(args, out).output().unwrap();
    (o.status.code(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

/// Everything the journal in `out` holds.
fn journal(out: &Path) -> kforge_store::Journal {
    kforge_store::Store::open(&out.join("journal.db")).unwrap().journal(None).unwrap()
}

fn git(dir: &Path, args: &[&str]) -> String {
    let o = Command::new("git").arg("-C").arg(dir).args(args).output().unwrap();
    assert!(o.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn campaign(out: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("campaign.json")).unwrap()).unwrap()
}

/// A dispatch-only campaign over the folder `p` on the CPU against default mode, two rounds.
fn dispatch_args(p: &Path) -> Vec<&str> {
    vec![p.to_str().unwrap(), "--device", "cpu", "--baseline", "default", "--agents", "dispatch", "--rounds", "2"]
}

/// Edit a problem file: `# comment` appended (its source, and so its hash, changes).
fn append_comment(path: &Path, comment: &str) {
    let source = std::fs::read_to_string(path).unwrap();
    std::fs::write(path, format!("{source}\n# {comment}\n")).unwrap();
}

/// A campaign directory with these (level, file) problems copied from the test corpus, under
/// `name` when given.
fn problems(dir: &Path, files: &[(&str, &str, &str)]) -> PathBuf {
    let problems = dir.join("problems");
    for (level, name, copy_as) in files {
        std::fs::create_dir_all(problems.join(level)).unwrap();
        std::fs::copy(repo().join("tests/candidates/problems").join(name), problems.join(level).join(copy_as)).unwrap();
    }
    problems
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
            "--html",
            dir.path().join("report.html").to_str().unwrap(),
        ],
        &out,
    );
    assert_eq!(code, Some(0), "{text}");
    // A progress line per step, with the time and budget left.
    for step in ["measure done in", "result done in"] {
        assert!(text.contains(step) && text.contains("elapsed"), "{step} in {text}");
    }
    let r: Value = serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    // What the steps' processes wrote is in their logs, not among the progress lines. A verify
    // step runs only when a variant won (on a loaded CPU, nothing may beat the baseline).
    let log = |step: &str| std::fs::read_to_string(out.join("logs").join(format!("{step}.log"))).unwrap_or_default();
    let verified = r["decision"]["kind"] != "fallback";
    for step in ["dispatch", "result", "verify"].into_iter().filter(|s| *s != "verify" || verified) {
        assert!(log(step).starts_with(&format!("== {step}, run 1 of the journal, at ")), "{step}: {}", log(step));
    }
    assert!(!verified || log("verify").contains("GATE"), "the verify table: {}", log("verify"));
    assert!(verified || log("verify").is_empty(), "nothing won, nothing verified: {}", log("verify"));
    assert!(!text.contains("GATE"), "the verify table among the progress lines: {text}");
    assert_eq!(r["baseline"], "default");
    // The HTML page: a bar per timed variant, the noise band, the variants' table.
    let page = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    let timed = r["measurement"]["modes"].as_object().unwrap().len();
    assert_eq!(page.matches("class=\"bar\"").count(), timed, "{page}");
    assert!(page.contains("<svg") && page.contains("row_softmax.py") && !page.contains("<script"));
    // The journal: the run, its steps (device seconds counted for the device steps), every
    // measured candidate and the decision.
    let j = journal(&out);
    assert_eq!(j.runs.len(), 1);
    assert!(j.runs[0].finished_ns.is_some() && j.runs[0].stopped.is_none());
    let measure = j.steps.iter().find(|s| s.step == "measure").unwrap();
    assert_eq!((measure.status.as_str(), measure.gpu_seconds_kind.as_deref()), ("done", Some("wall")));
    assert!(measure.gpu_seconds.unwrap() > 0.0 && measure.output_hash.is_some());
    let modes = r["measurement"]["modes"].as_object().unwrap();
    assert_eq!(j.candidates.len(), modes.len());
    for c in &j.candidates {
        assert_eq!(c.speedup, modes[&c.variant]["speedup"].as_f64(), "{c:?}");
        assert_eq!(c.agent, if c.variant.contains('+') { "inductor" } else { "dispatch" });
    }
    assert_eq!(j.decisions.len(), 1);
    assert_eq!(j.decisions[0].kind, r["decision"]["kind"].as_str().unwrap());
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
            // The workspace: one commit for the improvement, naming problem, variant, agent, speedup.
            let log = git(&out, &["log", "--format=%s"]);
            assert_eq!(log.lines().count(), 1, "{log}");
            assert!(log.contains(&format!("row_softmax.py: {mode} ({agent}) ")) && log.contains('x'), "{log}");
            let files = git(&out, &["show", "--name-only", "--format="]);
            assert_eq!(
                files.lines().filter(|l| !l.is_empty()).collect::<Vec<_>>(),
                ["model_new.py", "policy.toml", "report.json"]
            );
        }
        // Kept: the result file is the baseline's own (compiled in the baseline mode).
        Some("fallback") => {
            assert!(result.contains("mode='default'"), "{result}");
            assert!(text.contains("result: the baseline kept"), "{text}");
            assert!(
                out.join(".git").is_dir() && git(&out, &["rev-list", "--all"]).is_empty(),
                "no improvement: no commit"
            );
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
        (
            vec!["tests/candidates/problems/row_softmax.py", "--device", "cpu", "--budget-gpu-s", "0"],
            "--budget-gpu-s must be a positive number of seconds, got 0",
        ),
        (
            vec!["tests/candidates/problems/row_softmax.py", "--device", "cpu", "--budget-wall-s", "-3"],
            "--budget-wall-s must be a positive number of seconds, got -3",
        ),
        (
            vec!["tests/candidates/problems/row_softmax.py", "--device", "cpu", "--jobs", "0"],
            "--jobs must be between 1",
        ),
        (
            vec!["tests/candidates/problems/row_softmax.py", "--device", "cpu", "--compile-workers", "-1"],
            "--compile-workers must be between 0 and 8 (processes per measure step), got -1",
        ),
        (
            vec!["tests/candidates/problems/row_softmax.py", "--device", "cpu", "--compile-workers", "9"],
            "--compile-workers must be between 0 and 8",
        ),
        (
            vec!["tests/candidates/problems/row_softmax.py", "--device", "cpu", "--decisions", "Cargo.toml"],
            "the decisions file Cargo.toml is not a kforge optimize decisions file: ",
        ),
        (
            vec!["tests/candidates/problems/row_softmax.py", "--decisions", "d.json", "--summarize"],
            "--summarize reads a campaign: tests/candidates/problems/row_softmax.py is not a directory of problems",
        ),
        (
            vec!["tests/candidates/problems", "--decisions", "no/such/decisions.json", "--summarize"],
            "--summarize: the decisions file no/such/decisions.json does not exist",
        ),
        (vec!["tests/candidates/problems", "--summarize"], "--decisions <FILE>"),
        (vec!["tests/candidates/problems", "--machine", "cpu"], "--summarize"),
    ] {
        let out = dir.path().join("o");
        let (code, text) = optimize(&args, &out);
        assert_eq!(code, Some(2), "{args:?}: {text}");
        assert!(text.contains(why), "{args:?}: {text}");
        assert!(!out.join("dispatch.json").exists() && !out.join("journal.db").exists(), "{args:?}: nothing ran");
    }
}

/// `--step-limit-s`: a step past it is killed, the problem fails naming the step and the limit,
/// and the journal holds the step as failed; 0 is refused before anything runs.
#[test]
fn a_step_past_its_limit_is_killed_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let args = ["tests/candidates/problems/row_softmax.py", "--device", "cpu", "--baseline", "default"];
    let t0 = std::time::Instant::now();
    let (code, text) = optimize(&[&args[..], &["--step-limit-s", "1"]].concat(), &out);
    assert!(code.is_some_and(|c| c != 0), "{text}");
    assert!(text.contains("the dispatch step passed its limit of 1 s (--step-limit-s) and was killed"), "{text}");
    assert!(text.contains(&format!("(all of it: {})", out.join("logs/dispatch.log").display())), "{text}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(60), "killed at the limit, not run to its end");
    let j = journal(&out);
    let measure = j.steps.iter().find(|s| s.step == "measure").unwrap();
    assert_eq!(measure.status, "failed", "{measure:?}");
    assert!(!out.join("dispatch.json").exists(), "the killed step wrote nothing");
    let (code, text) = optimize(&[&args[..], &["--step-limit-s", "0"]].concat(), &dir.path().join("zero"));
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("--step-limit-s must be a positive number of seconds, got 0"), "{text}");
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
    let html = dir.path().join("campaign.html");
    let args = [p, "--device", "cpu", "--baseline", "default", "--rounds", "2", "--html", html.to_str().unwrap()];
    let (code, text) = optimize(&args, &out);
    assert_eq!(code, Some(0), "{text}");
    // The self-contained page: a bar per problem, the per-level table (kforge_optimize::html).
    let page = std::fs::read_to_string(&html).unwrap();
    assert_eq!(page.matches("class=\"bar\"").count(), 2, "{page}");
    assert!(page.contains("<td>level1</td>") && page.contains("<td>level2</td>") && !page.contains("<script"));
    // The campaign's page links each problem's own page, relative to its folder.
    for folder in ["o/level1/row_softmax", "o/level2/vector_add"] {
        assert!(page.contains(&format!("<a href=\"{folder}/report.html\">report.html</a>")), "{page}");
    }
    // Each problem's own page beside its report, with what its result file changes.
    for folder in ["level1/row_softmax", "level2/vector_add"] {
        let own = std::fs::read_to_string(out.join(folder).join("report.html")).unwrap();
        assert!(own.contains("<h2>What the result changes</h2><p>model_new.py against the problem's source"), "{own}");
        assert!(own.contains("<span class=\"add\">+ class ModelNew(Reference):</span>"), "{own}");
    }
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
    // Issue 18's goals per level, against default mode: 1.35 for level1, 1.20 for level2.
    let goals: Vec<(&str, f64)> = c["goals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["level"].as_str().unwrap(), g["geomean_goal"].as_f64().unwrap()))
        .collect();
    assert_eq!(goals, [("level1", 1.35), ("level2", 1.20)]);
    assert!(text.contains("GOALS") && text.contains("WHY BASELINES WERE KEPT"), "{text}");
    assert!(page.contains("<h2>Against the goals</h2>"), "{page}");
    // Resumed: the same question, nothing runs again.
    let (code, text) = optimize(&[&args[..], &["--resume"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(campaign(&out)["problems"].as_array().unwrap().iter().all(|p| p["resumed"] == true), "{text}");
    // A problem whose source changed since its decision is decided again; the other is taken.
    let edited = problems.join("level2/vector_add.py");
    append_comment(&edited, "edited after its decision");
    let (code, text) = optimize(&[&args[..], &["--resume"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("[2/2] level2/vector_add.py: its source changed since its decision: decided again"),
        "{text}"
    );
    let resumed: Vec<bool> =
        campaign(&out)["problems"].as_array().unwrap().iter().map(|p| p["resumed"] == true).collect();
    assert_eq!(resumed, [true, false], "{text}");
    // Output from before the journal: its reports answer the same question, so they count.
    for f in ["journal.db", "journal.db-wal", "journal.db-shm"] {
        std::fs::remove_file(out.join(f)).ok();
    }
    let (code, text) = optimize(&[&args[..], &["--resume"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(campaign(&out)["problems"].as_array().unwrap().iter().all(|p| p["resumed"] == true), "{text}");
    assert!(journal(&out).steps.is_empty(), "nothing ran");
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

/// A two-problem campaign run with `args` into `out` and killed (SIGKILL, its whole process
/// group: the machine gone) while its second problem runs, synchronized on the progress line of
/// its first decision and of the second's measure step.
fn killed_after_the_first_decision(args: &[&str], out: &Path) {
    let mut child = command(args, out)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let second_measured = line.contains("[2/2]") && line.contains("measure done");
        seen.push(line);
        if second_measured {
            break;
        }
    }
    assert!(seen.iter().any(|l| l.contains("[1/2]") && l.contains("decided:")), "{seen:#?}");
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    child.wait().unwrap();
    drop(lines); // open until the kill: the run never wrote into a closed pipe
}

/// A campaign killed (SIGKILL, its whole process group: the machine gone) while its second
/// problem runs, synchronized on the progress line of its first decision and of the second's
/// measure step, its output folder then moved (as a campaign's state is unpacked into another
/// folder on the next machine), then resumed there: the decided problem is not run again (no step
/// of it in the second run), the finished measurement is reused, and the results are complete.
#[test]
fn a_killed_campaign_resumes_without_redoing_finished_work() {
    let dir = tempfile::tempdir().unwrap();
    let p = problems(
        dir.path(),
        &[("level1", "row_softmax.py", "row_softmax.py"), ("level2", "vector_add.py", "vector_add.py")],
    );
    let killed = dir.path().join("o");
    let args = [p.to_str().unwrap(), "--device", "cpu", "--baseline", "default", "--rounds", "2"];
    killed_after_the_first_decision(&args, &killed);
    let out = dir.path().join("elsewhere/o");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    std::fs::rename(&killed, &out).unwrap();
    let before = journal(&out);
    assert_eq!(before.decisions.len(), 1, "the first problem was decided");
    assert!(before.runs[0].finished_ns.is_none(), "the run was killed");
    assert!(!out.join("campaign.json").exists());

    let (code, text) = optimize(&[&args[..], &["--resume"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    let after = journal(&out);
    let second_run = after.runs[1].id;
    let steps = |run: u64, problem: &str| -> Vec<(String, String)> {
        after
            .steps
            .iter()
            .filter(|s| s.run == run && s.problem.ends_with(problem))
            .map(|s| (s.step.clone(), s.status.clone()))
            .collect()
    };
    assert!(steps(second_run, "row_softmax.py").is_empty(), "the decided problem ran no step again: {text}");
    assert!(text.contains("[1/2]") && text.contains("resumed: its decision is in the journal"), "{text}");
    let again = steps(second_run, "vector_add.py");
    assert_eq!(again[0], ("measure".to_string(), "reused".to_string()), "{again:?}");
    for problem in ["row_softmax.py", "vector_add.py"] {
        let measured = after.steps.iter().filter(|s| s.problem.ends_with(problem) && s.step == "measure");
        assert_eq!(measured.filter(|s| s.status == "done").count(), 1, "{problem} measured once");
    }
    assert_eq!(after.decisions.len(), 2);
    let c = campaign(&out);
    assert_eq!(c["problems"].as_array().unwrap().len(), 2);
    assert_eq!(c["problems"][0]["resumed"], true);
    assert_eq!(c["problems"][1]["resumed"], false);
    // Each counts what deciding it cost over both runs: the resumed one what it cost when it was
    // decided (not 0), the other at least its measurement reused from the killed run.
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("level1/row_softmax/report.json")).unwrap()).unwrap();
    assert!(report["spent"]["seconds"].as_f64().unwrap() > 0.0, "{report}");
    assert_eq!(c["problems"][0]["seconds"], report["spent"]["seconds"]);
    assert_eq!(c["problems"][0]["gpu_seconds"], report["spent"]["gpu_seconds"]);
    let first_measure = before.steps.iter().find(|s| s.problem.ends_with("vector_add.py") && s.step == "measure");
    let measured_s = first_measure.and_then(|s| s.seconds).unwrap();
    assert!(c["problems"][1]["seconds"].as_f64().unwrap() > measured_s, "{c}");
    assert!(c["problems"][1]["gpu_seconds"].as_f64().unwrap() >= first_measure.unwrap().gpu_seconds.unwrap(), "{c}");
    let all = &c["summary"][2];
    assert_eq!(
        (all["problems"].as_u64(), all["failed"].as_u64(), all["not_reached"].as_u64()),
        (Some(2), Some(0), Some(0))
    );
    assert_eq!(all["optimized"].as_u64().unwrap() + all["fallbacks"].as_u64().unwrap(), 2);
}

/// A campaign that moves machines: run with `--decisions` and killed after its first decision, its
/// output folder then lost whole (journal, reports, result files), resumed into a fresh folder
/// from the decisions file alone: the decided problem runs no step and its report is restored (and
/// journaled: the new folder resumes without the file too), the other is run and added.
#[test]
fn a_campaign_resumes_on_a_fresh_machine_from_its_decisions_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = problems(
        dir.path(),
        &[("level1", "row_softmax.py", "row_softmax.py"), ("level2", "vector_add.py", "vector_add.py")],
    );
    let (out, decisions) = (dir.path().join("o"), dir.path().join("kept/decisions.json"));
    let args = [p.to_str().unwrap(), "--device", "cpu", "--baseline", "default", "--rounds", "2"];
    let with_file = [&args[..], &["--decisions", decisions.to_str().unwrap()]].concat();
    killed_after_the_first_decision(&with_file, &out);
    let entries = |l: &Value| -> Vec<String> {
        l["entries"].as_array().unwrap().iter().map(|e| e["report"]["problem"].as_str().unwrap().to_string()).collect()
    };
    let read = || -> Value { serde_json::from_str(&std::fs::read_to_string(&decisions).unwrap()).unwrap() };
    let first = read();
    assert_eq!(entries(&first), [p.join("level1/row_softmax.py").display().to_string()], "written at the decision");
    assert_eq!(first["decisions"], 1);
    let decided = first["entries"][0]["report"].clone();
    let result_of = |o: &Path| -> Vec<String> {
        ["model_new.py", "policy.toml"]
            .map(|n| std::fs::read_to_string(o.join("level1/row_softmax").join(n)).unwrap())
            .into()
    };
    let written = result_of(&out);
    assert!(written[0].contains("class ModelNew"), "{}", written[0]);
    let carried = &first["entries"][0]["result_files"];
    assert_eq!(
        (carried["model_new.py"].as_str(), carried["policy.toml"].as_str()),
        (Some(&*written[0]), Some(&*written[1]))
    );
    std::fs::remove_dir_all(&out).unwrap();

    let (code, text) = optimize(&[&with_file[..], &["--resume"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("[1/2]") && text.contains("resumed: its decision is in the decisions file"), "{text}");
    let j = journal(&out);
    assert!(j.steps.iter().all(|s| s.problem.ends_with("vector_add.py")), "the decided problem ran no step: {text}");
    assert_eq!(j.decisions.len(), 2, "the restored decision is journaled");
    let mut restored: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("level1/row_softmax/report.json")).unwrap()).unwrap();
    let here = std::path::absolute(out.join("level1/row_softmax/model_new.py")).unwrap();
    assert_eq!(restored["result"], here.display().to_string(), "its result named in the new folder");
    for key in ["result", "policy"] {
        restored[key] = decided[key].clone();
    }
    assert_eq!(restored, decided, "its report restored as it was decided");
    assert_eq!(result_of(&out), written, "and its result files, as they were decided");
    // A file from before the result files were carried, or whose carried files were edited since:
    // the report alone is restored (no result file written), and the run says which.
    let restore_from = |entry: Value, name: &str, said: &str| {
        let (folder, file) = (dir.path().join(name), dir.path().join(format!("{name}.json")));
        let mut d = first.clone();
        d["entries"][0] = entry;
        std::fs::write(&file, d.to_string()).unwrap();
        let cut =
            [&args[..], &["--decisions", file.to_str().unwrap(), "--resume", "--budget-wall-s", "0.001"]].concat();
        let (code, text) = optimize(&cut, &folder);
        assert_eq!(code, Some(0), "{text}");
        assert!(text.contains(said), "{name}: {text}");
        assert!(folder.join("level1/row_softmax/report.json").exists(), "{name}");
        assert!(!folder.join("level1/row_softmax/model_new.py").exists(), "{name}");
    };
    let mut without = first["entries"][0].clone();
    without.as_object_mut().unwrap().remove("result_files");
    restore_from(without, "older", "its result files are not in the decisions file");
    let mut edited = first["entries"][0].clone();
    edited["result_files"]["model_new.py"] = format!("{}# edited\n", written[0]).into();
    restore_from(edited, "edited", "result files do not hash as decided");
    let c = campaign(&out);
    assert_eq!((c["problems"][0]["resumed"].clone(), c["problems"][1]["resumed"].clone()), (true.into(), false.into()));
    assert!(c["problems"].as_array().unwrap().iter().all(|p| p["decision"].is_object()), "{c}");
    assert_eq!(c["problems"][0]["seconds"], decided["spent"]["seconds"], "it counts what it cost when decided");
    let both = read();
    assert_eq!(entries(&both).len(), 2, "the new decision added");
    assert_eq!(both["entries"][0], first["entries"][0], "the old entry unchanged");

    let (code, text) = optimize(&[&args[..], &["--resume"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(text.matches("resumed: its decision is in the journal").count(), 2, "{text}");

    // A folder whose journal holds the decision but lost its result files (session 31: a state
    // pack from before they were packed): resumed from the journal, the files come back from the
    // decisions file as decided; without the file nothing is written.
    let lost = || ["model_new.py", "policy.toml"].map(|n| std::fs::remove_file(out.join("level1/row_softmax").join(n)));
    assert!(lost().iter().all(|r| r.is_ok()));
    let (code, text) = optimize(&[&args[..], &["--resume"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(!out.join("level1/row_softmax/model_new.py").exists() && !text.contains("were missing here"), "{text}");
    let (code, text) = optimize(&[&with_file[..], &["--resume"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(text.matches("resumed: its decision is in the journal").count(), 2, "{text}");
    assert_eq!(text.matches("its result files were missing here: written from").count(), 1, "{text}");
    assert_eq!(result_of(&out), written, "written as they were decided");

    // Gate 4's speedup filled into the file afterwards (backfill_confirmed.py): a run resumed from
    // the journal counts it too, for the same decision only.
    let kept = std::fs::read_to_string(&decisions).unwrap();
    let mut filled = read();
    assert!(filled["entries"][0]["report"]["confirmed"].is_null(), "the CPU run confirms nothing: {filled}");
    filled["entries"][0]["report"]["confirmed"] = 1.5.into();
    std::fs::write(&decisions, filled.to_string()).unwrap();
    let (code, text) = optimize(&[&with_file[..], &["--resume"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(text.matches("resumed: its decision is in the journal").count(), 2, "{text}");
    assert_eq!(campaign(&out)["problems"][0]["confirmed"], 1.5, "{text}");
    filled["entries"][0]["report"]["decision"] = serde_json::json!({"kind": "fallback", "reason": "another"});
    std::fs::write(&decisions, filled.to_string()).unwrap();
    let (code, text) = optimize(&[&with_file[..], &["--resume"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(campaign(&out)["problems"][0]["confirmed"].is_null(), "another decision's figure is not taken: {text}");
    std::fs::write(&decisions, kept).unwrap();

    // The campaign's summary anywhere, from the file alone: a spent budget starts nothing new.
    let elsewhere = dir.path().join("summary-only");
    let (code, text) = optimize(&[&with_file[..], &["--resume", "--budget-wall-s", "0.001"]].concat(), &elsewhere);
    assert_eq!(code, Some(0), "{text}");
    let again = campaign(&elsewhere);
    assert_eq!(again["summary"], c["summary"], "the same summary: {text}");
    assert!(journal(&elsewhere).steps.is_empty(), "no step ran: {text}");
    // Or with --summarize: no step, no python, no output folder; the same summary, its machine named.
    let (json, none) = (dir.path().join("summary.json"), dir.path().join("none"));
    let summarize = [&with_file[..], &["--summarize", "--json", json.to_str().unwrap()]].concat();
    let (code, text) = optimize(&summarize, &none);
    assert_eq!(code, Some(0), "{text}");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(s["summary"], c["summary"], "the same summary: {text}");
    let machine = read()["entries"][0]["machine"].as_str().unwrap().to_string();
    assert_eq!(s["machine"], machine.as_str());
    assert!(text.contains(&format!("decided on {machine}, read from ")) && !none.exists(), "{text}");
    let other = [&with_file[..], &["--summarize", "--agents", "dispatch,inductor"]].concat();
    let (code, text) = optimize(&other, &none);
    assert_eq!(code, Some(2), "another question: {text}");
    assert!(text.contains("holds no decision for these problems under this question"), "{text}");

    // Decided on another machine: not taken here (said, and run again: here the budget stops it).
    let file = std::fs::read_to_string(&decisions).unwrap();
    assert!(machine.starts_with("cpu, torch "), "{machine}");
    std::fs::write(
        &decisions,
        file.replace(&format!("\"machine\":\"{machine}\""), "\"machine\":\"NVIDIA H200, torch 2.11\""),
    )
    .unwrap();
    let moved = dir.path().join("moved");
    let (code, text) = optimize(&[&with_file[..], &["--resume", "--budget-wall-s", "0.001"]].concat(), &moved);
    assert_eq!(code, Some(0), "{text}");
    let why = format!("does not hold here (decided on NVIDIA H200, torch 2.11, this run is on {machine}): run again");
    assert_eq!(text.matches(&why).count(), 2, "{text}");
    assert!(campaign(&moved)["problems"].as_array().unwrap().iter().all(|p| p["not_reached"] == "budget"));
    // Summarized anywhere: the file's machine, or the one named when it has it.
    let (code, text) = optimize(&[&summarize[..], &["--machine", "NVIDIA H200, torch 2.11"]].concat(), &none);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("decided on NVIDIA H200, torch 2.11"), "{text}");
    let (code, text) = optimize(&[&summarize[..], &["--machine", &machine]].concat(), &none);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains(&format!("no decision of these problems made on {machine}; it has some made on: NVIDIA H200"))
    );

    // A folder's report names its machine too: resumed from the journal only on that machine.
    let report_path = out.join("level2/vector_add/report.json");
    let mut report: Value = serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
    assert_eq!(report["machine"], machine.as_str(), "{report}");
    report["machine"] = "NVIDIA H200, torch 2.11".into();
    std::fs::write(&report_path, report.to_string()).unwrap();
    let (code, text) = optimize(&[&args[..], &["--resume", "--budget-wall-s", "0.001"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    let why = format!("its report was decided on NVIDIA H200, torch 2.11, this run is on {machine}: run again");
    assert_eq!(text.matches(&why).count(), 1, "{text}");
    assert_eq!(text.matches("resumed: its decision is in the journal").count(), 1, "the other one: {text}");
}

/// A GPU-seconds budget spent by the first step: nothing else starts, the problems are recorded
/// as not reached (not failed) and the summary says so; resumed without the budget, the campaign
/// completes and the measurement already taken is reused.
#[test]
fn a_spent_budget_stops_new_work_and_resume_completes_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = problems(dir.path(), &[("level1", "vector_add.py", "a.py"), ("level1", "row_softmax.py", "b.py")]);
    let out = dir.path().join("o");
    let args = [p.to_str().unwrap(), "--device", "cpu", "--baseline", "default", "--rounds", "2"];
    let (code, text) = optimize(&[&args[..], &["--budget-gpu-s", "0.001"]].concat(), &out);
    assert_eq!(code, Some(0), "not reached is not a failure: {text}");
    let c = campaign(&out);
    let reached: Vec<&Value> = c["problems"].as_array().unwrap().iter().map(|p| &p["not_reached"]).collect();
    assert_eq!(reached, ["budget", "budget"], "{c}");
    assert!(c["problems"][0]["gpu_seconds"].as_f64().unwrap() > 0.0, "its measure step ran");
    assert_eq!(c["problems"][1]["gpu_seconds"], 0.0);
    assert_eq!((c["summary"][0]["not_reached"].as_u64(), c["summary"][0]["failed"].as_u64()), (Some(2), Some(0)));
    assert_eq!(c["budget"]["spent"], "gpu");
    for want in ["not reached: budget", "the gpu budget is spent", "2 problem(s) not reached (budget)", "NOT-REACHED"] {
        assert!(text.contains(want), "{want} in {text}");
    }
    let j = journal(&out);
    assert_eq!(j.runs[0].stopped.as_deref(), Some("budget"));
    assert_eq!(j.steps.iter().map(|s| s.step.as_str()).collect::<Vec<_>>(), ["measure"], "no step after the budget");
    assert!(j.decisions.is_empty());

    let (code, text) = optimize(&[&args[..], &["--resume"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    let c = campaign(&out);
    assert!(c["problems"].as_array().unwrap().iter().all(|p| p["decision"].is_object()), "{c}");
    let j = journal(&out);
    let first: Vec<&str> = j
        .steps
        .iter()
        .filter(|s| s.run == j.runs[1].id && s.problem.ends_with("a.py"))
        .map(|s| s.status.as_str())
        .collect();
    assert_eq!(first[0], "reused", "{first:?}");

    // A wall budget starts no step it cannot hold: a new problem's measure step, expected to take
    // the upper quartile of the journal's (with --resume, earlier runs' count), is not started
    // when less than that is left (here 0.9 of the shortest, the start-up's seconds less); the
    // decided problems are still taken from the journal, and the budget line says what was held.
    std::fs::copy(repo().join("tests/candidates/problems/mse.py"), p.join("level1/c.py")).unwrap();
    let shortest = j
        .steps
        .iter()
        .filter(|s| s.step == "measure" && s.status == "done")
        .filter_map(|s| s.seconds)
        .fold(f64::INFINITY, f64::min);
    let budget = format!("{:.3}", 0.9 * shortest);
    let (code, text) = optimize(&[&args[..], &["--resume", "--budget-wall-s", &budget]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    let c = campaign(&out);
    let states: Vec<(bool, &Value)> =
        c["problems"].as_array().unwrap().iter().map(|p| (p["decision"].is_object(), &p["not_reached"])).collect();
    assert_eq!(states, [(true, &Value::Null), (true, &Value::Null), (false, &Value::from("budget"))], "{c}");
    assert!(text.contains("not reached: budget (before its measure step: a measure step takes about"), "{text}");
    // 0.9 of the shortest is below the quartile: no such step fits this budget, and the line says
    // so; a finished step's length is no floor, so the step is held, not started bounded.
    assert!(text.contains("s of the wall budget are left; none fits a --budget-wall-s of"), "{text}");
    assert!(text.contains("1 step(s) held back (a measure step takes about"), "{text}");
    assert!(text.contains("--resume continues them, given a wall budget that holds their steps"), "{text}");
    assert_eq!(c["budget"]["held_back"], 1, "{c}");
    let j = journal(&out);
    let last = j.runs.last().unwrap().id;
    assert!(!j.steps.iter().any(|s| s.run == last && s.status != "reused"), "nothing started: {:?}", j.steps);

    // One problem: stopped by the budget after its measurement, exit status 3, no report.
    let single = dir.path().join("single");
    let (code, text) =
        optimize(&[p.join("level1/a.py").to_str().unwrap(), "--device", "cpu", "--budget-gpu-s", "0.001"], &single);
    assert_eq!(code, Some(3), "{text}");
    assert!(text.contains("not reached: budget: gpu") && !single.join("report.json").exists(), "{text}");
}

/// A journal in `out` whose one run was killed while `p`'s `level3/a.py` measure step had been
/// running for 1000 s (its job started at once; the run's last sign of life a result step's
/// start now); returns now (Unix ns).
fn journal_with_a_killed_measure(p: &Path, out: &Path) -> i64 {
    std::fs::create_dir_all(out).unwrap();
    let problem = p.join("level3/a.py").display().to_string();
    let store = kforge_store::Store::open(&out.join("journal.db")).unwrap();
    let question = kforge_store::QuestionRow {
        problem: p.display().to_string(),
        size: "default".into(),
        device: "cpu".into(),
        baseline: "default".into(),
        agents: "dispatch".into(),
        rounds: 2,
    };
    let run = kforge_store::RunRow {
        id: 0,
        question,
        budget_gpu_s: None,
        budget_wall_s: Some(600.0),
        jobs: 1,
        started_ns: 0,
        finished_ns: None,
        stopped: None,
    };
    let killed = store.insert_run(&run).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
    let measure = store.step_started(killed, &problem, "measure", "an older input", now - 1_000_000_000_000).unwrap();
    store.step_work_began(measure, now - 1_000_000_000_000).unwrap(); // its job started at once
    store.step_started(killed, &problem, "result", "its last sign of life", now).unwrap();
    now
}

/// Under a wall budget a step admitted in full still gets deadlines (a safety net for an
/// estimate that proves short, or none at all in a first run): one that fits never reaches them
/// and is journaled as a full step; one the net cuts ends with what it measured, journaled
/// `bounded` (its seconds are not a full step's), instead of outliving the run, and is its
/// problem's floor for a later run.
#[test]
fn a_step_admitted_in_full_under_a_wall_budget_gets_a_safety_net() {
    let dir = tempfile::tempdir().unwrap();
    let p = problems(dir.path(), &[("level1", "vector_add.py", "a.py")]);
    let args = dispatch_args(&p);
    let out = dir.path().join("o");
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let (code, text) = optimize(&[&args[..], &["--budget-wall-s", "600"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains("bounded"), "{text}");
    let m: Value = serde_json::from_str(&std::fs::read_to_string(out.join("level1/a/dispatch.json")).unwrap()).unwrap();
    let (part, end) = (m["prepare_until"].as_f64().unwrap(), m["until"].as_f64().unwrap());
    assert!(part > at + 0.95 * 600.0 && part < at + 600.0 + 30.0 && end > part, "{part} {end} vs {at}");
    assert!(m.get("not_prepared").is_none(), "nothing cut: {m}");
    let j = journal(&out);
    let measured = j.steps.iter().find(|s| s.step == "measure").unwrap();
    assert_eq!((measured.status.as_str(), measured.outcome.as_deref()), ("done", None), "{measured:?}");

    // Six seconds for nine variants' compiles on the CPU: the net cuts the step.
    let out = dir.path().join("cut");
    let agents = [&args[..6], &["dispatch,inductor"], &args[7..]].concat();
    let (code, text) = optimize(&[&agents[..], &["--budget-wall-s", "6"]].concat(), &out);
    assert!(code == Some(0) || code == Some(2), "{text}");
    let j = journal(&out);
    let measured = j.steps.iter().find(|s| s.step == "measure").unwrap();
    assert_eq!(measured.outcome.as_deref(), Some("bounded"), "{measured:?}\n{text}");

    // Cut after what it ran (its floor, about 6 s), it takes at least that: a resumed run whose
    // whole budget is less does not run it in full to be cut again (session 19's livelock). It
    // takes the cut result; or, when the baseline's own compile outlived the 6 s (a loaded
    // machine) and the step failed, it starts bounded (at a run's start) or is held back naming
    // its floor. The budget is a second under the floor: more than the run's start takes.
    let budget = format!("{:.1}", measured.seconds.unwrap() - 1.0);
    let (code, text) = optimize(&[&agents[..], &["--resume", "--budget-wall-s", &budget]].concat(), &out);
    assert!(code == Some(0) || code == Some(2), "{text}");
    let j = journal(&out);
    let again: Vec<(&str, Option<&str>)> =
        j.steps.iter().filter(|s| s.step == "measure").map(|s| (s.status.as_str(), s.outcome.as_deref())).collect();
    match measured.status.as_str() {
        "done" => {
            assert!(text.contains("measure: reused"), "{text}");
            assert_eq!(again, [("done", Some("bounded")), ("reused", Some("bounded"))], "{text}");
        }
        "failed" => {
            let floor = "had run that long when its run was killed or it ended bounded";
            assert!(text.contains(floor), "{text}");
            assert!(again[1..].iter().all(|(_, outcome)| *outcome == Some("bounded")), "never in full: {again:?}");
        }
        other => panic!("the cut step's status: {other}"),
    }
}

/// Journal `problem`'s `step` (input hash `input`) in `run`: its work began `seconds` ago and it
/// ended now as `end` says (`finished_ns` and `seconds` filled in). Returns the step's id.
fn journal_step(
    store: &kforge_store::Store,
    (run, problem, step, input): (u64, &str, &str, &str),
    seconds: f64,
    end: kforge_store::StepEnd,
) -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
    let began = now - (seconds * 1e9) as i64;
    let id = store.step_started(run, problem, step, input, began).unwrap();
    store.step_work_began(id, began).unwrap();
    store.step_finished(id, &kforge_store::StepEnd { finished_ns: now, seconds, ..end }).unwrap();
    id
}

/// A level-3 problem in a campaign folder under `root`, and its output folder, whose measure step
/// ran bounded (a killed run's floor, 1000 s, passes the 200 s budget); then the GPU budget was
/// spent: undecided.
fn measured_bounded(root: &Path) -> (PathBuf, PathBuf) {
    measured_bounded_with(root, &[])
}

/// `measured_bounded`, its run given `extra` arguments too.
fn measured_bounded_with(root: &Path, extra: &[&str]) -> (PathBuf, PathBuf) {
    let p = problems(root, &[("level3", "vector_add.py", "a.py")]);
    let out = root.join("o");
    journal_with_a_killed_measure(&p, &out);
    let args = dispatch_args(&p);
    let budgets = ["--resume", "--budget-wall-s", "200", "--budget-gpu-s", "0.001"];
    let (code, text) = optimize(&[&args[..], &budgets, extra].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("measure: bounded: "), "{text}");
    (p, out)
}

/// A bounded measurement is a stopgap: a later run whose budget holds the step in full runs it
/// in full instead of taking it (a floor set wrongly, by a step that had waited in the daemon's
/// queue, had bounded level-1 measure steps for good in session 17).
#[test]
fn a_bounded_measurement_is_not_taken_by_a_run_that_holds_the_step_in_full() {
    let dir = tempfile::tempdir().unwrap();
    let (p, out) = measured_bounded(dir.path());
    let args = dispatch_args(&p);
    // A budget that holds the floor: measured in full, the bounded result not taken.
    let (code, text) = optimize(&[&args[..], &["--resume", "--budget-wall-s", "2000"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains("measure: reused") && !text.contains("measure: bounded"), "{text}");
    let j = journal(&out);
    let outcomes: Vec<Option<&str>> =
        j.steps.iter().filter(|s| s.step == "measure" && s.status == "done").map(|s| s.outcome.as_deref()).collect();
    assert_eq!(outcomes.len(), 2, "{outcomes:?}");
    assert_eq!(outcomes[0], Some("bounded"));
    assert_ne!(outcomes[1], Some("bounded"));
}

/// In `out`'s journal, a later run that journaled `step` of the bounded measurement's problem
/// (the measure step itself when `step` is "measure", on its input) ending as `end`, `seconds`
/// long: (the bounded measurement, that run, the step's id).
fn after_the_bounded_measurement(
    out: &Path,
    step: &str,
    seconds: f64,
    end: kforge_store::StepEnd,
) -> (kforge_store::StepRow, u64, u64) {
    let store = kforge_store::Store::open(&out.join("journal.db")).unwrap();
    let all = store.journal(None).unwrap();
    let bounded = all.steps.iter().find(|s| s.step == "measure" && s.status == "done").unwrap().clone();
    let run = store.insert_run(&kforge_store::RunRow { id: 0, ..all.runs[0].clone() }).unwrap();
    let input = if step == "measure" { bounded.input_hash.clone() } else { format!("its {step} input") };
    let id = journal_step(&store, (run, &bounded.problem, step, &input), seconds, end);
    (bounded, run, id)
}

/// A bounded measurement is taken after all once running the step in full was tried since and
/// came to nothing: a full run that fails once (session 23: torch's CUDA graph trees asserted
/// after 430 s of level3/004's second measure step) is not tried in every later run, each time
/// at the cost of the steps built on the bounded result.
#[test]
fn a_bounded_measurement_is_taken_once_running_it_in_full_failed() {
    let dir = tempfile::tempdir().unwrap();
    let (p, out) = measured_bounded(dir.path());
    let args = dispatch_args(&p);
    // A later run tried the step in full: its work began, then it failed.
    let end = kforge_store::StepEnd {
        status: "failed".into(),
        error: Some("the dispatch step ended with Some(1): AssertionError".into()),
        ..kforge_store::StepEnd::default()
    };
    let (bounded, run, tried) = after_the_bounded_measurement(&out, "measure", 430.0, end);
    let (code, text) = optimize(&[&args[..], &["--resume", "--budget-wall-s", "2000"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    let said = format!(
        "measure: takes its bounded result (step {} of run {}): running it in full again, step {tried} of run {run}, \
         ended failed: the dispatch step ended with Some(1): AssertionError",
        bounded.id, bounded.run
    );
    assert!(text.contains(&said), "{said}\n{text}");
    let j = journal(&out);
    let measured: Vec<(&str, Option<u64>)> =
        j.steps.iter().filter(|s| s.step == "measure").map(|s| (s.status.as_str(), s.reused_from)).collect();
    assert_eq!(measured.last(), Some(&("reused", Some(bounded.id))), "the bounded one taken: {measured:?}");
    assert_eq!(measured.iter().filter(|(status, _)| *status == "done").count(), 1, "not run in full: {measured:?}");
    let c = campaign(&out);
    assert!(c["problems"][0]["decision"].is_object(), "decided with it: {c}");
}

/// A bounded measurement the problem went on from (its verify step finished since, the problem
/// still undecided: its config step was left) is taken by a run whose budget holds the step in
/// full: in session 32 a 500 s budget ran level3/007's bounded measure step again in full (207 s
/// for a 1.0255x in place of 1.0235x) and level3/004's until the call was killed, both of them
/// past their verify steps already, their config steps all that was left.
#[test]
fn a_bounded_measurement_the_problem_went_on_from_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let (p, out) = measured_bounded(dir.path());
    let args = dispatch_args(&p);
    let end = kforge_store::StepEnd { status: "done".into(), outcome: Some("accepted".into()), ..Default::default() };
    let (bounded, run, verified) = after_the_bounded_measurement(&out, "verify", 20.0, end);
    let (code, text) = optimize(&[&args[..], &["--resume", "--budget-wall-s", "2000"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    let said = format!(
        "measure: takes its bounded result (step {} of run {}): the problem went on from it (its verify step, \
         step {verified} of run {run}, finished since)",
        bounded.id, bounded.run
    );
    assert!(text.contains(&said), "{said}\n{text}");
    let j = journal(&out);
    let measured: Vec<&str> = j.steps.iter().filter(|s| s.step == "measure").map(|s| s.status.as_str()).collect();
    assert_eq!(measured.iter().filter(|s| **s == "done").count(), 1, "not run in full: {measured:?}");
    assert_eq!(measured.last(), Some(&"reused"));
}

/// The bounded measurement's row and its file's bytes in `out` (one problem, level3/a).
fn bounded_measurement(out: &Path) -> (kforge_store::StepRow, Vec<u8>) {
    let j = journal(out);
    let row = j.steps.iter().find(|s| s.step == "measure" && s.status == "done").unwrap().clone();
    assert_eq!(row.outcome.as_deref(), Some("bounded"), "{row:?}");
    (row, std::fs::read(out.join("level3/a/dispatch.json")).unwrap())
}

/// A step run again over a finished result of the same input keeps that result's files first
/// (`.kept/<output hash>/`): a rerun that never finished but rewrote them (session 32: level3/004's
/// measure step run in full, killed at the call's `HARD_S` after it wrote `dispatch.json`) does not
/// take the finished result with it. Here the rerun in full is killed by `--step-limit-s` and its
/// rewrite is made by hand; the next run takes the bounded result back from the kept copy.
#[test]
fn a_rerun_that_never_finished_does_not_take_the_finished_result_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let (p, out) = measured_bounded(dir.path());
    let args = dispatch_args(&p);
    let (bounded, bytes) = bounded_measurement(&out);
    let hash = bounded.output_hash.clone().unwrap();
    // A budget that holds the step in full: run again, and killed at its limit.
    let (code, text) =
        optimize(&[&args[..], &["--resume", "--budget-wall-s", "2000", "--step-limit-s", "1"]].concat(), &out);
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("passed its limit of 1 s (--step-limit-s) and was killed"), "{text}");
    let kept = out.join(".kept").join(&hash).join("level3/a/dispatch.json");
    assert_eq!(std::fs::read(&kept).unwrap(), bytes, "kept before the rerun: {}", kept.display());
    // What the killed rerun had written over it.
    std::fs::write(out.join("level3/a/dispatch.json"), "{\"written by\": \"a run that never finished\"}").unwrap();
    let (code, text) = optimize(&[&args[..], &["--resume", "--budget-wall-s", "2000"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains(&format!("measure: takes its bounded result (step {} of run {})", bounded.id, bounded.run)),
        "{text}"
    );
    assert!(text.contains(&format!("measure: reused (step {} of run {})", bounded.id, bounded.run)), "{text}");
    assert_eq!(std::fs::read(out.join("level3/a/dispatch.json")).unwrap(), bytes, "taken back from the kept copy");
    let c = campaign(&out);
    assert!(c["problems"][0]["decision"].is_object(), "decided with it: {c}");
}

/// The same loss where no kept copy was made (a journal of an older binary, session 32's call
/// 12): the decisions file carries the finished step's text, and a run whose journal has the step
/// finished but whose file has changed keeps the carried text and takes it back.
#[test]
fn a_rewritten_result_is_taken_back_from_the_decisions_file() {
    let dir = tempfile::tempdir().unwrap();
    let decisions = dir.path().join("decisions.json");
    let (p, out) = measured_bounded_with(dir.path(), &["--decisions", decisions.to_str().unwrap()]);
    let args = dispatch_args(&p);
    let (bounded, bytes) = bounded_measurement(&out);
    let d: Value = serde_json::from_str(&std::fs::read_to_string(&decisions).unwrap()).unwrap();
    let carried: Vec<&Value> =
        d["steps"].as_array().unwrap_or_else(|| panic!("{d}")).iter().filter(|c| c["step"] == "measure").collect();
    assert_eq!(carried.len(), 1, "{d}");
    assert_eq!(carried[0]["output_hash"].as_str(), bounded.output_hash.as_deref());
    // A rerun in full began, rewrote the file and was killed (journaled as such, no kept copy).
    let store = kforge_store::Store::open(&out.join("journal.db")).unwrap();
    let all = store.journal(None).unwrap();
    let run = store.insert_run(&kforge_store::RunRow { id: 0, ..all.runs[0].clone() }).unwrap();
    let id = store.step_started(run, &bounded.problem, "measure", &bounded.input_hash, 1).unwrap();
    store.step_work_began(id, 1).unwrap();
    drop(store);
    std::fs::write(out.join("level3/a/dispatch.json"), "{}").unwrap();
    let (code, text) = optimize(
        &[&args[..], &["--resume", "--budget-wall-s", "2000", "--decisions", decisions.to_str().unwrap()]].concat(),
        &out,
    );
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("measure: reused (step {} of run {})", bounded.id, bounded.run)), "{text}");
    assert_eq!(std::fs::read(out.join("level3/a/dispatch.json")).unwrap(), bytes, "taken back from the carried text");
    assert!(out.join(".kept").join(bounded.output_hash.unwrap()).join("level3/a/dispatch.json").is_file());
}

/// A measure step that a killed run had left running for longer than the whole wall budget (a
/// level-3 model on a 10-minute device call): the next run does not hold that problem's measure
/// step back forever, it starts it bounded, says so (naming the problem's own killed step, the
/// journal's problem and the run's being the same), passes the deadline to the measure step, and
/// decides the problem inside its budget with what it prepared.
#[test]
fn a_measure_step_killed_past_the_budget_starts_bounded_next_time() {
    let dir = tempfile::tempdir().unwrap();
    let p = problems(dir.path(), &[("level3", "vector_add.py", "a.py")]);
    let out = dir.path().join("o");
    let now = journal_with_a_killed_measure(&p, &out);

    let args = dispatch_args(&p);
    let (code, text) = optimize(&[&args[..], &["--resume", "--budget-wall-s", "200"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("measure: bounded: no measure step fits a --budget-wall-s of 200 in full: one takes at least 1000 s here (this problem's had run that long when its run was killed or it ended bounded); it prepares variants for"),
        "{text}"
    );
    let m: Value = serde_json::from_str(&std::fs::read_to_string(out.join("level3/a/dispatch.json")).unwrap()).unwrap();
    let until = m["prepare_until"].as_f64().expect("the deadline reached the measure step");
    let at = now as f64 / 1e9;
    // 65 % of what was left of 200 s, at least three quarters of it when the step started.
    assert!(until > at + 0.75 * 0.65 * 200.0 && until < at + 0.65 * 200.0 + 30.0, "{until} vs {at}");
    // Its end, 90 % of what was left, came with it (no timing round past the first two after it).
    let end = m["until"].as_f64().expect("the step's end reached the measure step");
    assert!(end > until + 0.75 * 0.25 * 200.0 && end < at + 0.9 * 200.0 + 30.0, "{end} vs {until}");
    let c = campaign(&out);
    assert!(c["problems"][0]["decision"].is_object(), "decided inside its budget: {c}");
    assert_eq!(c["budget"]["held_back"], 0, "{c}");
    // Journaled as bounded: its seconds are not what a full one takes, and the floor stays.
    let j = journal(&out);
    let measured = j.steps.iter().find(|s| s.step == "measure" && s.status == "done").unwrap();
    assert_eq!(measured.outcome.as_deref(), Some("bounded"), "{measured:?}");
}

/// A step's floor outlives its machine in the decisions file: a run that knows a killed measure
/// step's floor writes it into `--decisions` while the problem is undecided; a fresh folder (a new
/// machine: no journal) resumed from that file starts the step bounded at its run's start, naming
/// the floor, instead of late in a run; once the problem is decided the file keeps no floor of it.
#[test]
fn a_steps_floor_travels_with_the_decisions_file_to_a_fresh_machine() {
    let dir = tempfile::tempdir().unwrap();
    let p = problems(dir.path(), &[("level3", "vector_add.py", "a.py")]);
    let out = dir.path().join("o");
    journal_with_a_killed_measure(&p, &out);
    let file = dir.path().join("decisions.json");
    let plain = dispatch_args(&p);
    let args = [&plain[..], &["--decisions", file.to_str().unwrap()]].concat();
    let read = || -> Value { serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap() };
    // Bounded by the killed step's 1000 s, then the GPU budget is spent: undecided, its floor kept.
    let (code, text) =
        optimize(&[&args[..], &["--resume", "--budget-wall-s", "200", "--budget-gpu-s", "0.001"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("measure: bounded: "), "{text}");
    let d = read();
    assert_eq!(d["entries"].as_array().map(Vec::len), Some(0), "{d}");
    let floors = d["floors"].as_array().unwrap_or_else(|| panic!("no floors in {d}"));
    let measure = floors.iter().find(|f| f["step"] == "measure").unwrap_or_else(|| panic!("{d}"));
    assert!(measure["seconds"].as_f64().unwrap() >= 1000.0, "{measure}");
    assert!(measure["question"]["problem"].as_str().unwrap().ends_with("level3/a.py"), "{measure}");
    // The floor alone: the bounded measure step the file carries too is taken out (as a file of
    // before carried steps had none; `a_problems_finished_steps_travel_with_…` takes it).
    let mut d = d;
    assert!(d.as_object_mut().unwrap().remove("steps").is_some(), "the bounded step is carried: {d}");
    std::fs::write(&file, d.to_string()).unwrap();

    // A new machine: an empty folder, the file alone.
    let fresh = dir.path().join("fresh");
    let (code, text) = optimize(&[&args[..], &["--resume", "--budget-wall-s", "200"]].concat(), &fresh);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains(
            "measure: bounded: no measure step fits a --budget-wall-s of 200 in full: one takes at least 1000 s here"
        ),
        "{text}"
    );
    let d = read();
    assert_eq!(d["entries"].as_array().map(Vec::len), Some(1), "decided: {d}");
    assert!(d.get("floors").is_none(), "a decided problem keeps no floor: {d}");
}

/// A problem's finished steps outlive their machine in the decisions file: a run that measured
/// an undecided problem writes its measure step (input hash, output file's text) into
/// `--decisions`; a fresh folder (a new machine, or a state pack lost with one) resumed from that
/// file takes the measurement as its own journal's, runs only what is left, and decides the
/// problem with it; the decided problem's steps leave the file.
#[test]
fn a_problems_finished_steps_travel_with_the_decisions_file_to_a_fresh_machine() {
    let dir = tempfile::tempdir().unwrap();
    let p = problems(dir.path(), &[("level1", "vector_add.py", "a.py")]);
    let (out, file) = (dir.path().join("o"), dir.path().join("decisions.json"));
    let args = [&dispatch_args(&p)[..], &["--decisions", file.to_str().unwrap(), "--resume"]].concat();
    let read = || -> Value { serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap() };
    // Measured, then the GPU budget is spent: undecided, its measure step carried.
    let (code, text) = optimize(&[&args[..], &["--budget-gpu-s", "0.001"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    let d = read();
    assert_eq!(d["entries"].as_array().map(Vec::len), Some(0), "{d}");
    let steps = d["steps"].as_array().unwrap_or_else(|| panic!("no steps in {d}"));
    let measure = steps.iter().find(|c| c["step"] == "measure").unwrap_or_else(|| panic!("{d}"));
    let measured = std::fs::read_to_string(out.join("level1/a/dispatch.json")).unwrap();
    assert_eq!(measure["text"].as_str(), Some(measured.as_str()));
    assert_eq!(measure["output"].as_str(), Some("level1/a/dispatch.json"));
    let hash = measure["input_hash"].as_str().unwrap().to_string();

    // Decided again on a new machine (`--redecide`): nothing carried is taken, the step runs.
    let (file2, again) = (dir.path().join("decisions2.json"), dir.path().join("again"));
    std::fs::copy(&file, &file2).unwrap();
    let redecide = [&dispatch_args(&p)[..], &["--decisions", file2.to_str().unwrap(), "--resume"]].concat();
    let (code, text) =
        optimize(&[&redecide[..], &["--redecide", "level1/a*", "--budget-gpu-s", "0.001"]].concat(), &again);
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains("taken from the decisions file") && text.contains("measure…"), "{text}");

    // A new machine: an empty folder, the file alone. The measure step is not run again.
    let fresh = dir.path().join("fresh");
    let (code, text) = optimize(&args, &fresh);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("finished step(s) taken from the decisions file"), "{text}");
    assert!(!text.contains("measure…"), "measured again: {text}");
    let j = journal(&fresh);
    let m: Vec<_> = j.steps.iter().filter(|s| s.step == "measure").collect();
    assert!(!m.is_empty() && m.iter().all(|s| s.input_hash == hash && s.status != "running"), "{m:?}");
    assert_eq!(std::fs::read_to_string(fresh.join("level1/a/dispatch.json")).unwrap(), measured);
    assert_eq!(j.decisions.len(), 1, "decided with the carried measurement");
    let d = read();
    assert_eq!(d["entries"].as_array().map(Vec::len), Some(1), "{d}");
    assert!(d.get("steps").is_none(), "a decided problem's steps leave the file: {d}");
}

/// Two identical problems (the same source) in one run, in flight at once (`--jobs 2`): measured
/// and verified once, the other waits and takes the first's outputs. Two different problems with
/// `--jobs 2` run side by side, and the journal and summary stay whole.
#[test]
fn identical_candidates_are_measured_once_and_jobs_run_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let p = problems(dir.path(), &[("level1", "vector_add.py", "a.py"), ("level1", "vector_add.py", "b.py")]);
    let out = dir.path().join("o");
    let args = [p.to_str().unwrap(), "--device", "cpu", "--baseline", "default", "--rounds", "2", "--jobs", "2"];
    let (code, text) = optimize(&args, &out);
    assert_eq!(code, Some(0), "{text}");
    let j = journal(&out);
    let of = |problem: &str| -> Vec<(&str, &str)> {
        j.steps.iter().filter(|s| s.problem.ends_with(problem)).map(|s| (s.step.as_str(), s.status.as_str())).collect()
    };
    // Whichever started first measured; the other reused (result files may differ after a fallback).
    let (first, second) = if of("a.py")[0].1 == "done" { (of("a.py"), of("b.py")) } else { (of("b.py"), of("a.py")) };
    assert_eq!((first[0], second[0]), (("measure", "done"), ("measure", "reused")), "{first:?} {second:?}");
    // Its result step runs again when the first's fallback rewrote the file before it could take
    // it (the file it writes names its own problem, so then its verification runs too); when it
    // took the file, one of the two verify steps ran (whichever reached it first) and the other
    // took its verdict (none ran when nothing won).
    let result_ran = second.contains(&("result", "done"));
    let verified = [&first, &second].iter().flat_map(|s| s.iter()).filter(|s| **s == ("verify", "done")).count();
    assert!(verified <= if result_ran { 2 } else { 1 }, "verified at most once per result file: {first:?} {second:?}");
    assert!(
        second.iter().all(|(step, status)| *status == "reused" || *step == "result" || *step == "verify"),
        "{second:?}"
    );
    assert_eq!(
        std::fs::read(out.join("level1/a/dispatch.json")).unwrap(),
        std::fs::read(out.join("level1/b/dispatch.json")).unwrap()
    );
    assert_eq!(j.candidates.iter().filter(|c| c.problem.ends_with("a.py")).count(), j.candidates.len() / 2);
    let hashes = |problem: &str| -> Vec<String> {
        j.candidates.iter().filter(|c| c.problem.ends_with(problem)).map(|c| c.content_hash.clone()).collect()
    };
    assert_eq!(hashes("a.py"), hashes("b.py"), "identical candidates, one hash");

    // Side by side: the second problem's measurement starts before the first's ends.
    let out2 = dir.path().join("o2");
    let p2 =
        problems(&dir.path().join("two"), &[("level1", "vector_add.py", "a.py"), ("level2", "row_softmax.py", "b.py")]);
    let (code, text) = optimize(
        &[p2.to_str().unwrap(), "--device", "cpu", "--baseline", "default", "--rounds", "2", "--jobs", "2"],
        &out2,
    );
    assert_eq!(code, Some(0), "{text}");
    let j = journal(&out2);
    let measure = |problem: &str| j.steps.iter().find(|s| s.step == "measure" && s.problem.ends_with(problem)).unwrap();
    let (a, b) = (measure("a.py"), measure("b.py"));
    assert!(a.started_ns < b.finished_ns.unwrap() && b.started_ns < a.finished_ns.unwrap(), "{a:?} {b:?}");
    assert_eq!(j.decisions.len(), 2);
    assert!(j.steps.iter().all(|s| s.status == "done"), "{:?}", j.steps);
    let c = campaign(&out2);
    let names: Vec<&str> = c["problems"].as_array().unwrap().iter().map(|p| p["problem"].as_str().unwrap()).collect();
    assert_eq!(names, ["level1/a.py", "level2/b.py"], "in order, whatever finished first");
}

/// With `--daemon` the measure step is a daemon job: its GPU-seconds are its time inside the
/// daemon's regions (no more than the step's wall seconds), journaled as such.
#[test]
fn through_the_daemon_the_measurement_counts_its_region_time() {
    let mut d = common::TestDaemon::start(&[]);
    let out = d.path("o");
    let args = ["tests/candidates/problems/vector_add.py", "--device", "cpu", "--baseline", "default", "--rounds", "2"];
    let o = command(&[&args[..], &["--daemon"]].concat(), &out).env("KFORGE_SOCKET", &d.socket).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{text}");
    let j = journal(&out);
    let m = j.steps.iter().find(|s| s.step == "measure").unwrap();
    assert_eq!(m.gpu_seconds_kind.as_deref(), Some("region"), "{m:?}");
    let (gpu, wall) = (m.gpu_seconds.unwrap(), m.seconds.unwrap());
    assert!(gpu > 0.0 && gpu <= wall, "region {gpu} s within the step's {wall} s");
    if let Some(v) = j.steps.iter().find(|s| s.step == "verify") {
        assert_eq!(v.gpu_seconds_kind.as_deref(), Some("region"), "{v:?}");
    }
    // Each step's work is journaled as begun when its job started (the verify step's, when a
    // winner was verified, from the line `kforge verify` writes then), never before the step itself.
    for s in &j.steps {
        assert!(matches!(s.work, kforge_store::WorkStart::Since(ns) if ns >= s.started_ns), "{s:?}");
    }
    if j.steps.iter().any(|s| s.step == "verify") {
        let log = std::fs::read_to_string(out.join("logs/verify.log")).unwrap();
        assert!(log.contains("kforge verify: the daemon started job "), "{log}");
    }
    let jobs = d.report().jobs;
    assert!(jobs
        .iter()
        .any(|j| j.label.as_deref() == Some("optimize:dispatch:tests/candidates/problems/vector_add.py")));
    d.shutdown();
}

/// `--gpu-memory GIB` with `--daemon`: the measurement's and the verification's jobs declare it,
/// so the daemon admits by it (a quarter of the device otherwise); refused without the daemon
/// and when not a positive size.
#[test]
fn through_the_daemon_the_steps_declare_their_gpu_memory() {
    const G: u64 = 1 << 30;
    let dir = tempfile::tempdir().unwrap();
    let mem = dir.path().join("memory.json");
    common::write_memory(&mem, 80, &[]);
    let mut d = common::TestDaemon::start(&["--debug-gpu-memory", mem.to_str().unwrap()]);
    let out = d.path("o");
    // A problem the rewrite agent wins by far (diag-matmul): a result to verify, whatever the noise.
    let args = diag_scale_args();
    let o = command(&[&args[..], &["--daemon", "--gpu-memory", "2"]].concat(), &out)
        .env("KFORGE_SOCKET", &d.socket)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{text}");
    let rep = d.report();
    // Each ended job of the step declared it (a job still running, e.g. a warm worker the daemon
    // keeps, has no row until it ends).
    let declared = |prefix: &str| {
        let ended: Vec<_> = rep
            .jobs
            .iter()
            .filter(|j| j.label.as_deref().is_some_and(|l| l.starts_with(prefix)) && j.ended_ns.is_some())
            .collect();
        assert!(!ended.is_empty(), "no ended {prefix} job: {:?}", rep.jobs);
        let rows: Vec<_> = ended
            .iter()
            .map(|job| {
                let m = rep.job_memory.iter().find(|m| m.job == job.id);
                let m = m.unwrap_or_else(|| panic!("no memory row of {job:?}: {:?}", rep.job_memory));
                (m.expected_bytes, m.source.clone())
            })
            .collect();
        assert!(rows.windows(2).all(|w| w[0] == w[1]), "{rows:?}");
        rows[0].clone()
    };
    assert_eq!(declared("optimize:dispatch:"), (Some(2 * G), Some("declared".into())));
    assert_eq!(declared("verify:"), (Some(2 * G), Some("declared".into())));
    d.shutdown();
    for (extra, why) in [
        (vec!["--gpu-memory", "2"], "--daemon"),
        (vec!["--daemon", "--gpu-memory", "0"], "--gpu-memory must be a positive number of GiB"),
    ] {
        let (code, text) = optimize(&[&args[..], &extra[..]].concat(), &dir.path().join("bad"));
        assert_eq!(code, Some(2), "{extra:?}: {text}");
        assert!(text.contains(why), "{extra:?}: {text}");
    }
}

/// Without `--gpu-memory`, a step's job declares what the same problem's step used in an earlier
/// run: the daemon tells each job's client its peak, the journal keeps it, and a later run (a
/// fresh daemon on a new machine, in a device campaign) declares it with its margin instead of
/// being admitted at the daemon's default share.
#[test]
fn a_later_run_declares_the_gpu_memory_an_earlier_run_used() {
    const G: u64 = 1 << 30;
    let dir = tempfile::tempdir().unwrap();
    // A problem the rewrite agent wins by far (diag-matmul), so that its result is verified.
    let p = problems(dir.path(), &[("level1", "diag_scale.py", "a.py")]);
    let mem = dir.path().join("memory.json");
    let file = mem.clone();
    let write = move |pids: &[u32]| common::write_memory(&file, 70, &pids.iter().map(|&p| (p, 3)).collect::<Vec<_>>());
    write(&[]);
    let mut d = common::TestDaemon::start(&["--debug-gpu-memory", mem.to_str().unwrap()]);
    // The fake sampler's processes: every running job's at 3 GiB, while the runs go on.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (stop, socket) = (stop.clone(), d.socket.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok(mut c) = kforge_client::Client::connect(&socket) else { break };
                let Ok(kforge_proto::Reply::Status(st)) = c.request(&kforge_proto::Request::Status) else { break };
                write(&st.jobs.iter().filter_map(|j| j.pid).collect::<Vec<_>>());
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        })
    };
    let out = d.path("o");
    let args = [
        p.to_str().unwrap(),
        "--device",
        "cpu",
        "--baseline",
        "default",
        "--agents",
        "dispatch,rewrite",
        "--rounds",
        "2",
    ];
    let run = |extra: &[&str]| {
        let o = command(&[&args[..], &["--daemon"], extra].concat(), &out).env("KFORGE_SOCKET", &d.socket).output();
        let o = o.unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert_eq!(o.status.code(), Some(0), "{text}");
    };
    run(&[]);
    run(&["--resume", "--redecide", "level1/a*"]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    watcher.join().unwrap();
    let rep = d.report();
    let margin = 3 * G + 3 * G / 4 + (512 << 20);
    // The verify step's job (`kforge verify --daemon`): its peak, from the verdict, journaled
    // (the second run takes the first's verification of the same result).
    let journal = kforge_store::Store::open(&out.join("journal.db")).unwrap();
    let problem = p.join("level1/a.py").display().to_string();
    assert_eq!(journal.step_memory(&problem, "verify:default").unwrap(), Some(3 * G));
    // The measure step's job (a Python step), run in both.
    let prefix = "optimize:dispatch:";
    let rows: Vec<(Option<u64>, Option<String>, u64)> = rep
        .jobs
        .iter()
        .filter(|j| j.label.as_deref().is_some_and(|l| l.starts_with(prefix)))
        .filter_map(|j| rep.job_memory.iter().find(|m| m.job == j.id))
        .map(|m| (m.expected_bytes, m.source.clone(), m.peak_bytes))
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].2, 3 * G, "the first run's job was seen at its use: {rows:?}");
    assert_ne!(rows[0].1.as_deref(), Some("declared"), "nothing to declare yet: {rows:?}");
    assert_eq!((rows[1].0, rows[1].1.as_deref()), (Some(margin), Some("declared")), "{rows:?}");
    d.shutdown();
}

/// `kforge optimize`'s arguments for diag_scale.py (a diag-matmul, which the rewrite agent wins by
/// far) on the CPU against default mode. Five timing rounds: with two, a loaded CI machine's
/// spread made the interval (a t of 12.7 for one degree of freedom) reach below the noise floor,
/// and the winner fell back.
fn diag_scale_args() -> [&'static str; 9] {
    let problem = "tests/candidates/problems/diag_scale.py";
    [problem, "--agents", "dispatch,rewrite", "--device", "cpu", "--baseline", "default", "--rounds", "5"]
}

/// The rewrite agent beside the dispatch agent: a rule fires on diag_scale.py (diag-matmul), its
/// variants `eager~rewrite` and `default~rewrite` are measured in the same rounds, the report
/// names the rules; a rewrite winner is credited to the rewrite agent and its result file (the
/// rewritten forward) passed verification under the policy beside it.
#[test]
fn the_rewrite_agent_is_measured_and_credited_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let args = diag_scale_args();
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
            // The workspace's one commit: the improvement's files, naming problem, variant, agent.
            let log = git(&out, &["log", "--format=%s"]);
            assert_eq!(log.lines().count(), 1, "{log}");
            assert!(log.contains(&format!("diag_scale.py: {mode} (rewrite) ")), "{log}");
            let files = git(&out, &["show", "--name-only", "--format="]);
            assert!(files.lines().any(|l| l == "model_new.py") && files.lines().any(|l| l == "policy.toml"), "{files}");
        }
        (Some("improved"), Some(mode)) => assert_eq!(r["decision"]["agent"], "dispatch", "{mode}"),
        (Some("fallback"), _) => assert!(result.contains("mode='default'"), "{result}"),
        k => panic!("decision {k:?}: {r}"),
    }
}

/// A forward of two graphs (a `torch.compiler.disable` hook between them): the dispatch agent's
/// per-graph search runs in the measure step, says what it found in the table and the report,
/// journals every plan it timed (each once, the dispatch agent's), and whatever it ends with is
/// verified before it counts.
#[test]
fn a_forward_of_two_graphs_is_searched_per_graph_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let (out, html) = (dir.path().join("o"), dir.path().join("report.html"));
    let args = [
        "python/tests/fixtures/graphs/linear_hook_softmax.py",
        "--agents",
        "dispatch",
        "--device",
        "cpu",
        "--baseline",
        "default",
        "--rounds",
        "2",
        "--html",
        html.to_str().unwrap(),
    ];
    let (code, text) = optimize(&args, &out);
    assert_eq!(code, Some(0), "{text}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<p>per graph: 2 graphs (breaks: "), "{page}");
    assert!(page.contains("<h2>What the result changes</h2>") && page.contains("<span class=\"del\">- class Model("));
    let r: Value = serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let g = &r["measurement"]["graphs"];
    assert_eq!(g["count"], 2, "{g}");
    assert!(g["breaks"][0].as_str().unwrap().contains("linear_hook_softmax.py:"), "{g}");
    assert!(text.contains("per graph: 2 graphs (breaks: "), "{text}");
    let timed: Vec<String> = g["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|round| round["modes"].as_object().unwrap().keys().cloned().collect::<Vec<_>>())
        .filter(|v| v.starts_with("graphs:"))
        .collect();
    assert!(!timed.is_empty(), "{g}");
    let j = journal(&out);
    let mut plans: Vec<&str> =
        j.candidates.iter().filter(|c| c.variant.starts_with("graphs:")).map(|c| c.variant.as_str()).collect();
    assert!(j.candidates.iter().filter(|c| c.variant.starts_with("graphs:")).all(|c| c.agent == "dispatch"));
    let journaled = plans.len();
    plans.sort();
    plans.dedup();
    assert_eq!(plans.len(), journaled, "each plan journaled once: {plans:?}");
    assert!(timed.iter().all(|v| plans.contains(&v.as_str())), "{timed:?} against {plans:?}");
    let result = std::fs::read_to_string(out.join("model_new.py")).unwrap();
    match (r["decision"]["kind"].as_str(), r["decision"]["mode"].as_str()) {
        (Some("improved"), Some(mode)) => {
            assert_eq!(
                (r["decision"]["agent"].as_str(), r["verified"].as_str()),
                (Some("dispatch"), Some("passed-without-performance"))
            );
            assert_eq!(result.contains("def routed_backend(plan):"), mode.starts_with("graphs:"), "{result}");
        }
        (Some("fallback"), _) => assert!(result.contains("mode='default'"), "{result}"),
        k => panic!("decision {k:?}: {r}"),
    }
}

/// The beam's second round on the CPU (its two knobs: freezing, aggressive-fusion): when both
/// measured faster than the baseline alone, their combination is timed beside them in a second
/// measurement (`beam.json`, a journaled `beam` step) and the decision comes from it; otherwise
/// the search stops after round 1 and says why. Either way the report names what happened.
/// A width of 1, or a beam without the inductor agent, is refused before anything runs.
#[test]
fn the_beam_combines_the_knobs_that_helped_or_says_why_not() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let args = ["tests/candidates/problems/row_softmax.py", "--device", "cpu", "--baseline", "default"];
    let beam = [&args[..], &["--agents", "dispatch,inductor", "--rounds", "2", "--beam-width", "2"]].concat();
    let (code, text) = optimize(&beam, &out);
    assert_eq!(code, Some(0), "{text}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(r["beam_width"], 2);
    let first = &r["measurement"]["modes"];
    // A knob whose compile generated the baseline's code again is not timed (same_code_as).
    for v in ["default+freezing", "default+aggressive-fusion"] {
        let same = r["measurement"]["prepared"][v]["same_code_as"].as_str();
        assert_eq!(first[v]["speedup"].is_f64(), same.is_none(), "{v}: timed or named the same code: {r}");
    }
    let helped = ["default+freezing", "default+aggressive-fusion"]
        .iter()
        .filter(|v| first[**v]["speedup"].as_f64().is_some_and(|s| s > 1.0))
        .count();
    let steps: Vec<String> = journal(&out).steps.iter().map(|s| s.step.clone()).collect();
    if helped == 2 {
        let second = &r["beam"]["measurement"]["modes"];
        let combined = second.as_object().unwrap().keys().find(|k| k.matches('+').count() == 2);
        assert!(combined.is_some(), "the combination measured: {second}");
        assert!(out.join("beam.json").is_file() && steps.contains(&"beam".to_string()), "{steps:?}");
        assert!(text.contains("beam round 2"), "{text}");
    } else {
        let why = r["beam"]["stopped"].as_str().unwrap();
        assert!(why.contains(&format!("{helped} knob(s) measured faster than default alone")), "{why}");
        assert!(!out.join("beam.json").exists() && !steps.contains(&"beam".to_string()), "{steps:?}");
        assert!(text.contains("beam: stopped after round 1"), "{text}");
    }
    for (extra, why) in [
        (&["--agents", "dispatch,inductor", "--beam-width", "1"][..], "--beam-width must be 0"),
        (&["--agents", "dispatch", "--beam-width", "3"][..], "add inductor to --agents"),
    ] {
        let (code, text) = optimize(&[&args[..], extra].concat(), &dir.path().join("bad"));
        assert_eq!(code, Some(2), "{text}");
        assert!(text.contains(why), "{text}");
    }
}

/// The config agent beside the dispatch agent on the CPU: its step is skipped with the reason
/// (Inductor's CPU backend generates C++, no Triton kernels) in the progress and the report, the
/// decision is the dispatch family's; the config agent alone on the CPU is refused before
/// anything runs (nothing could be measured).
#[test]
fn the_config_agent_is_skipped_on_the_cpu_and_alone_there_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let problem = "tests/candidates/problems/row_softmax.py";
    let args = [problem, "--agents", "dispatch,config", "--device", "cpu", "--baseline", "default", "--rounds", "2"];
    let (code, text) = optimize(&args, &out);
    assert_eq!(code, Some(0), "{text}");
    let why = "needs a GPU: Inductor's CPU backend generates C++, no Triton kernels";
    assert!(text.contains(&format!("row_softmax.py: config: skipped: {why}")), "{text}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(r["agents"], serde_json::json!(["dispatch", "config"]));
    assert_eq!(r["config"]["skipped"], format!("config: {why}"), "{r}");
    assert!(r["config"].get("measurement").is_none() && !out.join("config").exists(), "nothing of config ran");
    match r["decision"]["kind"].as_str() {
        Some("improved") => assert_eq!(r["decision"]["agent"], "dispatch", "{r}"),
        Some("fallback") => {
            let reason = r["decision"]["reason"].as_str().unwrap();
            assert!(reason.ends_with(&format!("; config: {why}")), "{reason}");
        }
        k => panic!("decision {k:?}: {r}"),
    }
    // The journal: no config step, no config candidate.
    let j = journal(&out);
    assert!(j.steps.iter().all(|s| s.step != "config" && s.step != "config-verify"), "{:?}", j.steps);
    assert!(j.candidates.iter().all(|c| c.agent == "dispatch"), "{:?}", j.candidates);
    // Alone on the CPU the config agent measures nothing: refused, nothing run.
    let alone = dir.path().join("alone");
    let (code, text) = optimize(&[problem, "--agents", "config", "--device", "cpu"], &alone);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains(&format!("--agents config: config: {why}; on the CPU nothing here can be measured")),
        "{text}"
    );
    assert!(!alone.join("journal.db").exists() && !alone.join("dispatch.json").exists());
}

/// A python3 that stands in for the GPU agents' processes on a machine without one: the
/// dispatch agent measures nothing but the baseline; the config agent's measurement is the
/// realistic result in `FAKE_CONFIG_JSON`, its result file written by config.py's own
/// `write_result`. Everything else runs in python3.
const FAKE_GPU_PYTHON: &str = r#"#!/usr/bin/env python3
import json, os, sys

argv = sys.argv[1:]
def arg(flag):
    return argv[argv.index(flag) + 1]
if argv[:2] == ["-m", "kforge.optimize.dispatch"]:
    b = arg("--baseline")
    assert arg("--profile-baseline") == "1", argv  # the config agent on a GPU: the ceiling first
    m = {"baseline": b, "winner": b, "fallback": True, "modes": {}, "noise_floor": None, "prepared": {b: {"ok": True}}}
    if "FAKE_SHARE" in os.environ:
        m["baseline_profile"] = {"triton_share": float(os.environ["FAKE_SHARE"])}
    json.dump(m, open(arg("--out"), "w"))
elif argv[:2] == ["-m", "kforge.optimize.config"]:
    from kforge.optimize.config import write_result
    measured = json.load(open(os.environ["FAKE_CONFIG_JSON"]))
    # The dispatch family kept its baseline: the config agent has only the baseline to beat.
    assert arg("--device") == "cuda" and arg("--rounds") == "2" and arg("--beat") == "1.0000", argv
    write_result(argv[2], measured, arg("--result-dir"))
    json.dump(measured, open(arg("--out"), "w"))
else:
    os.execvp("python3", ["python3"] + argv)
"#;

/// The config step on a GPU (`--device 0`, its processes stood in for by `FAKE_GPU_PYTHON`): the
/// config agent runs in its own journaled step with the baseline, size, rounds and result folder
/// passed, its result (`config/`) is verified into its own verdict (`config/verdict.json`; here
/// `could-not-run`: verify sees no GPU), its candidate journaled with that verdict, the report and
/// table show its per-kernel choices and model speedup; unverified, the baseline is kept; resumed,
/// its steps are reused; a config step that fails is its family's fallback, not the problem's.
#[test]
fn on_a_gpu_the_config_agent_runs_in_its_own_step_and_is_verified() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("python3-fake-gpu");
    std::fs::write(&fake, FAKE_GPU_PYTHON).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = dir.path().join("o");
    let args = [
        "tests/candidates/problems/row_softmax.py",
        "--agents",
        "dispatch,config",
        "--device",
        "0",
        "--rounds",
        "2",
        "--python",
        fake.to_str().unwrap(),
    ];
    let o = command(&args, &out)
        .env("FAKE_CONFIG_JSON", repo().join("crates/kforge-optimize/testdata/config.json"))
        .env("CUDA_VISIBLE_DEVICES", "") // verify sees no GPU wherever this runs: could-not-run
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{text}");
    for f in ["config/config.json", "config/model_new.py", "config/policy.toml", "config/verdict.json"] {
        assert!(out.join(f).is_file(), "{f}: {text}");
    }
    let pinned = std::fs::read_to_string(out.join("config/model_new.py")).unwrap();
    assert!(pinned.contains("autotune_lookup_table") && pinned.contains("(agent config)"), "{pinned}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let c = &r["config"];
    assert_eq!((c["measurement"]["winner"].as_str(), c["verified"].as_str()), (Some("config"), Some("could-not-run")));
    assert_eq!(c["decision"]["kind"], "fallback");
    assert_eq!(r["decision"]["kind"], "fallback", "{r}");
    let reason = r["decision"]["reason"].as_str().unwrap();
    assert!(reason.ends_with("; config measured 1.210x but its result file was could-not-run"), "{reason}");
    // The result is the baseline's, not the unverified config result.
    let result = std::fs::read_to_string(out.join("model_new.py")).unwrap();
    assert!(result.contains("mode='max-autotune'") && !result.contains("autotune_lookup_table"), "{result}");
    for want in [
        "config… ",
        "config done in",
        "config-verify done in",
        "triton_red_fused_native_layer_norm_0",
        "R0_BLOCK=2048 XBLOCK=1 warps=16 stages=1 -> R0_BLOCK=4096 XBLOCK=1 warps=8 stages=1 (1.310x)",
        "config (model)",
        "config result: could-not-run",
    ] {
        assert!(text.contains(want), "{want} in {text}");
    }
    // The journal: the config steps on the device, the config candidate with its verdict.
    let j = journal(&out);
    let step = |name: &str| j.steps.iter().find(|s| s.step == name).unwrap_or_else(|| panic!("{name}: {:?}", j.steps));
    assert_eq!((step("config").status.as_str(), step("config").gpu_seconds_kind.as_deref()), ("done", Some("wall")));
    assert_eq!(step("config").output.as_deref(), Some("config/config.json"), "relative to the output folder");
    assert_eq!(step("config-verify").outcome.as_deref(), Some("could-not-run"));
    assert!(j.steps.iter().all(|s| s.step != "verify"), "the dispatch family had no winner to verify");
    let cand = j.candidates.iter().find(|c| c.agent == "config").unwrap();
    assert_eq!(
        (cand.variant.as_str(), cand.verdict.as_deref(), cand.speedup),
        ("config", Some("could-not-run"), Some(1.21))
    );
    // Resumed without its report: the config steps are taken from the journal (same inputs).
    std::fs::remove_file(out.join("report.json")).unwrap();
    let o = command(&[&args[..], &["--resume"]].concat(), &out)
        .env("FAKE_CONFIG_JSON", repo().join("crates/kforge-optimize/testdata/config.json"))
        .env("CUDA_VISIBLE_DEVICES", "") // verify sees no GPU wherever this runs: could-not-run
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(text.contains("config: reused") && text.contains("config-verify: reused"), "{text}");
    let again: Value = serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(again["config"], r["config"]);
    // A config step that fails is its family's fallback, journaled as failed; the problem is
    // still decided (the dispatch family's result stands).
    let broken = dir.path().join("broken");
    let o = command(&args, &broken)
        .env("FAKE_CONFIG_JSON", dir.path().join("no-such.json"))
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{text}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(broken.join("report.json")).unwrap()).unwrap();
    let error = r["config"]["error"].as_str().unwrap();
    assert!(error.starts_with("the config step ended with") && error.contains("FileNotFoundError"), "{error}");
    assert!(r["decision"]["reason"].as_str().unwrap().contains("; config: failed: the config step ended"), "{r}");
    assert!(text.contains("config: failed: the config step ended"), "{text}");
    let failed = journal(&broken).steps.into_iter().find(|s| s.step == "config").unwrap();
    assert_eq!(failed.status, "failed", "{failed:?}");
    // The baseline's profile says its Triton kernels take no device time: its Amdahl ceiling
    // (1.0) cannot beat even the baseline, so the config step does not run at all.
    let none = dir.path().join("no-triton");
    let o = command(&args, &none)
        .env("FAKE_CONFIG_JSON", dir.path().join("no-such.json")) // would fail, were it run
        .env("FAKE_SHARE", "0.0")
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(text.contains("config: skipped: its Amdahl ceiling is 1.000x"), "{text}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(none.join("report.json")).unwrap()).unwrap();
    assert!(r["config"]["skipped"].as_str().unwrap().contains("not above the 1.000x"), "{r}");
    assert!(journal(&none).steps.iter().all(|s| s.step != "config") && !none.join("config/config.json").exists());
}

/// `--compile-workers 1`: the measure step starts a compile worker, which warms the variants the
/// step then prepares (`compile_workers` and each variant's `warmed` in `dispatch.json`). The
/// workers are not part of the step's input: a run without them hashes the step the same, so a
/// resumed campaign given another `--jobs` (another default) reuses its finished steps.
#[test]
fn compile_workers_reach_the_measure_step_and_are_not_part_of_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "tests/candidates/problems/vector_add.py",
        "--device",
        "cpu",
        "--baseline",
        "default",
        "--agents",
        "dispatch,inductor",
        "--rounds",
        "2",
    ];
    let measured = |workers: &str, out: &Path| -> (Value, String) {
        let (code, text) = optimize(&[&args[..], &["--compile-workers", workers]].concat(), out);
        assert_eq!(code, Some(0), "{text}");
        let m: Value = serde_json::from_str(&std::fs::read_to_string(out.join("dispatch.json")).unwrap()).unwrap();
        let j = journal(out);
        let step = j.steps.iter().find(|s| s.step == "measure").expect("a measure step");
        (m, step.input_hash.clone())
    };
    let (with, hash_with) = measured("1", &dir.path().join("with"));
    assert_eq!(with["compile_workers"], serde_json::json!({"asked": 1, "started": 1}), "{with}");
    let warmed: Vec<&String> = with["prepared"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, p)| p["warmed"]["ok"] == true && p["warmed"]["cache_hit"] == true)
        .map(|(v, _)| v)
        .collect();
    assert!(!warmed.is_empty(), "a variant warmed and loaded from the cache: {with}");
    let (without, hash_without) = measured("0", &dir.path().join("without"));
    assert!(without.get("compile_workers").is_none(), "{without}");
    assert_eq!(hash_with, hash_without, "the workers are not the step's input");
}

/// `--redecide`: a decided problem decided again (its decisions-file entry removed at the start,
/// its earlier runs' steps and decision not taken), the others resumed; a redecision a budget cut
/// short is continued by a later `--resume` without the flag, from its own steps only; a pattern
/// that matches nothing, or the flag without `--resume`, is named.
#[test]
fn a_decided_problem_is_decided_again_with_redecide_and_a_later_resume_continues_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = problems(dir.path(), &[("level1", "vector_add.py", "a.py"), ("level1", "row_softmax.py", "b.py")]);
    let (out, decisions) = (dir.path().join("o"), dir.path().join("decisions.json"));
    let args = dispatch_args(&p);
    let with_file = [&args[..], &["--decisions", decisions.to_str().unwrap()]].concat();
    let (code, text) = optimize(&with_file, &out);
    assert_eq!(code, Some(0), "{text}");
    let decided_at = |problem: &str| -> Option<u64> {
        let d: Value = serde_json::from_str(&std::fs::read_to_string(&decisions).unwrap()).unwrap();
        d["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["report"]["problem"].as_str().unwrap().ends_with(problem))
            .map(|e| e["decided_unix_s"].as_u64().unwrap())
    };
    assert!(decided_at("a.py").is_some() && decided_at("b.py").is_some());

    // Cut short by a GPU-seconds budget after its measure step: the entry is gone from the file
    // at the start, the measure step ran again (not reused from run 1), b was resumed.
    let redo = [&with_file[..], &["--resume", "--redecide", "level1/a*", "--budget-gpu-s", "0.001"]].concat();
    let (code, text) = optimize(&redo, &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("a.py: its entry left the decisions file"), "{text}");
    assert!(text.contains("a.py: decided again (--redecide)"), "{text}");
    assert_eq!(decided_at("a.py"), None, "removed, not yet decided again: {text}");
    let j = journal(&out);
    let run2 = j.runs.last().unwrap().id;
    let measured: Vec<(u64, &str)> = j
        .steps
        .iter()
        .filter(|s| s.problem.ends_with("a.py") && s.step == "measure")
        .map(|s| (s.run, s.status.as_str()))
        .collect();
    assert_eq!(measured.last(), Some(&(run2, "done")), "measured again, not reused: {measured:?}");

    // A later --resume continues the redecision, with the flag again (harmless while it is
    // undecided) or without it: its own measure step is taken, run 1's decision is not.
    let again = [&with_file[..], &["--resume", "--redecide", "level1/a*"]].concat();
    let (code, text) = optimize(&again, &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("a.py: decided again (--redecide): run {run2}'s redecision goes on")), "{text}");
    assert!(!text.contains("a.py: resumed"), "run 1's decision is not taken: {text}");
    let j = journal(&out);
    let run3 = j.runs.last().unwrap().id;
    let reused = j.steps.iter().find(|s| s.run == run3 && s.problem.ends_with("a.py") && s.step == "measure").unwrap();
    let from = j.steps.iter().find(|s| Some(s.id) == reused.reused_from).unwrap();
    assert_eq!((reused.status.as_str(), from.run), ("reused", run2), "its own redecision's step: {reused:?}");
    assert!(j.decisions.iter().any(|d| d.run == run3 && d.question.problem.ends_with("a.py")), "decided in run 3");
    assert!(decided_at("a.py").is_some(), "the new decision is in the file");
    let (code, text) = optimize(&[&with_file[..], &["--resume"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("a.py: resumed: its decision is in the journal"), "now decided: {text}");
    // Once decided, the flag starts another redecision; a run that starts no step of it (a
    // spent budget) journals none, and its problem keeps its decision, in the file too.
    let (code, text) = optimize(&[&again[..], &["--budget-wall-s", "0.001"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(decided_at("a.py").is_some(), "still in the file: {text}");
    let (code, text) = optimize(&[&with_file[..], &["--resume"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("a.py: resumed: its decision is in the journal"), "no redecision journaled: {text}");

    for (extra, why) in [
        (vec!["--resume", "--redecide", "level9/*"], "--redecide level9/*: matches none of the problems of"),
        (vec!["--redecide", "level1/a*"], "--resume"),
    ] {
        let (code, text) = optimize(&[&with_file[..], &extra[..]].concat(), &out);
        assert_eq!(code, Some(2), "{extra:?}: {text}");
        assert!(text.contains(why), "{extra:?}: {text}");
    }
}

/// With `--resume`, a measured problem whose beam step ended bounded after longer than the whole
/// wall budget (its own floor: it starts only at a run's start) starts before the others, so that
/// it is not reached late and held back again.
#[test]
fn a_resumed_campaign_starts_a_problem_whose_beam_starts_only_at_a_runs_start_first() {
    let dir = tempfile::tempdir().unwrap();
    let p = problems(dir.path(), &[("level1", "vector_add.py", "a.py"), ("level1", "row_softmax.py", "b.py")]);
    let out = dir.path().join("o");
    let args = dispatch_args(&p);
    // Both measured side by side, then the GPU-seconds budget is spent.
    let (code, text) = optimize(&[&args[..], &["--jobs", "2", "--budget-gpu-s", "0.001"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    // An earlier run's beam step of b ran bounded for 1000 s and failed.
    let store = kforge_store::Store::open(&out.join("journal.db")).unwrap();
    let first = store.journal(None).unwrap().runs[0].clone();
    let earlier = store.insert_run(&kforge_store::RunRow { id: 0, ..first }).unwrap();
    let b = p.join("level1/b.py").display().to_string();
    let end = kforge_store::StepEnd {
        status: "failed".into(),
        outcome: Some("bounded".into()),
        error: Some("the step's end came first".into()),
        ..kforge_store::StepEnd::default()
    };
    journal_step(&store, (earlier, &b, "beam", "an older input"), 1000.0, end);
    let all = store.journal(None).unwrap();
    let measured = all.steps.iter().filter(|s| s.step == "measure" && s.status == "done").count();
    assert_eq!(measured, 2, "both measured in full: {text}");
    drop(store);
    let (code, text) = optimize(&[&args[..], &["--jobs", "1", "--resume", "--budget-wall-s", "200"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    let at = |n: &str| text.find(n).unwrap_or_else(|| panic!("{n}: {text}"));
    assert!(at("[2/2]") < at("[1/2]"), "b (its beam's floor 1000 s) before a: {text}");
}

/// Three problems, a, b (level1) and c (level3), in a campaign folder under `root`, and its
/// output folder: a run measured a, then its GPU-seconds budget was spent (b and c not reached);
/// a killed run had left c's measure step running for `floor_s` seconds: c's own floor. c's
/// source is a's (its measure step would take a's) when `c_is_a`, else a's with a comment.
fn measured_a_and_killed_c(root: &Path, floor_s: i64, c_is_a: bool) -> (PathBuf, PathBuf) {
    let p = problems(
        root,
        &[
            ("level1", "vector_add.py", "a.py"),
            ("level1", "row_softmax.py", "b.py"),
            ("level3", "vector_add.py", "c.py"),
        ],
    );
    if !c_is_a {
        let c = p.join("level3/c.py");
        append_comment(&c, "c, not a");
    }
    let out = root.join("o");
    let args = dispatch_args(&p);
    let (code, text) = optimize(&[&args[..], &["--jobs", "1", "--budget-gpu-s", "0.001"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("[1/3]") && text.contains("not reached"), "{text}");
    let store = kforge_store::Store::open(&out.join("journal.db")).unwrap();
    let first = store.journal(None).unwrap().runs[0].clone();
    let killed = store.insert_run(&kforge_store::RunRow { id: 0, finished_ns: None, stopped: None, ..first }).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
    let c = p.join("level3/c.py").display().to_string();
    let began = now - floor_s * 1_000_000_000;
    let measure = store.step_started(killed, &c, "measure", "an older input", began).unwrap();
    store.step_work_began(measure, began).unwrap();
    store.step_started(killed, &c, "result", "its last sign of life", now).unwrap();
    (p, out)
}

/// With `--resume` and a wall budget, a problem whose measure step already ran longer than the
/// whole budget without finishing (a killed run's floor of its own) starts after the problems
/// that can finish, and its progress line says why; it still starts (bounded) once a slot is free
/// early enough.
#[test]
fn a_problem_whose_measure_step_outlived_a_whole_budget_starts_after_those_that_can_finish() {
    let dir = tempfile::tempdir().unwrap();
    let (p, out) = measured_a_and_killed_c(dir.path(), 10_000, false);
    let args = dispatch_args(&p);
    let (code, text) = optimize(&[&args[..], &["--jobs", "1", "--resume", "--budget-wall-s", "5000"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    let at = |n: &str| text.find(n).unwrap_or_else(|| panic!("{n}: {text}"));
    assert!(at("[3/3] level3/c.py: starts after the problems that can finish") < at("[2/3]"), "said first: {text}");
    let started = |n: &str| text.match_indices(n).map(|(i, _)| i).nth(1).unwrap_or_else(|| panic!("{n}: {text}"));
    assert!(at("[2/3]") < started("[3/3]"), "b (never measured) before c (floor 10000 s): {text}");
    assert!(text.contains("at least 10000 s here"), "{text}");
    let c = campaign(&out);
    assert!(c["problems"].as_array().unwrap().iter().all(|p| p["decision"].is_object()), "all decided: {c}");
}

/// A problem measured only bounded, whose bounded result the run will take (its budget cannot
/// hold the step in full), starts among the measured problems, not after the problems that can
/// finish (session 23's call 7: level3/004, a verify step from a decision, waited so). Measured
/// is by the step's input: c, whose source is a's, takes a's measure step, here bounded.
#[test]
fn a_problem_measured_bounded_starts_among_the_measured() {
    let dir = tempfile::tempdir().unwrap();
    let (p, out) = measured_a_and_killed_c(dir.path(), 1000, true);
    let store = kforge_store::Store::open(&out.join("journal.db")).unwrap();
    let a = p.join("level1/a.py").display().to_string();
    let steps = store.journal(None).unwrap().steps;
    let measured_a = steps.iter().find(|s| s.problem == a && s.step == "measure").expect("a was measured");
    let end = kforge_store::StepEnd {
        status: "done".into(),
        outcome: Some("bounded".into()),
        output: measured_a.output.clone(),
        output_hash: measured_a.output_hash.clone(),
        finished_ns: measured_a.finished_ns.unwrap(),
        seconds: 1000.0,
        ..kforge_store::StepEnd::default()
    };
    store.step_finished(measured_a.id, &end).unwrap();
    drop(store);
    let args = dispatch_args(&p);
    let (code, text) = optimize(&[&args[..], &["--jobs", "1", "--resume", "--budget-wall-s", "200"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains("starts after the problems that can finish"), "{text}");
    let at = |n: &str| text.find(n).unwrap_or_else(|| panic!("{n}: {text}"));
    assert!(at("[1/3]") < at("[3/3]") && at("[3/3]") < at("[2/3]"), "a, c (measured bounded), then b: {text}");
}

/// With `--resume`, a campaign starts the measured problems first (a step or three from a
/// decision), then those whose measure step no run finished, the longest expected first (a
/// killed run's floor of its own); each keeps its number and its place in the summary.
#[test]
fn a_resumed_campaign_starts_the_measured_problems_first_then_the_unmeasured_the_longest_first() {
    let dir = tempfile::tempdir().unwrap();
    let (p, out) = measured_a_and_killed_c(dir.path(), 1000, false);
    let args = dispatch_args(&p);
    let (code, text) = optimize(&[&args[..], &["--jobs", "1", "--resume"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    let at = |n: &str| text.find(n).unwrap_or_else(|| panic!("{n}: {text}"));
    assert!(at("[1/3]") < at("[3/3]") && at("[3/3]") < at("[2/3]"), "a (measured), c (floor 1000 s), then b: {text}");
    let c = campaign(&out);
    let names: Vec<&str> = c["problems"].as_array().unwrap().iter().map(|p| p["problem"].as_str().unwrap()).collect();
    assert!(names[0].ends_with("a.py") && names[2].ends_with("c.py"), "the summary keeps the order: {names:?}");
    assert!(c["problems"].as_array().unwrap().iter().all(|p| p["decision"].is_object()), "{c}");
}

/// Measured is by the measure step's input, not by the problem's name: a problem whose source
/// changed since it was measured starts among those whose measure step is still to run (after
/// c, whose killed run's floor is longer), not among the measured.
#[test]
fn a_problem_whose_source_changed_since_it_was_measured_is_not_started_as_measured() {
    let dir = tempfile::tempdir().unwrap();
    let (p, out) = measured_a_and_killed_c(dir.path(), 1000, false);
    let a = p.join("level1/a.py");
    append_comment(&a, "edited since");
    let args = dispatch_args(&p);
    let (code, text) = optimize(&[&args[..], &["--jobs", "1", "--resume"]].concat(), &out);
    assert_eq!(code, Some(0), "{text}");
    let at = |n: &str| text.find(n).unwrap_or_else(|| panic!("{n}: {text}"));
    assert!(at("[3/3]") < at("[1/3]") && at("[1/3]") < at("[2/3]"), "c (floor 1000 s), then a and b: {text}");
}
