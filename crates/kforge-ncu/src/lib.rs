//! Nsight Compute (`ncu`) for kforge's profile step: the command line that profiles the kernels
//! of a program's NVTX range [`RANGE`] for the speed-of-light metrics [`METRICS`], and its CSV
//! read back into launches ([`parse`]) and per-kernel rows ([`kernels`]).
//!
//! Both of ncu's CSV layouts are read: the raw page (`--page raw`: a column per metric, a row
//! per launch, an optional row of units) that [`args`] asks for, and the details page (ncu's
//! default: a row per launch and metric, with `Metric Name`, `Metric Unit`, `Metric Value`), so
//! a CSV a user saved with either works. Lines that are not part of the table (`==PROF==`,
//! `==WARNING==`, `==ERROR==`, the program's own output) are skipped; ncu's own messages are
//! kept for the error when no table came.

mod csv;

use serde::{Deserialize, Serialize};
use std::path::Path;

/// The NVTX push/pop range the profiled program opens around the forwards to profile (the
/// default domain): only kernels launched inside it are profiled.
pub const RANGE: &str = "kforge-profile";

/// Kernel duration (`gpu__time_duration.sum`).
pub const DURATION: &str = "gpu__time_duration.sum";
/// Memory speed of light, % of peak: the busiest of DRAM, L2 and L1 (ncu's "Memory Throughput").
pub const SOL_MEMORY: &str = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed";
/// Compute speed of light, % of peak: the busiest SM pipeline (ncu's "Compute (SM) Throughput").
pub const SOL_COMPUTE: &str = "sm__throughput.avg.pct_of_peak_sustained_elapsed";
/// Achieved occupancy, % of the warps an SM can hold.
pub const OCCUPANCY: &str = "sm__warps_active.avg.pct_of_peak_sustained_active";
/// The base set: what the strategy analyst's tiers need.
pub const METRICS: [&str; 4] = [DURATION, SOL_MEMORY, SOL_COMPUTE, OCCUPANCY];
/// DRAM bytes read and written (`dram__bytes.sum`).
pub const DRAM_BYTES: &str = "dram__bytes.sum";
/// Non-tensor floating-point instructions executed per thread (fp32, fp16, fp64) and the
/// operations each counts, as ncu's own derived metrics weigh them (`…_ffma_pred_on_x2`,
/// `…_hadd_pred_on_x2`, `…_hfma_pred_on_x4`): an FMA two; a half-precision instruction a packed
/// pair (HADD2, HMUL2: two; HFMA2: four), so a scalar half instruction (one lane used) counts
/// double. Tensor-core work is not among them: its share shows in the
/// compute speed of light only. (Blackwell's packed fp32 instructions have counters of their own,
/// not read here.)
pub const FLOP_COUNTERS: [(&str, f64); 9] = [
    ("sm__sass_thread_inst_executed_op_fadd_pred_on.sum", 1.0),
    ("sm__sass_thread_inst_executed_op_fmul_pred_on.sum", 1.0),
    ("sm__sass_thread_inst_executed_op_ffma_pred_on.sum", 2.0),
    ("sm__sass_thread_inst_executed_op_hadd_pred_on.sum", 2.0),
    ("sm__sass_thread_inst_executed_op_hmul_pred_on.sum", 2.0),
    ("sm__sass_thread_inst_executed_op_hfma_pred_on.sum", 4.0),
    ("sm__sass_thread_inst_executed_op_dadd_pred_on.sum", 1.0),
    ("sm__sass_thread_inst_executed_op_dmul_pred_on.sum", 1.0),
    ("sm__sass_thread_inst_executed_op_dfma_pred_on.sum", 2.0),
];

/// Whether `message` names one of the counters beyond [`METRICS`] ([`DRAM_BYTES`],
/// [`FLOP_COUNTERS`]), by the name before its first `.` (ncu may print a regular expression).
pub fn extra_metric_named(message: &str) -> bool {
    let base = |m: &'static str| m.split('.').next().unwrap_or(m);
    std::iter::once(DRAM_BYTES).chain(FLOP_COUNTERS.iter().map(|(m, _)| *m)).any(|m| message.contains(base(m)))
}

