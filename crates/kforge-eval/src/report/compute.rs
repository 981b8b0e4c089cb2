//! Computing the evaluation report from run manifests and their stores: the reference truth,
//! the report's rows, and per row its inflation, ranking and region statistics.

use super::{
    bucket_of, BucketInflation, EvalReport, FlippedPair, OperatorRanking, Outlier, PairRanking, RegionStats,
    ReportOptions, RunSummary, TimelineEntry, BUCKETS, FLIPS, FULL_CLOCK_FRACTION, OUTLIERS,
};
use crate::runner::RunManifest;
use crate::stats;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;

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

/// Per command of one store report: its sample count and the region it was measured in.
fn measured_in(rep: &kforge_store::Report) -> BTreeMap<String, (usize, Option<kforge_store::RegionRow>)> {
    let by_id: BTreeMap<u64, &kforge_store::RegionRow> = rep.regions.iter().map(|r| (r.id, r)).collect();
    rep.measurements
        .iter()
        .filter(|m| m.valid)
        .map(|m| (m.name.clone(), (m.samples_ms.len(), m.region.and_then(|rid| by_id.get(&rid).map(|r| (*r).clone())))))
        .collect()
}

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
pub(super) fn truth_base_name(name: &str) -> &str {
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
pub(super) fn is_repeat_name(name: &str) -> bool {
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
                freeze_ms: region.as_ref().map(|r| r.steps.freeze_ms),
                settle_ms: region.as_ref().map(|r| r.steps.settle_ms),
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
        (col(|r| r.wait_ms), col(|r| r.steps.drain_ms), col(|r| r.steps.freeze_ms), col(|r| r.steps.settle_ms));
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
        drain_timeouts: regions.iter().filter(|r| r.steps.drain_timed_out).count(),
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
