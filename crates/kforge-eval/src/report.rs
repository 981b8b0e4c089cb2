//! The evaluation report: what `kforge report RUN… --json/--html` computes from run manifests
//! and the store. [`compute`] fills these structures; `html::render` draws them.

use serde::{Deserialize, Serialize};

/// Duration buckets of the timed kernels (by their isolated median).
pub const BUCKETS: [&str; 4] = ["<0.1 ms", "0.1-1 ms", "1-10 ms", ">10 ms"];

/// Bucket index of an isolated median in milliseconds.
pub fn bucket_of(ms: f64) -> usize {
    if ms < 0.1 {
        0
    } else if ms < 1.0 {
        1
    } else if ms < 10.0 {
        2
    } else {
        3
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EvalReport {
    /// Workload file the runs used.
    pub workload: String,
    /// Device description (from the manifests).
    pub device: String,
    /// Bucket labels, in order (see [`BUCKETS`]).
    pub buckets: Vec<String>,
    /// Commands of the ground-truth run with a valid isolated median.
    pub isolated_commands: usize,
    /// The smallest ground-truth gap (slower / faster − 1) of a candidate pair counted in
    /// [`RunSummary::ranking_resolved`].
    #[serde(default)]
    pub resolved_min_gap: f64,
    pub runs: Vec<RunSummary>,
}

/// Options of [`compute_with`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReportOptions {
    /// The smallest ground-truth gap of a pair counted in the resolved ranking (0.02: 2 %).
    pub min_gap: f64,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions { min_gap: DEFAULT_MIN_GAP }
    }
}

/// Default [`ReportOptions::min_gap`]: pairs whose ground truths differ by less than 2 % are
/// within what an idle H200 repeats to (in the second evaluation pass the warm truth — the same
/// commands timed again, one at a time, on the idle GPU — flipped 12 of 468 pairs below 2 % and
/// 5 at or above it).
pub const DEFAULT_MIN_GAP: f64 = 0.02;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunSummary {
    pub name: String,
    pub policy: String,
    /// Ablation step: `gate`, `drain`, `freeze`, `isolate`, `warm`, or `full`.
    pub ablation: String,
    pub warm: bool,
    pub concurrency: usize,
    pub commands: usize,
    pub failed: usize,
    pub wall_s: f64,
    pub throughput_per_min: f64,
    /// GPUs the run measured on: 1, or every GPU of the machine for a run over all of them
    /// (manifest device `all: A; B`).
    #[serde(default = "one_gpu")]
    pub gpus: usize,
    /// A run over several GPUs sent each candidate group to one GPU (manifest `gpu_groups`).
    #[serde(default)]
    pub gpu_groups: bool,
    /// Commands measured on each GPU (its name as manifests give it: `NAME (DESCRIPTION)`), for a
    /// run over several GPUs: how evenly the placement spread the load. Empty on one GPU.
    #[serde(default)]
    pub commands_per_gpu: BTreeMap<String, usize>,
    /// Throughput per GPU over the `command` run's per GPU, when there is one: a run over two
    /// GPUs is compared with what whole-command exclusivity does on as many GPUs.
    pub throughput_ratio_vs_command: Option<f64>,
    /// One entry per bucket, in [`BUCKETS`] order.
    pub inflation: Vec<BucketInflation>,
    /// All commands together.
    pub inflation_all: BucketInflation,
    /// Commands of this run whose ground truth was taken on another GPU (left out of inflation
    /// and ranking unless the run has no same-GPU truth at all).
    #[serde(default)]
    pub cross_device_commands: usize,
    /// Inflation and ranking compare with ground truth from another GPU (no same-GPU truth).
    #[serde(default)]
    pub compared_across_devices: bool,
    pub ranking: Vec<OperatorRanking>,
    /// All candidate pairs of all operators pooled (None: no pair compared).
    #[serde(default)]
    pub ranking_all: Option<PairRanking>,
    /// The pairs whose ground truths differ by at least [`EvalReport::resolved_min_gap`]: the
    /// ranking a measurement as repeatable as the idle GPU can be asked to keep.
    #[serde(default)]
    pub ranking_resolved: Option<PairRanking>,
    /// Flipped pairs, largest ground-truth gap first (at most [`FLIPS`]).
    #[serde(default)]
    pub flips: Vec<FlippedPair>,
    /// This row is not a run but a second ground truth — a warm one beside the cold reference,
    /// or one named `truth-repeat…` — against the reference: one command at a time on the idle
    /// GPU again. A cold repeat shows how far the device repeats itself, the floor under every
    /// run's inflation and ranking; a warm one adds the difference of protocol (no process
    /// start-up between commands).
    #[serde(default)]
    pub repeat_of_truth: bool,
    /// Inflation per bucket over the commands whose region ended at full clock — its SM clock at
    /// release at least [`FULL_CLOCK_FRACTION`] of the highest clock recorded by the regions of
    /// its part of the run (its slice; the whole run when not sliced), and the same for its truth
    /// region when the truth recorded clocks — in [`BUCKETS`] order; empty when no region of the
    /// run recorded a clock. On the H200 a heavy kernel
    /// timed for ~100 ms runs into the power cap by itself, and when that starts decides its
    /// median: this splits the runtime's effect from the GPU's power management.
    #[serde(default)]
    pub full_clock: Vec<BucketInflation>,
    /// Commands (compared with ground truth) whose region ended below full clock — or whose
    /// ground-truth region did, when the truth recorded clocks.
    #[serde(default)]
    pub throttled_commands: usize,
    /// The highest SM clock (MHz) the run's regions recorded, at grant or release.
    #[serde(default)]
    pub top_sm_clock_mhz: Option<u32>,
    pub regions: RegionStats,
    /// Share of the run's wall time during which some region was held (union of intervals).
    pub busy_share: f64,
    /// The commands furthest from their ground truth (largest |inflation|, at most
    /// [`OUTLIERS`]), with what their regions recorded: the evidence behind a p95.
    #[serde(default)]
    pub outliers: Vec<Outlier>,
    /// Regions of the run, relative to its start (at most 2000, evenly thinned).
    pub timeline: Vec<TimelineEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct BucketInflation {
    pub bucket: String,
    pub n: usize,
    pub p50: f64,
    pub p95: f64,
    /// Sorted inflation values (measured / isolated − 1), for CDF plots.
    pub values: Vec<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OperatorRanking {
    pub operator: String,
    /// Candidate groups (same operator, same problem size) compared.
    pub groups: usize,
    /// Candidate pairs compared over all groups.
    pub pairs: usize,
    /// Kendall tau-b between isolated and measured medians, pooled over groups by pair count.
    pub kendall_tau: f64,
    /// Share of pairs ordered differently than in isolation.
    pub flip_rate: f64,
}

/// Candidate pairs compared, pooled over operators.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct PairRanking {
    /// Pairs ordered (untied) both in isolation and in the run.
    pub pairs: usize,
    /// Pairs ordered differently than in isolation.
    pub flips: usize,
    /// (concordant − discordant) / pairs.
    pub kendall_tau: f64,
}

impl PairRanking {
    fn of(concordant: usize, discordant: usize) -> Option<PairRanking> {
        let pairs = concordant + discordant;
        (pairs > 0).then(|| PairRanking {
            pairs,
            flips: discordant,
            kendall_tau: (concordant as f64 - discordant as f64) / pairs as f64,
        })
    }
}

/// Two candidates of one group that the run ordered differently than the ground truth.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FlippedPair {
    pub operator: String,
    pub group: String,
    /// Faster in isolation.
    pub faster: String,
    /// Slower in isolation.
    pub slower: String,
    /// Isolated medians: slower / faster − 1 (> 0).
    pub truth_gap: f64,
    /// Measured medians: slower / faster − 1 (< 0: the flip).
    pub measured_gap: f64,
}

/// Flipped pairs listed per run.
pub const FLIPS: usize = 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct RegionStats {
    pub count: usize,
    pub wait_ms_p50: f64,
    pub wait_ms_p95: f64,
    pub drain_ms_p50: f64,
    pub drain_ms_p95: f64,
    pub freeze_ms_p50: f64,
    pub freeze_ms_p95: f64,
    pub settle_ms_p50: f64,
    pub settle_ms_p95: f64,
    pub drain_timeouts: usize,
    pub revoked: usize,
    pub tainted: usize,
    pub overlapping_pairs: usize,
    /// SM clock (MHz) when regions were granted (GPU regions that recorded one): median and lowest.
    #[serde(default)]
    pub sm_clock_mhz_granted_p50: Option<f64>,
    #[serde(default)]
    pub sm_clock_mhz_granted_min: Option<f64>,
    /// GPU temperature (°C) when regions were granted: median and highest.
    #[serde(default)]
    pub gpu_temp_c_granted_p50: Option<f64>,
    #[serde(default)]
    pub gpu_temp_c_granted_max: Option<f64>,
    /// Seconds regions were held (grant to release), summed over all regions.
    #[serde(default)]
    pub held_s: f64,
    /// Seconds of settle steps (before the grant, the GPU gated), summed over all regions.
    #[serde(default)]
    pub settle_s: f64,
}

