//! `kforge demo` and `kforge bench-runtime`: a private daemon, a generated workload, and the
//! figures that show what regions buy (throughput vs `command`, inflation vs `none`).

pub use kforge_eval::stats;

use anyhow::{bail, Context, Result};
use kforge_client::Client;
use kforge_proto::{Policy, Reply, Request, SubmitSpec};
use kforge_store::Report;
use serde::Serialize;
use std::collections::BTreeMap;
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

#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Benchmark commands per policy (at least 40 for the README's claims).
    #[arg(long, default_value_t = 40)]
    pub commands: usize,
    /// Workload seed (the same seed gives the same commands).
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Concurrent commands the private daemon admits.
    #[arg(long, default_value_t = 8)]
    pub max_concurrent: usize,
    /// Python interpreter for the commands.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Keep the work directory (store, scripts) and print where it is.
    #[arg(long)]
    pub keep: bool,
}

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Uncontended enter+exit round trips to time.
    #[arg(long, default_value_t = 2000)]
    pub iterations: usize,
    /// Clients competing for the region in the hand-over benchmark.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Regions each competing client takes.
    #[arg(long, default_value_t = 250)]
    pub rounds: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
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

pub use kforge_eval::runner::{run_job_capturing, PrivateDaemon};

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

fn spec(dir: &Path, python: &str, c: &DemoCommand, policy: Policy, label: &str, untimed: bool) -> SubmitSpec {
    let (compile, wait) = if untimed { (c.compile_ms, c.wait_ms) } else { (0.0, 0.0) };
    SubmitSpec {
        argv: vec![
            python.into(),
            dir.join("bench_cmd.py").display().to_string(),
            c.name.clone(),
            c.n.to_string(),
            format!("{compile:.1}"),
            format!("{wait:.1}"),
        ],
        cwd: dir.display().to_string(),
        env: std::env::vars().filter(|(k, _)| k == "PATH" || k == "HOME" || k == "LANG").collect(),
        device: "cpu".into(),
        policy: Some(policy),
        label: Some(label.into()),
        warm: false,
        timeout_ms: None,
        gpu_group: None,
    }
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

fn check_exit(label: &str, name: &str, (code, out): &(i32, String)) -> Result<()> {
    if *code != 0 {
        bail!("demo command {name} ({label}) failed with exit code {code}:\n{out}");
    }
    Ok(())
}

pub fn demo(kforge: &Path, a: DemoArgs) -> Result<i32> {
    if a.commands == 0 {
        bail!("--commands must be at least 1");
    }
    let py_ok = Command::new(&a.python).arg("-c").arg("import sys; assert sys.version_info >= (3, 8)").status();
    if !matches!(py_ok, Ok(s) if s.success()) {
        bail!("the demo needs Python 3.8 or newer as {:?} (pass --python PATH)", a.python);
    }
    let tmp = tempfile::Builder::new().prefix("kforge-demo-").tempdir().context("creating a work directory")?;
    let dir = tmp.path().to_path_buf();
    std::fs::write(dir.join("bench_cmd.py"), DEMO_SCRIPT).context("writing bench_cmd.py")?;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let reserve = if cores >= 2 { "1" } else { "0" };
    let max_conc = a.max_concurrent.to_string();
    let flags: Vec<String> = ["--gpus", "none", "--reserve-cores", reserve, "--max-concurrent", &max_conc]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let daemon = PrivateDaemon::start(kforge, &dir, &dir.join("kforge.db"), &flags)?;
    let cmds = generate(a.commands, a.seed);
    eprintln!(
        "kforge demo: {} commands per policy, {} host cores, private daemon at {}",
        cmds.len(),
        cores,
        daemon.socket.display()
    );

    // Ground truth: each kernel alone on an idle device, one command at a time.
    eprint!("  isolated  ");
    for c in &cmds {
        let r = run_job_capturing(&daemon.socket, spec(&dir, &a.python, c, Policy::Command, "isolated", false))?;
        check_exit("isolated", &c.name, &r)?;
        eprint!(".");
    }
    eprintln!();
    let isolated = medians(&daemon.report("isolated")?);

    let mut policies = BTreeMap::new();
    for policy in [Policy::None, Policy::Command, Policy::Region] {
        let label = policy.as_str();
        eprint!("  {label:<8}  ");
        let t0 = Instant::now();
        let results: Vec<Result<(i32, String)>> = std::thread::scope(|s| {
            let hs: Vec<_> = cmds
                .iter()
                .map(|c| {
                    let sp = spec(&dir, &a.python, c, policy, label, true);
                    let sock = daemon.socket.clone();
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
        for (c, r) in cmds.iter().zip(results) {
            check_exit(label, &c.name, &r?)?;
        }
        let rep = daemon.report(label)?;
        let meds = medians(&rep);
        let infl: Vec<f64> =
            meds.iter().filter_map(|(k, v)| isolated.get(k).map(|iso| stats::inflation(*v, *iso))).collect();
        if infl.len() != cmds.len() {
            bail!("{label}: {} of {} commands reported a valid measurement", infl.len(), cmds.len());
        }
        let waits: Vec<f64> = rep.regions.iter().map(|r| r.wait_ms).collect();
        let freezes: Vec<f64> = rep.regions.iter().map(|r| r.freeze_ms).collect();
        policies.insert(
            label.to_string(),
            PolicyResult {
                commands: cmds.len(),
                wall_s: wall,
                throughput_per_min: cmds.len() as f64 / wall * 60.0,
                inflation_p50: stats::quantile(&infl, 0.5).unwrap_or(f64::NAN),
                inflation_p95: stats::quantile(&infl, 0.95).unwrap_or(f64::NAN),
                overlapping_regions: stats::overlapping_pairs(&rep.regions),
                regions: rep.regions.len(),
                region_wait_ms_p50: stats::median(&waits).unwrap_or(0.0),
                region_freeze_ms_p50: stats::median(&freezes).unwrap_or(0.0),
                revoked: rep.regions.iter().filter(|r| r.revoked).count(),
            },
        );
    }
    // Ground truth again: how far the host alone moves the same timings (the noise floor).
    eprint!("  repeat    ");
    for c in &cmds {
        let r = run_job_capturing(&daemon.socket, spec(&dir, &a.python, c, Policy::Command, "isolated-repeat", false))?;
        check_exit("isolated-repeat", &c.name, &r)?;
        eprint!(".");
    }
    eprintln!();
    let repeat = medians(&daemon.report("isolated-repeat")?);
    let noise: Vec<f64> =
        repeat.iter().filter_map(|(k, v)| isolated.get(k).map(|iso| stats::inflation(*v, *iso))).collect();
    let noise_floor = NoiseFloor {
        inflation_p50: stats::quantile(&noise, 0.5).unwrap_or(f64::NAN),
        inflation_p95: stats::quantile(&noise, 0.95).unwrap_or(f64::NAN),
    };
    drop(daemon);
    let ratio = policies["region"].throughput_per_min / policies["command"].throughput_per_min;
    let result = DemoResult {
        seed: a.seed,
        host_cores: cores,
        policies,
        throughput_ratio_region_vs_command: ratio,
        noise_floor,
        isolated_median_ms: isolated,
        commands: cmds,
    };
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_vec_pretty(&result)?).with_context(|| format!("writing {}", p.display()))?;
    }
    if a.keep {
        let kept = tmp.keep();
        eprintln!("  work directory kept: {}", kept.display());
    }
    println!();
    println!(
        "{:<8} {:>8} {:>7} {:>10} {:>10} {:>10} {:>8} {:>9}",
        "POLICY", "COMMANDS", "WALL_S", "CMDS/MIN", "INFL_P50", "INFL_P95", "REGIONS", "OVERLAPS"
    );
    for (k, p) in &result.policies {
        println!(
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
    println!(
        "{:<8} {:>8} {:>7} {:>10} {:>9.1}% {:>9.1}% {:>8} {:>9}",
        "(noise)",
        result.commands.len(),
        "-",
        "-",
        result.noise_floor.inflation_p50 * 100.0,
        result.noise_floor.inflation_p95 * 100.0,
        "-",
        "-"
    );
    println!(
        "region vs command throughput: {:.2}x   (noise: isolated pass repeated at the end vs the first)",
        result.throughput_ratio_region_vs_command
    );
    Ok(0)
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    pub iterations: usize,
    pub round_trip_us_p50: f64,
    pub round_trip_us_p99: f64,
    pub round_trip_us_mean: f64,
    pub clients: usize,
    pub handovers: usize,
    pub handover_us_p50: f64,
    pub handover_us_p99: f64,
}

fn enter(c: &mut Client) -> Result<u64> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc_gettid() } as u32;
    match c.request(&Request::RegionEnter {
        job: None,
        device: Some("cpu".into()),
        name: "bench".into(),
        pid: std::process::id(),
        tid,
        lease_ms: None,
    })? {
        Reply::RegionGranted(g) => Ok(g.region),
        other => bail!("unexpected reply to region_enter: {other:?}"),
    }
}

fn exit(c: &mut Client, region: u64) -> Result<()> {
    match c.request(&Request::RegionExit { region })? {
        Reply::RegionReleased { .. } => Ok(()),
        other => bail!("unexpected reply to region_exit: {other:?}"),
    }
}

extern "C" {
    #[link_name = "gettid"]
    fn libc_gettid() -> i32;
}

/// Time the runtime itself against a private daemon (region policy, no jobs to freeze).
pub fn bench_runtime(kforge: &Path, a: BenchArgs) -> Result<i32> {
    if a.iterations == 0 || a.clients < 2 || a.rounds == 0 {
        bail!("--iterations and --rounds must be positive and --clients at least 2");
    }
    let tmp = tempfile::Builder::new().prefix("kforge-bench-").tempdir().context("creating a work directory")?;
    let daemon =
        PrivateDaemon::start(kforge, tmp.path(), &tmp.path().join("kforge.db"), &["--gpus".into(), "none".into()])?;
    let mut c = daemon.client()?;
    for _ in 0..100 {
        let r = enter(&mut c)?;
        exit(&mut c, r)?;
    }
    let mut rt = Vec::with_capacity(a.iterations);
    for _ in 0..a.iterations {
        let t = Instant::now();
        let r = enter(&mut c)?;
        exit(&mut c, r)?;
        rt.push(t.elapsed().as_secs_f64() * 1e6);
    }
    // Contended: clients loop enter/exit; hand-over = next grant received − previous exit sent.
    let origin = Instant::now();
    let logs: Vec<Result<Vec<(f64, f64)>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..a.clients)
            .map(|_| {
                let sock = daemon.socket.clone();
                let rounds = a.rounds;
                s.spawn(move || -> Result<Vec<(f64, f64)>> {
                    let mut c = Client::connect(&sock)?;
                    let mut log = Vec::with_capacity(rounds);
                    for _ in 0..rounds {
                        let r = enter(&mut c)?;
                        let granted = origin.elapsed().as_secs_f64() * 1e6;
                        let exit_sent = origin.elapsed().as_secs_f64() * 1e6;
                        exit(&mut c, r)?;
                        log.push((granted, exit_sent));
                    }
                    Ok(log)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("client thread panicked")))).collect()
    });
    let mut events: Vec<(f64, f64)> = Vec::new();
    for l in logs {
        events.extend(l?);
    }
    events.sort_by(|x, y| x.0.total_cmp(&y.0));
    let handover: Vec<f64> = events.windows(2).map(|w| w[1].0 - w[0].1).filter(|d| *d >= 0.0).collect();
    drop(daemon);
    let mean = rt.iter().sum::<f64>() / rt.len() as f64;
    let res = BenchResult {
        iterations: a.iterations,
        round_trip_us_p50: stats::quantile(&rt, 0.5).unwrap_or(0.0),
        round_trip_us_p99: stats::quantile(&rt, 0.99).unwrap_or(0.0),
        round_trip_us_mean: mean,
        clients: a.clients,
        handovers: handover.len(),
        handover_us_p50: stats::quantile(&handover, 0.5).unwrap_or(0.0),
        handover_us_p99: stats::quantile(&handover, 0.99).unwrap_or(0.0),
    };
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_vec_pretty(&res)?).with_context(|| format!("writing {}", p.display()))?;
    }
    println!("{:<40} {:>10} {:>10} {:>10}", "BENCHMARK", "P50_US", "P99_US", "MEAN_US");
    println!(
        "{:<40} {:>10.1} {:>10.1} {:>10.1}",
        format!("region enter+exit, uncontended (n={})", res.iterations),
        res.round_trip_us_p50,
        res.round_trip_us_p99,
        res.round_trip_us_mean
    );
    println!(
        "{:<40} {:>10.1} {:>10.1} {:>10}",
        format!("region hand-over, {} clients (n={})", res.clients, res.handovers),
        res.handover_us_p50,
        res.handover_us_p99,
        "-"
    );
    Ok(0)
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
