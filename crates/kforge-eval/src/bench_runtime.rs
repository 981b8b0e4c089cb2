//! `kforge bench-runtime`: the runtime itself timed against a private daemon (region policy, no
//! jobs to freeze) — the uncontended region round trip and the contended hand-over.

use crate::runner::PrivateDaemon;
use crate::stats;
use anyhow::{bail, Context, Result};
use kforge_client::Client;
use kforge_proto::{Reply, Request};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

/// What `kforge bench-runtime` measures.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Uncontended enter+exit round trips to time.
    pub iterations: usize,
    /// Clients competing for the region in the hand-over benchmark.
    pub clients: usize,
    /// Regions each competing client takes.
    pub rounds: usize,
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

/// Uncontended enter+exit round trips on one connection, in microseconds (after 100 untimed).
fn round_trips(daemon: &PrivateDaemon, iterations: usize) -> Result<Vec<f64>> {
    let mut c = daemon.client()?;
    for _ in 0..100 {
        let r = enter(&mut c)?;
        exit(&mut c, r)?;
    }
    let mut rt = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        let r = enter(&mut c)?;
        exit(&mut c, r)?;
        rt.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(rt)
}

/// Clients loop enter/exit; a hand-over is the next grant received − the previous exit sent,
/// in microseconds.
fn handovers(daemon: &PrivateDaemon, clients: usize, rounds: usize) -> Result<Vec<f64>> {
    let origin = Instant::now();
    let logs: Vec<Result<Vec<(f64, f64)>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..clients)
            .map(|_| {
                let sock = daemon.socket.clone();
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
    Ok(events.windows(2).map(|w| w[1].0 - w[0].1).filter(|d| *d >= 0.0).collect())
}

/// Time the runtime itself against a private daemon started from the `kforge` binary.
pub fn bench_runtime(kforge: &Path, o: &BenchOptions) -> Result<BenchResult> {
    if o.iterations == 0 || o.clients < 2 || o.rounds == 0 {
        bail!("--iterations and --rounds must be positive and --clients at least 2");
    }
    let tmp = tempfile::Builder::new().prefix("kforge-bench-").tempdir().context("creating a work directory")?;
    let daemon =
        PrivateDaemon::start(kforge, tmp.path(), &tmp.path().join("kforge.db"), &["--gpus".into(), "none".into()])?;
    let rt = round_trips(&daemon, o.iterations)?;
    let handover = handovers(&daemon, o.clients, o.rounds)?;
    drop(daemon);
    let mean = rt.iter().sum::<f64>() / rt.len() as f64;
    Ok(BenchResult {
        iterations: o.iterations,
        round_trip_us_p50: stats::quantile(&rt, 0.5).unwrap_or(0.0),
        round_trip_us_p99: stats::quantile(&rt, 0.99).unwrap_or(0.0),
        round_trip_us_mean: mean,
        clients: o.clients,
        handovers: handover.len(),
        handover_us_p50: stats::quantile(&handover, 0.5).unwrap_or(0.0),
        handover_us_p99: stats::quantile(&handover, 0.99).unwrap_or(0.0),
    })
}

/// The table `kforge bench-runtime` prints.
pub fn table(r: &BenchResult) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "{:<40} {:>10} {:>10} {:>10}", "BENCHMARK", "P50_US", "P99_US", "MEAN_US");
    let _ = writeln!(
        t,
        "{:<40} {:>10.1} {:>10.1} {:>10.1}",
        format!("region enter+exit, uncontended (n={})", r.iterations),
        r.round_trip_us_p50,
        r.round_trip_us_p99,
        r.round_trip_us_mean
    );
    let _ = writeln!(
        t,
        "{:<40} {:>10.1} {:>10.1} {:>10}",
        format!("region hand-over, {} clients (n={})", r.clients, r.handovers),
        r.handover_us_p50,
        r.handover_us_p99,
        "-"
    );
    t
}
