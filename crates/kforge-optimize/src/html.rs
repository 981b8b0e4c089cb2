//! `kforge optimize --html`: the report as one self-contained HTML file (inline CSS and SVG, no
//! script, nothing fetched), for people who would rather look than read. A problem's page plots
//! every measured variant's speedup over the baseline with its 95 % interval against the noise
//! band; a campaign's page plots every problem's result (coloured by the agent that won it, the
//! fallbacks at 1.0), the per-level summary and which agent won what.

use crate::goals::GoalCheck;
use crate::{Agent, Decision, DispatchMeasurement, LevelSummary, ProblemOutcome, Report};
use std::collections::BTreeMap;
use std::fmt::Write;

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}\
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\
td:first-child,th:first-child{text-align:left}h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}\
.note{color:#666}svg text{font:11px system-ui,sans-serif}\
pre.diff{font:12px/1.35 ui-monospace,monospace;background:#fafafa;border:1px solid #ddd;padding:6px;overflow-x:auto}\
.add{background:#e6f4ea;display:block}.del{background:#fbe9e7;display:block}.hunk{color:#3b7dd8;display:block}";

/// Colour of an agent's bars; the baseline kept (and failures) are grey.
fn colour(agent: Option<Agent>) -> &'static str {
    match agent {
        Some(Agent::Dispatch) => "#3b7dd8",
        Some(Agent::Inductor) => "#e08a1e",
        Some(Agent::Rewrite) => "#3aa655",
        Some(Agent::Config) => "#9b4dca",
        Some(Agent::Llm) => "#d0453f",
        None => "#9a9a9a",
    }
}

/// Text made safe for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title><style>{STYLE}</style></head>\n\
         <body><h1>{t}</h1>\n{body}</body></html>\n",
        t = escape(title)
    )
}

/// One horizontal bar of a speedup chart: its label, value, interval and colour.
struct Bar {
    label: String,
    speedup: f64,
    ci95: Option<[f64; 2]>,
    colour: &'static str,
    note: String,
}

/// Horizontal bars on a log axis centred on 1.0 (the baseline), the noise band shaded.
fn speedup_chart(bars: &[Bar], noise_floor: Option<f64>) -> String {
    let (label_w, plot_w, row_h) = (300.0, 420.0, 20.0);
    let values = bars.iter().flat_map(|b| {
        let ci = b.ci95.unwrap_or([b.speedup, b.speedup]);
        [b.speedup, ci[0], ci[1]]
    });
    let span = values.chain(noise_floor).filter(|v| *v > 0.0).map(|v| v.ln().abs()).fold(0.05_f64, f64::max) * 1.1;
    let x = |v: f64| label_w + plot_w / 2.0 + (v.max(1e-9).ln() / span) * (plot_w / 2.0);
    let height = row_h * bars.len() as f64 + 30.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" role=\"img\">",
        w = label_w + plot_w + 80.0
    );
    if let Some(f) = noise_floor.filter(|f| *f > 1.0) {
        let (a, b) = (x(1.0 / f), x(f));
        let _ = write!(
            s,
            "<rect class=\"noise\" x=\"{a:.1}\" y=\"0\" width=\"{:.1}\" height=\"{height}\" fill=\"#eee\"/>",
            b - a
        );
    }
    let one = x(1.0);
    let _ = write!(s, "<line x1=\"{one:.1}\" y1=\"0\" x2=\"{one:.1}\" y2=\"{height}\" stroke=\"#555\"/>");
    for (i, b) in bars.iter().enumerate() {
        let y = i as f64 * row_h + 4.0;
        let (from, to) = (one.min(x(b.speedup)), one.max(x(b.speedup)));
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\
             <rect class=\"bar\" x=\"{from:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{}</title></rect>",
            label_w - 6.0,
            y + 12.0,
            escape(&b.label),
            (to - from).max(1.0),
            row_h - 6.0,
            b.colour,
            escape(&b.note)
        );
        if let Some([lo, hi]) = b.ci95 {
            let _ = write!(
                s,
                "<line class=\"ci\" x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#111\"/>",
                x(lo),
                y + (row_h - 6.0) / 2.0,
                x(hi),
                y + (row_h - 6.0) / 2.0
            );
        }
        let _ = write!(s, "<text x=\"{:.1}\" y=\"{:.1}\">{:.3}x</text>", label_w + plot_w + 4.0, y + 12.0, b.speedup);
    }
    let _ = write!(
        s,
        "<text x=\"{one:.1}\" y=\"{:.1}\" text-anchor=\"middle\">1.0 = baseline (log scale; shaded: noise band)</text></svg>",
        height - 6.0
    );
    s
}

