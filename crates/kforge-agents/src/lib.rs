//! kforge optimize's LLM agents and the search loop over them (issue 19).
//!
//! - [`context`]: what the agents know about a problem (source, baseline, inventory, profile).
//! - [`analyst`]: the strategy analyst, deterministic: a tier per kernel, the Amdahl ceiling.
//! - [`prompt`]: the versioned prompt files (`prompts/llm/*.md`), their templates and bounds.
//! - The planner, executor, summarizer and synthesis step talk to a model through
//!   [`kforge_llm::Chat`]; only the caller's [`Judge`] declares a candidate correct or faster.
//! - [`memory`]: the experience memory and the strategy tracker.
//! - [`search`]: the beam over chains, its stop rules, what it reports ([`Observer`]) and
//!   returns ([`SearchOutcome`]).

pub mod analyst;
pub mod candidate;
pub mod context;
mod executor;
pub mod memory;
pub mod planner;
pub mod prompt;
pub mod search;
pub mod summarizer;
mod talk;

pub use candidate::{Candidate, Judge, Judgement, Verdict};
pub use context::{BaselineInfo, Inventory, KernelInfo, KernelKind, KernelProfile, ProblemContext};
pub use search::{
    search, Bounds, ConfigError, IterationSummary, LoopConfig, Meltdown, Observer, Quiet, SearchOutcome, Stats, Stop,
};
