//! [`Client`]: the [`Chat`] implementation over HTTP. One call: its key and occurrence → the
//! replay cache (per its mode) → the budget → HTTP with retries → the tolerant reply → recorded
//! (or its failure recorded) → charged → an [`Answer`].
//!
//! Retried: HTTP 408, 429, 500, 502, 503, 504 (also as a 200 body's `{"error": {"code": …}}`),
//! timeouts and transport errors, up to `max_attempts`, waiting `base·2^(n−1)` (capped) or the
//! server's `Retry-After` seconds (capped; an HTTP-date `Retry-After` is not read). A 400 (or
//! 422) that mentions `seed` while a seed was sent is sent once more without it, and no seed is
//! sent again. `timeout_s` bounds each attempt as a whole (a streamed reply included).
//! The progress callback is called for streamed replies only. Nothing here ever switches to another
//! provider.

use std::io::BufRead;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::budget::{Hold, Meter};
use crate::chat::{Reply, Request, Usage};
use crate::config::ProviderConfig;
use crate::replay::{self, Cache, CallRow, FailureRow, Lookup, Mode, NewCall};
use crate::wire::{self, BodyOptions, Line, WireError};
use crate::{Answer, Chat, LlmError, Scope};

/// Statuses worth another attempt.
pub const RETRYABLE: [u16; 12] = [408, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524, 529];

/// How much of an error body an error keeps.
const EXCERPT_CHARS: usize = 2000;

/// A streamed reply's progress, given to the progress callback as chunks arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Characters of text so far.
    pub content_chars: usize,
    /// Characters of tool-call arguments so far.
    pub argument_chars: usize,
    /// Since the call began (retries' waits included).
    pub elapsed: Duration,
    /// The HTTP attempt being read (1 for the first).
    pub attempt: u32,
}

/// What this client did so far.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Stats {
    /// Calls answered (replayed ones included).
    pub calls: u64,
    /// Calls answered from the replay cache.
    pub replayed: u64,
    /// HTTP requests sent.
    pub attempts: u64,
    /// Attempts that were retries after a retryable problem.
    pub retries: u64,
    /// Requests sent again without the seed the server rejected (0 or 1).
    pub seed_rejected: u64,
    /// Calls that gave no answer (an error) or an empty reply.
    pub failures: u64,
    /// Tokens spent (replayed calls spend none), those of cut-off attempts included.
    pub tokens: u64,
    /// Of `tokens`, those of attempts the server started answering (a 2xx) that gave no reply —
    /// a stream cut off, a body that did not arrive — estimated from what arrived: a provider
    /// bills them, so the budget is charged them.
    pub wasted_tokens: u64,
    /// US dollars spent.
    pub usd: f64,
}

/// Called as a streamed reply arrives.
pub type ProgressFn = dyn Fn(&Scope, &Progress) + Send + Sync;

/// The wait before retry `n` (1 for the first): the server's `Retry-After` when it gave one,
/// else `base·2^(n−1)`; never more than `cap`.
pub fn backoff(n: u32, base_s: f64, cap_s: f64, retry_after_s: Option<f64>) -> Duration {
    let wait = retry_after_s.unwrap_or_else(|| base_s * 2f64.powi(n.saturating_sub(1).min(62) as i32));
    Duration::from_secs_f64(wait.min(cap_s).max(0.0))
}

/// An OpenAI-compatible chat-completions client: one provider, a budget, a replay cache.
pub struct Client {
    config: ProviderConfig,
    meter: Arc<Meter>,
    cache: Arc<Cache>,
    agent: ureq::Agent,
    seed_rejected: AtomicBool,
    progress: Option<Box<ProgressFn>>,
    stats: Mutex<Stats>,
}

/// Builds a [`Client`] with a progress callback.
pub struct ClientBuilder {
    client: Client,
}

impl ClientBuilder {
    /// Calls `f` as each chunk of a streamed reply arrives.
    pub fn progress(mut self, f: impl Fn(&Scope, &Progress) + Send + Sync + 'static) -> ClientBuilder {
        self.client.progress = Some(Box::new(f));
        self
    }

