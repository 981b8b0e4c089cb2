//! HTML rendering of an [`EvalReport`]: one self-contained page (inline CSS and inline SVG; no
//! scripts, no external fonts, no URLs), so it can be opened offline or attached to a ticket.
//!
//! All text from the report goes through [`esc`]; every number goes through a formatter that
//! prints "—" for NaN/inf (tables) or a finite fallback (SVG coordinates), so the page never
//! contains `NaN` coordinates.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::report::{BucketInflation, EvalReport, RunSummary, TimelineEntry, BUCKETS};

/// What a missing or non-finite value prints as.
const DASH: &str = "—";

/// Run colours (the "tab10" palette without its red, which marks revoked regions).
const PALETTE: [&str; 9] =
    ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const REVOKED_COLOUR: &str = "#d62728";

/// Most steps drawn per CDF line (longer series are evenly thinned).
const MAX_CDF_STEPS: usize = 1000;
/// Inflation axis limits, in percent.
const CDF_MIN_LO: f64 = -100.0;
const CDF_MAX_HI: f64 = 1000.0;

const CSS: &str = r#"
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       margin: 24px; color: #222; background: #fff; }
h1 { font-size: 1.6em; margin-bottom: 0.3em; }
h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: 2px 12px; }
dl.meta dt { font-weight: 600; }
dl.meta dd { margin: 0; font-family: ui-monospace, Menlo, Consolas, monospace; word-break: break-all; }
table { border-collapse: collapse; font-size: 0.88em; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; }
th.l, td.l { text-align: left; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(440px, 1fr)); gap: 16px; }
figure { margin: 8px 0; }
figcaption { font-size: 0.85em; color: #555; }
svg { display: block; max-width: 100%; height: auto; }
svg text { font-size: 11px; fill: #333; }
svg .axis { stroke: #888; stroke-width: 1; }
svg .gridline { stroke: #eee; stroke-width: 1; }
svg text.title { font-size: 12px; font-weight: 600; }
svg text.empty { fill: #888; font-style: italic; }
.note { color: #666; font-size: 0.85em; }
"#;

/// A self-contained HTML page (works offline: inline CSS and inline SVG, no scripts, no external
/// fonts or URLs) presenting the report.
pub fn render(r: &crate::report::EvalReport) -> String {
    let mut out = String::with_capacity(64 * 1024);
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    out.push_str("<title>kforge runtime evaluation</title>\n<style>");
    out.push_str(CSS);
    out.push_str("</style>\n</head>\n<body>\n");
    section_header(&mut out, r);
    section_summary(&mut out, r);
    section_throughput(&mut out, r);
    section_cdfs(&mut out, r);
    section_bucket_table(&mut out, r);
    section_ranking(&mut out, r);
    section_regions(&mut out, r);
    section_outliers(&mut out, r);
    section_timelines(&mut out, r);
    out.push_str("</body>\n</html>\n");
    out
}

// ---------------------------------------------------------------------------------------------
// Text helpers

/// Escapes text for HTML element content and attribute values (SVG included).
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            _ => o.push(c),
        }
    }
    o
}

/// `x` with `decimals` decimals, "—" when not finite.
fn fmt_f(x: f64, decimals: usize) -> String {
    if x.is_finite() {
        format!("{x:.decimals$}")
    } else {
        DASH.to_string()
    }
}

/// A fraction as a percentage with 2 decimals (0.1234 → "12.34%"), "—" when not finite.
fn fmt_pct(frac: f64) -> String {
    if frac.is_finite() {
        format!("{:.2}%", frac * 100.0)
    } else {
        DASH.to_string()
    }
}

/// A ratio as "1.23×", "—" when absent or not finite.
fn fmt_ratio(r: Option<f64>) -> String {
    match r {
        Some(x) if x.is_finite() => format!("{x:.2}×"),
        _ => DASH.to_string(),
    }
}

fn fmt_yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// "p50 / p95 (n)" of one bucket, in percent.
fn fmt_bucket_cell(b: Option<&BucketInflation>) -> String {
    match b {
        Some(b) => format!("{} / {} ({})", fmt_pct(b.p50), fmt_pct(b.p95), b.n),
        None => DASH.to_string(),
    }
}

/// At most `max` characters of `s`, with an ellipsis when cut (for SVG labels).
fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// Dash pattern for runs beyond the palette, so lines stay distinguishable.
fn dash(i: usize) -> &'static str {
    match (i / PALETTE.len()) % 3 {
        0 => "",
        1 => "6 3",
        _ => "2 2",
    }
}

fn bucket_label(r: &EvalReport, b: usize) -> &str {
    r.buckets.get(b).map(String::as_str).unwrap_or(BUCKETS[b])
}

// ---------------------------------------------------------------------------------------------
// Numeric helpers

/// Nearest-rank-with-interpolation quantile of sorted finite values; None when empty.
fn quantile_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64))
}

