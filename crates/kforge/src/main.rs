//! `kforge`: the command-line front of the kforge libraries. Thin: this file parses arguments and
//! dispatches to one module per command, which maps its flags onto a library call and prints.

mod control;
mod daemon;
mod demo;
mod inspect;
mod internal;
mod job;
mod optimize;
mod output;
mod profile;
mod report;
mod run;
mod scripted;
mod status;
mod values;
mod verify;
mod workload;

use anyhow::Result;
use clap::{Parser, Subcommand};
use kforge_client::resolve_socket;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "kforge",
    version,
    about = "Benchmark GPU kernels concurrently on shared GPUs; only timed regions are exclusive."
)]
struct Cli {
    /// Daemon socket (else $KFORGE_SOCKET, else $XDG_RUNTIME_DIR/kforge/kforge.sock or /tmp/kforge-<uid>/kforge.sock).
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the node daemon: manages devices, runs submitted commands, grants exclusive regions.
    Daemon(daemon::DaemonArgs),
    /// Submit a benchmark command and stream its output; exits with the command's exit code.
    Run(run::RunArgs),
    /// Show devices, freeze and isolation mechanisms, jobs, region queues and holders.
    Status(status::StatusArgs),
    /// Without RUN files: dump what the daemon's store recorded (jobs, regions, measurements) as
    /// JSON. With run manifests (`*.run.json` from `kforge workload truth|run`): the evaluation
    /// report — throughput, inflation per duration bucket, ranking fidelity, region statistics.
    Report(report::ReportArgs),
    /// Inventory a problem compiled with torch.compile: its Triton kernels and vendor-library
    /// calls in launch order, GPU time per entry, which are replaceable, per-kernel replay and a
    /// re-stitch round trip. Runs the capture on a GPU (Python, torch, Triton), or reads a saved one.
    Inspect(inspect::InspectArgs),
    /// Verify a candidate (a ModelNew file) against a problem through the gate cascade: static,
    /// dry run, multi-seed correctness, model level (fp64 rule), exploit checks, performance.
    /// Exit 0 accepted (or passed without the performance gate), 1 rejected, 2 could not run.
    Verify(verify::VerifyArgs),
    /// Profile a compiled problem's kernels (or a Triton kernel file's) with Nsight Compute, or
    /// read a CSV ncu wrote: per kernel its launches, time, memory and compute speed of light,
    /// occupancy, DRAM GB/s against the measured copy peak, non-tensor GFLOP/s, and the strategy
    /// analyst's tier (near-optimal, memory-bound, compute-bound, under-utilized).
    Profile(profile::ProfileArgs),
    /// Make a problem faster: run the agents (dispatch, inductor knobs, rewrites, kernel configs,
    /// LLM agents with --llm), verify every candidate through the cascade, time through regions,
    /// write the winner as a standalone ModelNew file with its verify policy, and keep the
    /// baseline when nothing wins.
    Optimize(Box<optimize::OptimizeArgs>),
    /// Serve a scripted OpenAI-compatible chat-completions endpoint (scripted replies, errors,
    /// delays, malformed bodies, slow streams) until SIGINT or SIGTERM: the LLM loop without a model.
    ScriptedEndpoint(scripted::ScriptedArgs),
    /// Agent-like benchmark workloads: generate, time in isolation, run under a policy.
    Workload {
        #[command(subcommand)]
        cmd: workload::WorkloadCmd,
    },
    /// Cancel a queued or running job (kills its process tree).
    Cancel(control::CancelArgs),
    /// Stop the daemon: running jobs are killed, queued jobs fail.
    Shutdown,
    /// The main demo: a private daemon, a generated workload of short CPU benchmark commands under
    /// the none, command and region policies, plus ground truth; prints a table. No GPU needed.
    Demo(demo::DemoArgs),
    /// Benchmark the runtime itself: uncontended region round trip and contended hand-over.
    BenchRuntime(demo::BenchArgs),
    /// Internal: the guardian process a daemon starts (kills its jobs if it dies).
    #[command(name = "__guardian", hide = true)]
    Guardian(internal::GuardianArgs),
    /// Debugging and test helpers.
    #[command(hide = true)]
    Debug {
        #[command(subcommand)]
        cmd: internal::DebugCmd,
    },
}

fn main() {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("kforge: {e:#}");
            std::process::exit(2);
        }
    }
}

/// Run the command; its exit code.
fn dispatch(cli: Cli) -> Result<i32> {
    let socket = resolve_socket(cli.socket.as_deref());
    match cli.cmd {
        Cmd::Daemon(a) => daemon::daemon(socket, a),
        Cmd::Run(a) => run::run(&socket, a),
        Cmd::Status(a) => status::status(&socket, a),
        Cmd::Report(a) => report::report(&socket, a),
        Cmd::Workload { cmd } => workload::workload(cmd),
        Cmd::Inspect(a) => inspect::inspect(&socket, a),
        Cmd::Verify(a) => verify::verify(&socket, a),
        Cmd::Profile(a) => profile::profile(&socket, a),
        Cmd::Optimize(a) => optimize::optimize(&socket, *a),
        Cmd::ScriptedEndpoint(a) => scripted::scripted_endpoint(a),
        Cmd::Cancel(a) => control::cancel(&socket, a),
        Cmd::Shutdown => control::shutdown(&socket),
        Cmd::Demo(a) => demo::demo(a),
        Cmd::BenchRuntime(a) => demo::bench_runtime(a),
        Cmd::Guardian(a) => internal::guardian(a),
        Cmd::Debug { cmd } => internal::debug(cmd),
    }
}