/// One command's ground truth on one GPU.
struct IsolatedTruth {
    median_ms: f64,
    device: String,
    /// The truth manifest it comes from.
    part: String,
    /// Whether its region ended at full clock (None: no clock recorded).
    full_clock: Option<bool>,
    /// Samples, and the region it was measured in.
    measured: (usize, Option<kforge_store::RegionRow>),
}

/// Outliers listed per run.
pub const OUTLIERS: usize = 10;

/// One command of a run far from its ground truth, and its region.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Outlier {
    pub id: String,
    pub operator: String,
    pub isolated_ms: f64,
    pub measured_ms: f64,
    pub inflation: f64,
    /// Samples reported in the run and in the ground truth (at most `MAX_REPORTED_SAMPLES` of the
    /// Python client, 32768, evenly thinned: for µs kernels fewer than were timed).
    pub samples: usize,
    pub truth_samples: usize,
    /// SM clock (MHz) at the release of the run's region and of the truth's (when recorded).
    pub sm_clock_mhz_released: Option<u32>,
    pub truth_sm_clock_mhz_released: Option<u32>,
    /// The run's region: reserved core, wait, freeze and settle times (ms).
    pub core: Option<u32>,
    pub wait_ms: Option<f64>,
    pub freeze_ms: Option<f64>,
    pub settle_ms: Option<f64>,
}

/// Per command of one store report: its sample count and the region it was measured in.
fn measured_in(rep: &kforge_store::Report) -> BTreeMap<String, (usize, Option<kforge_store::RegionRow>)> {
    let by_id: BTreeMap<u64, &kforge_store::RegionRow> = rep.regions.iter().map(|r| (r.id, r)).collect();
    rep.measurements
        .iter()
        .filter(|m| m.valid)
        .map(|m| (m.name.clone(), (m.samples_ms.len(), m.region.and_then(|rid| by_id.get(&rid).map(|r| (*r).clone())))))
        .collect()
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TimelineEntry {
    pub job: Option<u64>,
    pub device: String,
    pub start_s: f64,
    pub end_s: f64,
    pub revoked: bool,
}

use crate::runner::RunManifest;
use crate::stats;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;

/// A region "ended at full clock" when its SM clock at release is at least this share of the
/// highest clock the run recorded (the H200 boosts to 1980 MHz; a power-capped one ran at
/// 1185–1900 MHz in the first evaluation pass).
pub const FULL_CLOCK_FRACTION: f64 = 0.97;

fn q(xs: &[f64], p: f64) -> f64 {
    stats::quantile(xs, p).unwrap_or(f64::NAN)
}

fn medians(r: &kforge_store::Report) -> BTreeMap<String, f64> {
    r.measurements
        .iter()
        .filter(|m| m.valid)
        .filter_map(|m| stats::median(&m.samples_ms).map(|v| (m.name.clone(), v)))
        .collect()
}

fn inflation_of(bucket: &str, mut values: Vec<f64>) -> BucketInflation {
    values.sort_by(|a, b| a.total_cmp(b));
    BucketInflation { bucket: bucket.into(), n: values.len(), p50: q(&values, 0.5), p95: q(&values, 0.95), values }
}

/// Per measured command of one store report: whether the region it was measured in ended at full
/// clock (SM clock at release at least [`FULL_CLOCK_FRACTION`] of the highest clock the report's
/// regions recorded — per part, for a run or truth taken in slices). Commands without a clock
/// reading are left out.
fn full_clock_at_release(rep: &kforge_store::Report) -> BTreeMap<String, bool> {
    let Some(top) = top_clock(&rep.regions) else {
        return BTreeMap::new();
    };
    measured_in(rep)
        .into_iter()
        .filter_map(|(name, (_, region))| {
            let c = region?.sm_clock_mhz_released?;
            Some((name, f64::from(c) >= FULL_CLOCK_FRACTION * f64::from(top)))
        })
        .collect()
}

fn one_gpu() -> usize {
    1
}

/// How many GPUs a part ran on: every GPU its manifest lists (`all: A; B`), else one.
fn gpus_of(p: &RunManifest) -> usize {
    p.device.strip_prefix("all: ").map_or(1, |l| l.split("; ").count().max(1))
}

/// The GPU each command of one part was measured on, as manifests name a GPU (`NAME
/// (DESCRIPTION)`): the part's device, or for a run over every GPU (device `all: A; B`) the one
/// its job ran on.
fn measured_on(p: &RunManifest, rep: &kforge_store::Report) -> BTreeMap<String, String> {
    let every: Vec<&str> = p.device.strip_prefix("all: ").map(|l| l.split("; ").collect()).unwrap_or_default();
    let job_device: BTreeMap<u64, &str> = rep.jobs.iter().map(|j| (j.id, j.device.as_str())).collect();
    rep.measurements
        .iter()
        .filter(|m| m.valid)
        .map(|m| {
            let name = m.job.and_then(|j| job_device.get(&j).copied());
            let dev = name
                .and_then(|n| every.iter().find(|e| e.split(" (").next() == Some(n)))
                .map_or_else(|| p.device.clone(), |e| e.to_string());
            (m.name.clone(), dev)
        })
        .collect()
}

/// The highest SM clock (MHz) these regions recorded, at grant or release.
fn top_clock(regions: &[kforge_store::RegionRow]) -> Option<u32> {
    regions.iter().flat_map(|r| [r.sm_clock_mhz_granted, r.sm_clock_mhz_released]).flatten().max()
}

/// Fill the GPU clock and temperature statistics from the regions that recorded them.
fn with_gpu_state(mut st: RegionStats, regions: &[kforge_store::RegionRow]) -> RegionStats {
    let clocks: Vec<f64> = regions.iter().filter_map(|r| r.sm_clock_mhz_granted).map(f64::from).collect();
    let temps: Vec<f64> = regions.iter().filter_map(|r| r.gpu_temp_c_granted).map(f64::from).collect();
    st.sm_clock_mhz_granted_p50 = stats::quantile(&clocks, 0.5);
    st.sm_clock_mhz_granted_min = clocks.iter().copied().reduce(f64::min);
    st.gpu_temp_c_granted_p50 = stats::quantile(&temps, 0.5);
    st.gpu_temp_c_granted_max = temps.iter().copied().reduce(f64::max);
    st
}

/// Whether two workload files are the same workload (same path, or byte-identical copies: a state
/// directory moved between machines keeps its workload under another path).
fn same_workload(a: &str, b: &str) -> Result<bool> {
    if a == b {
        return Ok(true);
    }
    let read = |p: &str| std::fs::read(p).with_context(|| format!("reading workload {p}"));
    Ok(read(a)? == read(b)?)
}

/// A ground truth's name without the part suffix kforge gives a truth taken with an offset or a
/// limit, and without a GPU suffix (`truth-warm-50` → `truth-warm`, `truth-gpu1-50` → `truth`).
fn truth_base_name(name: &str) -> &str {
    // `name` without a trailing `-PREFIX<digits>`, when it has one.
    let strip = |name: &'_ str, prefix: &str| -> Option<usize> {
        let (base, n) = name.rsplit_once('-')?;
        let digits = n.strip_prefix(prefix)?;
        (!base.is_empty() && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then_some(base.len())
    };
    let name = &name[..strip(name, "").unwrap_or(name.len())];
    &name[..strip(name, "gpu").unwrap_or(name.len())]
}

/// A ground truth passed beside the reference one is a repeat: a warm truth beside a cold one, or
/// one named `truth-repeat…`.
fn is_repeat_name(name: &str) -> bool {
    truth_base_name(name).starts_with("truth-repeat")
}

fn load(m: &RunManifest) -> Result<kforge_store::Report> {
    let store = kforge_store::Store::open(std::path::Path::new(&m.db))
        .with_context(|| format!("opening the store of run {}", m.name))?;
    Ok(store.report(Some(&m.label))?)
}

/// Compute the report of runs against the ground truth among `manifests`: one or more manifests
/// of kind `truth` (parts of one ground truth split with `--offset`/`--limit`; a command may be in
/// only one of them).
///
/// A cold truth is the reference when there is one (the cold runs' protocol); the parts of a warm
/// truth passed beside it form a *repeat* row ([`RunSummary::repeat_of_truth`]): the idle GPU
/// measured twice.
pub fn compute(manifests: &[RunManifest]) -> Result<EvalReport> {
    compute_with(manifests, &ReportOptions::default())
}

/// [`compute`] with options.
pub fn compute_with(manifests: &[RunManifest], opts: &ReportOptions) -> Result<EvalReport> {
    if !(opts.min_gap.is_finite() && opts.min_gap >= 0.0) {
        bail!("the resolved ranking's minimum gap must be a finite share >= 0, not {}", opts.min_gap);
    }
    let (truths, repeats) = reference_and_repeats(manifests);
    let Some(truth) = truths.first().copied() else {
        bail!("no ground-truth run among the manifests (make one with `kforge workload truth`)");
    };
    let cmds = crate::workload::read(std::path::Path::new(&truth.workload))?;
    let reference = Reference {
        truth,
        iso: isolated_truths(&truths, truth)?,
        by_id: cmds.iter().map(|c| (c.id.as_str(), c)).collect(),
    };
    let rows = report_rows(&repeats, manifests, truth)?;
    // Whole-command exclusivity's throughput per GPU: the yardstick of every run.
    let command_tp = rows
        .iter()
        .find(|g| g.1[0].kind == "run" && g.1[0].policy == "command")
        .map(|g| throughput_per_min(&g.1) / gpus_of_parts(&g.1) as f64);
    let runs = rows
        .iter()
        .map(|(name, parts)| summarize(name, parts, &reference, command_tp, opts.min_gap))
        .collect::<Result<Vec<_>>>()?;
    Ok(EvalReport {
        workload: truth.workload.clone(),
        device: {
            let mut devs: Vec<&str> = truths.iter().map(|t| t.device.as_str()).collect();
            devs.sort_unstable();
            devs.dedup();
            devs.join("; ")
        },
        buckets: BUCKETS.iter().map(|s| s.to_string()).collect(),
        isolated_commands: reference.iso.len(),
        resolved_min_gap: opts.min_gap,
        runs,
    })
}

/// The ground-truth manifests split into the reference's parts — the cold truth (the cold runs'
/// protocol) when there is one, its parts on every GPU — and the repeats: every other truth.
fn reference_and_repeats(manifests: &[RunManifest]) -> (Vec<&RunManifest>, Vec<&RunManifest>) {
    let all_truths: Vec<&RunManifest> = manifests.iter().filter(|m| m.kind == "truth").collect();
    let reference_warm = !all_truths.iter().any(|m| !m.warm && !is_repeat_name(&m.name));
    all_truths.into_iter().partition(|m| m.warm == reference_warm && !is_repeat_name(&m.name))
}

/// What every row is compared with: the reference truth, its isolated medians per command and
/// GPU, and the workload's commands by id.
struct Reference<'a> {
    truth: &'a RunManifest,
    iso: BTreeMap<String, Vec<IsolatedTruth>>,
    by_id: BTreeMap<&'a str, &'a crate::workload::Command>,
}