/// Finite values × 100 (fraction → percent), sorted.
fn finite_sorted_pct(values: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = values.iter().filter(|x| x.is_finite()).map(|x| x * 100.0).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// Lowest finite Kendall tau over the run's operators (NaN when there is none).
fn worst_tau(run: &RunSummary) -> f64 {
    run.ranking.iter().map(|o| o.kendall_tau).filter(|t| t.is_finite()).fold(f64::NAN, f64::min)
}

/// Up to `max` indices into 0..n, evenly spaced, always including the last one.
fn sample_indices(n: usize, max: usize) -> Vec<usize> {
    if n <= max || max < 2 {
        return (0..n).collect();
    }
    (0..max).map(|k| (k * (n - 1) + (max - 1) / 2) / (max - 1)).collect()
}

/// Round tick values covering [lo, hi], about `target` of them.
fn nice_ticks(lo: f64, hi: f64, target: usize) -> (Vec<f64>, f64) {
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo || target == 0 {
        return (vec![if lo.is_finite() { lo } else { 0.0 }], 1.0);
    }
    let raw = (hi - lo) / target as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let mut ticks = Vec::new();
    let mut t = (lo / step).ceil() * step;
    while t <= hi + step * 1e-9 && ticks.len() < 50 {
        ticks.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    (ticks, step)
}

fn fmt_tick(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 || !step.is_finite() || step <= 0.0 { 0 } else { (-step.log10().floor()) as usize };
    fmt_f(v, decimals)
}

/// A linear map from the domain [d0, d1] to the range [r0, r1]; values outside the domain are
/// clamped to its ends, non-finite values go to an end (NaN to the start).
#[derive(Clone, Copy)]
struct Scale {
    d0: f64,
    d1: f64,
    r0: f64,
    r1: f64,
}

impl Scale {
    fn map(&self, v: f64) -> f64 {
        let t = if v.is_nan() {
            0.0
        } else if self.d1 > self.d0 {
            ((v - self.d0) / (self.d1 - self.d0)).clamp(0.0, 1.0)
        } else {
            0.0
        };
        self.r0 + t * (self.r1 - self.r0)
    }
}

// ---------------------------------------------------------------------------------------------
// SVG helpers (all coordinates go through `svg_num`, so nothing non-finite reaches the page)

/// A coordinate with one decimal; non-finite values become 0.
fn svg_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.1}")
    } else {
        "0".to_string()
    }
}

fn svg_open(w: f64, h: f64, label: &str) -> String {
    let (w, h) = (svg_num(w), svg_num(h));
    format!("<svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"{}\">\n", esc(label))
}

fn svg_close() -> &'static str {
    "</svg>\n"
}

/// A text element; `anchor` is `start`, `middle` or `end`; `class` may be empty.
fn svg_text(x: f64, y: f64, anchor: &str, class: &str, text: &str) -> String {
    let class = if class.is_empty() { String::new() } else { format!(" class=\"{class}\"") };
    format!("<text x=\"{}\" y=\"{}\" text-anchor=\"{anchor}\"{class}>{}</text>\n", svg_num(x), svg_num(y), esc(text))
}

fn svg_line(x1: f64, y1: f64, x2: f64, y2: f64, class: &str) -> String {
    format!(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"{class}\"/>\n",
        svg_num(x1),
        svg_num(y1),
        svg_num(x2),
        svg_num(y2)
    )
}

/// A filled rectangle with an optional hover title.
fn svg_rect(x: f64, y: f64, w: f64, h: f64, fill: &str, title: Option<&str>) -> String {
    let geom = format!(
        "x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{fill}\"",
        svg_num(x),
        svg_num(y),
        svg_num(w.max(0.0)),
        svg_num(h.max(0.0))
    );
    match title {
        Some(t) => format!("<rect {geom}><title>{}</title></rect>\n", esc(t)),
        None => format!("<rect {geom}/>\n"),
    }
}

fn svg_polyline(points: &[(f64, f64)], stroke: &str, dasharray: &str) -> String {
    let mut pts = String::with_capacity(points.len() * 12);
    for (i, (x, y)) in points.iter().enumerate() {
        if i > 0 {
            pts.push(' ');
        }
        let _ = write!(pts, "{},{}", svg_num(*x), svg_num(*y));
    }
    let dash = if dasharray.is_empty() { String::new() } else { format!(" stroke-dasharray=\"{dasharray}\"") };
    format!("<polyline points=\"{pts}\" fill=\"none\" stroke=\"{stroke}\" stroke-width=\"1.5\"{dash}/>\n")
}

/// A horizontal axis along `y` with ticks and labels below it, plus light vertical grid lines
/// up to `grid_top`, and `label` centred under the ticks.
fn svg_x_axis(x: &Scale, y: f64, grid_top: f64, ticks: &[f64], step: f64, label: &str) -> String {
    let mut s = svg_line(x.r0, y, x.r1, y, "axis");
    for &t in ticks {
        let px = x.map(t);
        s.push_str(&svg_line(px, grid_top, px, y, "gridline"));
        s.push_str(&svg_line(px, y, px, y + 4.0, "axis"));
        s.push_str(&svg_text(px, y + 15.0, "middle", "", &fmt_tick(t, step)));
    }
    s.push_str(&svg_text((x.r0 + x.r1) / 2.0, y + 30.0, "middle", "", label));
    s
}

/// A vertical axis along `x` with ticks, labels to its left and light horizontal grid lines.
fn svg_y_axis(y: &Scale, x: f64, grid_right: f64, ticks: &[f64], step: f64) -> String {
    let mut s = svg_line(x, y.r0, x, y.r1, "axis");
    for &t in ticks {
        let py = y.map(t);
        s.push_str(&svg_line(x, py, grid_right, py, "gridline"));
        s.push_str(&svg_line(x - 4.0, py, x, py, "axis"));
        s.push_str(&svg_text(x - 6.0, py + 4.0, "end", "", &fmt_tick(t, step)));
    }
    s
}

/// A small SVG holding only a message (for charts without data).
fn svg_message(w: f64, h: f64, title: &str, message: &str) -> String {
    let mut s = svg_open(w, h, title);
    if !title.is_empty() {
        s.push_str(&svg_text(8.0, 16.0, "start", "title", title));
    }
    s.push_str(&svg_text(w / 2.0, h / 2.0, "middle", "empty", message));
    s.push_str(svg_close());
    s
}

// ---------------------------------------------------------------------------------------------
// HTML helpers

