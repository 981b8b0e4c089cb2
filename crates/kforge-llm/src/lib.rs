//! OpenAI-compatible chat completions for kforge's LLM agents.
//!
//! - [`chat`]: the vocabulary (messages, tools, requests, tolerant replies).
//! - [`config`]: which provider, from flags, the environment and a TOML file.
//! - [`wire`]: the OpenAI wire format (request bodies; replies read tolerantly, streamed or not).
//! - [`Chat`]: what an agent calls. Its implementation here ([`client::Client`]) sends requests
//!   over HTTP with retries and backoff, charges a [`budget::Meter`], and records every call in
//!   the [`replay::Cache`]; with `--replay RUN` it answers from that run's records, spending
//!   nothing, and with `--resume` from a killed run's records where it has them.
//!
//! A failing provider stops the agent with an error that says why; nothing here switches to
//! another provider.

pub mod budget;
pub mod chat;
pub mod client;
pub mod config;
pub mod replay;
pub mod wire;

pub use chat::{Arguments, FinishReason, Message, Params, Reply, Request, Role, Tool, ToolCall, Usage};
pub use client::{Client, Progress, Stats};

/// Who is asking: the problem (per-problem budgets count by it) and the agent's role
/// (`planner`, `executor`, …), recorded beside the call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    pub problem: String,
    pub role: String,
    /// The agent's task the call belongs to (`i1-c0-p2`; empty for none): two identical
    /// requests of different tasks are told apart by the replay cache, whatever order threads
    /// sent them in.
    pub task: String,
}

/// A call's reply and what it cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub reply: Reply,
    /// HTTP attempts made (1 without retries; 0 when replayed).
    pub attempts: u32,
    /// Answered from the replay cache (no tokens spent).
    pub replayed: bool,
    /// Money charged for this call, from the model's prices (0 when replayed or unpriced).
    pub usd: f64,
    /// The call's row in the replay cache (`llm_calls.id`; 0 for an empty reply, which is
    /// recorded only in `llm_failures`).
    pub call: i64,
}

/// What an agent calls to talk to a model.
pub trait Chat: Send + Sync {
    /// One call: the reply, or why there is none.
    fn chat(&self, request: &Request, scope: &Scope) -> Result<Answer, LlmError>;

    /// Whether it only answers from records (`--replay`): a search that has stopped may still
    /// ask it what the recorded run asked before it stopped, since nothing is spent.
    fn recorded_only(&self) -> bool {
        false
    }
}

/// Why a call gave no reply.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// A budget would be passed by this call; nothing was sent.
    #[error("budget spent: {what} (limit {limit}, spent {spent})")]
    Budget { what: String, limit: f64, spent: f64 },
    /// `--replay`: the recorded run stopped on a budget at this call.
    #[error("budget spent (as run {run} recorded): {error}")]
    BudgetRecorded { run: i64, error: String },
    /// The server answered with an error status that is not retried (or retries ran out on one).
    #[error("{url}: HTTP {status}: {body}")]
    Status { url: String, status: u16, body: String },
    /// Every attempt failed with a retryable problem; the last one is said.
    #[error("{url}: gave up after {attempts} attempts: {last}")]
    Exhausted { url: String, attempts: u32, last: String },
    /// The server could not be reached or the connection broke.
    #[error("{url}: {problem}")]
    Transport { url: String, problem: String },
    /// The body was not a chat completion.
    #[error("{url}: not a chat completion: {problem}")]
    BadResponse { url: String, problem: String },
    /// `--replay`: the recorded run has no answer for this request.
    #[error(
        "replay of run {run}: no recorded answer for request {key} (occurrence {occurrence}) ({role} of {problem})"
    )]
    NotRecorded { run: i64, key: String, occurrence: u32, problem: String, role: String },
    /// `--replay`: the recorded run's call failed here (no reply was recorded), so the replay
    /// fails the same way.
    #[error("replay of run {run}: the recorded call {key} (occurrence {occurrence}) failed: {error}")]
    RecordedFailure { run: i64, key: String, occurrence: u32, error: String },
    /// The provider configuration is unusable.
    #[error("LLM configuration: {0}")]
    Config(String),
    /// The replay cache's SQLite file.
    #[error("replay cache {path}: {problem}")]
    Cache { path: String, problem: String },
}
