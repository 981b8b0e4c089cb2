//! `kforge workload gen|truth|run`: generate an agent-like workload, time it in isolation, run it
//! under a policy — `kforge_eval::workload` and `kforge_eval::runner` behind flags.

use crate::values::{AblationArg, PolicyArg, ProfileArg};
use anyhow::Result;
use kforge_eval::report::BUCKETS;
use kforge_eval::runner::{self, Ablation, RunManifest, RunOptions};
use kforge_eval::workload;
use kforge_proto::Policy;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum WorkloadCmd {
    /// Generate a workload (JSON Lines) and its candidate script next to it.
    Gen {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// gpu: Triton candidates of six operators; cpu: stdlib-Python candidates (runs anywhere).
        #[arg(long, value_enum, default_value = "gpu")]
        profile: ProfileArg,
        /// Least commands per duration bucket (<0.1, 0.1-1, 1-10, >10 ms, by estimate).
        #[arg(long, default_value_t = 50)]
        per_bucket: usize,
        /// Python used to list the gpu candidate space (no GPU needed).
        #[arg(long, default_value = "python3")]
        python: String,
    },
    /// Time every command alone, one at a time (the ground truth), its timed part in a region
    /// (settled GPU, clocks recorded); writes truth.run.json.
    Truth {
        /// The workload (JSON Lines from `kforge workload gen`).
        workload: PathBuf,
        /// Run the commands in a warm worker (same timing protocol, no interpreter start-up).
        #[arg(long)]
        warm: bool,
        /// Manifest name (default truth, or truth-warm; -OFFSET added when --offset or --limit
        /// is given). Name a second GPU's truth apart, e.g. truth-gpu1.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        common: WorkloadCommon,
    },
    /// Run the workload concurrently under a policy; writes NAME.run.json.
    Run {
        /// The workload (JSON Lines from `kforge workload gen`).
        workload: PathBuf,
        /// Isolation policy of every command.
        #[arg(long, value_enum)]
        policy: PolicyArg,
        /// Ablation step under the region policy (each adds one mechanism).
        #[arg(long, value_enum, default_value = "isolate")]
        ablation: AblationArg,
        /// Same as --ablation warm.
        #[arg(long)]
        warm: bool,
        /// Commands in flight.
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Run name (default: policy, plus ablation under region).
        #[arg(long)]
        name: Option<String>,
        /// With --device all: send each command to the least busy GPU, not to the GPU of its
        /// candidate group (more even load; candidate pairs split over two GPUs are not ranked).
        #[arg(long)]
        no_gpu_groups: bool,
        #[command(flatten)]
        common: WorkloadCommon,
    },
}

#[derive(clap::Args)]
pub struct WorkloadCommon {
    /// auto (the first GPU, else cpu), cpu, a GPU index, or all (runs only: every GPU, --concurrency
    /// commands in flight on each, each candidate group on one GPU, picked by load when its first
    /// command starts — for scaling runs; see --no-gpu-groups).
    #[arg(long, default_value = "auto")]
    device: String,
    /// Store of all runs (default: kforge-eval.db beside the workload).
    #[arg(long)]
    db: Option<PathBuf>,
    /// Cores reserved for measuring threads in the isolate and warm steps.
    #[arg(long, default_value_t = 1)]
    reserve_cores: usize,
    /// Skip the first N commands (split a long run over several calls).
    #[arg(long, default_value_t = 0)]
    offset: usize,
    /// Run only N commands (after --offset).
    #[arg(long)]
    limit: Option<usize>,
    /// Time limit per command, seconds.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    /// Longest wait, before each region, for the GPU's power-cap throttling to clear (0: no
    /// settle step). Default: the ablation step's (1500 from freeze on, 0 before).
    #[arg(long, value_name = "MS")]
    settle_timeout_ms: Option<u64>,
}

impl WorkloadCommon {
    /// Run options of `workload` with these flags; the rest as `truth` and `run` set them.
    fn options(self, workload: PathBuf, policy: Policy, ablation: Ablation, name: String) -> Result<RunOptions> {
        Ok(RunOptions {
            kforge: crate::output::this_binary()?,
            db: self.db.unwrap_or_else(|| runner::default_db(&workload)),
            workload,
            policy,
            ablation,
            concurrency: 1,
            device: self.device,
            name,
            truth: false,
            reserve_cores: self.reserve_cores,
            offset: self.offset,
            limit: self.limit,
            timeout: Duration::from_secs(self.timeout_s),
            settle_timeout_ms: self.settle_timeout_ms,
            gpu_groups: false,
        })
    }
}

pub fn workload(cmd: WorkloadCmd) -> Result<i32> {
    match cmd {
        WorkloadCmd::Gen { out, seed, profile, per_bucket, python } => {
            let cmds = workload::generate_listing_with(profile.into(), seed, per_bucket, &python)?;
            workload::write(&out, &cmds)?;
            println!("{} commands written to {} (seed {seed}); by estimated duration:", cmds.len(), out.display());
            for (b, n) in BUCKETS.iter().zip(workload::bucket_counts(&cmds)) {
                println!("  {b:<9} {n}");
            }
            Ok(0)
        }
        WorkloadCmd::Truth { workload, warm, name, common } => {
            let ablation = if warm { Ablation::Warm } else { Ablation::Isolate };
            let name = runner::truth_name(name.as_deref(), warm, common.offset, common.limit);
            let o = RunOptions { truth: true, ..common.options(workload, Policy::Command, ablation, name)? };
            let (m, path) = runner::run(&o)?;
            println!(
                "ground truth: {} commands in {:.1} s, {} failed; manifest {}",
                m.commands,
                m.wall_s,
                m.failed.len(),
                path.display()
            );
            Ok(exit_code(&m))
        }
        WorkloadCmd::Run { workload, policy, ablation, warm, concurrency, name, no_gpu_groups, common } => {
            let policy = Policy::from(policy);
            let ablation = if warm { Ablation::Warm } else { ablation.into() };
            let name = name.unwrap_or_else(|| runner::run_name(policy, ablation));
            let o = RunOptions {
                concurrency,
                gpu_groups: !no_gpu_groups,
                ..common.options(workload, policy, ablation, name)?
            };
            let (m, path) = runner::run(&o)?;
            println!(
                "{}: {} commands in {:.1} s ({:.1}/min), {} failed; manifest {}",
                m.name,
                m.commands,
                m.wall_s,
                m.commands as f64 / m.wall_s * 60.0,
                m.failed.len(),
                path.display()
            );
            Ok(exit_code(&m))
        }
    }
}

/// 0 when every command of the run succeeded, else 1.
fn exit_code(m: &RunManifest) -> i32 {
    if m.failed.is_empty() {
        0
    } else {
        1
    }
}