/// Per command, per GPU its ground truth was taken on (parts can come from different machines,
/// and a scaling run needs every GPU's): the isolated median, whether its region ended at full
/// clock (when the truth recorded clocks: a truth taken under the region policy does), and the
/// samples and region it was measured in.
fn isolated_truths(truths: &[&RunManifest], truth: &RunManifest) -> Result<BTreeMap<String, Vec<IsolatedTruth>>> {
    let mut iso: BTreeMap<String, Vec<IsolatedTruth>> = BTreeMap::new();
    for t in truths {
        if !same_workload(&t.workload, &truth.workload)? {
            bail!("ground-truth parts {} and {} used different workloads", truth.name, t.name);
        }
        let rep = load(t)?;
        let full = full_clock_at_release(&rep);
        let mut measured = measured_in(&rep);
        for (id, v) in medians(&rep) {
            let on = iso.entry(id.clone()).or_default();
            if let Some(x) = on.iter().find(|x| x.device == t.device) {
                bail!(
                    "command {id} is in two ground-truth parts of one GPU ({} and {}, GPU {}): check --offset/--limit, and \
                     pass the parts of one ground truth per GPU (a warm truth, or one named truth-repeat, beside it is \
                     reported as a repeat row)",
                    x.part,
                    t.name,
                    t.device
                );
            }
            on.push(IsolatedTruth {
                median_ms: v,
                device: t.device.clone(),
                part: t.name.clone(),
                full_clock: full.get(&id).copied(),
                measured: measured.remove(&id).unwrap_or((0, None)),
            });
        }
    }
    Ok(iso)
}

/// The report's rows with their parts: the repeats (a repeat truth's parts share its base name),
/// then the runs (runs named `NAME@SLICE` are parts of one run NAME taken slice by slice, each
/// slice's truth and runs in one device call, so that a machine change cannot split them).
fn report_rows<'a>(
    repeats: &[&'a RunManifest],
    manifests: &'a [RunManifest],
    truth: &RunManifest,
) -> Result<Vec<(String, Vec<&'a RunManifest>)>> {
    let mut rows: Vec<(String, Vec<&RunManifest>)> = Vec::new();
    for m in repeats.iter().copied().chain(manifests.iter().filter(|m| m.kind == "run")) {
        if !same_workload(&m.workload, &truth.workload)? {
            bail!(
                "{} {} used workload {}, the ground truth {}: different workloads",
                m.kind,
                m.name,
                m.workload,
                truth.workload
            );
        }
        let base =
            if m.kind == "truth" { truth_base_name(&m.name) } else { m.name.split('@').next().unwrap_or(&m.name) }
                .to_string();
        match rows.iter_mut().find(|g| g.0 == base) {
            Some(g) => {
                let first = g.1[0];
                if (
                    first.kind.as_str(),
                    first.policy.as_str(),
                    first.ablation.as_str(),
                    first.warm,
                    &first.daemon_flags,
                    first.gpu_groups,
                ) != (m.kind.as_str(), m.policy.as_str(), m.ablation.as_str(), m.warm, &m.daemon_flags, m.gpu_groups)
                {
                    bail!("runs {} and {} share the name {base} but not policy, ablation, warm, daemon flags and GPU groups", first.name, m.name);
                }
                g.1.push(m);
            }
            None => rows.push((base, vec![m])),
        }
    }
    Ok(rows)
}

/// Commands per minute of a row's parts together.
fn throughput_per_min(parts: &[&RunManifest]) -> f64 {
    let wall: f64 = parts.iter().map(|m| m.wall_s).sum();
    let cmds: usize = parts.iter().map(|m| m.commands).sum();
    if wall > 0.0 {
        cmds as f64 / wall * 60.0
    } else {
        0.0
    }
}

/// GPUs a row measured on: the most of any of its parts.
fn gpus_of_parts(parts: &[&RunManifest]) -> usize {
    parts.iter().map(|m| gpus_of(m)).max().unwrap_or(1)
}

/// A row's parts laid end to end: medians with the GPU of the part that measured them, per
/// command its region's clock state and measurement, and the regions of all parts (their
/// intervals and timeline relative to the row's start).
struct MergedRun {
    meds: BTreeMap<String, f64>,
    med_device: BTreeMap<String, String>,
    /// Per command: whether the region its measurement was taken in ended at full clock.
    full_at_release: BTreeMap<String, bool>,
    measured: BTreeMap<String, (usize, Option<kforge_store::RegionRow>)>,
    regions: Vec<kforge_store::RegionRow>,
    intervals: Vec<(f64, f64)>,
    timeline: Vec<TimelineEntry>,
}

fn merge_parts(name: &str, parts: &[&RunManifest]) -> Result<MergedRun> {
    let mut r = MergedRun {
        meds: BTreeMap::new(),
        med_device: BTreeMap::new(),
        full_at_release: BTreeMap::new(),
        measured: BTreeMap::new(),
        regions: Vec::new(),
        intervals: Vec::new(),
        timeline: Vec::new(),
    };
    let mut offset = 0.0;
    for p in parts {
        let rep = load(p)?;
        let mut on = measured_on(p, &rep);
        for (id, v) in medians(&rep) {
            r.med_device.insert(id.clone(), on.remove(&id).unwrap_or_else(|| p.device.clone()));
            if r.meds.insert(id.clone(), v).is_some() {
                bail!(
                    "{name} measured command {id} twice (in two of its parts, up to {}): pass each part once",
                    p.name
                );
            }
        }
        r.full_at_release.extend(full_clock_at_release(&rep));
        r.measured.extend(measured_in(&rep));
        let rel = |ns: i64| ns as f64 / 1e9 - p.started_unix + offset;
        r.intervals.extend(rep.regions.iter().filter_map(|g| Some((rel(g.granted_ns), rel(g.released_ns?)))));
        r.timeline.extend(rep.regions.iter().filter_map(|g| {
            Some(TimelineEntry {
                job: g.job,
                device: g.device.clone(),
                start_s: rel(g.granted_ns),
                end_s: rel(g.released_ns?),
                revoked: g.revoked,
            })
        }));
        r.regions.extend(rep.regions);
        offset += p.wall_s;
    }
    Ok(r)
}

/// Which ground truth each command of a row is compared with. Inflation compares a run with
/// ground truth from the same GPU: two GPUs of one model differ by more than the goals allow.
/// Only when a run has no same-GPU truth at all is it compared across GPUs, and marked so.
struct TruthOf<'a> {
    iso: &'a BTreeMap<String, Vec<IsolatedTruth>>,
    med_device: &'a BTreeMap<String, String>,
    reference_device: &'a str,
    compared_across: bool,
}

impl<'a> TruthOf<'a> {
    fn new(reference: &'a Reference, run: &'a MergedRun) -> TruthOf<'a> {
        let mut t = TruthOf {
            iso: &reference.iso,
            med_device: &run.med_device,
            reference_device: &reference.truth.device,
            compared_across: false,
        };
        t.compared_across =
            run.meds.keys().any(|id| t.iso.contains_key(id)) && !run.meds.keys().any(|id| t.same_gpu(id).is_some());
        t
    }

    fn same_gpu(&self, id: &String) -> Option<&'a IsolatedTruth> {
        self.iso.get(id)?.iter().find(|t| Some(&t.device) == self.med_device.get(id))
    }

    /// The truth a command is compared with: its own GPU's; for a run that has no same-GPU truth
    /// at all, the reference's first GPU's where it has one (one GPU for the whole run).
    fn get(&self, id: &String) -> Option<&'a IsolatedTruth> {
        self.same_gpu(id).or_else(|| {
            let on = self.iso.get(id).filter(|_| self.compared_across)?;
            on.iter().find(|t| t.device == self.reference_device).or_else(|| on.first())
        })
    }

    /// Commands measured whose truth is only from other GPUs.
    fn cross_device_commands(&self, meds: &BTreeMap<String, f64>) -> usize {
        meds.keys().filter(|id| self.iso.contains_key(*id) && self.same_gpu(id).is_none()).count()
    }
}