/// What a result changes, for its page: the problem's source and the result file the run ended
/// with (the winner's, or the baseline's own when it was kept).
pub struct Change<'a> {
    pub problem: &'a str,
    pub result_name: &'a str,
    pub result: &'a str,
}

/// Diff lines shown at most (a longer diff says how many more there are).
const MAX_DIFF_LINES: usize = 3000;

/// The result file against the problem as a unified diff, added lines green and removed red.
fn change_section(c: &Change) -> String {
    let hunks = crate::diff::hunks(c.problem, c.result, 3);
    let (added, removed) = crate::diff::counts(&hunks);
    let mut s = format!(
        "<h2>What the result changes</h2><p>{} against the problem's source: {added} line(s) added, {removed} removed.</p>",
        escape(c.result_name)
    );
    if hunks.is_empty() {
        return s;
    }
    s.push_str("<details open><summary>diff</summary><pre class=\"diff\">");
    let mut shown = 0usize;
    for h in &hunks {
        let (old_len, new_len) = h.lengths();
        let _ = write!(s, "<span class=\"hunk\">@@ -{},{old_len} +{},{new_len} @@</span>", h.old_start, h.new_start);
        for line in &h.lines {
            if shown == MAX_DIFF_LINES {
                break;
            }
            shown += 1;
            let (class, mark, text) = match line {
                crate::diff::Line::Same(t) => ("", ' ', t),
                crate::diff::Line::Added(t) => ("add", '+', t),
                crate::diff::Line::Removed(t) => ("del", '-', t),
            };
            if class.is_empty() {
                let _ = writeln!(s, "{mark} {}", escape(text));
            } else {
                let _ = write!(s, "<span class=\"{class}\">{mark} {}</span>", escape(text));
            }
        }
    }
    let total: usize = hunks.iter().map(|h| h.lines.len()).sum();
    if total > shown {
        let _ = write!(s, "<span class=\"hunk\">… {} more line(s) not shown</span>", total - shown);
    }
    s.push_str("</pre></details>");
    s
}

/// A problem's page: the question, the decision, every variant against the noise band, and,
/// given `change`, what the result file changes against the problem's source.
pub fn problem_html(r: &Report, change: Option<&Change>) -> String {
    let m = &r.measurement;
    let q = &r.question;
    let mut body = format!(
        "<p>{} at size <b>{}</b> on <b>{}</b>, against torch.compile <b>{}</b>; agents: {}; {} rounds.</p>",
        escape(&q.problem),
        escape(&q.size),
        escape(&q.device),
        q.baseline.mode(),
        q.agents.iter().map(|a| a.name()).collect::<Vec<_>>().join(", "),
        q.rounds
    );
    let decision = match &r.decision {
        Decision::Improved { agent, mode, speedup, ci95 } => format!(
            "<b>{}</b> ({}) at <b>{speedup:.3}x</b> (95 % interval {:.3}–{:.3}), verified",
            escape(mode),
            agent.name(),
            ci95[0],
            ci95[1]
        ),
        Decision::Fallback { reason } => format!("<b>baseline kept</b>: {}", escape(reason)),
    };
    let _ = write!(body, "<p>Result: {decision}.</p>");
    if r.tried.len() > 1 {
        let each: Vec<String> = r
            .tried
            .iter()
            .map(|t| format!("<b>{}</b> {}", escape(&t.variant), crate::journal::verified_name(t.verified)))
            .collect();
        let _ = write!(body, "<p>Verified in turn: {}.</p>", each.join(", then "));
    }
    body.push_str("<h2>Variants against the baseline</h2>");
    let bars = variant_bars(m);
    body.push_str(&speedup_chart(&bars, m.noise_floor));
    body.push_str(&legend());
    body.push_str(&variants_table(r));
    if let Some(g) = m.graphs.as_ref().filter(|g| g.count > 1) {
        let _ = write!(body, "<p>{}</p>", escape(g.line().trim_end()));
    }
    if let Some(line) = r.decisive().cuda_graph_line() {
        let _ = write!(body, "<p class=\"note\">{}</p>", escape(line.trim_end()));
    }
    body.push_str(&beam_section(r));
    body.push_str(&config_section(r));
    body.push_str(&llm_section(r));
    if let Some(c) = change {
        body.push_str(&change_section(c));
    }
    page(&format!("kforge optimize: {}", q.problem), &body)
}

fn variant_bars(m: &DispatchMeasurement) -> Vec<Bar> {
    m.modes
        .iter()
        .map(|(name, t)| Bar {
            label: name.clone(),
            speedup: t.speedup,
            ci95: Some(t.ci95),
            colour: colour(Some(Agent::of_variant(name))),
            note: format!("{name}: {:.3}x ({:.3}-{:.3})", t.speedup, t.ci95[0], t.ci95[1]),
        })
        .collect()
}

