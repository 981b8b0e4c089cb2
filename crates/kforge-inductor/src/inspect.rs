//! The `kforge inspect` report: a capture (written by `python/kforge/inspect/capture.py` on a GPU) turned
//! into inventories, GPU-time attribution and the replay / re-stitch results, plus the table.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::profile::{attribute, Attribution, KernelEvent};
use crate::{parse_wrapper, Inventory, KernelCategory, ParseError};

/// Capture format version this crate reads.
pub const CAPTURE_VERSION: u64 = 1;

/// What `python3 -m kforge.inspect.capture` writes (the boundary format; see that module).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Capture {
    pub kforge_capture: u64,
    pub source: String,
    /// `problem` or `triton`.
    pub kind: String,
    pub mode: String,
    #[serde(default)]
    pub torch: Option<String>,
    #[serde(default)]
    pub triton: Option<String>,
    #[serde(default)]
    pub device: Option<String>,
    /// The problem's size preset captured (`default`, `large`: `kforge inspect --size`).
    #[serde(default = "default_size")]
    pub size: String,
    /// Inductor wrapper modules, in load (= execution) order.
    pub wrappers: Vec<String>,
    /// GPU kernels of each profiled iteration, in order.
    #[serde(default)]
    pub iterations: Vec<Vec<KernelEvent>>,
    #[serde(default)]
    pub check: Option<Value>,
    #[serde(default)]
    pub replay: Vec<Value>,
    #[serde(default)]
    pub restitch: Option<Value>,
    /// Each recorded Triton kernel's least traffic against the device's bandwidth
    /// (python/kforge/inspect/roofline.py `roofline_summary`); absent in older captures.
    #[serde(default)]
    pub roofline: Option<Value>,
}

/// Why a capture could not be reported.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("capture format {found} is not the one this kforge reads ({CAPTURE_VERSION})")]
    Version { found: u64 },
    #[error("wrapper {index} of the capture: {source}")]
    Wrapper { index: usize, source: ParseError },
}

/// The report of one inspected problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InspectReport {
    pub source: String,
    pub kind: String,
    pub mode: String,
    pub torch: Option<String>,
    pub triton: Option<String>,
    pub device: Option<String>,
    /// The problem's size preset captured.
    pub size: String,
    /// All wrappers' inventories merged in execution order.
    pub inventory: Inventory,
    /// Number of wrapper modules (graphs) merged.
    pub graphs: usize,
    pub triton_kernels: usize,
    pub template_kernels: usize,
    pub vendor_calls: usize,
    pub attribution: Attribution,
    pub check: Option<Value>,
    pub replay: Vec<Value>,
    pub restitch: Option<Value>,
    /// The capture's roofline, as it wrote it.
    #[serde(default)]
    pub roofline: Option<Value>,
}

/// Parse every wrapper of `cap`, merge them in order and attribute the profiled GPU time.
fn default_size() -> String {
    "default".into()
}

pub fn report(cap: &Capture) -> Result<InspectReport, InspectError> {
    if cap.kforge_capture != CAPTURE_VERSION {
        return Err(InspectError::Version { found: cap.kforge_capture });
    }
    let mut inv = Inventory { kernels: Vec::new(), launches: Vec::new(), buffers: Vec::new() };
    for (index, w) in cap.wrappers.iter().enumerate() {
        let one = parse_wrapper(w).map_err(|source| InspectError::Wrapper { index, source })?;
        inv.kernels.extend(one.kernels);
        inv.launches.extend(one.launches);
        inv.buffers.extend(one.buffers);
    }
    let attribution = attribute(&inv, &cap.iterations);
    let vendor_calls = inv.launches.iter().filter(|l| !matches!(l, crate::Launch::Triton { .. })).count();
    Ok(InspectReport {
        source: cap.source.clone(),
        kind: cap.kind.clone(),
        mode: cap.mode.clone(),
        torch: cap.torch.clone(),
        triton: cap.triton.clone(),
        device: cap.device.clone(),
        size: cap.size.clone(),
        graphs: cap.wrappers.len(),
        triton_kernels: inv.kernels.len(),
        template_kernels: inv.kernels.iter().filter(|k| k.category == KernelCategory::Template).count(),
        vendor_calls,
        inventory: inv,
        attribution,
        check: cap.check.clone(),
        replay: cap.replay.clone(),
        restitch: cap.restitch.clone(),
        roofline: cap.roofline.clone(),
    })
}

impl InspectReport {
    /// A Triton kernel's fraction of the device's bandwidth in the roofline, where its estimate
    /// holds (its row has a ceiling).
    pub fn bandwidth_of_peak(&self, kernel: &str) -> Option<f64> {
        let row = &self.roofline.as_ref()?["kernels"][kernel];
        row["ceiling"].is_number().then(|| row["of_peak"].as_f64()).flatten()
    }
}