/// A row's inflation against its truths: per bucket, per bucket at full clock, over all
/// commands, and the commands furthest from their truth.
struct Inflations {
    per_bucket: Vec<Vec<f64>>,
    full_clock_bucket: Vec<Vec<f64>>,
    throttled_commands: usize,
    all: Vec<f64>,
    outliers: Vec<Outlier>,
}

fn inflations(run: &MergedRun, truth_of: &TruthOf, by_id: &BTreeMap<&str, &crate::workload::Command>) -> Inflations {
    let mut r = Inflations {
        per_bucket: vec![Vec::new(); BUCKETS.len()],
        full_clock_bucket: vec![Vec::new(); BUCKETS.len()],
        throttled_commands: 0,
        all: Vec::new(),
        outliers: Vec::new(),
    };
    for (id, v) in &run.meds {
        if let Some(t) = truth_of.get(id) {
            let i = &t.median_ms;
            let x = stats::inflation(*v, *i);
            let (n, region) = run.measured.get(id).cloned().unwrap_or((0, None));
            let (tn, truth_region) = t.measured.clone();
            r.outliers.push(Outlier {
                id: id.clone(),
                operator: by_id.get(id.as_str()).map(|c| c.operator.clone()).unwrap_or_default(),
                isolated_ms: *i,
                measured_ms: *v,
                inflation: x,
                samples: n,
                truth_samples: tn,
                sm_clock_mhz_released: region.as_ref().and_then(|r| r.sm_clock_mhz_released),
                truth_sm_clock_mhz_released: truth_region.as_ref().and_then(|r| r.sm_clock_mhz_released),
                core: region.as_ref().and_then(|r| r.core),
                wait_ms: region.as_ref().map(|r| r.wait_ms),
                freeze_ms: region.as_ref().map(|r| r.freeze_ms),
                settle_ms: region.as_ref().map(|r| r.settle_ms),
            });
            r.per_bucket[bucket_of(*i)].push(x);
            r.all.push(x);
            // Both the run's region and (when it recorded one) the ground truth's at full clock.
            match (run.full_at_release.get(id), t.full_clock) {
                (Some(true), None | Some(true)) => r.full_clock_bucket[bucket_of(*i)].push(x),
                (Some(_), _) => r.throttled_commands += 1,
                (None, _) => {}
            }
        }
    }
    r.outliers.sort_by(|a, b| b.inflation.abs().total_cmp(&a.inflation.abs()));
    r.outliers.truncate(OUTLIERS);
    r
}

/// A row's ranking fidelity: per operator, over all pairs, over the resolved pairs, and the
/// flipped pairs with the largest ground-truth gap.
struct Ranking {
    per_operator: Vec<OperatorRanking>,
    all: Option<PairRanking>,
    resolved: Option<PairRanking>,
    flips: Vec<FlippedPair>,
}

/// Candidate groups, pairs pooled per operator and over all operators. A group holds the
/// candidates measured on one GPU: a pair split over two GPUs (a run over every GPU) would
/// compare the GPUs, not the candidates.
fn ranking(
    run: &MergedRun,
    truth_of: &TruthOf,
    by_id: &BTreeMap<&str, &crate::workload::Command>,
    min_gap: f64,
) -> Ranking {
    // (operator, group, GPU) → (command, isolated median, measured median) per candidate.
    type Candidates<'a> = BTreeMap<(&'a str, &'a str, &'a str), Vec<(&'a str, f64, f64)>>;
    let mut groups: Candidates = BTreeMap::new();
    for (id, v) in &run.meds {
        if let (Some(t), Some(c), Some(dev)) = (truth_of.get(id), by_id.get(id.as_str()), run.med_device.get(id)) {
            groups.entry((c.operator.as_str(), c.group.as_str(), dev.as_str())).or_default().push((
                id.as_str(),
                t.median_ms,
                *v,
            ));
        }
    }
    let mut per_op: BTreeMap<&str, (usize, usize, usize)> = BTreeMap::new(); // groups, concordant, discordant
    let (mut all_c, mut all_d, mut res_c, mut res_d) = (0, 0, 0, 0);
    let mut flips: Vec<FlippedPair> = Vec::new();
    for ((op, group, _), pts) in &groups {
        if pts.len() < 2 {
            continue;
        }
        let e = per_op.entry(op).or_default();
        e.0 += 1;
        for (k, x) in pts.iter().enumerate() {
            for y in &pts[k + 1..] {
                // Ties in isolation or in the run order nothing: left out. Tau here is
                // (C − D) / (C + D) over untied pairs (equal to tau-b when there is no tie;
                // medians of float timings practically never tie).
                let order = stats::pair_order((x.1, y.1), (x.2, y.2));
                if order == stats::PairOrder::Tied {
                    continue;
                }
                let (fast, slow) = if x.1 < y.1 { (x, y) } else { (y, x) };
                let truth_gap = slow.1 / fast.1 - 1.0;
                let resolved = truth_gap >= min_gap;
                if order == stats::PairOrder::Concordant {
                    e.1 += 1;
                    all_c += 1;
                    res_c += usize::from(resolved);
                } else {
                    e.2 += 1;
                    all_d += 1;
                    res_d += usize::from(resolved);
                    flips.push(FlippedPair {
                        operator: op.to_string(),
                        group: group.to_string(),
                        faster: fast.0.to_string(),
                        slower: slow.0.to_string(),
                        truth_gap,
                        measured_gap: slow.2 / fast.2 - 1.0,
                    });
                }
            }
        }
    }
    flips.sort_by(|a, b| b.truth_gap.total_cmp(&a.truth_gap));
    flips.truncate(FLIPS);
    let per_operator = per_op
        .into_iter()
        .map(|(op, (g, c, d))| OperatorRanking {
            operator: op.into(),
            groups: g,
            pairs: c + d,
            kendall_tau: if c + d == 0 { f64::NAN } else { (c as f64 - d as f64) / (c + d) as f64 },
            flip_rate: if c + d == 0 { 0.0 } else { d as f64 / (c + d) as f64 },
        })
        .collect();
    Ranking { per_operator, all: PairRanking::of(all_c, all_d), resolved: PairRanking::of(res_c, res_d), flips }
}

/// Statistics of a row's regions: the steps before the grant, what went wrong, GPU state, and
/// the time held and settled.
fn region_stats(regions: &[kforge_store::RegionRow]) -> RegionStats {
    let col = |f: fn(&kforge_store::RegionRow) -> f64| regions.iter().map(f).collect::<Vec<f64>>();
    let (wait, drain, freeze, settle) =
        (col(|r| r.wait_ms), col(|r| r.drain_ms), col(|r| r.freeze_ms), col(|r| r.settle_ms));
    let st = RegionStats {
        count: regions.len(),
        wait_ms_p50: q(&wait, 0.5),
        wait_ms_p95: q(&wait, 0.95),
        drain_ms_p50: q(&drain, 0.5),
        drain_ms_p95: q(&drain, 0.95),
        freeze_ms_p50: q(&freeze, 0.5),
        freeze_ms_p95: q(&freeze, 0.95),
        settle_ms_p50: q(&settle, 0.5),
        settle_ms_p95: q(&settle, 0.95),
        drain_timeouts: regions.iter().filter(|r| r.drain_timed_out).count(),
        revoked: regions.iter().filter(|r| r.revoked).count(),
        tainted: regions.iter().filter(|r| r.tainted).count(),
        overlapping_pairs: stats::overlapping_pairs(regions),
        sm_clock_mhz_granted_p50: None,
        sm_clock_mhz_granted_min: None,
        gpu_temp_c_granted_p50: None,
        gpu_temp_c_granted_max: None,
        held_s: regions.iter().filter_map(|r| Some((r.released_ns? - r.granted_ns) as f64 / 1e9)).sum(),
        settle_s: settle.iter().sum::<f64>() / 1e3,
    };
    with_gpu_state(st, regions)
}