/// The beam's second round: its variants against the same baseline, or why it did not run.
fn beam_section(r: &Report) -> String {
    let Some(b) = &r.beam else { return String::new() };
    let mut s = String::from("<h2>Beam, round 2: the knobs that helped, combined</h2>");
    if let Some(m) = &b.measurement {
        s.push_str(&speedup_chart(&variant_bars(m), m.noise_floor));
    }
    if let Some(why) = &b.stopped {
        let _ = write!(s, "<p class=\"note\">{}</p>", escape(why));
    }
    s
}

/// The config agent per kernel: its time share in the baseline, the share it would have after
/// (its share over its own kernel speedup, against the baseline's total), the choice.
fn config_section(r: &Report) -> String {
    let Some(c) = &r.config else { return String::new() };
    let mut s = String::from("<h2>The config agent: launch configurations per kernel</h2>");
    for why in [&c.skipped, &c.error].into_iter().flatten() {
        let _ = write!(s, "<p class=\"note\">{}</p>", escape(why));
    }
    let Some(m) = &c.measurement else { return s };
    if let (Some(share), Some(ceiling)) = (m.triton_share, m.amdahl_ceiling()) {
        let _ = write!(
            s,
            "<p>Triton kernels: {:.0} % of the baseline's device time; the Amdahl ceiling of a search over them \
             (every one at zero time): {}.</p>",
            share * 100.0,
            if ceiling.is_finite() { format!("{ceiling:.2}x") } else { "unbounded".into() }
        );
    }
    if let Some(r) = &m.roofline {
        let _ = write!(s, "<p>{}</p>", escape(r.line().trim_end().trim_start_matches("config: ")));
    }
    s.push_str(
        "<table><tr><th>kernel</th><th>kind</th><th>share before</th><th>share after (est.)</th><th>choice</th></tr>",
    );
    let mut kernels: Vec<_> = m.kernels.iter().collect();
    kernels.sort_by(|a, b| b.1.share.unwrap_or(0.0).total_cmp(&a.1.share.unwrap_or(0.0)));
    for (name, k) in kernels {
        let before = k.share.unwrap_or(0.0);
        let after = match (k.fallback, k.speedup) {
            (false, Some(x)) if x > 0.0 => before / x,
            _ => before,
        };
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{:.1} %</td><td>{:.1} %</td><td>{}</td></tr>",
            escape(name),
            escape(k.kind.as_deref().unwrap_or("?")),
            before * 100.0,
            after * 100.0,
            escape(&k.choice())
        );
    }
    for (name, k) in m.roofline.iter().flat_map(crate::Roofline::at_roof) {
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>—</td><td>—</td><td>not tuned: {}</td></tr>",
            escape(name),
            escape(k.kind.as_deref().unwrap_or("?")),
            escape(&k.at_roof_text())
        );
    }
    s.push_str("</table>");
    if let Some(t) = m.modes.get("config") {
        let _ = write!(
            s,
            "<p>The model with every winner pinned: {:.3}x ({:.3}–{:.3}) against {}.</p>",
            t.speedup,
            t.ci95[0],
            t.ci95[1],
            escape(&m.baseline)
        );
    }
    s
}

/// The LLM agents' search: every candidate with its verdict (cheats marked), the best one, the
/// cost of the calls.
fn llm_section(r: &Report) -> String {
    let Some(l) = &r.llm else { return String::new() };
    let mut s = format!(
        "<h2>The LLM agents: {} on {}</h2><p>{} iteration(s), stopped: {}.",
        escape(&l.model),
        escape(&l.endpoint),
        l.iterations,
        escape(&l.stop)
    );
    if let Some(run) = l.replayed_from {
        let _ = write!(s, " Replayed from run {run}'s recorded replies.");
    }
    if let Some(e) = &l.error {
        let _ = write!(s, " <b>Provider failed</b>: {}.", escape(e));
    }
    s.push_str("</p><table><tr><th>candidate</th><th>strategy</th><th>verdict</th><th>check</th><th>speedup</th></tr>");
    for c in &l.candidates {
        let check = match (&c.duplicate_of, &c.gate) {
            (Some(d), _) => format!("duplicate of {}", escape(d)),
            (None, Some(g)) => format!("{}{}", escape(g), if c.exploit { " <b>(exploit)</b>" } else { "" }),
            (None, None) => String::new(),
        };
        let best = if l.best.as_ref() == Some(&c.id) { " <b>(best)</b>" } else { "" };
        let _ = write!(
            s,
            "<tr><td>{}{best}</td><td>{}</td><td>{}</td><td>{check}</td><td>{}</td></tr>",
            escape(&c.id),
            escape(&c.strategy),
            escape(&c.verdict),
            c.speedup.map(|x| format!("{x:.3}x")).unwrap_or_else(|| "-".into())
        );
    }
    let u = &l.usage;
    let _ = write!(
        s,
        "</table><p class=\"note\">{} calls ({} replayed, {} retried), {} tokens, ${:.4}; {} malformed replies fed back, \
         {} executor retries, {} duplicates, {} meltdowns.</p>",
        u.calls, u.replayed, u.retries, u.tokens, u.usd, u.malformed, u.executor_retries, u.duplicates, u.meltdowns
    );
    s
}

