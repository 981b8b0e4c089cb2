//! Hidden commands: the guardian a daemon starts (`kforge __guardian`) and test helpers
//! (`kforge debug …`).

use anyhow::{Context, Result};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct GuardianArgs {
    #[arg(long)]
    ledger: PathBuf,
}

pub fn guardian(a: GuardianArgs) -> Result<i32> {
    kforge_daemon::guardian::run_guardian(&a.ledger).with_context(|| format!("guardian for {}", a.ledger.display()))?;
    Ok(0)
}

#[derive(clap::Subcommand)]
pub enum DebugCmd {
    /// A process that submits fake work honouring a gate segment (as the CUDA shim will).
    Submitter {
        #[arg(long, env = "KFORGE_GATE")]
        gate: PathBuf,
        #[arg(long)]
        log: PathBuf,
        /// Submissions to make (0 = until killed).
        #[arg(long, default_value_t = 0)]
        count: u64,
        /// How long each fake submission stays in flight, in microseconds.
        #[arg(long, default_value_t = 2000)]
        in_flight_us: u64,
    },
}

pub fn debug(cmd: DebugCmd) -> Result<i32> {
    match cmd {
        DebugCmd::Submitter { gate, log, count, in_flight_us } => {
            kforge_gate::run_test_submitter(&gate, &log, count, Duration::from_micros(in_flight_us))
                .with_context(|| format!("test submitter on {}", gate.display()))?;
            Ok(0)
        }
    }
}