/// The extended set `kforge profile` asks for first: [`METRICS`], [`DRAM_BYTES`] and the
/// [`FLOP_COUNTERS`] (if ncu refuses one of them, it falls back to [`METRICS`]).
pub fn extended_metrics() -> Vec<&'static str> {
    let mut v = METRICS.to_vec();
    v.push(DRAM_BYTES);
    v.extend(FLOP_COUNTERS.iter().map(|(m, _)| *m));
    v
}

/// Errors of this crate.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum NcuError {
    /// The text holds no result table; `messages` are ncu's own lines (`==ERROR==`, …).
    #[error("ncu wrote no result table (a CSV table, from --csv){}", messages_suffix(.messages))]
    NoTable { messages: Vec<String> },
    /// A line of the table is not CSV, or has another number of fields than the header.
    #[error("line {line} of ncu's table: {reason}")]
    Csv { line: usize, reason: String },
    /// The table lacks a column this crate needs.
    #[error("ncu's table has no column {0:?}: profile with --metrics {all} (raw page) or the SpeedOfLight section (details page)", all = METRICS.join(","))]
    MissingColumn(String),
    /// A metric's value is not a number.
    #[error("line {line} of ncu's table: {metric} is {value:?}, not a number{}", unit_suffix(.unit))]
    BadValue { line: usize, metric: String, value: String, unit: String },
}

fn messages_suffix(messages: &[String]) -> String {
    match messages.len() {
        0 => String::new(),
        _ => format!(": {}", messages.join(" | ")),
    }
}

fn unit_suffix(unit: &str) -> String {
    if unit.is_empty() {
        String::new()
    } else {
        format!(" (unit {unit:?})")
    }
}

/// One profiled kernel launch. A metric ncu reported as `n/a` (or not at all for this launch)
/// is `None`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Launch {
    /// ncu's launch id (`ID`).
    pub id: u64,
    /// The kernel's name as ncu prints it (`Kernel Name`).
    pub kernel: String,
    pub duration_ns: Option<f64>,
    pub sol_memory_pct: Option<f64>,
    pub sol_compute_pct: Option<f64>,
    pub occupancy_pct: Option<f64>,
    /// DRAM bytes moved ([`DRAM_BYTES`]).
    pub dram_bytes: Option<f64>,
    /// Non-tensor floating-point operations ([`FLOP_COUNTERS`]); `None` without any counter.
    pub flops: Option<f64>,
    /// Block and grid size as ncu prints them (`(256, 1, 1)`), when the table has them.
    pub block: Option<String>,
    pub grid: Option<String>,
}

/// One kernel over all its profiled launches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelRow {
    pub name: String,
    pub launches: u32,
    /// Summed duration of the launches that reported one.
    pub time_ns: f64,
    /// Duration-weighted means over the launches that reported the metric (plain means when no
    /// launch reported a duration); `None` when none did.
    pub sol_memory_pct: Option<f64>,
    pub sol_compute_pct: Option<f64>,
    pub occupancy_pct: Option<f64>,
    /// Summed over the launches that reported them.
    #[serde(default)]
    pub dram_bytes: Option<f64>,
    #[serde(default)]
    pub flops: Option<f64>,
    /// The first launch's block and grid size.
    #[serde(default)]
    pub block: Option<String>,
    #[serde(default)]
    pub grid: Option<String>,
}

impl KernelRow {
    /// Achieved DRAM bytes per second over the kernel's summed time.
    pub fn dram_bytes_per_s(&self) -> Option<f64> {
        self.dram_bytes.filter(|_| self.time_ns > 0.0).map(|b| b / (self.time_ns * 1e-9))
    }