fn legend() -> String {
    let mut s = String::from("<p class=\"note\">");
    for (name, a) in Agent::ALL {
        let _ = write!(s, "<span style=\"color:{}\">&#9632;</span> {name} &nbsp; ", colour(Some(a)));
    }
    let _ = write!(s, "<span style=\"color:{}\">&#9632;</span> baseline kept / failed</p>", colour(None));
    s
}

fn variants_table(r: &Report) -> String {
    let m = &r.measurement;
    let mut s = String::from(
        "<table><tr><th>variant</th><th>agent</th><th>speedup</th><th>95 % interval</th><th>beyond noise</th><th>note</th></tr>",
    );
    for (name, p) in &m.prepared {
        let t = m.modes.get(name);
        let note = match (&p.why, &p.rules) {
            (Some(why), _) => why.clone(),
            (None, Some(rules)) => format!("rules: {}", rules.join(", ")),
            _ => p.note(),
        };
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(name),
            Agent::of_variant(name).name(),
            t.map(|t| format!("{:.3}x", t.speedup)).unwrap_or_else(|| "—".into()),
            t.map(|t| format!("{:.3}–{:.3}", t.ci95[0], t.ci95[1])).unwrap_or_else(|| "—".into()),
            t.map(|t| if t.beyond_noise { "yes" } else { "no" }).unwrap_or(if *name == m.baseline {
                "baseline"
            } else {
                "—"
            }),
            escape(&note)
        );
    }
    for (name, same) in &m.duplicates {
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>—</td><td>—</td><td>—</td><td>not measured: it compiles exactly as {}</td></tr>",
            escape(name),
            Agent::of_variant(name).name(),
            escape(same)
        );
    }
    if let Some(f) = m.noise_floor {
        let _ = write!(s, "<tr><td colspan=\"6\">noise floor {f:.4} (the baseline against itself)</td></tr>");
    }
    s.push_str("</table>");
    s
}

/// A campaign's page: per level the summary, every problem's result, what each agent won.
/// `pages`: each problem's own page (its path relative to the campaign's page, or absolute), for
/// the problems that have one: local files, linked, never fetched.
pub fn campaign_html(
    title: &str,
    outcomes: &[ProblemOutcome],
    summary: &[LevelSummary],
    goals: &[GoalCheck],
    pages: &BTreeMap<String, String>,
) -> String {
    let mut body = summary_table(summary);
    body.push_str(&goals_table(goals));
    body.push_str("<h2>Every problem</h2>");
    let mut sorted: Vec<&ProblemOutcome> = outcomes.iter().collect();
    sorted.sort_by(|a, b| b.speedup().total_cmp(&a.speedup()).then(a.problem.cmp(&b.problem)));
    let bars: Vec<Bar> = sorted.iter().map(|o| outcome_bar(o)).collect();
    body.push_str(&speedup_chart(&bars, None));
    body.push_str(&legend());
    body.push_str(&attribution_table(outcomes));
    body.push_str(&problems_table(outcomes, pages));
    page(title, &body)
}

/// Issue 18's goals per level: met or missed, and why the baselines kept were kept.
fn goals_table(goals: &[GoalCheck]) -> String {
    if goals.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "<h2>Against the goals</h2><table><tr><th>level</th><th>confirmed geomean</th><th>goal</th><th>met</th>\
         <th>wall s / problem</th><th>GPU s / problem</th><th>cost met</th><th>lowest</th>\
         <th>vendor-bound kept</th><th>at the bandwidth roof</th><th>kept otherwise</th><th>undecided</th>\
         <th>searched in part</th></tr>",
    );
    for g in goals {
        let met = |m: Option<bool>| match m {
            Some(true) => "yes",
            Some(false) => "<b>no</b>",
            None => "—",
        };
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{:.3}x</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td><td>{}</td><td>{:.3}x</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&g.level),
            g.geomean_confirmed,
            g.geomean_goal.map(|x| format!("{x:.2}x")).unwrap_or_else(|| "—".into()),
            met(g.geomean_met),
            g.wall_s_per_problem,
            g.gpu_s_per_problem,
            met(g.cost_met),
            g.lowest,
            escape(&g.vendor_bound.join(", ")),
            escape(&g.at_roof.join(", ")),
            escape(&g.nothing_won.join(", ")),
            escape(&g.undecided.join(", ")),
            escape(&g.searched_in_part.join(", "))
        );
    }
    let _ = write!(
        s,
        "</table><p class=\"note\">Vendor-bound: the baseline's Triton kernels are below {:.0} % of its device time, so a \
         search over them is capped below {:.2}x (Amdahl). At the bandwidth roof: were every generated kernel to move \
         its least traffic at the device's bandwidth, the model would be at most {:.2}x faster. Searched in part: decided over a bounded measure step that left variants, \
         the rewrite or the per-graph search out (the problem's page names them). Cost goals: {:.0} s wall and {:.0} s GPU per problem.</p>",
        crate::goals::VENDOR_BOUND_SHARE * 100.0,
        crate::amdahl_ceiling(crate::goals::VENDOR_BOUND_SHARE),
        crate::goals::AT_ROOF_CEILING,
        crate::goals::WALL_S_PER_PROBLEM,
        crate::goals::GPU_S_PER_PROBLEM
    );
    s
}

