//! Runtime evaluation: agent-like workloads ([`workload`]), a runner that executes them through
//! a daemon under each policy and ablation ([`runner`]), and the report ([`report`], drawn by
//! `html`) of throughput, timing inflation per duration bucket, ranking fidelity and region
//! statistics. [`stats`] holds the arithmetic. [`demo`] is `kforge demo` (a small CPU workload
//! under every policy, no GPU needed) and [`bench_runtime`] times the runtime's own round trips.

pub mod bench_runtime;
pub mod demo;
pub mod html;
pub mod report;
pub mod runner;
pub mod stats;
pub mod workload;