    /// Achieved non-tensor FLOP/s over the kernel's summed time.
    pub fn flops_per_s(&self) -> Option<f64> {
        self.flops.filter(|_| self.time_ns > 0.0).map(|f| f / (self.time_ns * 1e-9))
    }
}

/// Ceilings the profiled program measured on the device, outside the profiled range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Peaks {
    /// A 1 GiB device-to-device copy: bytes read and written per second.
    pub copy_bytes_per_s: f64,
}

/// `kforge profile`'s JSON report: what was profiled and its kernels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// The problem file (or the CSV read with `--from-csv`).
    pub source: String,
    /// The torch.compile mode and size preset profiled (`None` for a CSV read back).
    pub mode: Option<String>,
    pub size: Option<String>,
    /// Forwards inside the range: each kernel's `launches` counts all of them.
    pub forwards: Option<u32>,
    /// The metrics ncu was asked for (empty for a CSV read back).
    #[serde(default)]
    pub metrics: Vec<String>,
    /// Measured by the profiled program (`None` for a CSV read back, or if it could not).
    #[serde(default)]
    pub peaks: Option<Peaks>,
    pub kernels: Vec<KernelRow>,
}

/// How ncu treats the caches between a kernel's replays (`--cache-control`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheControl {
    /// Flushed before each replay: cold-cache numbers (ncu's default).
    All,
    /// Left as the previous replay left them.
    None,
}

impl CacheControl {
    /// `all` or `none`.
    pub fn from_name(name: &str) -> Option<CacheControl> {
        match name {
            "all" => Some(CacheControl::All),
            "none" => Some(CacheControl::None),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            CacheControl::All => "all",
            CacheControl::None => "none",
        }
    }
}

/// ncu's arguments before the program's command line: `metrics` (e.g. [`METRICS`] or
/// [`extended_metrics`]) for kernels inside [`RANGE`] in any process the program starts, as a raw-page CSV in base units written
/// to `log_file`. The clocks are left as they are (`--clock-control none`): ncu's default locks
/// them to base, which a shared machine's other users would feel and which is not the clock
/// the timings ran at.
pub fn args(log_file: &Path, cache: CacheControl, metrics: &[&str]) -> Vec<String> {
    let fixed = ["--csv", "--page", "raw", "--print-units", "base", "--clock-control", "none"];
    let mut v: Vec<String> = fixed.iter().map(|s| s.to_string()).collect();
    v.extend(["--cache-control".to_string(), cache.name().to_string()]);
    v.extend(["--target-processes", "all", "--nvtx", "--nvtx-include"].map(String::from));
    v.push(format!("{RANGE}/"));
    v.push("--metrics".into());
    v.push(metrics.join(","));
    v.push("--log-file".into());
    v.push(log_file.display().to_string());
    v
}

/// Read ncu's CSV output (either page, see the crate's docs) into its launches, in table order.
///
/// Errors: [`NcuError::NoTable`] when no table is in `text` (ncu's messages attached),
/// [`NcuError::Csv`], [`NcuError::MissingColumn`] for `ID`, `Kernel Name` or, on the raw page, a
/// metric column, and [`NcuError::BadValue`].
pub fn parse(text: &str) -> Result<Vec<Launch>, NcuError> {
    let table = csv::find_table(text)?;
    if table.header.iter().any(|h| h == "Metric Name") {
        csv::details(&table)
    } else {
        csv::raw(&table)
    }
}

/// The launches grouped by kernel name, in the order each kernel first ran.
pub fn kernels(launches: &[Launch]) -> Vec<KernelRow> {
    let mut names: Vec<&str> = Vec::new();
    for l in launches {
        if !names.contains(&l.kernel.as_str()) {
            names.push(&l.kernel);
        }
    }
    names
        .into_iter()
        .map(|name| {
            let of: Vec<&Launch> = launches.iter().filter(|l| l.kernel == name).collect();
            row(name, &of)
        })
        .collect()
}

