//! The table `kforge report RUN…` prints.

use super::{EvalReport, PairRanking, RunSummary, FULL_CLOCK_FRACTION};

/// A run's name in tables: `*` when compared with another GPU's truth, `+` for a repeat truth.
pub fn run_label(run: &RunSummary) -> String {
    format!(
        "{}{}{}",
        run.name,
        if run.compared_across_devices { "*" } else { "" },
        if run.repeat_of_truth { "+" } else { "" }
    )
}

/// The table printed last by `kforge report RUN…`.
pub fn table(r: &EvalReport) -> String {
    // Run-name column: as wide as the longest name (16 at least; 19 in the tables below).
    let w = r.runs.iter().map(|x| run_label(x).len()).max().unwrap_or(0).max(16);
    let w_below = w.max(19);
    let mut s = runs_table(r, w);
    s.push_str(&legend(r));
    s.push_str(&serial_table(r, w_below));
    s.push_str(&full_clock_table(r, w_below));
    s
}

/// A share as a percentage with two decimals, `-` when undefined.
fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.2}%", x * 100.0)
    } else {
        "-".into()
    }
}

/// One row per run: throughput, inflation per bucket, ranking fidelity.
fn runs_table(r: &EvalReport, w: usize) -> String {
    let tau = |x: Option<PairRanking>| x.map(|t| format!("{:.3}", t.kendall_tau)).unwrap_or("-".into());
    let gap_col = format!("TAU all/>={:.0}%", r.resolved_min_gap * 100.0);
    let mut s = format!(
        "{:<w$} {:<8} {:<8} {:>5} {:>4} {:>8} {:>10} {:>6} {:>17} {:>17} {:>17} {:>17} {:>15}\n",
        "RUN",
        "POLICY",
        "ABLATE",
        "CMDS",
        "GPUS",
        "CMDS/MIN",
        "VS_CMD/GPU",
        "FAILED",
        "<0.1ms p50/p95",
        "0.1-1ms p50/p95",
        "1-10ms p50/p95",
        ">10ms p50/p95",
        gap_col
    );
    for run in &r.runs {
        let b: Vec<String> = run.inflation.iter().map(|b| format!("{}/{}", pct(b.p50), pct(b.p95))).collect();
        s.push_str(&format!(
            "{:<w$} {:<8} {:<8} {:>5} {:>4} {:>8.1} {:>10} {:>6} {:>17} {:>17} {:>17} {:>17} {:>15}\n",
            run_label(run),
            if run.repeat_of_truth { "truth" } else { run.policy.as_str() },
            run.ablation,
            run.commands,
            format!("{}{}", run.gpus, if run.gpu_groups { "g" } else { "" }),
            run.throughput_per_min,
            run.throughput_ratio_vs_command.map(|x| format!("{x:.2}x")).unwrap_or("-".into()),
            run.failed,
            b[0],
            b[1],
            b[2],
            b[3],
            format!("{}/{}", tau(run.ranking_all), tau(run.ranking_resolved)),
        ));
    }
    s
}

