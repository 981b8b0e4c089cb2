//! Runtime evaluation: agent-like workloads ([`workload`]), a runner that executes them through
//! a daemon under each policy and ablation ([`runner`]), and the report ([`report`], drawn by
//! `html`) of throughput, timing inflation per duration bucket, ranking fidelity and region
//! statistics. [`stats`] holds the arithmetic.

pub mod html;
pub mod report;
pub mod runner;
pub mod stats;
pub mod workload;
