//! `kforge demo`: a private daemon, a generated workload of short CPU benchmark commands under the
//! none, command and region policies plus ground truth, and the figures that show what regions
//! buy (throughput vs `command`, inflation vs `none`).

use crate::runner::{run_job_capturing, PrivateDaemon};
use crate::stats;
use anyhow::{bail, Context, Result};
use kforge_proto::{Policy, SubmitSpec};
use kforge_store::Report;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The benchmark command every demo job runs: untimed start-up, a CPU "compile" step and a
/// wait outside the region, then a pure-Python kernel timed with `kforge.do_bench`.
pub const DEMO_SCRIPT: &str = r#"
import os, sys, time, zlib
import kforge

name, n, compile_ms, wait_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])

# Untimed work outside the region: a CPU-bound "compile" step, then waiting (remote compile, I/O).
t0 = time.perf_counter()
x = 0
while (time.perf_counter() - t0) * 1e3 < compile_ms:
    x += 1
time.sleep(wait_ms / 1e3)

data = os.urandom(n)  # fresh random input

def kernel():
    return zlib.crc32(data)

assert kernel() == zlib.crc32(bytes(data))  # correctness check, untimed
ms = kforge.do_bench(kernel, warmup=5, rep=25, return_mode="median", name=name)
print(f"{name} n={n} median {ms:.4f} ms")
"#;

/// What `kforge demo` runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Benchmark commands per policy.
    pub commands: usize,
    /// Workload seed (the same seed gives the same commands).
    pub seed: u64,
    /// Concurrent commands the private daemon admits.
    pub max_concurrent: usize,
    /// Python interpreter for the commands.
    pub python: String,
    /// Keep the work directory (store, scripts) and say where it is.
    pub keep: bool,
}

/// One generated benchmark command.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DemoCommand {
    pub name: String,
    pub n: u64,
    pub compile_ms: f64,
    pub wait_ms: f64,
}

