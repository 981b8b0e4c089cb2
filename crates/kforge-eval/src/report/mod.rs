//! The evaluation report: what `kforge report RUN… --json/--html` computes from run manifests
//! and the store. [`compute`] fills these structures step by step (module `compute`), [`table`]
//! prints them (module `table`), `html::render` draws them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod compute;
mod table;
#[cfg(test)]
mod tests;

pub use compute::{compute, compute_with};
pub use table::{run_label, table};

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

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TimelineEntry {
    pub job: Option<u64>,
    pub device: String,
    pub start_s: f64,
    pub end_s: f64,
    pub revoked: bool,
}

/// A region "ended at full clock" when its SM clock at release is at least this share of the
/// highest clock the run recorded (the H200 boosts to 1980 MHz; a power-capped one ran at
/// 1185–1900 MHz in the first evaluation pass).
pub const FULL_CLOCK_FRACTION: f64 = 0.97;

fn one_gpu() -> usize {
    1
}
