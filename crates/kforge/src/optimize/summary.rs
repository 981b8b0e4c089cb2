//! `kforge optimize DIR --decisions FILE --summarize`: a campaign's summary from its decisions
//! file alone — the table, `--json` and `--html` a campaign run ends with — for the problems of
//! DIR that the file holds a decision for under the same question, on one machine. Nothing runs:
//! no step, no daemon, no torch. A campaign chained over lent GPU calls (or batch jobs) is read
//! where it is not running, and a call that was killed before its summary loses none.

use super::{content_hash, outcome_of, plan_on, problem_files, publish, question, OptimizeArgs};
use anyhow::{bail, Context, Result};
use kforge_optimize::decisions::{Answer, Decisions};
use kforge_optimize::{ProblemOutcome, Spent};
use std::collections::BTreeMap;
use std::path::Path;

pub fn summarize(a: &OptimizeArgs) -> Result<i32> {
    if !a.problem.is_dir() {
        bail!("--summarize reads a campaign: {} is not a directory of problems", a.problem.display());
    }
    let path = a.decisions.as_ref().context("--summarize needs --decisions FILE")?;
    let shown = path.display().to_string();
    if !path.is_file() {
        bail!("--summarize: the decisions file {shown} does not exist");
    }
    let file = Decisions::read(path)?;
    // The question does not depend on the machine; a machine's name only tells the plan whether
    // the campaign ran on a GPU (the config agent alone is refused on the CPU).
    let plan = plan_on(a, || Ok(a.machine.clone().unwrap_or_default()))?;
    let problems = problem_files(&a.problem)?;
    if problems.is_empty() {
        bail!("{}: no problem file below it", a.problem.display());
    }
    let questions: Vec<_> = problems.iter().map(|(_, p)| question(a, &plan, p)).collect();
    let machine = file.machine_for(&questions, a.machine.as_deref(), &shown)?;
    let outcomes = problems
        .iter()
        .zip(&questions)
        .map(|((rel, p), q)| {
            let source = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
            Ok(outcome(rel, file.answer(q, &machine, &content_hash(&[&source]))))
        })
        .collect::<Result<Vec<_>>>()?;
    let undecided = outcomes.iter().filter(|o| o.decision.is_none()).count();
    let mut tail = format!("decided on {machine}, read from {shown}\n");
    if undecided > 0 {
        tail += &format!("{undecided} problem(s) not decided yet: `--resume --decisions {shown}` runs them\n");
    }
    let extra = serde_json::json!({"machine": machine, "decisions": shown});
    publish(a, plan.baseline, &outcomes, extra, &BTreeMap::new(), &tail, false)?;
    Ok(0)
}

/// A problem's line in the summary: its decision as the file holds it (the cost it took over
/// every run, `Report::spent`), else not decided yet (and why, for an entry that does not hold).
fn outcome(rel: &Path, answer: Answer<'_>) -> ProblemOutcome {
    let (report, not_reached) = match answer {
        Answer::Taken(e) => (Some(&e.report), None),
        Answer::Nothing => (None, Some("not decided yet".to_string())),
        Answer::Stale(why) => {
            (None, Some(format!("not decided yet ({})", why.replace("this run is on", "the summary reads"))))
        }
    };
    // (resumed: all of them are, so the mark would say nothing)
    ProblemOutcome { not_reached, ..outcome_of(rel, report, Spent::default()) }
}