/// A small deterministic generator (SplitMix64): the workload depends on the seed alone.
struct SplitMix(u64);
impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Generate the demo workload: CRC-32 over 20 kB..8 MB of random bytes (log-uniform; ~0.01–4 ms
/// on one core), 10–40 ms of CPU "compile", 100–300 ms of waiting.
pub fn generate(count: usize, seed: u64) -> Vec<DemoCommand> {
    let mut r = SplitMix(seed);
    (0..count)
        .map(|i| {
            let n = (20_000f64 * (400f64).powf(r.unit())).round() as u64;
            DemoCommand {
                name: format!("cmd{i:03}"),
                n,
                compile_ms: 10.0 + 30.0 * r.unit(),
                wait_ms: 100.0 + 200.0 * r.unit(),
            }
        })
        .collect()
}

#[derive(Debug, Clone, Serialize)]
pub struct PolicyResult {
    pub commands: usize,
    pub wall_s: f64,
    pub throughput_per_min: f64,
    pub inflation_p50: f64,
    pub inflation_p95: f64,
    pub overlapping_regions: usize,
    pub regions: usize,
    pub region_wait_ms_p50: f64,
    pub region_freeze_ms_p50: f64,
    pub revoked: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct NoiseFloor {
    pub inflation_p50: f64,
    pub inflation_p95: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct DemoResult {
    pub seed: u64,
    pub host_cores: usize,
    pub policies: BTreeMap<String, PolicyResult>,
    pub throughput_ratio_region_vs_command: f64,
    /// Inflation of a second isolated pass against the first: what the host alone contributes.
    pub noise_floor: NoiseFloor,
    pub isolated_median_ms: BTreeMap<String, f64>,
    pub commands: Vec<DemoCommand>,
}

/// Median of each named measurement of a run, by command name.
fn medians(report: &Report) -> BTreeMap<String, f64> {
    report
        .measurements
        .iter()
        .filter(|m| m.valid)
        .filter_map(|m| stats::median(&m.samples_ms).map(|v| (m.name.clone(), v)))
        .collect()
}

/// Inflation of each command measured in `measured` against its isolated median.
fn inflations(measured: &BTreeMap<String, f64>, isolated: &BTreeMap<String, f64>) -> Vec<f64> {
    measured.iter().filter_map(|(k, v)| isolated.get(k).map(|iso| stats::inflation(*v, *iso))).collect()
}

fn check_exit(label: &str, name: &str, (code, out): &(i32, String)) -> Result<()> {
    if *code != 0 {
        bail!("demo command {name} ({label}) failed with exit code {code}:\n{out}");
    }
    Ok(())
}

/// The private daemon, its work directory and the workload of one demo.
struct DemoRun<'a> {
    daemon: PrivateDaemon,
    dir: &'a Path,
    python: &'a str,
    cmds: &'a [DemoCommand],
}

impl DemoRun<'_> {
    fn spec(&self, c: &DemoCommand, policy: Policy, label: &str, untimed: bool) -> SubmitSpec {
        let (compile, wait) = if untimed { (c.compile_ms, c.wait_ms) } else { (0.0, 0.0) };
        SubmitSpec {
            argv: vec![
                self.python.into(),
                self.dir.join("bench_cmd.py").display().to_string(),
                c.name.clone(),
                c.n.to_string(),
                format!("{compile:.1}"),
                format!("{wait:.1}"),
            ],
            cwd: self.dir.display().to_string(),
            env: std::env::vars().filter(|(k, _)| k == "PATH" || k == "HOME" || k == "LANG").collect(),
            device: "cpu".into(),
            policy: Some(policy),
            label: Some(label.into()),
            ..SubmitSpec::default()
        }
    }

    /// Each kernel alone on an idle device, one command at a time, without the untimed work:
    /// the ground truth. Returns the medians by command name.
    fn isolated_pass(&self, label: &str, progress: &str) -> Result<BTreeMap<String, f64>> {
        eprint!("  {progress:<8}  ");
        for c in self.cmds {
            let r = run_job_capturing(&self.daemon.socket, self.spec(c, Policy::Command, label, false))?;
            check_exit(label, &c.name, &r)?;
            eprint!(".");
        }
        eprintln!();
        Ok(medians(&self.daemon.report(label)?))
    }

    /// Every command at once (the daemon admits its limit) under `policy`, untimed work included.
    fn policy_pass(&self, policy: Policy, isolated: &BTreeMap<String, f64>) -> Result<PolicyResult> {
        let label = policy.as_str();
        eprint!("  {label:<8}  ");
        let t0 = Instant::now();
        let results: Vec<Result<(i32, String)>> = std::thread::scope(|s| {
            let hs: Vec<_> = self
                .cmds
                .iter()
                .map(|c| {
                    let sp = self.spec(c, policy, label, true);
                    let sock = self.daemon.socket.clone();
                    s.spawn(move || {
                        let r = run_job_capturing(&sock, sp);
                        eprint!(".");
                        r
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("runner thread panicked"))))
                .collect()
        });
        let wall = t0.elapsed().as_secs_f64();
        eprintln!(" {wall:.1} s");
        for (c, r) in self.cmds.iter().zip(results) {
            check_exit(label, &c.name, &r?)?;
        }
        let rep = self.daemon.report(label)?;
        let infl = inflations(&medians(&rep), isolated);
        if infl.len() != self.cmds.len() {
            bail!("{label}: {} of {} commands reported a valid measurement", infl.len(), self.cmds.len());
        }
        let waits: Vec<f64> = rep.regions.iter().map(|r| r.wait_ms).collect();
        let freezes: Vec<f64> = rep.regions.iter().map(|r| r.steps.freeze_ms).collect();
        Ok(PolicyResult {
            commands: self.cmds.len(),
            wall_s: wall,
            throughput_per_min: self.cmds.len() as f64 / wall * 60.0,
            inflation_p50: stats::quantile(&infl, 0.5).unwrap_or(f64::NAN),
            inflation_p95: stats::quantile(&infl, 0.95).unwrap_or(f64::NAN),
            overlapping_regions: stats::overlapping_pairs(&rep.regions),
            regions: rep.regions.len(),
            region_wait_ms_p50: stats::median(&waits).unwrap_or(0.0),
            region_freeze_ms_p50: stats::median(&freezes).unwrap_or(0.0),
            revoked: rep.regions.iter().filter(|r| r.revoked).count(),
        })
    }
}

/// Run the demo against a private daemon started from the `kforge` binary; progress goes to
/// stderr, the figures come back.
pub fn demo(kforge: &Path, o: &DemoOptions) -> Result<DemoResult> {
    if o.commands == 0 {
        bail!("--commands must be at least 1");
    }
    let py_ok = Command::new(&o.python).arg("-c").arg("import sys; assert sys.version_info >= (3, 8)").status();
    if !matches!(py_ok, Ok(s) if s.success()) {
        bail!("the demo needs Python 3.8 or newer as {:?} (pass --python PATH)", o.python);
    }
    let tmp = tempfile::Builder::new().prefix("kforge-demo-").tempdir().context("creating a work directory")?;
    let dir: PathBuf = tmp.path().to_path_buf();
    std::fs::write(dir.join("bench_cmd.py"), DEMO_SCRIPT).context("writing bench_cmd.py")?;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let reserve = if cores >= 2 { "1" } else { "0" };
    let max_conc = o.max_concurrent.to_string();
    let flags: Vec<String> = ["--gpus", "none", "--reserve-cores", reserve, "--max-concurrent", &max_conc]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let cmds = generate(o.commands, o.seed);
    let run = DemoRun {
        daemon: PrivateDaemon::start(kforge, &dir, &dir.join("kforge.db"), &flags)?,
        dir: &dir,
        python: &o.python,
        cmds: &cmds,
    };
    eprintln!(
        "kforge demo: {} commands per policy, {} host cores, private daemon at {}",
        cmds.len(),
        cores,
        run.daemon.socket.display()
    );
    let isolated = run.isolated_pass("isolated", "isolated")?;
    let mut policies = BTreeMap::new();
    for policy in [Policy::None, Policy::Command, Policy::Region] {
        policies.insert(policy.as_str().to_string(), run.policy_pass(policy, &isolated)?);
    }
    // Ground truth again: how far the host alone moves the same timings (the noise floor).
    let noise = inflations(&run.isolated_pass("isolated-repeat", "repeat")?, &isolated);
    drop(run);
    let noise_floor = NoiseFloor {
        inflation_p50: stats::quantile(&noise, 0.5).unwrap_or(f64::NAN),
        inflation_p95: stats::quantile(&noise, 0.95).unwrap_or(f64::NAN),
    };
    let ratio = policies["region"].throughput_per_min / policies["command"].throughput_per_min;
    if o.keep {
        let kept = tmp.keep();
        eprintln!("  work directory kept: {}", kept.display());
    }
    Ok(DemoResult {
        seed: o.seed,
        host_cores: cores,
        policies,
        throughput_ratio_region_vs_command: ratio,
        noise_floor,
        isolated_median_ms: isolated,
        commands: cmds,
    })
}

/// The table `kforge demo` prints: one row per policy, the noise floor, the throughput ratio.
pub fn table(r: &DemoResult) -> String {
    let mut t = String::from("\n");
    let _ = writeln!(
        t,
        "{:<8} {:>8} {:>7} {:>10} {:>10} {:>10} {:>8} {:>9}",
        "POLICY", "COMMANDS", "WALL_S", "CMDS/MIN", "INFL_P50", "INFL_P95", "REGIONS", "OVERLAPS"
    );
    for (k, p) in &r.policies {
        let _ = writeln!(
            t,
            "{:<8} {:>8} {:>7.1} {:>10.1} {:>9.1}% {:>9.1}% {:>8} {:>9}",
            k,
            p.commands,
            p.wall_s,
            p.throughput_per_min,
            p.inflation_p50 * 100.0,
            p.inflation_p95 * 100.0,
            p.regions,
            p.overlapping_regions
        );
    }
    let _ = writeln!(
        t,
        "{:<8} {:>8} {:>7} {:>10} {:>9.1}% {:>9.1}% {:>8} {:>9}",
        "(noise)",
        r.commands.len(),
        "-",
        "-",
        r.noise_floor.inflation_p50 * 100.0,
        r.noise_floor.inflation_p95 * 100.0,
        "-",
        "-"
    );
    let _ = writeln!(
        t,
        "region vs command throughput: {:.2}x   (noise: isolated pass repeated at the end vs the first)",
        r.throughput_ratio_region_vs_command
    );
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn workload_is_deterministic_per_seed() {
        assert_eq!(generate(50, 3), generate(50, 3));
        assert_ne!(generate(50, 3), generate(50, 4));
        let w = generate(200, 1);
        assert!(w.iter().all(|c| (20_000..=8_000_000).contains(&c.n)
            && (10.0..=40.0).contains(&c.compile_ms)
            && (100.0..=300.0).contains(&c.wait_ms)));
        let names: std::collections::BTreeSet<_> = w.iter().map(|c| &c.name).collect();
        assert_eq!(names.len(), 200);
    }
}