/// The mean of the values there are, each with its weight; `None` when they weigh nothing.
fn weighted_mean(values: impl Iterator<Item = (Option<f64>, f64)>) -> Option<f64> {
    let (mut sum, mut weight) = (0.0, 0.0);
    for (v, w) in values {
        if let Some(v) = v {
            sum += v * w;
            weight += w;
        }
    }
    (weight > 0.0).then(|| sum / weight)
}

/// The sum of the values there are; `None` when there is none.
fn sum(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    values.flatten().fold(None, |acc, v| Some(acc.unwrap_or(0.0) + v))
}

fn row(name: &str, of: &[&Launch]) -> KernelRow {
    let timed = of.iter().any(|l| l.duration_ns.is_some());
    let weight = |l: &Launch| if timed { l.duration_ns.unwrap_or(0.0) } else { 1.0 };
    let mean = |metric: fn(&Launch) -> Option<f64>| weighted_mean(of.iter().map(|l| (metric(l), weight(l))));
    KernelRow {
        name: name.to_string(),
        launches: of.len() as u32,
        time_ns: of.iter().filter_map(|l| l.duration_ns).sum(),
        sol_memory_pct: mean(|l| l.sol_memory_pct),
        sol_compute_pct: mean(|l| l.sol_compute_pct),
        occupancy_pct: mean(|l| l.occupancy_pct),
        dram_bytes: sum(of.iter().map(|l| l.dram_bytes)),
        flops: sum(of.iter().map(|l| l.flops)),
        block: of.first().and_then(|l| l.block.clone()),
        grid: of.first().and_then(|l| l.grid.clone()),
    }
}

/// A kernel name without what differs between tools that print the same kernel: a leading
/// `void ` and surrounding space. `kforge inspect` (the torch profiler) and ncu both print
/// demangled names; ncu may leave out the return type.
pub fn name_key(name: &str) -> &str {
    let name = name.trim();
    name.strip_prefix("void ").unwrap_or(name).trim()
}

const ANONYMOUS: &str = "(anonymous namespace)";

/// Where a demangled name's parameter list starts: the first `(` outside template arguments
/// that does not open `(anonymous namespace)`.
fn parameters_at(key: &str) -> Option<usize> {
    let mut depth = 0i32;
    for (i, c) in key.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            '(' if depth == 0 && !key[i..].starts_with(ANONYMOUS) => return Some(i),
            _ => {}
        }
    }
    None
}

/// The function name of a demangled kernel name: [`name_key`] up to its template arguments or
/// parameter list (`at::native::f<4>(int)` → `at::native::f`; `(anonymous namespace)` is part
/// of the name).
pub fn base_name(name: &str) -> &str {
    let key = name_key(name);
    let end = key
        .char_indices()
        .find(|&(i, c)| c == '<' || (c == '(' && !key[i..].starts_with(ANONYMOUS)))
        .map_or(key.len(), |(i, _)| i);
    key[..end].trim()
}

/// A kernel name up to its parameter list, white space dropped: the torch profiler prints the
/// parameters' types, ncu may print template placeholders (`(int, T2, T3)`) instead.
fn without_parameters(name: &str) -> String {
    let key = name_key(name);
    let end = parameters_at(key).unwrap_or(key.len());
    key[..end].chars().filter(|c| !c.is_whitespace()).collect()
}

/// Whether two printed names are one kernel: equal but for a leading `void ` and white space
/// (demanglers space `char *` and `> >` differently).
pub fn same_kernel(a: &str, b: &str) -> bool {
    let squash = |s: &str| name_key(s).chars().filter(|c| !c.is_whitespace()).collect::<String>();
    squash(a) == squash(b)
}