    /// The client.
    pub fn build(self) -> Client {
        self.client
    }
}

/// Why one attempt failed.
enum Failure {
    /// Worth another attempt. `spent`: what an attempt the server started answering used,
    /// estimated (charged to the budget though it gave no reply).
    Retry { problem: String, retry_after_s: Option<f64>, spent: Option<Usage> },
    /// A status not retried (kept apart to spot a rejected seed).
    Status { status: u16, body: String },
    /// Not worth another attempt.
    Final(LlmError),
}

impl Client {
    /// A client of `config`'s provider, charging `meter` and recording in `cache`.
    pub fn new(config: ProviderConfig, meter: Arc<Meter>, cache: Arc<Cache>) -> Client {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs_f64(config.timeout_s.max(0.001))))
            .build()
            .new_agent();
        Client {
            config,
            meter,
            cache,
            agent,
            seed_rejected: AtomicBool::new(false),
            progress: None,
            stats: Mutex::new(Stats::default()),
        }
    }

    /// A builder for a client with a progress callback.
    pub fn builder(config: ProviderConfig, meter: Arc<Meter>, cache: Arc<Cache>) -> ClientBuilder {
        ClientBuilder { client: Client::new(config, meter, cache) }
    }

    /// The provider's configuration.
    pub fn config(&self) -> &ProviderConfig {
        &self.config
    }

    /// What this client did so far.
    pub fn stats(&self) -> Stats {
        *self.tally()
    }

    fn tally(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How a budget refusal reads (`LlmError::Budget`'s message).
const BUDGET_SPENT: &str = "budget spent:";

impl Chat for Client {
    fn recorded_only(&self) -> bool {
        matches!(self.cache.mode(), Mode::Replay { .. })
    }

    fn chat(&self, request: &Request, scope: &Scope) -> Result<Answer, LlmError> {
        let key = replay::task_key(request, &scope.task);
        let occurrence = self.cache.next_occurrence(&key);
        match self.cache.lookup(&key, occurrence, scope)? {
            Lookup::Recorded(row) => return self.answer_recorded(row, request, scope),
            Lookup::Failed(failure) => return self.fail_recorded(failure, scope),
            Lookup::Ask => {}
        }
        let prompt_chars = wire::prompt_chars(request);
        let price = self.config.price.as_ref();
        let hold = match self.meter.admit(scope, wire::estimate_tokens(prompt_chars), price, request.params.max_tokens)
        {
            Ok(hold) => hold,
            Err(e) => {
                // Recorded, so that a replay stops where this run stopped.
                self.cache.record_failure(scope, &key, occurrence, &e.to_string(), None)?;
                return Err(e);
            }
        };
        let started = Instant::now();
        let mut wasted = Usage::default();
        let (reply, attempts) = match self.send(request, scope, hold.max_tokens, prompt_chars, &mut wasted) {
            Ok(sent) => sent,
            Err(e) => return Err(self.failed(hold, scope, &key, occurrence, e, &wasted)),
        };
        let usd = price.map(|p| p.cost(&reply.usage)).unwrap_or(0.0);
        let wasted_usd = self.wasted_usd(&wasted);
        self.meter.charge(hold, &reply.usage.plus(&wasted), usd + wasted_usd);
        {
            let mut t = self.tally();
            t.calls += 1;
            t.tokens += reply.usage.total() + wasted.total();
            t.wasted_tokens += wasted.total();
            t.usd += usd + wasted_usd;
        }
        let call = if reply.is_empty() {
            self.tally().failures += 1;
            self.cache.record_failure(scope, &key, occurrence, "empty reply", Some(&reply))?;
            0
        } else {
            let latency_s = started.elapsed().as_secs_f64();
            let new = NewCall {
                scope,
                key: &key,
                occurrence,
                request,
                reply: &reply,
                usd: usd + wasted_usd, // what the call cost, as the tokens recorded with it
                attempts,
                latency_s,
                replayed: false,
                wasted,
            };
            self.cache.record(&new)?
        };
        Ok(Answer { reply, attempts, replayed: false, usd, call })
    }
}

impl Client {
    /// A call that gave no reply: its hold freed, the failure recorded (the provider's error
    /// wins over a cache error while recording it).
    fn failed(&self, hold: Hold, scope: &Scope, key: &str, occurrence: u32, e: LlmError, wasted: &Usage) -> LlmError {
        if wasted.total() > 0 {
            let usd = self.wasted_usd(wasted);
            self.meter.charge(hold, wasted, usd); // attempts cut off: billed, though no reply came
            let mut t = self.tally();
            (t.tokens, t.wasted_tokens, t.usd) =
                (t.tokens + wasted.total(), t.wasted_tokens + wasted.total(), t.usd + usd);
        } else {
            self.meter.release(hold);
        }
        self.tally().failures += 1;
        let _recorded = self.cache.record_failure(scope, key, occurrence, &e.to_string(), None);
        e
    }

    /// What cut-off attempts cost at the provider's price (none without one).
    fn wasted_usd(&self, wasted: &Usage) -> f64 {
        self.config.price.as_ref().filter(|_| wasted.total() > 0).map(|p| p.cost(wasted)).unwrap_or(0.0)
    }

    /// Answers from a recorded call: recorded again under this run (marked replayed) unless
    /// it is this run's own row; on `--resume` the budget is charged what the killed run spent.
    fn answer_recorded(&self, row: CallRow, request: &Request, scope: &Scope) -> Result<Answer, LlmError> {
        let reply = row.reply().map_err(|problem| LlmError::Cache { path: self.cache.path().into(), problem })?;
        if let Mode::Resume { .. } = self.cache.mode() {
            let spent = Usage {
                prompt_tokens: row.prompt_tokens,
                completion_tokens: row.completion_tokens,
                estimated: row.estimated,
            };
            self.meter.charge_recorded(scope, &spent, row.usd);
        }
        let call = if row.run == self.cache.run() {
            row.id
        } else {
            let new = NewCall {
                scope,
                key: &row.key,
                occurrence: row.occurrence,
                request,
                reply: &reply,
                usd: 0.0,
                attempts: 0,
                latency_s: 0.0,
                replayed: true,
                wasted: Usage::default(),
            };
            self.cache.record(&new)?
        };
        let mut t = self.tally();
        t.calls += 1;
        t.replayed += 1;
        Ok(Answer { reply, attempts: 0, replayed: true, usd: 0.0, call })
    }

    /// `--replay` of a call that failed (or replied empty) when recorded: the same again.
    fn fail_recorded(&self, f: FailureRow, scope: &Scope) -> Result<Answer, LlmError> {
        let empty = match &f.reply {
            Some(json) => Some(serde_json::from_str::<Reply>(json).map_err(|e| LlmError::Cache {
                path: self.cache.path().into(),
                problem: format!("failure {}: the recorded reply does not read: {e}", f.id),
            })?),
            None => None,
        };
        self.cache.record_failure(scope, &f.key, f.occurrence, &f.error, empty.as_ref())?;
        let mut t = self.tally();
        t.failures += 1;
        if empty.is_some() {
            // As when recorded: an answer (replayed) and a failure.
            t.calls += 1;
            t.replayed += 1;
        }
        match empty {
            Some(reply) => Ok(Answer { reply, attempts: 0, replayed: true, usd: 0.0, call: 0 }),
            None if f.error.starts_with(BUDGET_SPENT) => Err(LlmError::BudgetRecorded { run: f.run, error: f.error }),
            None => Err(LlmError::RecordedFailure { run: f.run, key: f.key, occurrence: f.occurrence, error: f.error }),
        }
    }

    /// Sends with retries; the reply and the attempts made.
    fn send(
        &self,
        request: &Request,
        scope: &Scope,
        max_tokens: Option<u64>,
        prompt_chars: usize,
        wasted: &mut Usage,
    ) -> Result<(Reply, u32), LlmError> {
        let url = self.config.completions_url();
        let started = Instant::now();
        let mut seed = request.params.seed.is_some() && !self.seed_rejected.load(Ordering::Relaxed);
        let (mut attempts, mut tries) = (0u32, 0u32);
        loop {
            attempts += 1;
            tries += 1;
            let options =
                BodyOptions { reasoning: self.config.reasoning, stream: self.config.stream, seed, max_tokens };
            let body = wire::body(request, &options).to_string();
            self.tally().attempts += 1;
            let failure = match self.attempt(&url, &body, scope, prompt_chars, started, attempts) {
                Ok(reply) => return Ok((reply, attempts)),
                Err(f) => f,
            };
            match failure {
                Failure::Final(e) => return Err(e),
                Failure::Status { status: 400 | 422, body } if seed && body.to_lowercase().contains("seed") => {
                    // Not a provider switch: the same provider, the same request without a seed.
                    self.seed_rejected.store(true, Ordering::Relaxed);
                    self.tally().seed_rejected += 1;
                    seed = false;
                    tries -= 1;
                }
                Failure::Status { status, body } => return Err(LlmError::Status { url, status, body }),
                Failure::Retry { problem, retry_after_s, spent } => {
                    if let Some(u) = spent {
                        *wasted = wasted.plus(&u);
                    }
                    if tries >= self.config.max_attempts {
                        return Err(LlmError::Exhausted { url, attempts, last: problem });
                    }
                    self.tally().retries += 1;
                    let c = &self.config;
                    std::thread::sleep(backoff(tries, c.backoff_base_s, c.backoff_cap_s, retry_after_s));
                }
            }
        }
    }

    /// One HTTP exchange.
    fn attempt(
        &self,
        url: &str,
        body: &str,
        scope: &Scope,
        prompt_chars: usize,
        started: Instant,
        attempt: u32,
    ) -> Result<Reply, Failure> {
        let mut post = self.agent.post(url).header("Content-Type", "application/json");
        if let Some(key) = &self.config.api_key {
            post = post.header("Authorization", format!("Bearer {key}"));
        }
        let response = post.send(body).map_err(|e| self.transport(url, e))?;
        let status = response.status().as_u16();
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        let retry_after_s = header("retry-after").and_then(|v| v.trim().parse::<f64>().ok()).filter(|s| s.is_finite());
        let is_stream = header("content-type").is_some_and(|t| t.contains("text/event-stream"));
        let mut body = response.into_body();
        if !(200..300).contains(&status) {
            let text = body.read_to_string().unwrap_or_else(|e| format!("(the body did not read: {e})"));
            let text = wire::excerpt(text.trim(), EXCERPT_CHARS);
            if RETRYABLE.contains(&status) {
                return Err(Failure::Retry { problem: format!("HTTP {status}: {text}"), retry_after_s, spent: None });
            }
            return Err(Failure::Status { status, body: text });
        }
        // From here the server is answering (a 2xx): an attempt that gives no reply is charged
        // what arrived, estimated (Failure::Retry's `spent`).
        let reply = if is_stream {
            self.read_stream(url, body.into_reader(), scope, prompt_chars, started, attempt)?
        } else {
            let text = body
                .read_to_string()
                .map_err(|e| spent(self.transport(url, e), wire::partial_usage(prompt_chars, 0)))?;
            let start = text.trim_start();
            if start.starts_with("data:") || start.starts_with(':') {
                self.read_stream(url, text.as_bytes(), scope, prompt_chars, started, attempt)?
            } else {
                wire::parse_reply(&text, prompt_chars)
            }
        };
        reply.map_err(|e| wire_failure(url, status, e))
    }

    /// Reads a server-sent-event stream, telling the progress callback of each chunk.
    fn read_stream(
        &self,
        url: &str,
        reader: impl std::io::Read,
        scope: &Scope,
        prompt_chars: usize,
        started: Instant,
        attempt: u32,
    ) -> Result<Result<Reply, WireError>, Failure> {
        let mut reader = std::io::BufReader::new(reader);
        let mut stream = wire::Stream::default();
        let mut line = String::new();
        loop {
            line.clear();
            let so_far = |stream: &wire::Stream| {
                let (content, arguments) = stream.chars();
                wire::partial_usage(prompt_chars, content + arguments)
            };
            let n = reader
                .read_line(&mut line)
                .map_err(|e| spent(self.transport(url, ureq::Error::from(e)), so_far(&stream)))?;
            if n == 0 {
                if stream.chunks() > 0 && !stream.ended() {
                    // A reply cut off mid-stream is not an answer (it would be cached as one).
                    let problem = "the stream ended before [DONE] and without a finish reason".to_string();
                    return Err(Failure::Retry { problem, retry_after_s: None, spent: Some(so_far(&stream)) });
                }
                break;
            }
            match stream.line(&line) {
                Ok(Line::Done) => break,
                Ok(Line::Nothing) => {}
                Ok(Line::Chunk) => {
                    if let Some(f) = &self.progress {
                        let (content_chars, argument_chars) = stream.chars();
                        f(scope, &Progress { content_chars, argument_chars, elapsed: started.elapsed(), attempt });
                    }
                }
                Err(e) => return Ok(Err(e)),
            }
        }
        Ok(stream.finish(prompt_chars))
    }

    /// A failure to exchange: a timeout or a transport problem is retried, a bad URL is not.
    fn transport(&self, url: &str, e: ureq::Error) -> Failure {
        let problem = match &e {
            ureq::Error::BadUri(_) | ureq::Error::Http(_) | ureq::Error::RequireHttpsOnly(_) => {
                return Failure::Final(LlmError::Transport { url: url.to_string(), problem: e.to_string() })
            }
            ureq::Error::Timeout(_) => format!("timed out after {} s ({e})", self.config.timeout_s),
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
                format!("timed out after {} s ({e})", self.config.timeout_s)
            }
            _ => e.to_string(),
        };
        Failure::Retry { problem, retry_after_s: None, spent: None }
    }
}

/// `f` with what its attempt used, when it is to be retried (a final failure is not charged).
fn spent(f: Failure, usage: Usage) -> Failure {
    match f {
        Failure::Retry { problem, retry_after_s, .. } => Failure::Retry { problem, retry_after_s, spent: Some(usage) },
        other => other,
    }
}

/// A 2xx body that is not a reply: a server error inside it is retried when its code is.
fn wire_failure(url: &str, status: u16, e: WireError) -> Failure {
    match e {
        WireError::Server { code: Some(code), message } if RETRYABLE.contains(&code) => Failure::Retry {
            problem: format!("HTTP {status} carrying error {code}: {message}"),
            retry_after_s: None,
            spent: None,
        },
        WireError::Server { code, message } => Failure::Final(LlmError::Status {
            url: url.to_string(),
            status: code.unwrap_or(status),
            body: wire::excerpt(&message, EXCERPT_CHARS),
        }),
        WireError::Bad(problem) => Failure::Final(LlmError::BadResponse { url: url.to_string(), problem }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_honours_retry_after() {
        let waits: Vec<f64> = (1..=6).map(|n| backoff(n, 1.0, 30.0, None).as_secs_f64()).collect();
        assert_eq!(waits, [1.0, 2.0, 4.0, 8.0, 16.0, 30.0]);
        assert_eq!(backoff(1, 1.0, 30.0, Some(7.0)), Duration::from_secs(7));
        assert_eq!(backoff(1, 1.0, 30.0, Some(600.0)), Duration::from_secs(30));
        assert_eq!(backoff(100, 0.5, 10.0, None), Duration::from_secs(10));
    }

    #[test]
    fn server_errors_in_a_200_are_retried_by_code() {
        let f = wire_failure("u", 200, WireError::Server { code: Some(429), message: "slow down".into() });
        assert!(matches!(f, Failure::Retry { problem, .. } if problem.contains("slow down")));
        let f = wire_failure("u", 200, WireError::Server { code: Some(401), message: "bad key".into() });
        assert!(matches!(f, Failure::Final(LlmError::Status { status: 401, .. })));
        let f = wire_failure("u", 200, WireError::Bad("no choices".into()));
        assert!(matches!(f, Failure::Final(LlmError::BadResponse { .. })));
    }
}