/// Every problem in order, its result and a link to its own page where it has one.
fn problems_table(outcomes: &[ProblemOutcome], pages: &BTreeMap<String, String>) -> String {
    let mut s = String::from(
        "<h2>Each problem</h2><table><tr><th>problem</th><th>result</th><th>speedup</th><th>confirmed</th><th>seconds</th><th>page</th></tr>",
    );
    for o in outcomes {
        let bar = outcome_bar(o);
        let link = pages
            .get(&o.problem)
            .map(|p| format!("<a href=\"{}\">report.html</a>", escape(p)))
            .unwrap_or_else(|| "—".into());
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{:.3}x</td><td>{}</td><td>{:.1}</td><td>{link}</td></tr>",
            escape(&o.problem),
            escape(&bar.note),
            o.speedup(),
            o.confirmed.map(|c| format!("{c:.3}x")).unwrap_or_else(|| "—".into()),
            o.seconds
        );
    }
    s.push_str("</table>");
    s
}

fn outcome_bar(o: &ProblemOutcome) -> Bar {
    let (agent, ci95, note) = match (&o.decision, &o.not_reached, &o.error) {
        (Some(Decision::Improved { agent, mode, ci95, .. }), _, _) => {
            (Some(*agent), Some(*ci95), format!("{mode} ({})", agent.name()))
        }
        (Some(Decision::Fallback { reason }), _, _) => (None, None, format!("baseline kept: {reason}")),
        (None, Some(why), _) => (None, None, format!("not reached: {why}")),
        (None, None, e) => (None, None, format!("failed: {}", e.as_deref().unwrap_or("?"))),
    };
    Bar { label: o.problem.clone(), speedup: o.speedup(), ci95, colour: colour(agent), note }
}

fn summary_table(summary: &[LevelSummary]) -> String {
    let mut s = String::from(
        "<table><tr><th>level</th><th>problems</th><th>optimized</th><th>fallbacks</th><th>failed</th>\
         <th>not reached</th><th>geomean</th><th>confirmed</th><th>fast_1</th><th>seconds</th><th>GPU-seconds</th></tr>",
    );
    for l in summary {
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.3}x</td><td>{:.3}x</td><td>{:.2}</td><td>{:.1}</td><td>{:.1}</td></tr>",
            escape(&l.level),
            l.problems,
            l.optimized,
            l.fallbacks,
            l.failed,
            l.not_reached,
            l.geomean,
            l.geomean_confirmed,
            l.fast_1,
            l.seconds,
            l.gpu_seconds
        );
    }
    s.push_str("</table><p class=\"note\">geomean over the baseline: fallbacks, failures and problems not reached count as 1.0; confirmed: each winner at the speedup gate 4 measured for its shipped result file in its own process (where it did), the goals' figure.</p>");
    s
}

