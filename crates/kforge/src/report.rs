//! `kforge report`: without run manifests, what the daemon's store recorded (JSON); with them,
//! the evaluation report (table, JSON, HTML) of `kforge_eval::report`.

use crate::output::write_out;
use anyhow::{bail, Context, Result};
use kforge_client::Client;
use kforge_eval::report::{compute_with, ReportOptions, DEFAULT_MIN_GAP};
use kforge_eval::runner::RunManifest;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct ReportArgs {
    /// Run manifests; exactly one must be the ground truth.
    runs: Vec<PathBuf>,
    /// Only jobs with this label (store dump).
    #[arg(long)]
    label: Option<String>,
    /// Write JSON to this file (`-` or no value: standard output).
    #[arg(long, num_args = 0..=1, default_missing_value = "-")]
    json: Option<String>,
    /// Write a self-contained HTML page with plots (evaluation report).
    #[arg(long)]
    html: Option<PathBuf>,
    /// Percent: the resolved ranking counts only candidate pairs whose ground truths differ by
    /// at least this much (closer pairs are within what the idle GPU repeats to).
    #[arg(long, value_name = "PCT", default_value_t = DEFAULT_MIN_GAP * 100.0)]
    min_gap: f64,
}

pub fn report(socket: &Path, a: ReportArgs) -> Result<i32> {
    if a.runs.is_empty() {
        store_dump(socket, a)
    } else {
        evaluation(a)
    }
}

/// What the daemon's store recorded, as JSON.
fn store_dump(socket: &Path, a: ReportArgs) -> Result<i32> {
    if a.html.is_some() {
        bail!("--html needs run manifests (`kforge report truth.run.json region.run.json … --html out.html`)");
    }
    let mut c = Client::connect(socket)?;
    let parts = c.report_parts(a.label).context("asking the daemon for its store")?;
    let report = kforge_store::Report::from_parts(parts).context("reading the daemon's report")?;
    write_out(a.json.as_deref().unwrap_or("-"), &serde_json::to_string_pretty(&report)?)?;
    Ok(0)
}

/// The evaluation report of run manifests: JSON and HTML where asked, the table unless the JSON
/// goes to standard output.
fn evaluation(a: ReportArgs) -> Result<i32> {
    if !(a.min_gap.is_finite() && a.min_gap >= 0.0) {
        bail!("--min-gap is a percentage >= 0 (2 for 2 %), not {}", a.min_gap);
    }
    let manifests = a.runs.iter().map(|p| RunManifest::load(p)).collect::<Result<Vec<_>>>()?;
    let r = compute_with(&manifests, &ReportOptions { min_gap: a.min_gap / 100.0 })?;
    if let Some(dest) = &a.json {
        write_out(dest, &serde_json::to_string_pretty(&r)?)?;
    }
    if let Some(p) = &a.html {
        std::fs::write(p, kforge_eval::html::render(&r)).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("kforge report: wrote {}", p.display());
    }
    if a.json.as_deref() != Some("-") {
        print!("{}", kforge_eval::report::table(&r));
    }
    Ok(0)
}