/// The rows of `rows` that are kernel `name`: by [`same_kernel`]; failing that, by the name up
/// to its parameter list (template arguments included); failing that, the one row with
/// `name`'s [`base_name`] (none when several share it: `at::native::elementwise_kernel` is many
/// kernels).
pub fn rows_for<'a>(rows: &'a [KernelRow], name: &str) -> Vec<&'a KernelRow> {
    let same: Vec<&KernelRow> = rows.iter().filter(|r| same_kernel(&r.name, name)).collect();
    if !same.is_empty() {
        return same;
    }
    let key = without_parameters(name);
    let templated: Vec<&KernelRow> = rows.iter().filter(|r| without_parameters(&r.name) == key).collect();
    if !templated.is_empty() {
        return templated;
    }
    let base: Vec<&KernelRow> = rows.iter().filter(|r| base_name(&r.name) == base_name(name)).collect();
    if base.len() == 1 {
        base
    } else {
        Vec::new()
    }
}

/// Rows of several kernels as one row named `name` (an operation that launches several
/// kernels): launches and time summed, percentages weighted by time (plain means when no row
/// has a time).
pub fn combine(name: &str, rows: &[&KernelRow]) -> KernelRow {
    let timed = rows.iter().any(|r| r.time_ns > 0.0);
    let weight = |r: &KernelRow| if timed { r.time_ns } else { 1.0 };
    let mean = |metric: fn(&KernelRow) -> Option<f64>| weighted_mean(rows.iter().map(|r| (metric(r), weight(r))));
    KernelRow {
        name: name.to_string(),
        launches: rows.iter().map(|r| r.launches).sum(),
        time_ns: rows.iter().map(|r| r.time_ns).sum(),
        sol_memory_pct: mean(|r| r.sol_memory_pct),
        sol_compute_pct: mean(|r| r.sol_compute_pct),
        occupancy_pct: mean(|r| r.occupancy_pct),
        dram_bytes: sum(rows.iter().map(|r| r.dram_bytes)),
        flops: sum(rows.iter().map(|r| r.flops)),
        block: rows.first().and_then(|r| r.block.clone()),
        grid: rows.first().and_then(|r| r.grid.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_ask_for_the_range_the_metrics_and_leave_the_clocks() {
        let a = args(Path::new("/tmp/p.csv"), CacheControl::None, &METRICS);
        let after = |flag: &str| a[a.iter().position(|x| x == flag).unwrap() + 1].clone();
        assert_eq!(after("--clock-control"), "none");
        assert_eq!(after("--nvtx-include"), "kforge-profile/");
        assert_eq!(after("--metrics").split(',').count(), 4);
        assert_eq!(after("--log-file"), "/tmp/p.csv");
        assert_eq!(after("--page"), "raw");
        assert_eq!(after("--cache-control"), "none");
        assert_eq!(CacheControl::from_name("warm"), None);
        assert!(extra_metric_named("==ERROR== Failed to find metric regex:^dram__bytes\\.(sum)$"));
        assert!(extra_metric_named("Failed to find metric sm__sass_thread_inst_executed_op_hfma_pred_on.sum"));
        assert!(!extra_metric_named(
            "==ERROR== Failed to find metric sm__warps_active.avg.pct_of_peak_sustained_active"
        ));
    }

    #[test]
    fn names_match_across_tools() {
        assert_eq!(name_key(" void at::native::k<4>(int) "), "at::native::k<4>(int)");
        assert_eq!(base_name("void at::native::k<4, (anonymous namespace)::f>(int)"), "at::native::k");
        assert_eq!(base_name("triton_poi_fused_add_0"), "triton_poi_fused_add_0");
        let anon = "void at::native::(anonymous namespace)::softmax_warp_forward<float, 10>(float *, int)";
        assert_eq!(base_name(anon), "at::native::(anonymous namespace)::softmax_warp_forward");
        assert_eq!(without_parameters(anon), "at::native::(anonymousnamespace)::softmax_warp_forward<float,10>");
    }

    fn krow(name: &str, t: f64, m: Option<f64>) -> KernelRow {
        KernelRow {
            name: name.into(),
            launches: 1,
            time_ns: t,
            sol_memory_pct: m,
            sol_compute_pct: Some(50.0),
            occupancy_pct: None,
            dram_bytes: Some(t * 2.0),
            flops: None,
            block: None,
            grid: None,
        }
    }

    #[test]
    fn rows_are_found_by_name_then_by_a_unique_base_name() {
        let rows = [
            krow("void at::native::elementwise_kernel<128, 2, A>(int, B)", 1.0, None),
            krow("void at::native::elementwise_kernel<128, 4, C>(int, D)", 1.0, None),
            krow("sm90_xmma_gemm_bf16_kernel<x>", 3.0, Some(40.0)),
            krow("triton_poi_fused_0", 1.0, Some(80.0)),
        ];
        assert_eq!(rows_for(&rows, "at::native::elementwise_kernel<128,4,C>(int,D)").len(), 1, "spacing aside");
        assert!(rows_for(&rows, "void at::native::elementwise_kernel<64, 1, E>(int, F)").is_empty(), "ambiguous");
        assert_eq!(rows_for(&rows, "sm90_xmma_gemm_bf16_kernel<y>")[0].time_ns, 3.0, "unique base");
        // The torch profiler's parameter types against ncu's placeholders.
        let kineto = "void at::native::elementwise_kernel<128, 4, C>(int, at::native::Functor<float>)";
        assert_eq!(rows_for(&rows, kineto).len(), 1);
        assert!(std::ptr::eq(rows_for(&rows, kineto)[0], &rows[1]));
        let anon = [
            krow("void at::native::(anonymous namespace)::softmax_warp_forward<float, 10>(T1)", 2.0, Some(60.0)),
            krow("void at::native::(anonymous namespace)::layer_norm_kernel<float>(T1)", 5.0, Some(30.0)),
        ];
        let ln = rows_for(&anon, "at::native::(anonymous namespace)::layer_norm_kernel<float>(int, float*)");
        assert_eq!(ln.iter().map(|r| r.time_ns).collect::<Vec<_>>(), [5.0], "two anonymous-namespace kernels apart");
        let one = combine("extern_kernels.mm", &[&rows[2], &rows[3]]);
        assert_eq!((one.launches, one.time_ns, one.sol_memory_pct), (2, 4.0, Some(50.0)));
        assert_eq!((one.dram_bytes, one.flops), (Some(8.0), None));
        assert!((one.dram_bytes_per_s().unwrap() - 2e9).abs() < 1.0, "8 bytes in 4 ns");
        assert_eq!(one.sol_compute_pct, Some(50.0));
        assert_eq!(combine("none", &[]).sol_memory_pct, None);
    }

    fn launch(kernel: &str, d: Option<f64>, m: Option<f64>) -> Launch {
        Launch {
            id: 0,
            kernel: kernel.into(),
            duration_ns: d,
            sol_memory_pct: m,
            sol_compute_pct: Some(10.0),
            occupancy_pct: None,
            dram_bytes: d,
            flops: None,
            block: None,
            grid: None,
        }
    }

    #[test]
    fn kernels_weigh_launches_by_duration_in_first_run_order() {
        let l = [
            launch("b", Some(300.0), Some(80.0)),
            launch("a", Some(10.0), Some(5.0)),
            launch("b", Some(100.0), Some(40.0)),
            launch("b", None, None),
        ];
        let rows = kernels(&l);
        assert_eq!(rows.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["b", "a"]);
        assert_eq!(rows[0].launches, 3);
        assert_eq!(rows[0].time_ns, 400.0);
        assert_eq!(rows[0].sol_memory_pct, Some(70.0));
        assert_eq!(rows[0].sol_compute_pct, Some(10.0));
        assert_eq!(rows[0].occupancy_pct, None);
        assert_eq!(rows[0].dram_bytes, Some(400.0), "summed where reported");
        assert_eq!(rows[1].flops, None);
        let untimed = kernels(&[launch("c", None, Some(20.0)), launch("c", None, Some(40.0))]);
        assert_eq!(untimed[0].sol_memory_pct, Some(30.0));
        assert_eq!(untimed[0].time_ns, 0.0);
    }
}