/// Which agent won what: problems won and the geometric mean of its wins.
fn attribution_table(outcomes: &[ProblemOutcome]) -> String {
    let mut by: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    for o in outcomes {
        if let Some(Decision::Improved { agent, speedup, .. }) = &o.decision {
            by.entry(agent.name()).or_default().push(*speedup);
        }
    }
    let mut s = String::from(
        "<h2>Which agent won what</h2><table><tr><th>agent</th><th>problems won</th><th>geomean of its wins</th></tr>",
    );
    for (name, wins) in &by {
        let g = (wins.iter().map(|v| v.ln()).sum::<f64>() / wins.len() as f64).exp();
        let _ = write!(s, "<tr><td>{name}</td><td>{}</td><td>{g:.3}x</td></tr>", wins.len());
    }
    if by.is_empty() {
        s.push_str("<tr><td colspan=\"3\">no agent won a problem: every result is the baseline</td></tr>");
    }
    s.push_str("</table>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{summarize, Baseline, DispatchMeasurement, ModeTiming, Prepared, Question, Verified};

    fn report() -> Report {
        let timing = |s: f64| ModeTiming { speedup: s, ci95: [s * 0.98, s * 1.02], beyond_noise: s > 1.03 };
        let prepared = |why: Option<&str>| Prepared {
            ok: why.is_none(),
            why: why.map(String::from),
            first_call_s: None,
            rules: None,
            exactness: None,
            same_code_as: None,
            no_effect: None,
            not_prepared: None,
        };
        let m = DispatchMeasurement {
            baseline: "max-autotune".into(),
            winner: "default+freezing".into(),
            fallback: false,
            noise_floor: Some(1.02),
            modes: [("eager".to_string(), timing(0.7)), ("default+freezing".to_string(), timing(1.3))].into(),
            prepared: [
                ("eager".to_string(), prepared(None)),
                ("default+freezing".to_string(), prepared(None)),
                ("reduce-overhead".to_string(), prepared(Some("<graph break> & more"))),
            ]
            .into(),
            rewrite: None,
            graphs: None,
            baseline_profile: None,
            duplicates: BTreeMap::new(),
            not_prepared: Vec::new(),
            rounds_cut: None,
            input_bytes: None,
        };
        Report {
            question: Question {
                problem: "level1/x<y>.py".into(),
                size: "default".into(),
                device: "0".into(),
                baseline: Baseline::MaxAutotune,
                agents: vec![Agent::Dispatch, Agent::Inductor],
                rounds: 5,
                beam_width: 0,
                steps: crate::STEPS_VERSION,
            },
            measurement: m,
            verified: Some(Verified::Accepted),
            decision: Decision::Improved {
                agent: Agent::Inductor,
                mode: "default+freezing".into(),
                speedup: 1.3,
                ci95: [1.27, 1.33],
            },
            result: "model_new.py".into(),
            policy: "policy.toml".into(),
            beam: None,
            config: None,
            llm: None,
            tried: Vec::new(),
            spent: None,
            machine: None,
            source_hash: None,
            confirmed: None,
        }
    }

    /// Self-contained: no script, nothing fetched (the SVG namespace is a name, not a fetch).
    fn assert_self_contained(html: &str) {
        assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
        assert!(!html.contains("<script") && !html.contains("src=") && !html.contains("href="), "{html}");
        assert_eq!(html.matches("http").count(), html.matches("http://www.w3.org/2000/svg").count());
    }

    #[test]
    fn a_problems_page_plots_every_variant_against_the_noise_band() {
        let html = problem_html(&report(), None);
        assert_self_contained(&html);
        assert_eq!(html.matches("class=\"bar\"").count(), 2, "one bar per timed variant");
        assert_eq!(html.matches("class=\"ci\"").count(), 2, "each with its interval");
        assert_eq!(html.matches("class=\"noise\"").count(), 1);
        assert!(html.contains("level1/x&lt;y&gt;.py") && !html.contains("x<y>"), "names are escaped");
        assert!(html.contains("&lt;graph break&gt; &amp; more"), "why a variant was left out, escaped");
        assert!(html.contains("<b>default+freezing</b> (inductor) at <b>1.300x</b>"));
        assert!(html.contains(colour(Some(Agent::Inductor))) && html.contains(colour(Some(Agent::Dispatch))));
        assert!(!html.contains("Verified in turn"), "one verified variant: nothing to list");
        let mut r = report();
        r.tried = vec![
            crate::Tried { variant: "default+aggressive-fusion".into(), verified: Verified::Rejected },
            crate::Tried { variant: "default+freezing".into(), verified: Verified::Accepted },
        ];
        let html = problem_html(&r, None);
        assert!(
            html.contains(
                "Verified in turn: <b>default+aggressive-fusion</b> rejected, then <b>default+freezing</b> accepted"
            ),
            "{html}"
        );
    }

    #[test]
    fn a_baseline_with_cuda_graphs_has_its_input_copy_said_on_the_page() {
        let mut r = report();
        r.measurement.baseline = "max-autotune".into();
        assert!(!problem_html(&r, None).contains("CUDA graphs:"), "no size recorded: nothing said");
        r.measurement.input_bytes = Some(2 << 30);
        let html = problem_html(&r, None);
        assert!(
            html.contains("CUDA graphs: max-autotune copies the forward&#39;s 2.00 GiB of tensor inputs"),
            "{html}"
        );
    }

    #[test]
    fn the_beam_and_the_config_agent_have_their_sections() {
        let mut r = report();
        assert!(!problem_html(&r, None).contains("Beam, round 2") && !problem_html(&r, None).contains("config agent"));
        let second = r.measurement.clone();
        r.beam =
            Some(crate::BeamOutcome { measurement: Some(second), stopped: Some("beam: round 2 found <none>".into()) });
        r.config = Some(crate::ConfigReport {
            skipped: Some("config: needs a GPU".into()),
            error: None,
            measurement: None,
            verified: None,
            decision: None,
            result: None,
        });
        let html = problem_html(&r, None);
        assert_self_contained(&html);
        assert_eq!(html.matches("class=\"bar\"").count(), 4, "round 1 and round 2");
        assert!(html.contains("beam: round 2 found &lt;none&gt;") && html.contains("config: needs a GPU"), "{html}");
        assert!(!html.contains("The LLM agents"));
        r.llm = Some(crate::llm::LlmReport {
            model: "m<1>".into(),
            candidates: vec![crate::llm::LlmCandidate {
                id: "i1-c0-p0-a0".into(),
                strategy: "skip-work".into(),
                verdict: "rejected".into(),
                gate: Some("exploits:ghost-replay".into()),
                exploit: true,
                speedup: None,
                ci95: None,
                duplicate_of: None,
                source: "llm/candidates/i1-c0-p0-a0.py".into(),
            }],
            ..crate::llm::LlmReport::default()
        });
        let html = problem_html(&r, None);
        assert!(html.contains("The LLM agents: m&lt;1&gt;") && html.contains("exploits:ghost-replay <b>(exploit)</b>"));
        r.llm = None;
        // A config measurement: a row per kernel, the largest share first, a won kernel's share
        // after its own speedup.
        let m = crate::ConfigMeasurement::parse(include_str!("../testdata/config.json")).unwrap();
        let rows = m.kernels.len();
        let won: Vec<(f64, f64)> =
            m.kernels.values().filter(|k| !k.fallback).filter_map(|k| Some((k.share?, k.speedup?))).collect();
        r.config.as_mut().unwrap().measurement = Some(m);
        let html = problem_html(&r, None);
        assert_eq!(
            html.matches("</td></tr>").count()
                - html.split("<h2>The config agent").next().unwrap().matches("</td></tr>").count(),
            rows
        );
        for (share, speedup) in won {
            assert!(
                html.contains(&format!("{:.1} %</td><td>{:.1} %", share * 100.0, share / speedup * 100.0)),
                "{html}"
            );
        }
        assert!(html.contains("The model with every winner pinned") && html.contains("Amdahl ceiling"), "{html}");
        assert!(!html.contains("roofline ceiling"), "a step before the roofline has none");
        // With a roofline: its line, and a row for the kernel left at its roof.
        let roof = crate::KernelRoof {
            kind: Some("pointwise".into()),
            bytes: Some(6.4e9),
            of_peak: Some(1.022),
            ceiling: Some(1.027),
            why: None,
            skipped: true,
        };
        let m = r.config.as_mut().unwrap().measurement.as_mut().unwrap();
        m.roofline = Some(crate::Roofline {
            peak_bytes_per_s: Some(2.9e12),
            skip_at: Some(1.02),
            ceiling: Some(1.08),
            kernels: [("triton_poi_fused_silu_9<".to_string(), roof)].into(),
            why: None,
        });
        let html = problem_html(&r, None);
        assert_self_contained(&html);
        assert!(html.contains("roofline ceiling 1.080x (every generated kernel at its bandwidth roof"), "{html}");
        assert!(
            html.contains(
                "<td>triton_poi_fused_silu_9&lt;</td><td>pointwise</td><td>—</td><td>—</td>\
                 <td>not tuned: at 102% of the device&#39;s bandwidth: at most 1.027x</td>"
            ),
            "{html}"
        );
    }

    #[test]
    fn a_problems_page_shows_what_the_result_changes_as_a_diff() {
        let problem = "import torch\nclass Model:\n    def forward(self, x):\n        return torch.diag(x) @ x\n";
        let result = "import torch\nclass ModelNew:\n    def forward(self, x):\n        return x.unsqueeze(-1) * x\n";
        let change = Change { problem, result_name: "model_new.py", result };
        let html = problem_html(&report(), Some(&change));
        assert_self_contained(&html);
        assert!(html.contains("model_new.py against the problem's source: 2 line(s) added, 2 removed"), "{html}");
        assert!(html.contains("<span class=\"del\">-         return torch.diag(x) @ x</span>"), "{html}");
        assert!(
            html.contains("<span class=\"add\">+ class ModelNew:</span>") && html.contains("@@ -1,4 +1,4 @@"),
            "{html}"
        );
        let same = Change { problem, result_name: "model_new.py", result: problem };
        let html = problem_html(&report(), Some(&same));
        assert!(html.contains("0 line(s) added, 0 removed") && !html.contains("<pre class=\"diff\">"), "{html}");
        assert!(!problem_html(&report(), None).contains("What the result changes"));
        let mut r = report();
        r.measurement.duplicates.insert("max-autotune+coordinate-descent".into(), "max-autotune".into());
        let html = problem_html(&r, None);
        assert!(html.contains("<tr><td>max-autotune+coordinate-descent</td><td>inductor</td>"), "{html}");
        assert!(html.contains("not measured: it compiles exactly as max-autotune</td>"), "{html}");
        let same =
            Prepared { ok: true, same_code_as: Some("max-autotune".into()), ..r.measurement.prepared["eager"].clone() };
        r.measurement.prepared.insert("max-autotune+aggressive-fusion".into(), same);
        let html = problem_html(&r, None);
        assert!(
            html.contains("<td>—</td><td>not timed: its compile generated the same code as max-autotune</td>"),
            "{html}"
        );
    }

    #[test]
    fn a_faster_variant_is_drawn_right_of_the_baseline_and_a_slower_one_left() {
        let html = problem_html(&report(), None);
        let bars: Vec<(f64, f64)> = html
            .split("class=\"bar\" x=\"")
            .skip(1)
            .map(|rest| {
                let x: f64 = rest.split('"').next().unwrap().parse().unwrap();
                let w: f64 = rest.split("width=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
                (x, w)
            })
            .collect();
        let one: f64 = html.split("<line x1=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
        // BTreeMap order: "default+freezing" (1.3x) then "eager" (0.7x).
        assert!((bars[0].0 - one).abs() < 0.2 && bars[0].1 > 10.0, "{bars:?} {one}");
        assert!((bars[1].0 + bars[1].1 - one).abs() < 0.2, "{bars:?} {one}");
        assert!(bars[1].1 > bars[0].1, "|ln 0.7| > |ln 1.3|: {bars:?}");
    }

    #[test]
    fn a_campaigns_page_counts_fallbacks_as_one_and_credits_agents() {
        let outcome = |p: &str, decision: Option<Decision>, not_reached: Option<&str>| ProblemOutcome {
            problem: p.into(),
            level: p.split('/').next().unwrap().into(),
            decision,
            error: None,
            not_reached: not_reached.map(String::from),
            seconds: 10.0,
            gpu_seconds: 4.0,
            resumed: false,
            triton_share: None,
            confirmed: None,
            roofline_ceiling: None,
            not_prepared: 0,
        };
        let won = |a: Agent, s: f64| Some(Decision::Improved { agent: a, mode: "m".into(), speedup: s, ci95: [s, s] });
        let outcomes = vec![
            outcome("level1/a.py", won(Agent::Dispatch, 2.0), None),
            outcome("level1/b.py", won(Agent::Dispatch, 1.125), None),
            outcome("level2/c.py", Some(Decision::Fallback { reason: "no mode beat".into() }), None),
            outcome("level2/d.py", None, Some("budget")),
        ];
        let summary = summarize(&outcomes);
        let html = campaign_html("campaign", &outcomes, &summary, &[], &BTreeMap::new());
        assert_self_contained(&html);
        assert!(!html.contains("Against the goals"), "no goals given: no section");
        let goals = crate::goals::check(&outcomes, &summary, Baseline::MaxAutotune);
        let with_goals = campaign_html("campaign", &outcomes, &summary, &goals, &BTreeMap::new());
        assert_self_contained(&with_goals);
        assert!(
            with_goals.contains("<h2>Against the goals</h2>")
                && with_goals.contains("<td>level1</td><td>1.500x</td><td>1.25x</td><td>yes</td>"),
            "{with_goals}"
        );
        let pages: BTreeMap<String, String> =
            [(outcomes[0].problem.clone(), "level1/a/report.html".to_string())].into();
        let linked = campaign_html("campaign", &outcomes, &summary, &[], &pages);
        assert_eq!(linked.matches("href=").count(), 1, "only the problem with a page is linked");
        assert!(linked.contains(&format!("<td>{}</td>", outcomes[0].problem)), "{linked}");
        assert!(linked.contains("<a href=\"level1/a/report.html\">report.html</a>"), "{linked}");
        assert!(
            !linked.contains("http")
                || linked.matches("http").count() == linked.matches("http://www.w3.org/2000/svg").count()
        );
        assert_eq!(html.matches("class=\"bar\"").count(), 4);
        assert!(html.contains("<td>level1</td><td>2</td><td>2</td>") && html.contains("1.500x"), "level1 geomean 1.5");
        assert!(html.contains("<td>dispatch</td><td>2</td><td>1.500x</td>"), "{html}");
        assert!(html.contains("baseline kept: no mode beat") && html.contains("not reached: budget"));
        let empty = campaign_html("c", &outcomes[2..], &summarize(&outcomes[2..]), &[], &BTreeMap::new());
        assert!(empty.contains("no agent won a problem"));
    }
}