/// The notes under the runs table: what its marks and columns mean, where they occur.
fn legend(r: &EvalReport) -> String {
    let mut s = String::new();
    if r.runs.iter().any(|x| x.compared_across_devices) {
        s.push_str("* inflation and ranking against ground truth taken on another GPU (no same-GPU truth for these commands)\n");
    }
    if r.runs.iter().any(|x| x.repeat_of_truth) {
        s.push_str("+ a second ground truth (one command at a time, idle GPU; warm, or named truth-repeat) against the reference: how far the device repeats itself\n");
    }
    if let Some(x) = r
        .runs
        .iter()
        .filter(|x| !x.compared_across_devices && x.cross_device_commands > 0)
        .map(|x| x.cross_device_commands)
        .max()
    {
        s.push_str(&format!(
            "(up to {x} commands per run left out of inflation: their ground truth is from another GPU)\n"
        ));
    }
    for run in r.runs.iter().filter(|x| !x.commands_per_gpu.is_empty()) {
        let split: Vec<String> = run
            .commands_per_gpu
            .iter()
            .map(|(d, n)| format!("GPU {} {n}", d.split(" (").next().unwrap_or(d)))
            .collect();
        s.push_str(&format!("{}: commands measured per GPU: {}\n", run_label(run), split.join(", ")));
    }
    if r.runs.iter().any(|x| x.gpu_groups) {
        s.push_str("GPUS g: each candidate group ran on one GPU (GPU groups); without g a run over several GPUs ranks only the pairs that landed on one\n");
    }
    if r.runs.iter().any(|x| x.throughput_ratio_vs_command.is_some()) {
        s.push_str("VS_CMD/GPU: commands per minute per GPU over the command run's per GPU (whole-command exclusivity on as many GPUs)\n");
    }
    s.push_str(&format!(
        "TAU: Kendall tau over all candidate pairs / over the pairs whose ground truths differ by >= {:.1} %\n",
        r.resolved_min_gap * 100.0
    ));
    s
}

/// Region runs' serial share per GPU: time held plus settle steps over the wall time, when any
/// run settled.
fn serial_table(r: &EvalReport, w: usize) -> String {
    let mut s = String::new();
    // Region runs only: under `command` the whole command is exclusive, under `none` nothing is,
    // and a repeat of the truth runs one command at a time anyway.
    let serial: Vec<&RunSummary> = r
        .runs
        .iter()
        .filter(|x| x.policy == "region" && !x.repeat_of_truth && x.regions.count > 0 && x.wall_s > 0.0)
        .collect();
    if serial.iter().any(|x| x.regions.settle_s > 0.0) {
        s.push_str(&format!(
            "\nserial time per GPU (regions are exclusive, and so is the settle step before each):\n{:<w$} {:>7} {:>7} {:>9} {:>9}\n",
            "RUN", "WALL_S", "HELD_S", "SETTLE_S", "SERIAL"
        ));
        for run in serial {
            let g = &run.regions;
            s.push_str(&format!(
                "{:<w$} {:>7.1} {:>7.1} {:>9.1} {:>8.0}%\n",
                run_label(run),
                run.wall_s,
                g.held_s,
                g.settle_s,
                (g.held_s + g.settle_s) / (run.wall_s * run.gpus as f64) * 100.0
            ));
        }
    }
    s
}

/// Inflation per bucket over the regions that ended at full clock, for runs that recorded clocks.
fn full_clock_table(r: &EvalReport, w: usize) -> String {
    let mut s = String::new();
    let clocked: Vec<&RunSummary> = r.runs.iter().filter(|x| !x.full_clock.is_empty()).collect();
    if !clocked.is_empty() {
        s.push_str(&format!(
            "\nregions that ended at full clock (SM clock at release >= {:.0} % of the top clock of the run or slice; the truth's too, where it recorded one):\n{:<w$} {:>7} {:>9} {:>19} {:>19} {:>19} {:>19}\n",
            FULL_CLOCK_FRACTION * 100.0, "RUN", "TOP_MHZ", "THROTTLED", "<0.1ms n p50/p95", "0.1-1ms n p50/p95", "1-10ms n p50/p95", ">10ms n p50/p95"
        ));
        for run in clocked {
            let b: Vec<String> =
                run.full_clock.iter().map(|b| format!("{} {}/{}", b.n, pct(b.p50), pct(b.p95))).collect();
            s.push_str(&format!(
                "{:<w$} {:>7} {:>9} {:>19} {:>19} {:>19} {:>19}\n",
                run_label(run),
                run.top_sm_clock_mhz.map(|c| c.to_string()).unwrap_or("-".into()),
                run.throttled_commands,
                b[0],
                b[1],
                b[2],
                b[3]
            ));
        }
    }
    s
}
