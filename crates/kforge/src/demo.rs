//! `kforge demo` and `kforge bench-runtime`: `kforge_eval::demo` and `kforge_eval::bench_runtime`
//! behind flags, their JSON written where asked and their table printed.

use anyhow::{Context, Result};
use kforge_eval::bench_runtime::{self, BenchOptions};
use kforge_eval::demo::{self, DemoOptions};
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Benchmark commands per policy (at least 40 for the README's claims).
    #[arg(long, default_value_t = 40)]
    commands: usize,
    /// Workload seed (the same seed gives the same commands).
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Concurrent commands the private daemon admits.
    #[arg(long, default_value_t = 8)]
    max_concurrent: usize,
    /// Python interpreter for the commands.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Keep the work directory (store, scripts) and print where it is.
    #[arg(long)]
    keep: bool,
}

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Uncontended enter+exit round trips to time.
    #[arg(long, default_value_t = 2000)]
    iterations: usize,
    /// Clients competing for the region in the hand-over benchmark.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Regions each competing client takes.
    #[arg(long, default_value_t = 250)]
    rounds: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    std::fs::write(path, serde_json::to_vec_pretty(value)?).with_context(|| format!("writing {}", path.display()))
}

pub fn demo(a: DemoArgs) -> Result<i32> {
    let o = DemoOptions {
        commands: a.commands,
        seed: a.seed,
        max_concurrent: a.max_concurrent,
        python: a.python,
        keep: a.keep,
    };
    let r = demo::demo(&crate::output::this_binary()?, &o)?;
    if let Some(p) = &a.json {
        write_json(p, &r)?;
    }
    print!("{}", demo::table(&r));
    Ok(0)
}

pub fn bench_runtime(a: BenchArgs) -> Result<i32> {
    let o = BenchOptions { iterations: a.iterations, clients: a.clients, rounds: a.rounds };
    let r = bench_runtime::bench_runtime(&crate::output::this_binary()?, &o)?;
    if let Some(p) = &a.json {
        write_json(p, &r)?;
    }
    print!("{}", bench_runtime::table(&r));
    Ok(0)
}