/// A table. Headers are plain text (escaped here); cells are HTML (already escaped). The first
/// `left` columns are left-aligned, the others (numbers) right-aligned.
fn html_table(headers: &[&str], rows: &[Vec<String>], left: usize) -> String {
    let align = |i: usize| if i < left { " class=\"l\"" } else { "" };
    let mut s = String::from("<table>\n<thead><tr>");
    for (i, h) in headers.iter().enumerate() {
        let _ = write!(s, "<th{}>{}</th>", align(i), esc(h));
    }
    s.push_str("</tr></thead>\n<tbody>\n");
    for row in rows {
        s.push_str("<tr>");
        for (i, c) in row.iter().enumerate() {
            let _ = write!(s, "<td{}>{c}</td>", align(i));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody>\n</table>\n");
    s
}

fn no_runs_note(out: &mut String) {
    out.push_str("<p class=\"note\">No runs in this report.</p>\n");
}

// ---------------------------------------------------------------------------------------------
// Sections

fn section_header(out: &mut String, r: &EvalReport) {
    out.push_str("<h1>kforge runtime evaluation</h1>\n<dl class=\"meta\">\n");
    let _ = writeln!(out, "<dt>Workload</dt><dd>{}</dd>", esc(&r.workload));
    let _ = writeln!(out, "<dt>Device</dt><dd>{}</dd>", esc(&r.device));
    let _ = writeln!(out, "<dt>Isolated commands</dt><dd>{}</dd>", r.isolated_commands);
    let _ = writeln!(out, "<dt>Runs</dt><dd>{}</dd>", r.runs.len());
    out.push_str("</dl>\n");
    let across: Vec<&str> = r.runs.iter().filter(|x| x.compared_across_devices).map(|x| x.name.as_str()).collect();
    if !across.is_empty() {
        let _ = writeln!(
            out,
            "<p class=\"note\">Marked *: {} had no ground truth from their own GPU; their inflation and ranking compare with ground truth taken on another GPU of the same model.</p>",
            esc(&across.join(", "))
        );
    }
    let left_out =
        r.runs.iter().filter(|x| !x.compared_across_devices).map(|x| x.cross_device_commands).max().unwrap_or(0);
    if left_out > 0 {
        let _ = writeln!(out, "<p class=\"note\">Up to {left_out} commands per run are left out of inflation and ranking: their ground truth was taken on another GPU.</p>");
    }
}

fn summary_row(run: &RunSummary) -> Vec<String> {
    vec![
        esc(&crate::report::run_label(run)),
        if run.repeat_of_truth { "truth".to_string() } else { esc(&run.policy) },
        esc(&run.ablation),
        fmt_yes_no(run.warm).to_string(),
        run.concurrency.to_string(),
        {
            let mut cell = if run.gpu_groups { format!("{} (groups)", run.gpus) } else { run.gpus.to_string() };
            if !run.commands_per_gpu.is_empty() {
                let split: Vec<String> = run.commands_per_gpu.values().map(|n| n.to_string()).collect();
                cell.push_str(&format!(": {} commands", split.join(" / ")));
            }
            esc(&cell)
        },
        format!("{} ({})", run.commands, run.failed),
        fmt_f(run.wall_s, 1),
        fmt_f(run.throughput_per_min, 1),
        fmt_ratio(run.throughput_ratio_vs_command),
        fmt_pct(run.inflation_all.p50),
        fmt_pct(run.inflation_all.p95),
        run.ranking_all.map_or(DASH.to_string(), |t| fmt_f(t.kendall_tau, 3)),
        run.ranking_resolved.map_or(DASH.to_string(), |t| fmt_f(t.kendall_tau, 3)),
        fmt_f(worst_tau(run), 3),
        run.regions.count.to_string(),
        run.regions.revoked.to_string(),
        run.regions.tainted.to_string(),
        fmt_pct(run.busy_share),
    ]
}

fn section_summary(out: &mut String, r: &EvalReport) {
    out.push_str("<h2>Summary</h2>\n");
    if r.runs.is_empty() {
        no_runs_note(out);
        return;
    }
    let headers = [
        "run",
        "policy",
        "ablation",
        "warm",
        "concurrency",
        "GPUs",
        "commands (failed)",
        "wall s",
        "commands/min",
        "ratio vs command, per GPU",
        "inflation p50",
        "inflation p95",
        "Kendall τ (all pairs)",
        "Kendall τ (resolved pairs)",
        "worst operator τ",
        "regions",
        "revoked",
        "tainted",
        "busy share",
    ];
    let rows: Vec<Vec<String>> = r.runs.iter().map(summary_row).collect();
    out.push_str(&html_table(&headers, &rows, 3));
    let _ = writeln!(
        out,
        "<p class=\"note\">Inflation = measured / isolated − 1 over all commands of the run; \
         Kendall τ over all candidate pairs, and over the resolved pairs: those whose ground truths \
         differ by at least {:.1} %; worst operator τ is the lowest over operators; busy share is \
         the part of the wall time during which some region was held. Marked +: a second ground \
         truth (one command at a time on the idle GPU; warm, or named truth-repeat) against the \
         reference — how far the device repeats itself, the floor under every run (a warm one \
         also differs in protocol: no process start-up between commands).</p>",
        r.resolved_min_gap * 100.0
    );
}

fn section_throughput(out: &mut String, r: &EvalReport) {
    out.push_str("<h2>Throughput</h2>\n<figure>\n");
    out.push_str(&svg_throughput(&r.runs));
    out.push_str("<figcaption>Commands per minute; bar length proportional to throughput, ");
    out.push_str("labelled with the ratio to the <code>command</code> run.</figcaption>\n");
    out.push_str("</figure>\n");
}

fn svg_throughput(runs: &[RunSummary]) -> String {
    const W: f64 = 900.0;
    const LABEL_W: f64 = 210.0;
    const BAR_MAX: f64 = 440.0;
    const ROW: f64 = 24.0;
    const PAD: f64 = 10.0;
    if runs.is_empty() {
        return svg_message(W, 60.0, "", "no runs");
    }
    let max = runs.iter().map(|r| r.throughput_per_min).filter(|t| t.is_finite() && *t > 0.0).fold(0.0, f64::max);
    let h = 2.0 * PAD + ROW * runs.len() as f64;
    let mut s = svg_open(W, h, "throughput per run");
    for (i, run) in runs.iter().enumerate() {
        let y = PAD + ROW * i as f64;
        let tp = run.throughput_per_min;
        let len = if max > 0.0 && tp.is_finite() && tp > 0.0 { BAR_MAX * tp / max } else { 0.0 };
        s.push_str(&svg_text(LABEL_W - 8.0, y + 16.0, "end", "", &truncate(&run.name, 32)));
        let title = format!("{}: {} commands/min", run.name, fmt_f(tp, 1));
        s.push_str(&svg_rect(LABEL_W, y + 4.0, len, ROW - 8.0, colour(i), Some(&title)));
        let label =
            format!("{} /min · {} vs command per GPU", fmt_f(tp, 1), fmt_ratio(run.throughput_ratio_vs_command));
        s.push_str(&svg_text(LABEL_W + len + 6.0, y + 16.0, "start", "", &label));
    }
    s.push_str(&svg_line(LABEL_W, PAD, LABEL_W, h - PAD, "axis"));
    s.push_str(svg_close());
    s
}

fn section_cdfs(out: &mut String, r: &EvalReport) {
    out.push_str("<h2>Inflation CDFs per bucket</h2>\n<div class=\"grid\">\n");
    for b in 0..BUCKETS.len() {
        let label = bucket_label(r, b);
        let series: Vec<Vec<f64>> = r
            .runs
            .iter()
            .map(|run| run.inflation.get(b).map(|bi| finite_sorted_pct(&bi.values)).unwrap_or_default())
            .collect();
        out.push_str("<figure>\n");
        out.push_str(&svg_cdf(label, &r.runs, b, &series));
        out.push_str("</figure>\n");
    }
    out.push_str("</div>\n");
    out.push_str(
        "<p class=\"note\">Buckets by the isolated median of the kernel. Inflation = measured / \
         isolated − 1, in percent.</p>\n",
    );
}

/// The inflation axis range (percent) for all values of a bucket: from min(−5, data) (not below
/// −100) to the 99th percentile (at least +5, at most +1000).
fn cdf_range(series: &[Vec<f64>]) -> (f64, f64) {
    let mut all: Vec<f64> = series.iter().flatten().copied().collect();
    all.sort_by(|a, b| a.total_cmp(b));
    let min = all.first().copied().unwrap_or(0.0);
    let lo = min.clamp(CDF_MIN_LO, -5.0);
    let p99 = quantile_sorted(&all, 0.99).unwrap_or(5.0);
    let hi = p99.clamp(5.0, CDF_MAX_HI);
    (lo, hi)
}

/// Step-line points of the empirical CDF of sorted values.
fn cdf_points(sorted: &[f64], x: &Scale, y: &Scale) -> Vec<(f64, f64)> {
    let n = sorted.len();
    let mut pts = vec![(x.map(x.d0), y.map(0.0))];
    let mut prev = 0.0;
    for i in sample_indices(n, MAX_CDF_STEPS) {
        let px = x.map(sorted[i]);
        let frac = (i + 1) as f64 / n as f64;
        pts.push((px, y.map(prev)));
        pts.push((px, y.map(frac)));
        prev = frac;
    }
    pts.push((x.map(x.d1), y.map(prev)));
    pts
}

fn svg_cdf(label: &str, runs: &[RunSummary], bucket: usize, series: &[Vec<f64>]) -> String {
    const W: f64 = 440.0;
    const LEFT: f64 = 44.0;
    const RIGHT: f64 = 14.0;
    const TOP: f64 = 28.0;
    const PLOT_H: f64 = 170.0;
    const AXIS_H: f64 = 40.0;
    const LEGEND_ROW: f64 = 16.0;
    let title = format!("Bucket {label}");
    if series.iter().all(|v| v.is_empty()) {
        return svg_message(W, 120.0, &title, "no commands in this bucket");
    }
    let (lo, hi) = cdf_range(series);
    let x = Scale { d0: lo, d1: hi, r0: LEFT, r1: W - RIGHT };
    let y = Scale { d0: 0.0, d1: 1.0, r0: TOP + PLOT_H, r1: TOP };
    let h = TOP + PLOT_H + AXIS_H + LEGEND_ROW * runs.len() as f64 + 6.0;

    let mut s = svg_open(W, h, &format!("inflation CDF, bucket {label}"));
    s.push_str(&svg_text(8.0, 16.0, "start", "title", &title));
    let (yticks, ystep) = nice_ticks(0.0, 1.0, 4);
    s.push_str(&svg_y_axis(&y, LEFT, W - RIGHT, &yticks, ystep));
    let (xticks, xstep) = nice_ticks(lo, hi, 6);
    let axis_label = format!(
        "inflation % (linear, clipped to [{}, {}]; values beyond drawn at the edge)",
        fmt_f(lo, 0),
        fmt_f(hi, 0)
    );
    s.push_str(&svg_x_axis(&x, TOP + PLOT_H, TOP, &xticks, xstep, &axis_label));

    for (i, values) in series.iter().enumerate() {
        if !values.is_empty() {
            s.push_str(&svg_polyline(&cdf_points(values, &x, &y), colour(i), dash(i)));
        }
    }
    let legend_top = TOP + PLOT_H + AXIS_H;
    for (i, run) in runs.iter().enumerate() {
        let ly = legend_top + LEGEND_ROW * i as f64;
        let n = run.inflation.get(bucket).map_or(0, |bi| bi.n);
        s.push_str(&svg_rect(LEFT, ly + 3.0, 14.0, 4.0, colour(i), None));
        let text = format!("{}  n={n}", truncate(&run.name, 40));
        s.push_str(&svg_text(LEFT + 20.0, ly + 9.0, "start", "", &text));
    }
    s.push_str(svg_close());
    s
}

fn section_bucket_table(out: &mut String, r: &EvalReport) {
    out.push_str("<h2>Inflation per bucket</h2>\n");
    if r.runs.is_empty() {
        no_runs_note(out);
        return;
    }
    let labels: Vec<&str> = (0..BUCKETS.len()).map(|b| bucket_label(r, b)).collect();
    let mut headers: Vec<&str> = vec!["run"];
    headers.extend(labels.iter().copied());
    headers.push("all");
    let rows: Vec<Vec<String>> = r
        .runs
        .iter()
        .map(|run| {
            let mut row = vec![esc(&crate::report::run_label(run))];
            row.extend((0..BUCKETS.len()).map(|b| fmt_bucket_cell(run.inflation.get(b))));
            row.push(fmt_bucket_cell(Some(&run.inflation_all)));
            row
        })
        .collect();
    out.push_str(&html_table(&headers, &rows, 1));
    out.push_str("<p class=\"note\">Cells: inflation p50 / p95 (number of commands).</p>\n");
    let clocked: Vec<&RunSummary> = r.runs.iter().filter(|run| !run.full_clock.is_empty()).collect();
    if !clocked.is_empty() {
        out.push_str("<h3>Regions that ended at full clock</h3>\n");
        let mut headers: Vec<&str> = vec!["run", "top SM MHz", "throttled"];
        headers.extend(labels.iter().copied());
        let rows: Vec<Vec<String>> = clocked
            .iter()
            .map(|run| {
                let mut row = vec![
                    esc(&crate::report::run_label(run)),
                    run.top_sm_clock_mhz.map_or(DASH.to_string(), |c| c.to_string()),
                    run.throttled_commands.to_string(),
                ];
                row.extend((0..BUCKETS.len()).map(|b| fmt_bucket_cell(run.full_clock.get(b))));
                row
            })
            .collect();
        out.push_str(&html_table(&headers, &rows, 3));
        out.push_str(&format!(
            "<p class=\"note\">Only commands whose region ended with the SM clock at or above {:.0} % of the highest \
             clock recorded in the run (per slice, for a sliced run) — and whose ground-truth region did too, where \
             the truth recorded clocks; <em>throttled</em> counts the others; <em>top SM MHz</em> is the run's highest. A heavy kernel timed for ~100 ms can run \
             into the GPU's power cap by itself: when that starts decides its median.</p>\n",
            crate::report::FULL_CLOCK_FRACTION * 100.0
        ));
    }
}

fn section_ranking(out: &mut String, r: &EvalReport) {
    out.push_str("<h2>Ranking fidelity</h2>\n");
    if r.runs.is_empty() {
        no_runs_note(out);
        return;
    }
    let mut rows = Vec::new();
    for run in &r.runs {
        if run.ranking.is_empty() {
            let mut row = vec![esc(&crate::report::run_label(run)), "<em>no operators</em>".to_string()];
            row.extend(vec![DASH.to_string(); 4]);
            rows.push(row);
        }
        for op in &run.ranking {
            rows.push(vec![
                esc(&crate::report::run_label(run)),
                esc(&op.operator),
                op.groups.to_string(),
                op.pairs.to_string(),
                fmt_f(op.kendall_tau, 3),
                fmt_pct(op.flip_rate),
            ]);
        }
    }
    let headers = ["run", "operator", "groups", "pairs", "Kendall τ", "flip rate"];
    out.push_str(&html_table(&headers, &rows, 2));
    out.push_str(
        "<p class=\"note\">Kendall τ between isolated and measured medians of the candidates \
         of each group, pooled by pair count; flip rate = share of pairs ordered differently \
         than in isolation.</p>\n",
    );
    let flipped: Vec<&RunSummary> = r.runs.iter().filter(|run| !run.flips.is_empty()).collect();
    if flipped.is_empty() {
        return;
    }
    out.push_str("<h3>Flipped pairs</h3>\n");
    let mut rows = Vec::new();
    for run in flipped {
        for f in &run.flips {
            rows.push(vec![
                esc(&crate::report::run_label(run)),
                esc(&f.operator),
                esc(&f.group),
                esc(&f.faster),
                esc(&f.slower),
                fmt_pct(f.truth_gap),
                fmt_pct(f.measured_gap),
            ]);
        }
    }
    let headers =
        ["run", "operator", "group", "faster in isolation", "slower in isolation", "isolated gap", "measured gap"];
    out.push_str(&html_table(&headers, &rows, 5));
    let _ = writeln!(
        out,
        "<p class=\"note\">Per run the {} flipped pairs with the largest ground-truth gap (slower / faster − 1). \
         A flip at a gap the repeat of the truth also flips is the device's noise, not the runtime's.</p>",
        crate::report::FLIPS
    );
}

fn section_outliers(out: &mut String, r: &EvalReport) {
    let runs: Vec<&RunSummary> = r.runs.iter().filter(|run| !run.outliers.is_empty()).collect();
    if runs.is_empty() {
        return;
    }
    out.push_str("<h2>Furthest from the ground truth</h2>\n");
    let opt = |x: Option<u32>| x.map_or(DASH.to_string(), |v| v.to_string());
    let ms = |x: Option<f64>| x.map_or(DASH.to_string(), |v| format!("{v:.1}"));
    let headers = [
        "run",
        "command",
        "operator",
        "isolated ms",
        "measured ms",
        "inflation",
        "samples (truth)",
        "MHz at release (truth)",
        "core",
        "wait ms",
        "freeze ms",
        "settle ms",
    ];
    let mut rows = Vec::new();
    for run in runs {
        for o in &run.outliers {
            rows.push(vec![
                esc(&crate::report::run_label(run)),
                esc(&o.id),
                esc(&o.operator),
                format!("{:.4}", o.isolated_ms),
                format!("{:.4}", o.measured_ms),
                fmt_pct(o.inflation),
                format!("{} ({})", o.samples, o.truth_samples),
                format!("{} ({})", opt(o.sm_clock_mhz_released), opt(o.truth_sm_clock_mhz_released)),
                opt(o.core),
                ms(o.wait_ms),
                ms(o.freeze_ms),
                ms(o.settle_ms),
            ]);
        }
    }
    out.push_str(&html_table(&headers, &rows, 3));
    out.push_str(&format!(
        "<p class=\"note\">Per run the {} commands with the largest |inflation|, and what their regions recorded.</p>\n",
        crate::report::OUTLIERS
    ));
}

fn section_regions(out: &mut String, r: &EvalReport) {
    out.push_str("<h2>Region statistics</h2>\n");
    if r.runs.is_empty() {
        no_runs_note(out);
        return;
    }
    let headers = [
        "run",
        "regions",
        "wait p50",
        "wait p95",
        "drain p50",
        "drain p95",
        "freeze p50",
        "freeze p95",
        "settle p50",
        "settle p95",
        "held s (all)",
        "settle s (all)",
        "drain timeouts",
        "revoked",
        "tainted",
        "overlapping pairs",
        "SM MHz at grant p50 / min",
        "GPU °C at grant p50 / max",
    ];
    let rows: Vec<Vec<String>> = r
        .runs
        .iter()
        .map(|run| {
            let g = &run.regions;
            vec![
                esc(&crate::report::run_label(run)),
                g.count.to_string(),
                fmt_f(g.wait_ms_p50, 2),
                fmt_f(g.wait_ms_p95, 2),
                fmt_f(g.drain_ms_p50, 2),
                fmt_f(g.drain_ms_p95, 2),
                fmt_f(g.freeze_ms_p50, 2),
                fmt_f(g.freeze_ms_p95, 2),
                fmt_f(g.settle_ms_p50, 2),
                fmt_f(g.settle_ms_p95, 2),
                fmt_f(g.held_s, 1),
                fmt_f(g.settle_s, 1),
                g.drain_timeouts.to_string(),
                g.revoked.to_string(),
                g.tainted.to_string(),
                g.overlapping_pairs.to_string(),
                pair(g.sm_clock_mhz_granted_p50, g.sm_clock_mhz_granted_min),
                pair(g.gpu_temp_c_granted_p50, g.gpu_temp_c_granted_max),
            ]
        })
        .collect();
    out.push_str(&html_table(&headers, &rows, 1));
    out.push_str(
        "<p class=\"note\">Times in milliseconds, but the two sums in seconds: regions held (grant to release) \
         and settle steps (before the grant, the GPU gated) — both exclusive per GPU, so together with the \
         wall time they bound a run's throughput.</p>\n",
    );
}

/// "a / b" of two optional figures without decimals, "—" where none were recorded.
fn pair(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{} / {}", fmt_f(a, 0), fmt_f(b, 0)),
        _ => "—".to_string(),
    }
}

fn section_timelines(out: &mut String, r: &EvalReport) {
    out.push_str("<h2>Region timelines</h2>\n");
    if r.runs.is_empty() {
        no_runs_note(out);
        return;
    }
    for (i, run) in r.runs.iter().enumerate() {
        let (svg, shown, revoked) = svg_timeline(run, colour(i));
        out.push_str("<figure>\n");
        out.push_str(&svg);
        let _ = writeln!(
            out,
            "<figcaption>{}: {shown} regions shown ({revoked} revoked, in red) of {} in the run.</figcaption>",
            esc(&crate::report::run_label(run)),
            run.regions.count
        );
        out.push_str("</figure>\n");
    }
}

/// Hover text of one region.
fn region_title(e: &TimelineEntry) -> String {
    let job = e.job.map_or_else(|| "no job".to_string(), |j| format!("job {j}"));
    let revoked = if e.revoked { ", revoked" } else { "" };
    format!("{job} on {}: {}–{} s{revoked}", e.device, fmt_f(e.start_s, 3), fmt_f(e.end_s, 3))
}

/// The run's timeline, the number of regions drawn and how many of them were revoked.
fn svg_timeline(run: &RunSummary, fill: &str) -> (String, usize, usize) {
    const W: f64 = 1200.0;
    const LEFT: f64 = 150.0;
    const RIGHT: f64 = 16.0;
    const TOP: f64 = 26.0;
    const ROW: f64 = 18.0;
    const BAR_H: f64 = 10.0;
    const AXIS_H: f64 = 40.0;
    let title = format!("Run {}", run.name);
    let entries: Vec<&TimelineEntry> = run.timeline.iter().filter(|e| e.start_s.is_finite()).collect();
    if entries.is_empty() {
        return (svg_message(W, 70.0, &title, "no regions"), 0, 0);
    }
    let mut devices: BTreeMap<&str, usize> = BTreeMap::new();
    for e in &entries {
        devices.entry(e.device.as_str()).or_insert(0);
    }
    for (row, v) in devices.values_mut().enumerate() {
        *v = row;
    }
    let t_end = entries
        .iter()
        .flat_map(|e| [e.start_s, e.end_s])
        .chain(std::iter::once(run.wall_s))
        .filter(|t| t.is_finite())
        .fold(0.0, f64::max);
    let t_end = if t_end > 0.0 { t_end } else { 1.0 };
    let x = Scale { d0: 0.0, d1: t_end, r0: LEFT, r1: W - RIGHT };
    let plot_h = ROW * devices.len() as f64;
    let h = TOP + plot_h + AXIS_H;

    let mut s = svg_open(W, h, &format!("region timeline of run {}", run.name));
    s.push_str(&svg_text(8.0, 16.0, "start", "title", &title));
    let (ticks, step) = nice_ticks(0.0, t_end, 10);
    s.push_str(&svg_x_axis(&x, TOP + plot_h, TOP, &ticks, step, "time since the run started (s)"));
    for (dev, row) in &devices {
        let y = TOP + ROW * *row as f64 + ROW / 2.0 + 4.0;
        s.push_str(&svg_text(LEFT - 8.0, y, "end", "", &truncate(dev, 22)));
    }
    let mut revoked = 0;
    for e in &entries {
        let row = devices[e.device.as_str()];
        let x0 = x.map(e.start_s);
        let end = if e.end_s.is_finite() { e.end_s.max(e.start_s) } else { e.start_s };
        let w = (x.map(end) - x0).max(1.0);
        let y = TOP + ROW * row as f64 + (ROW - BAR_H) / 2.0;
        let colour = if e.revoked { REVOKED_COLOUR } else { fill };
        revoked += usize::from(e.revoked);
        s.push_str(&svg_rect(x0, y, w, BAR_H, colour, Some(&region_title(e))));
    }
    s.push_str(svg_close());
    (s, entries.len(), revoked)
}

// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{FlippedPair, OperatorRanking, PairRanking, RegionStats};

    fn bucket(label: &str, values: Vec<f64>) -> BucketInflation {
        let mut sorted = values.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        BucketInflation {
            bucket: label.to_string(),
            n: sorted.len(),
            p50: quantile_sorted(&sorted, 0.5).unwrap_or(f64::NAN),
            p95: quantile_sorted(&sorted, 0.95).unwrap_or(f64::NAN),
            values: sorted,
        }
    }

    fn run(name: &str, tp: f64, ratio: Option<f64>, scale: f64) -> RunSummary {
        let inflation: Vec<BucketInflation> = BUCKETS
            .iter()
            .enumerate()
            .map(|(b, label)| {
                // Bucket 2 stays empty in every run.
                let values = if b == 2 {
                    vec![]
                } else {
                    (0..50).map(|i| scale * (i as f64 / 50.0 - 0.02) * (b + 1) as f64).collect()
                };
                bucket(label, values)
            })
            .collect();
        let all: Vec<f64> = inflation.iter().flat_map(|b| b.values.clone()).collect();
        let timeline = (0..20)
            .map(|i| TimelineEntry {
                job: Some(i),
                device: format!("GPU-{}", i % 2),
                start_s: i as f64 * 0.5,
                end_s: i as f64 * 0.5 + 0.3,
                revoked: i == 7,
            })
            .collect();
        RunSummary {
            name: name.to_string(),
            policy: "fifo".to_string(),
            ablation: "full".to_string(),
            warm: true,
            concurrency: 4,
            commands: 150,
            failed: 1,
            wall_s: 10.0,
            throughput_per_min: tp,
            gpus: 1,
            gpu_groups: false,
            commands_per_gpu: Default::default(),
            throughput_ratio_vs_command: ratio,
            inflation,
            inflation_all: bucket("all", all),
            cross_device_commands: 0,
            compared_across_devices: false,
            full_clock: Vec::new(),
            throttled_commands: 0,
            top_sm_clock_mhz: None,
            outliers: Vec::new(),
            ranking_all: Some(PairRanking { pairs: 16, flips: 2, kendall_tau: 0.75 }),
            ranking_resolved: Some(PairRanking { pairs: 10, flips: 0, kendall_tau: 1.0 }),
            flips: vec![FlippedPair {
                operator: "matmul".to_string(),
                group: "mm<1024>".to_string(),
                faster: "c001".to_string(),
                slower: "c002".to_string(),
                truth_gap: 0.013,
                measured_gap: -0.004,
            }],
            repeat_of_truth: false,
            ranking: vec![
                OperatorRanking {
                    operator: "matmul".to_string(),
                    groups: 3,
                    pairs: 12,
                    kendall_tau: 0.9,
                    flip_rate: 0.05,
                },
                OperatorRanking {
                    operator: "softmax".to_string(),
                    groups: 2,
                    pairs: 4,
                    kendall_tau: 0.5,
                    flip_rate: 0.25,
                },
            ],
            regions: RegionStats { count: 20, revoked: 1, wait_ms_p50: 1.5, ..Default::default() },
            busy_share: 0.6,
            timeline,
        }
    }

    fn report() -> EvalReport {
        let mut odd = run("kforge <full> & \"warm\"", 900.0, Some(1.5), 0.3);
        // Non-finite values must print as "—" and never reach SVG coordinates.
        odd.wall_s = f64::NAN;
        odd.busy_share = f64::INFINITY;
        odd.inflation_all.p50 = f64::NAN;
        odd.inflation[0].values.push(f64::NAN);
        odd.ranking[1].kendall_tau = f64::NAN;
        odd.regions.drain_ms_p95 = f64::NAN;
        odd.timeline.push(TimelineEntry {
            job: None,
            device: "GPU-0".to_string(),
            start_s: 3.0,
            end_s: f64::NAN,
            revoked: false,
        });
        odd.timeline.push(TimelineEntry {
            job: None,
            device: "GPU-1".to_string(),
            start_s: f64::NAN,
            end_s: 1.0,
            revoked: false,
        });
        EvalReport {
            workload: "runs/a<b&c>.jsonl".to_string(),
            device: "NVIDIA H200 \"sxm\"".to_string(),
            buckets: BUCKETS.iter().map(|s| s.to_string()).collect(),
            isolated_commands: 150,
            resolved_min_gap: 0.02,
            runs: vec![
                run("command", 600.0, Some(1.0), 1.0),
                odd,
                run("gate-only", 0.0, None, 50.0),
                RunSummary { repeat_of_truth: true, ..run("truth-warm", 60.0, None, 1.0) },
            ],
        }
    }

    /// Every numeric SVG attribute and polyline coordinate parses as a finite number.
    fn assert_svg_numbers_finite(html: &str) {
        let mut checked = 0;
        for attr in [" x=\"", " y=\"", " x1=\"", " y1=\"", " x2=\"", " y2=\"", " width=\"", " height=\""] {
            for (pos, _) in html.match_indices(attr) {
                let rest = &html[pos + attr.len()..];
                let value = &rest[..rest.find('"').unwrap()];
                let v: f64 = value.parse().unwrap_or_else(|_| panic!("bad {attr}{value}"));
                assert!(v.is_finite(), "{attr}{value}");
                checked += 1;
            }
        }
        for (pos, _) in html.match_indices("points=\"") {
            let rest = &html[pos + 8..];
            let value = &rest[..rest.find('"').unwrap()];
            for pair in value.split(' ') {
                let (a, b) = pair.split_once(',').expect("x,y pair");
                for c in [a, b] {
                    let v: f64 = c.parse().unwrap_or_else(|_| panic!("bad point {pair}"));
                    assert!(v.is_finite(), "{pair}");
                }
                checked += 1;
            }
        }
        assert!(checked > 0);
    }

    #[test]
    fn renders_full_report() {
        let r = report();
        let html = render(&r);
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.trim_end().ends_with("</html>"));
        for bad in ["http://", "https://", "<script", "url(", "@import"] {
            assert!(!html.contains(bad), "page contains {bad}");
        }
        assert!(html.contains("runs/a&lt;b&amp;c&gt;.jsonl"));
        assert!(!html.contains("a<b&c>"));
        assert!(html.contains("NVIDIA H200 &quot;sxm&quot;"));
        assert_eq!(html.matches("<svg").count(), 1 + 4 + r.runs.len());
        assert_eq!(html.matches("</svg>").count(), 1 + 4 + r.runs.len());
        for run in &r.runs {
            assert!(html.contains(&esc(&run.name)), "missing run {}", run.name);
        }
        assert!(!html.contains("kforge <full>"));
        assert!(html.contains("kforge runtime evaluation"));
        assert!(html.contains("no commands in this bucket"));
        assert!(html.contains("<td>—</td>"));
        assert!(html.contains("<td>1.50×</td>"));
        assert!(html.contains("n=50"));
        assert!(html.contains(REVOKED_COLOUR));
        // Pooled and resolved tau, the flipped pairs (escaped), the repeat truth marked +.
        assert!(html.contains("<td>0.750</td>") && html.contains("resolved pairs") && html.contains("at least 2.0 %"));
        assert!(
            html.contains("<h3>Flipped pairs") && html.contains("mm&lt;1024&gt;") && html.contains("<td>1.30%</td>")
        );
        assert!(html.contains("<td class=\"l\">truth-warm+</td><td class=\"l\">truth</td>"), "repeat row");
        assert!(!html.contains("NaN"));
        assert!(!html.contains(">inf<") && !html.contains("\"inf\""));
        assert_svg_numbers_finite(&html);
        // Sections come in the specified order.
        let order = [
            "<h1>",
            "<h2>Summary",
            "<h2>Throughput",
            "<h2>Inflation CDFs",
            "<h2>Inflation per bucket",
            "<h2>Ranking fidelity",
            "<h2>Region statistics",
            "<h2>Region timelines",
        ];
        let positions: Vec<usize> = order.iter().map(|s| html.find(s).unwrap()).collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn renders_empty_and_degenerate_reports() {
        let empty = EvalReport {
            workload: String::new(),
            device: String::new(),
            buckets: vec![],
            isolated_commands: 0,
            resolved_min_gap: 0.02,
            runs: vec![],
        };
        let html = render(&empty);
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert_eq!(html.matches("<svg").count(), 5);
        assert!(!html.contains("NaN"));

        // A single run with no data at all and zero wall time.
        let mut lone = run("command", f64::NAN, None, 1.0);
        lone.wall_s = 0.0;
        lone.timeline.clear();
        lone.ranking.clear();
        lone.inflation.clear();
        lone.inflation_all = BucketInflation::default();
        let r = EvalReport { runs: vec![lone], ..empty };
        let html = render(&r);
        assert_eq!(html.matches("<svg").count(), 6);
        assert_eq!(html.matches("no commands in this bucket").count(), 4);
        assert!(html.contains("no regions"));
        assert!(html.contains("no operators"));
        assert!(!html.contains("NaN"));
        assert_svg_numbers_finite(&html);
    }

    #[test]
    fn helpers() {
        assert_eq!(esc("<a href='x'>&\"</a>"), "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;");
        assert_eq!(fmt_pct(0.12345), "12.35%");
        assert_eq!(fmt_pct(f64::NAN), "—");
        assert_eq!(fmt_f(f64::INFINITY, 2), "—");
        assert_eq!(fmt_ratio(Some(1.234)), "1.23×");
        assert_eq!(fmt_ratio(None), "—");
        assert_eq!(svg_num(f64::NAN), "0");
        assert_eq!(sample_indices(5, 10), vec![0, 1, 2, 3, 4]);
        let idx = sample_indices(10_000, 100);
        assert_eq!((idx.len(), idx[0], idx[99]), (100, 0, 9_999));
        let (ticks, step) = nice_ticks(-5.0, 37.0, 6);
        assert_eq!(step, 10.0);
        assert_eq!(ticks, vec![0.0, 10.0, 20.0, 30.0]);
        let (lo, hi) = cdf_range(&[vec![-20.0, 0.0, 50.0], vec![5000.0]]);
        assert_eq!(lo, -20.0);
        assert!(hi <= CDF_MAX_HI && hi > 50.0);
        assert!(worst_tau(&run("x", 1.0, None, 1.0)) == 0.5);
    }
}