/// One row of the report: a run (or a repeat of the truth) of `parts` against the reference.
fn summarize(
    name: &str,
    parts: &[&RunManifest],
    reference: &Reference,
    command_tp: Option<f64>,
    min_gap: f64,
) -> Result<RunSummary> {
    let m = parts[0];
    let repeat_of_truth = m.kind == "truth";
    let run = merge_parts(name, parts)?;
    let wall_s: f64 = parts.iter().map(|p| p.wall_s).sum();
    let truth_of = TruthOf::new(reference, &run);
    let top_clock = top_clock(&run.regions);
    let infl = inflations(&run, &truth_of, &reference.by_id);
    let full_clock = if top_clock.is_some() {
        BUCKETS.iter().zip(infl.full_clock_bucket).map(|(b, v)| inflation_of(b, v)).collect()
    } else {
        Vec::new()
    };
    let rank = ranking(&run, &truth_of, &reference.by_id, min_gap);
    let busy_share = if wall_s > 0.0 { (stats::union_length(&run.intervals) / wall_s).min(1.0) } else { 0.0 };
    let tp = throughput_per_min(parts);
    let gpus = gpus_of_parts(parts);
    Ok(RunSummary {
        name: name.to_string(),
        policy: m.policy.clone(),
        ablation: m.ablation.clone(),
        warm: m.warm,
        concurrency: m.concurrency,
        commands: parts.iter().map(|p| p.commands).sum(),
        failed: parts.iter().map(|p| p.failed.len()).sum(),
        wall_s,
        throughput_per_min: tp,
        gpus,
        gpu_groups: parts.iter().all(|p| p.gpu_groups),
        commands_per_gpu: if gpus > 1 { commands_per_gpu(&run.med_device) } else { BTreeMap::new() },
        // A repeat of the truth ran one command at a time: no throughput comparison.
        throughput_ratio_vs_command: command_tp.filter(|c| *c > 0.0 && !repeat_of_truth).map(|c| tp / gpus as f64 / c),
        inflation: BUCKETS.iter().zip(infl.per_bucket).map(|(b, v)| inflation_of(b, v)).collect(),
        inflation_all: inflation_of("all", infl.all),
        cross_device_commands: truth_of.cross_device_commands(&run.meds),
        compared_across_devices: truth_of.compared_across,
        ranking: rank.per_operator,
        ranking_all: rank.all,
        ranking_resolved: rank.resolved,
        flips: rank.flips,
        repeat_of_truth,
        full_clock,
        throttled_commands: infl.throttled_commands,
        top_sm_clock_mhz: top_clock,
        regions: region_stats(&run.regions),
        busy_share,
        outliers: infl.outliers,
        timeline: thinned(run.timeline),
    })
}

/// Commands measured on each GPU.
fn commands_per_gpu(med_device: &BTreeMap<String, String>) -> BTreeMap<String, usize> {
    med_device.values().fold(BTreeMap::new(), |mut acc, d| {
        *acc.entry(d.clone()).or_insert(0) += 1;
        acc
    })
}