/// The roofline's line: the device's bandwidth, the model's ceiling and how many kernels have
/// one, or why there is none; `None` for a capture without a roofline.
fn roofline_line(roofline: Option<&Value>) -> Option<String> {
    let r = roofline?;
    let Some(peak) = r["peak_bytes_per_s"].as_f64() else {
        let why = r["why"].as_str().unwrap_or("no bandwidth measured");
        return Some(format!("roofline: none ({why})\n"));
    };
    let kernels = r["kernels"].as_object().map(|k| (k.len(), k.values().filter(|v| v["ceiling"].is_number()).count()));
    let (all, with) = kernels.unwrap_or((0, 0));
    let ceiling = r["ceiling"].as_f64().map(|c| format!("{c:.3}x")).unwrap_or_else(|| "unbounded".into());
    Some(format!(
        "roofline: device bandwidth {:.2} TB/s; {with} of {all} kernels with a roofline (BW%: the rate of their least \
         traffic against it); every generated kernel at its roof: at most {ceiling}\n",
        peak / 1e12
    ))
}

fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.1}%", x * 100.0)
    } else {
        "-".into()
    }
}

/// The table `kforge inspect` prints last: one row per launch (GPU time, share, replaceable and
/// why), then unattributed kernels and the replay / re-stitch summary.
/// The round trip's timing in one line: T/T0 with its interval against the noise floor, and the
/// rounds it took (`plan`: of how many calls a side, sized by the first round's spread); None
/// when it was not timed.
fn round_trip_timing(x: &Value) -> Option<String> {
    let (ratio, floor) = (x["ratio"].as_f64()?, x["noise_floor"].as_f64()?);
    let ci = x["ratio_ci95"].as_array().map(|c| c.iter().filter_map(Value::as_f64).collect::<Vec<_>>());
    let interval = match ci.as_deref() {
        Some([lo, hi]) => format!(" ({lo:.4}–{hi:.4})"),
        _ => String::new(),
    };
    let verdict = if x["within_noise"] == Value::Bool(true) { "within noise" } else { "beyond noise" };
    let rounds = x["per_round"].as_array().map_or(0, Vec::len);
    let calls = x["plan"]["calls"].as_u64().map(|c| format!(" of {c} calls a side")).unwrap_or_default();
    Some(format!(
        "re-stitched against the baseline: T/T0 {ratio:.4}{interval}, {verdict}; noise floor {floor:.4} over {rounds} rounds{calls}\n"
    ))
}

pub fn table(r: &InspectReport) -> String {
    if r.kind == "triton" {
        // A standalone Triton file has no wrapper: its kernels are the profile's, by GPU time.
        let mut s = format!("{} (standalone Triton file): {:.1} µs GPU per run\n", r.source, r.attribution.total_us);
        s.push_str(&format!("{:<50} {:>10} {:>7}\n", "KERNEL", "GPU_US", "SHARE"));
        let mut ks = r.attribution.unattributed.clone();
        ks.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (name, us) in ks {
            s.push_str(&format!("{:<50} {:>10.1} {:>7}\n", name, us, pct(us / r.attribution.total_us)));
        }
        return s;
    }
    let mut s = format!(
        "{} ({}, mode {}): {} graph(s), {} Triton kernels ({} templates), {} vendor/fallback calls, {:.1} µs GPU per run\n",
        r.source, r.kind, r.mode, r.graphs, r.triton_kernels, r.template_kernels, r.vendor_calls, r.attribution.total_us
    );
    s.push_str(&format!(
        "{:>3} {:<7} {:<44} {:>10} {:>7} {:>6}  {}\n",
        "#", "KIND", "ENTRY", "GPU_US", "SHARE", "BW%", "REPLACEABLE"
    ));
    for l in &r.attribution.launches {
        let label: String = if l.label.chars().count() > 44 {
            l.label.chars().take(43).collect::<String>() + "…"
        } else {
            l.label.clone()
        };
        let bw = match r.bandwidth_of_peak(&l.label).filter(|_| l.kind == "triton") {
            Some(f) => format!("{:.0}%", f * 100.0),
            None => "-".into(),
        };
        s.push_str(&format!(
            "{:>3} {:<7} {:<44} {:>10.1} {:>7} {:>6}  {} ({})\n",
            l.launch,
            l.kind,
            label,
            l.gpu_us,
            pct(l.share),
            bw,
            if l.replaceable { "yes" } else { "no" },
            l.why
        ));
    }
    for (name, us) in &r.attribution.unattributed {
        s.push_str(&format!(
            "  -  {:<7} {:<44} {:>10.1} {:>7}  (no launch in call() matches it)\n",
            "gpu",
            name,
            us,
            pct(us / r.attribution.total_us)
        ));
    }
    if r.attribution.missing_triton_launches > 0 {
        s.push_str(&format!(
            "{} Triton launch(es) of call() never appeared in the profile\n",
            r.attribution.missing_triton_launches
        ));
    }
    let ok = r.replay.iter().filter(|v| v["ok"] == Value::Bool(true)).count();
    if !r.replay.is_empty() {
        s.push_str(&format!("replay: {ok}/{} kernels reproduced their in-model results alone\n", r.replay.len()));
    }
    if let Some(x) = &r.restitch {
        s.push_str(&format!(
            "re-stitch round trip: {} kernels replaced by their own source, outputs identical: {}, {} ms vs {} ms compiled\n",
            x["kernels_replaced"], x["identical"], x["restitched_ms"], x["baseline_ms"]
        ));
        if let Some(line) = round_trip_timing(x) {
            s.push_str(&line);
        }
    }
    if let Some(line) = roofline_line(r.roofline.as_ref()) {
        s.push_str(&line);
    }
    s.push_str(&format!("replaceable Triton share of GPU time: {}\n", pct(r.attribution.replaceable_share)));
    s
}