/// At most 2000 timeline entries, evenly thinned.
fn thinned(timeline: Vec<TimelineEntry>) -> Vec<TimelineEntry> {
    let step = (timeline.len() / 2000).max(1);
    timeline.into_iter().step_by(step).collect()
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{Command, Profile};
    use kforge_store::{JobRow, MeasurementRow, RegionRow, Store};
    use serde_json::json;

    fn cmd(id: &str, group: &str, op: &str) -> Command {
        Command {
            id: id.into(),
            profile: Profile::Cpu,
            operator: op.into(),
            group: group.into(),
            candidate: id.into(),
            spec: json!({"id": id}),
            est_ms: 1.0,
            argv: vec!["python3".into()],
        }
    }

    fn manifest(
        name: &str,
        kind: &str,
        policy: &str,
        db: &str,
        workload: &str,
        wall_s: f64,
        commands: usize,
    ) -> RunManifest {
        RunManifest {
            name: name.into(),
            kind: kind.into(),
            policy: policy.into(),
            ablation: "-".into(),
            warm: false,
            concurrency: 4,
            workload: workload.into(),
            db: db.into(),
            label: format!("eval:{name}"),
            device: "cpu".into(),
            daemon_flags: vec![],
            gpu_groups: false,
            started_unix: 1000.0,
            wall_s,
            commands,
            failed: vec![],
        }
    }

    /// Record one job per (id, median) under `label`, with a region [start, end] seconds.
    fn record(s: &Store, label: &str, first_id: u64, rows: &[(&str, f64, f64, f64)]) {
        record_clocked(s, label, first_id, rows, &[]);
    }

    /// `record`, the k-th region with SM clocks (granted, released) `clocks[k]` when given.
    fn record_clocked(
        s: &Store,
        label: &str,
        first_id: u64,
        rows: &[(&str, f64, f64, f64)],
        clocks: &[Option<(u32, u32)>],
    ) {
        record_on(s, label, first_id, rows, clocks, "cpu");
    }

    /// `record_clocked`, the jobs on daemon device `device`.
    fn record_on(
        s: &Store,
        label: &str,
        first_id: u64,
        rows: &[(&str, f64, f64, f64)],
        clocks: &[Option<(u32, u32)>],
        device: &str,
    ) {
        record_settled(s, label, first_id, rows, clocks, device, 0.0);
    }

    /// Rows as `record_on`, each region after a settle step of `settle_ms`.
    fn record_settled(
        s: &Store,
        label: &str,
        first_id: u64,
        rows: &[(&str, f64, f64, f64)],
        clocks: &[Option<(u32, u32)>],
        device: &str,
        settle_ms: f64,
    ) {
        for (k, (name, ms, start, end)) in rows.iter().enumerate() {
            let clock = clocks.get(k).copied().flatten();
            let id = first_id + k as u64;
            s.insert_job(&JobRow {
                id,
                label: Some(label.into()),
                argv: vec![],
                cwd: "/".into(),
                device: device.into(),
                policy: "region".into(),
                queued_ns: 0,
                started_ns: None,
                ended_ns: None,
                pid: None,
                exit_code: Some(0),
                signal: None,
                reason: None,
            })
            .unwrap();
            let ns = |t: f64| ((1000.0 + t) * 1e9) as i64;
            s.insert_region(&RegionRow {
                id,
                job: Some(id),
                device: "cpu".into(),
                name: name.to_string(),
                pid: 1,
                tid: 1,
                policy: "region".into(),
                exclusive: true,
                requested_ns: ns(*start),
                granted_ns: ns(*start),
                released_ns: Some(ns(*end)),
                wait_ms: 1.0,
                gate_ms: 0.0,
                drain_ms: 2.0,
                drain_timed_out: false,
                freeze_ms: 0.5,
                frozen_jobs: 1,
                settle_ms,
                settle_timed_out: false,
                gpu_temp_c_granted: None,
                sm_clock_mhz_granted: clock.map(|c| c.0),
                gpu_temp_c_released: None,
                sm_clock_mhz_released: clock.map(|c| c.1),
                isolate_ms: 0.1,
                core: Some(0),
                lease_ms: 60000,
                revoked: false,
                tainted: false,
            })
            .unwrap();
            if let Some((_, released)) = clock {
                s.region_released(id, ns(*end), false, false, Some((40, released))).unwrap();
            }
            // Three samples whose median is `ms`.
            s.insert_measurement(&MeasurementRow {
                id,
                job: Some(id),
                region: Some(id),
                name: name.to_string(),
                recorded_ns: 0,
                samples_ms: vec![ms * 0.9, *ms, ms * 1.5],
                valid: true,
            })
            .unwrap();
        }
    }

    #[test]
    fn report_from_a_synthetic_store() {
        let dir = tempfile::tempdir().unwrap();
        let wl = dir.path().join("w.jsonl");
        let cmds = vec![cmd("a", "g1", "mm"), cmd("b", "g1", "mm"), cmd("c", "g1", "mm"), cmd("d", "g2", "sm")];
        crate::workload::write(&wl, &cmds).unwrap();
        let dbp = dir.path().join("e.db");
        let s = Store::open(&dbp).unwrap();
        // Ground truth: a < b < c in group g1 (ranking), d alone; buckets: 0.05, 0.5, 5, 50 ms.
        record(
            &s,
            "eval:truth",
            1,
            &[("a", 0.05, 0.0, 0.1), ("b", 0.5, 0.2, 0.3), ("c", 5.0, 0.4, 0.5), ("d", 50.0, 0.6, 0.7)],
        );
        // Run: a +10%, b +0%, c slower than... keep order a<b<c except swap? b becomes 6.0 > c 5.5: one flip of 3 pairs.
        record(
            &s,
            "eval:region",
            11,
            &[("a", 0.055, 0.0, 1.0), ("b", 6.0, 2.0, 3.0), ("c", 5.5, 2.5, 4.0), ("d", 50.0, 9.0, 10.0)],
        );
        record(
            &s,
            "eval:command",
            21,
            &[("a", 0.05, 0.0, 1.0), ("b", 0.5, 1.0, 2.0), ("c", 5.0, 2.0, 3.0), ("d", 50.0, 3.0, 4.0)],
        );
        drop(s);
        let db = dbp.display().to_string();
        let w = wl.display().to_string();
        let ms = vec![
            manifest("truth", "truth", "command", &db, &w, 10.0, 4),
            manifest("region", "run", "region", &db, &w, 10.0, 4),
            manifest("command", "run", "command", &db, &w, 20.0, 4),
        ];
        let r = compute(&ms).unwrap();
        assert_eq!(r.isolated_commands, 4);
        let region = r.runs.iter().find(|x| x.name == "region").unwrap();
        assert_eq!(region.throughput_per_min, 24.0);
        assert_eq!(region.throughput_ratio_vs_command, Some(2.0));
        let infl: Vec<(usize, f64)> = region.inflation.iter().map(|b| (b.n, b.p50)).collect();
        assert_eq!(infl[0].0, 1);
        assert!((infl[0].1 - 0.1).abs() < 1e-9, "{infl:?}"); // a: 0.055 / 0.05 - 1
        assert!((infl[1].1 - 11.0).abs() < 1e-9); // b: 6.0 / 0.5 - 1
        assert!((infl[2].1 - 0.1).abs() < 1e-9); // c
        assert!(infl[3].1.abs() < 1e-12); // d
        assert_eq!(region.inflation_all.n, 4);
        // Ranking: group g1 has pairs (a,b) (a,c) (b,c); (b,c) flipped. g2 has one candidate: not ranked.
        let mm = region.ranking.iter().find(|o| o.operator == "mm").unwrap();
        assert_eq!((mm.groups, mm.pairs), (1, 3));
        assert!((mm.flip_rate - 1.0 / 3.0).abs() < 1e-12);
        assert!((mm.kendall_tau - 1.0 / 3.0).abs() < 1e-12);
        assert!(region.ranking.iter().all(|o| o.operator != "sm"));
        // Regions [0,1] [2,3] [2.5,4] [9,10]: union 4 s of 10 s; one overlapping pair.
        assert!((region.busy_share - 0.4).abs() < 1e-9, "{}", region.busy_share);
        assert_eq!(region.regions.overlapping_pairs, 1);
        assert_eq!(region.regions.count, 4);
        assert!((region.regions.drain_ms_p50 - 2.0).abs() < 1e-12);
        let command = r.runs.iter().find(|x| x.name == "command").unwrap();
        assert!(command.ranking.iter().all(|o| o.flip_rate == 0.0 && o.kendall_tau == 1.0));
        assert!(table(&r).contains("2.00x"));
        // No ground truth, or one command in two truth parts, are errors.
        assert!(compute(&ms[1..]).unwrap_err().to_string().contains("no ground-truth"));
        let two = vec![ms[0].clone(), ms[0].clone()];
        assert!(compute(&two).unwrap_err().to_string().contains("in two ground-truth parts of one GPU"));
    }

    #[test]
    fn resolved_ranking_flips_and_a_repeat_truth() {
        let dir = tempfile::tempdir().unwrap();
        let wl = dir.path().join("w.jsonl");
        let cmds = [
            cmd("a", "g1", "mm"),
            cmd("b", "g1", "mm"),
            cmd("c", "g1", "mm"),
            cmd("d", "g2", "ew"),
            cmd("e", "g2", "ew"),
        ];
        crate::workload::write(&wl, &cmds).unwrap();
        let dbp = dir.path().join("e.db");
        let s = Store::open(&dbp).unwrap();
        // Cold truth in two parts: a 1.00 < b 1.01 < c 1.50 (g1), d 2.00 < e 2.10 (g2).
        record(&s, "eval:truth-0", 1, &[("a", 1.0, 0.0, 0.1), ("b", 1.01, 0.2, 0.3), ("c", 1.5, 0.4, 0.5)]);
        record(&s, "eval:truth-3", 4, &[("d", 2.0, 0.0, 0.1), ("e", 2.1, 0.2, 0.3)]);
        // Warm truth (a repeat): flips a/b (1 % apart), keeps the rest.
        record(
            &s,
            "eval:truth-warm",
            11,
            &[
                ("a", 1.02, 0.0, 0.1),
                ("b", 1.0, 0.2, 0.3),
                ("c", 1.5, 0.4, 0.5),
                ("d", 2.0, 0.6, 0.7),
                ("e", 2.1, 0.8, 0.9),
            ],
        );
        // The run flips a/b (1 % apart) and d/e (5 % apart); a/c, b/c kept.
        record(
            &s,
            "eval:region",
            21,
            &[
                ("a", 1.01, 0.0, 1.0),
                ("b", 1.0, 1.0, 2.0),
                ("c", 1.6, 2.0, 3.0),
                ("d", 2.2, 3.0, 4.0),
                ("e", 2.1, 4.0, 5.0),
            ],
        );
        drop(s);
        let (db, w) = (dbp.display().to_string(), wl.display().to_string());
        let warm = |mut m: RunManifest| {
            m.warm = true;
            m
        };
        let ms = vec![
            manifest("truth-0", "truth", "region", &db, &w, 10.0, 3),
            warm(manifest("truth-warm", "truth", "region", &db, &w, 5.0, 5)),
            manifest("truth-3", "truth", "region", &db, &w, 10.0, 2),
            manifest("region", "run", "region", &db, &w, 10.0, 5),
            manifest("command", "run", "command", &db, &w, 20.0, 5),
        ];
        let r = compute_with(&ms, &ReportOptions { min_gap: 0.02 }).unwrap();
        // The cold parts are the reference (5 commands); the warm truth is a repeat row.
        assert_eq!(r.isolated_commands, 5);
        assert_eq!(r.resolved_min_gap, 0.02);
        let names: Vec<&str> = r.runs.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["truth-warm", "region", "command"]);
        let repeat = &r.runs[0];
        assert!(repeat.repeat_of_truth && repeat.throughput_ratio_vs_command.is_none());
        // Repeat: 4 pairs (a,b) (a,c) (b,c) (d,e), one flip at a 1 % gap: resolved pairs keep order.
        assert_eq!(repeat.ranking_all, Some(PairRanking { pairs: 4, flips: 1, kendall_tau: 0.5 }));
        assert_eq!(repeat.ranking_resolved, Some(PairRanking { pairs: 3, flips: 0, kendall_tau: 1.0 }));
        let run = &r.runs[1];
        assert!(!run.repeat_of_truth && run.throughput_ratio_vs_command == Some(2.0));
        assert_eq!(run.ranking_all, Some(PairRanking { pairs: 4, flips: 2, kendall_tau: 0.0 }));
        assert_eq!(run.ranking_resolved, Some(PairRanking { pairs: 3, flips: 1, kendall_tau: 1.0 / 3.0 }));
        // Flips, largest truth gap first, with both gaps.
        let f: Vec<(&str, &str, &str)> =
            run.flips.iter().map(|f| (f.operator.as_str(), f.faster.as_str(), f.slower.as_str())).collect();
        assert_eq!(f, [("ew", "d", "e"), ("mm", "a", "b")]);
        assert!(
            (run.flips[0].truth_gap - 0.05).abs() < 1e-9
                && (run.flips[0].measured_gap - (2.1 / 2.2 - 1.0)).abs() < 1e-9
        );
        let t = table(&r);
        assert!(t.contains("truth-warm+") && t.contains("0.000/0.333") && t.contains(">= 2.0 %"), "{t}");
        // A gap of 0 counts every pair; a negative or NaN one is refused.
        let r0 = compute_with(&ms, &ReportOptions { min_gap: 0.0 }).unwrap();
        assert_eq!(r0.runs[1].ranking_resolved, r0.runs[1].ranking_all);
        for bad in [-0.01, f64::NAN] {
            assert!(compute_with(&ms, &ReportOptions { min_gap: bad })
                .unwrap_err()
                .to_string()
                .contains("minimum gap"));
        }
        // A warm truth in parts is one repeat row; a cold truth named truth-repeat is another.
        let s = Store::open(&dbp).unwrap();
        record(&s, "eval:truth-warm-0", 31, &[("a", 1.0, 0.0, 0.1), ("b", 1.01, 0.2, 0.3)]);
        record(&s, "eval:truth-warm-2", 33, &[("c", 1.5, 0.0, 0.1)]);
        record(&s, "eval:truth-repeat", 41, &[("a", 1.0, 0.0, 0.1), ("c", 1.5, 0.2, 0.3)]);
        drop(s);
        let parts = vec![
            ms[0].clone(),
            ms[2].clone(),
            warm(manifest("truth-warm-0", "truth", "region", &db, &w, 5.0, 2)),
            warm(manifest("truth-warm-2", "truth", "region", &db, &w, 5.0, 1)),
            manifest("truth-repeat", "truth", "region", &db, &w, 5.0, 2),
        ];
        let rp = compute(&parts).unwrap();
        let rows: Vec<(&str, usize, bool)> =
            rp.runs.iter().map(|x| (x.name.as_str(), x.inflation_all.n, x.repeat_of_truth)).collect();
        assert_eq!(rows, [("truth-warm", 3, true), ("truth-repeat", 2, true)]);
        // A repeat (or a run) that measures a command twice is refused, not silently overwritten.
        let dup = vec![ms[0].clone(), ms[2].clone(), ms[1].clone(), parts[2].clone()];
        let e = compute(&dup).unwrap_err().to_string();
        assert!(e.contains("truth-warm measured command a twice"), "{e}");
        // Only warm truths: they are the reference, no repeat row.
        let only_warm = vec![ms[1].clone(), ms[3].clone()];
        let rw = compute(&only_warm).unwrap();
        assert_eq!(rw.runs.len(), 1);
        assert!(!rw.runs[0].repeat_of_truth);
        assert_eq!(truth_base_name("truth-warm-50"), "truth-warm");
        assert_eq!(truth_base_name("truth-warm"), "truth-warm");
        assert_eq!(truth_base_name("-5"), "-5");
        assert_eq!(truth_base_name("truth-gpu1-50"), "truth");
        assert_eq!(truth_base_name("truth-gpu1"), "truth");
        assert_eq!(truth_base_name("truth-gpux"), "truth-gpux");
        assert!(is_repeat_name("truth-repeat-gpu1-0") && !is_repeat_name("truth-warm"));
    }

    #[test]
    fn full_clock_inflation_leaves_out_regions_that_ended_throttled() {
        let dir = tempfile::tempdir().unwrap();
        let wl = dir.path().join("w.jsonl");
        let cmds = [
            cmd("a", "g1", "mm"),
            cmd("b", "g1", "mm"),
            cmd("c", "g2", "mm"),
            cmd("d", "g2", "mm"),
            cmd("e", "g3", "mm"),
        ];
        crate::workload::write(&wl, &cmds).unwrap();
        let dbp = dir.path().join("e.db");
        let s = Store::open(&dbp).unwrap();
        // The truth, under the region policy, recorded clocks: e's region ended power-capped.
        record_clocked(
            &s,
            "eval:truth",
            1,
            &[
                ("a", 0.05, 0.0, 0.1),
                ("b", 0.5, 0.2, 0.3),
                ("c", 5.0, 0.4, 0.5),
                ("d", 50.0, 0.6, 0.7),
                ("e", 5.0, 0.8, 0.9),
            ],
            &[Some((1980, 1980)), Some((1980, 1980)), None, None, Some((1980, 1400))],
        );
        // The run: a +10 % at full clock, b +40 % ending at 1500 MHz, c +1 % at 1975 of 1980 MHz,
        // d without a clock reading (counted in neither).
        record_clocked(
            &s,
            "eval:region",
            11,
            &[
                ("a", 0.055, 0.0, 1.0),
                ("b", 0.7, 1.0, 2.0),
                ("c", 5.05, 2.0, 3.0),
                ("d", 50.0, 3.0, 4.0),
                ("e", 5.0, 4.0, 5.0),
            ],
            &[Some((1980, 1980)), Some((1980, 1500)), Some((1965, 1975)), None, Some((1980, 1980))],
        );
        drop(s);
        let (db, w) = (dbp.display().to_string(), wl.display().to_string());
        let ms = vec![
            manifest("truth", "truth", "command", &db, &w, 10.0, 4),
            manifest("region", "run", "region", &db, &w, 10.0, 4),
        ];
        let r = compute(&ms).unwrap();
        let run = &r.runs[0];
        // b ended throttled in the run, e in the truth.
        assert_eq!((run.top_sm_clock_mhz, run.throttled_commands), (Some(1980), 2));
        let n: Vec<usize> = run.full_clock.iter().map(|b| b.n).collect();
        assert_eq!(n, vec![1, 0, 1, 0]);
        assert!((run.full_clock[0].p95 - 0.1).abs() < 1e-9 && (run.full_clock[2].p95 - 0.01).abs() < 1e-9);
        // The overall inflation still holds every command, b's +40 % included.
        assert_eq!(run.inflation_all.n, 5);
        assert!((run.inflation[1].p50 - 0.4).abs() < 1e-9);
        let t = table(&r);
        assert!(t.contains("regions that ended at full clock") && t.contains("1980"), "{t}");
        let html = crate::html::render(&r);
        assert!(html.contains("Regions that ended at full clock") && html.contains("Furthest from the ground truth"));
        // Outliers: largest |inflation| first, with their regions' evidence (e: +0 % last).
        let ids: Vec<&str> = run.outliers.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(ids[..2], ["b", "a"]);
        assert_eq!(ids.len(), 5);
        let b = &run.outliers[0];
        assert_eq!((b.samples, b.truth_samples, b.sm_clock_mhz_released, b.core), (3, 3, Some(1500), Some(0)));
        assert!((b.inflation - 0.4).abs() < 1e-9 && b.freeze_ms == Some(0.5));
        let e = run.outliers.iter().find(|o| o.id == "e").unwrap();
        assert_eq!(e.truth_sm_clock_mhz_released, Some(1400));
    }

    #[test]
    fn serial_time_sums_held_regions_and_settle_steps_per_gpu() {
        let dir = tempfile::tempdir().unwrap();
        let wl = dir.path().join("w.jsonl");
        crate::workload::write(&wl, &[cmd("a", "g1", "mm"), cmd("b", "g1", "mm")]).unwrap();
        let dbp = dir.path().join("e.db");
        let s = Store::open(&dbp).unwrap();
        record(&s, "eval:truth", 1, &[("a", 1.0, 0.0, 0.5), ("b", 2.0, 1.0, 1.5)]);
        // Regions of 1.0 and 2.0 s, each after 250 ms of settle; a run of 10 s.
        record_settled(&s, "eval:region", 11, &[("a", 1.0, 0.0, 1.0), ("b", 2.0, 2.0, 4.0)], &[], "cpu", 250.0);
        record(&s, "eval:command", 21, &[("a", 1.0, 0.0, 1.0), ("b", 2.0, 1.0, 2.0)]);
        drop(s);
        let (db, w) = (dbp.display().to_string(), wl.display().to_string());
        let ms = vec![
            manifest("truth", "truth", "region", &db, &w, 1.0, 2),
            manifest("region", "run", "region", &db, &w, 10.0, 2),
            manifest("command", "run", "command", &db, &w, 10.0, 2),
        ];
        let r = compute(&ms).unwrap();
        let region = r.runs.iter().find(|x| x.name == "region").unwrap();
        assert!(
            (region.regions.held_s - 3.0).abs() < 1e-9 && (region.regions.settle_s - 0.5).abs() < 1e-9,
            "{:?}",
            region.regions
        );
        let t = table(&r);
        let row =
            t.lines().skip_while(|l| !l.starts_with("serial time per GPU")).find(|l| l.starts_with("region ")).unwrap();
        assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["region", "10.0", "3.0", "0.5", "35%"]);
        // Whole-command exclusivity has no serial-time row: its regions are not what is exclusive.
        assert!(
            !t.lines().skip_while(|l| !l.starts_with("serial time per GPU")).any(|l| l.starts_with("command ")),
            "{t}"
        );
    }

    #[test]
    fn a_run_over_every_gpu_is_compared_with_each_gpus_truth() {
        let dir = tempfile::tempdir().unwrap();
        let wl = dir.path().join("w.jsonl");
        let cmds = [cmd("a", "g1", "mm"), cmd("b", "g1", "mm"), cmd("c", "g1", "mm")];
        crate::workload::write(&wl, &cmds).unwrap();
        let dbp = dir.path().join("e.db");
        let s = Store::open(&dbp).unwrap();
        // Truth of every command on both GPUs (GPU 1 is 10 % slower).
        let rows = |f: f64| [("a", 1.0 * f, 0.0, 0.1), ("b", 2.0 * f, 0.2, 0.3), ("c", 3.0 * f, 0.4, 0.5)];
        record_on(&s, "eval:truth", 1, &rows(1.0), &[], "0");
        record_on(&s, "eval:truth-gpu1", 4, &rows(1.1), &[], "1");
        // The scaling run: a and c on GPU 1 (+0 % against GPU 1's truth), b on GPU 0 (+5 %).
        record_on(&s, "eval:both", 11, &[("a", 1.1, 0.0, 1.0), ("c", 3.3, 0.0, 1.0)], &[], "1");
        record_on(&s, "eval:both", 13, &[("b", 2.1, 0.0, 1.0)], &[], "0");
        drop(s);
        let (db, w) = (dbp.display().to_string(), wl.display().to_string());
        let on = |mut m: RunManifest, dev: &str| {
            m.device = dev.into();
            m
        };
        let ms = vec![
            on(manifest("truth", "truth", "region", &db, &w, 1.0, 3), "0 (H200, GPU-a)"),
            on(manifest("truth-gpu1", "truth", "region", &db, &w, 1.0, 3), "1 (H200, GPU-b)"),
            on(manifest("both", "run", "region", &db, &w, 1.0, 3), "all: 0 (H200, GPU-a); 1 (H200, GPU-b)"),
        ];
        let r = compute(&ms).unwrap();
        assert_eq!(r.isolated_commands, 3);
        let run = &r.runs[0];
        assert_eq!((run.cross_device_commands, run.compared_across_devices, run.inflation_all.n), (0, false, 3));
        assert_eq!((run.gpus, run.throughput_ratio_vs_command), (2, None));
        // Against whole-command exclusivity on one GPU at the same commands per minute: half as
        // many per GPU — the ratio is per GPU, not the two GPUs' sum over one.
        {
            let s = Store::open(&dbp).unwrap();
            record_on(
                &s,
                "eval:command",
                31,
                &[("a", 1.0, 0.0, 1.0), ("b", 2.0, 1.0, 2.0), ("c", 3.0, 2.0, 3.0)],
                &[],
                "0",
            );
            let mut with_cmd = ms.clone();
            assert_eq!(with_cmd[2].name, "both");
            with_cmd.push(on(manifest("command", "run", "command", &db, &w, 1.0, 3), "0 (H200, GPU-a)"));
            let r = compute(&with_cmd).unwrap();
            let (both, command) = (&r.runs[0], &r.runs[1]);
            assert_eq!((both.gpus, command.gpus), (2, 1));
            let per_gpu: Vec<(&str, usize)> = both.commands_per_gpu.iter().map(|(d, n)| (d.as_str(), *n)).collect();
            assert_eq!(per_gpu, [("0 (H200, GPU-a)", 1), ("1 (H200, GPU-b)", 2)]);
            assert!(command.commands_per_gpu.is_empty());
            assert!(table(&r).contains("both: commands measured per GPU: GPU 0 1, GPU 1 2"), "{}", table(&r));
            assert_eq!((both.throughput_ratio_vs_command, command.throughput_ratio_vs_command), (Some(0.5), Some(1.0)));
            assert!(table(&r).contains("VS_CMD/GPU"));
            assert!(!both.gpu_groups && !table(&r).contains("GPUS g:"));
            // With GPU groups: marked in the table, and parts that differ in it are not merged.
            with_cmd[2].gpu_groups = true;
            let r = compute(&with_cmd).unwrap();
            assert!(r.runs[0].gpu_groups);
            let t = table(&r);
            assert!(t.lines().any(|l| l.starts_with("both ") && l.split_whitespace().nth(4) == Some("2g")), "{t}");
            assert!(t.contains("GPUS g: each candidate group ran on one GPU"));
            let mut part = with_cmd[2].clone();
            part.name = "both@9".into();
            part.gpu_groups = false;
            with_cmd[2].name = "both@0".into();
            with_cmd.push(part);
            let e = compute(&with_cmd).unwrap_err().to_string();
            assert!(
                e.contains("share the name both but not policy, ablation, warm, daemon flags and GPU groups"),
                "{e}"
            );
        }
        let mut x = run.inflation_all.values.clone();
        x.sort_by(f64::total_cmp);
        assert!(x[0].abs() < 1e-9 && x[1].abs() < 1e-9 && (x[2] - 0.05).abs() < 1e-9, "{x:?}");
        // Only the pair measured on one GPU is ranked: (a, c) on GPU 1; b's pairs span GPUs.
        assert_eq!(run.ranking_all.map(|t| t.pairs), Some(1));
        // A job on a GPU the manifest does not list keeps the manifest's device: no same-GPU truth.
        let s = Store::open(&dbp).unwrap();
        record_on(&s, "eval:both", 14, &[("d", 1.0, 0.0, 1.0)], &[], "7");
        record_on(&s, "eval:truth", 15, &[("d", 1.0, 0.6, 0.7)], &[], "0");
        // A run on a third GPU: compared across GPUs, with the reference's first GPU's truth.
        record_on(&s, "eval:elsewhere", 21, &[("a", 1.2, 0.0, 1.0), ("b", 2.4, 0.0, 1.0)], &[], "2");
        drop(s);
        let mut cmds4 = cmds.to_vec();
        cmds4.push(cmd("d", "g2", "mm"));
        crate::workload::write(&wl, &cmds4).unwrap();
        let mut ms2 = ms.clone();
        ms2.push(on(manifest("elsewhere", "run", "region", &db, &w, 1.0, 2), "2 (H200, GPU-c)"));
        let r = compute(&ms2).unwrap();
        assert_eq!(r.device, "0 (H200, GPU-a); 1 (H200, GPU-b)");
        let both = &r.runs[0];
        assert_eq!(
            (both.inflation_all.n, both.cross_device_commands),
            (3, 1),
            "d: measured on an unlisted GPU, left out"
        );
        let elsewhere = &r.runs[1];
        assert!(elsewhere.compared_across_devices);
        let mut x = elsewhere.inflation_all.values.clone();
        x.sort_by(f64::total_cmp);
        assert!((x[0] - 0.2).abs() < 1e-9 && (x[1] - 0.2).abs() < 1e-9, "GPU 0's truth (1.0, 2.0), not GPU 1's: {x:?}");
        // The same GPU's truth twice is refused.
        let twice = vec![ms[0].clone(), ms[0].clone(), ms[2].clone()];
        assert!(compute(&twice)
            .unwrap_err()
            .to_string()
            .contains("in two ground-truth parts of one GPU (truth and truth, GPU 0 (H200, GPU-a))"));
    }

    #[test]
    fn inflation_uses_ground_truth_from_the_same_gpu() {
        let dir = tempfile::tempdir().unwrap();
        let wl = dir.path().join("w.jsonl");
        let cmds = vec![cmd("a", "g1", "mm"), cmd("b", "g1", "mm"), cmd("c", "g2", "mm")];
        crate::workload::write(&wl, &cmds).unwrap();
        // A byte-identical copy of the workload elsewhere (a state directory from another call).
        let other = tempfile::tempdir().unwrap();
        let wl2 = other.path().join("w.jsonl");
        std::fs::copy(&wl, &wl2).unwrap();
        let dbp = dir.path().join("e.db");
        let s = Store::open(&dbp).unwrap();
        record(&s, "eval:t0", 1, &[("a", 1.0, 0.0, 0.1)]); // part 0 on GPU A
        record(&s, "eval:t1", 2, &[("b", 2.0, 0.0, 0.1), ("c", 3.0, 0.2, 0.3)]); // part 1 on GPU B
        record(&s, "eval:run", 11, &[("a", 1.5, 0.0, 1.0), ("b", 2.2, 1.0, 2.0), ("c", 3.3, 2.0, 3.0)]); // on GPU B
        record(&s, "eval:sub", 21, &[("a", 1.2, 0.0, 1.0)]); // on GPU B, only command a
        drop(s);
        let db = dbp.display().to_string();
        let on = |mut m: RunManifest, dev: &str| {
            m.device = dev.into();
            m
        };
        let ms = vec![
            on(manifest("t0", "truth", "command", &db, &wl.display().to_string(), 1.0, 1), "A"),
            on(manifest("t1", "truth", "command", &db, &wl2.display().to_string(), 1.0, 2), "B"),
            on(manifest("run", "run", "region", &db, &wl.display().to_string(), 1.0, 3), "B"),
            on(manifest("sub", "run", "region", &db, &wl.display().to_string(), 1.0, 1), "B"),
        ];
        let r = compute(&ms).unwrap();
        let run = r.runs.iter().find(|x| x.name == "run").unwrap();
        // a (truth on A) is left out: +10% for b and c only.
        assert_eq!(run.inflation_all.n, 2);
        assert!((run.inflation_all.p50 - 0.1).abs() < 1e-9, "{:?}", run.inflation_all);
        assert_eq!((run.cross_device_commands, run.compared_across_devices), (1, false));
        // A run with no same-GPU truth at all is compared across GPUs, and marked.
        let sub = r.runs.iter().find(|x| x.name == "sub").unwrap();
        assert_eq!((sub.inflation_all.n, sub.compared_across_devices), (1, true));
        assert!((sub.inflation_all.p50 - 0.2).abs() < 1e-9);
        assert!(table(&r).contains("sub*"));
        // A workload that differs is still refused.
        std::fs::write(&wl2, "{}\n").unwrap();
        assert!(compute(&ms).unwrap_err().to_string().contains("different workloads"));
    }

    #[test]
    fn slices_merge_into_one_run_with_per_slice_gpus() {
        let dir = tempfile::tempdir().unwrap();
        let wl = dir.path().join("w.jsonl");
        crate::workload::write(&wl, &[cmd("a", "g1", "mm"), cmd("b", "g1", "mm"), cmd("c", "g2", "mm")]).unwrap();
        let dbp = dir.path().join("e.db");
        let s = Store::open(&dbp).unwrap();
        record(&s, "eval:t0", 1, &[("a", 1.0, 0.0, 0.1)]);
        record(&s, "eval:t1", 2, &[("b", 2.0, 0.0, 0.1), ("c", 3.0, 0.2, 0.3)]);
        record(&s, "eval:region@0", 11, &[("a", 1.1, 0.0, 1.0)]);
        record(&s, "eval:region@1", 21, &[("b", 2.2, 0.0, 1.0), ("c", 3.3, 1.0, 2.0)]);
        drop(s);
        let (db, w) = (dbp.display().to_string(), wl.display().to_string());
        let on = |mut m: RunManifest, dev: &str| {
            m.device = dev.into();
            m
        };
        let mut ms = vec![
            on(manifest("t0", "truth", "command", &db, &w, 1.0, 1), "A"),
            on(manifest("t1", "truth", "command", &db, &w, 1.0, 2), "B"),
            on(manifest("region@0", "run", "region", &db, &w, 10.0, 1), "A"),
            on(manifest("region@1", "run", "region", &db, &w, 20.0, 2), "B"),
        ];
        let r = compute(&ms).unwrap();
        assert_eq!(r.runs.len(), 1);
        let run = &r.runs[0];
        assert_eq!((run.name.as_str(), run.commands, run.wall_s), ("region", 3, 30.0));
        assert!((run.throughput_per_min - 6.0).abs() < 1e-9);
        // Every command compared with truth from its own slice's GPU: +10 % each.
        assert_eq!((run.inflation_all.n, run.cross_device_commands, run.compared_across_devices), (3, 0, false));
        assert!((run.inflation_all.p95 - 0.1).abs() < 1e-9);
        assert_eq!(run.regions.count, 3);
        // The second slice's regions come after the first slice's wall time on the timeline.
        assert!(run.timeline.iter().any(|t| t.start_s >= 10.0));
        // Parts of one name must agree on the policy.
        ms[3].policy = "none".into();
        assert!(compute(&ms).unwrap_err().to_string().contains("share the name region"));
    }
}
