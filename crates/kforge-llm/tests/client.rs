//! The client against a scripted HTTP server inside the test: each connection gets the next
//! scripted answer, and every request is recorded with the time it arrived.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kforge_llm::budget::{Limits, Meter};
use kforge_llm::config::{Price, ProviderConfig};
use kforge_llm::replay::{Cache, Mode};
use kforge_llm::{wire, Arguments, Chat, Client, FinishReason, LlmError, Message, Params, Request, Scope};
use serde_json::{json, Value};

/// What the server does with one connection.
enum Act {
    /// Write this raw HTTP response and close.
    Respond(String),
    /// Read the request, answer nothing, and wait until the client hangs up.
    Hold,
}

struct Received {
    at: Instant,
    headers: Vec<String>,
    body: Value,
}

struct Server {
    url: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Server {
    fn start(script: Vec<Act>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = received.clone();
        std::thread::spawn(move || {
            for act in script {
                let Ok((stream, _)) = listener.accept() else { return };
                let log = log.clone();
                std::thread::spawn(move || serve(stream, act, &log));
            }
        });
        Server { url, received }
    }

    fn requests(&self) -> std::sync::MutexGuard<'_, Vec<Received>> {
        self.received.lock().unwrap()
    }
}

fn serve(stream: TcpStream, act: Act, log: &Mutex<Vec<Received>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut headers = Vec::new();
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let line = line.trim_end().to_string();
        if line.is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
        headers.push(line);
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    let body = serde_json::from_slice(&body).unwrap();
    log.lock().unwrap().push(Received { at: Instant::now(), headers, body });
    let mut stream = stream;
    match act {
        Act::Respond(raw) => {
            let _ = stream.write_all(raw.as_bytes());
        }
        Act::Hold => {
            // Returns when the client, having timed out, closes the connection.
            let _ = reader.read(&mut [0; 1]);
        }
    }
}

fn http(status: &str, headers: &[&str], content_type: &str, body: &str) -> Act {
    let mut raw = format!("HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n", body.len());
    for h in headers {
        raw.push_str(h);
        raw.push_str("\r\n");
    }
    raw.push_str("Connection: close\r\n\r\n");
    raw.push_str(body);
    Act::Respond(raw)
}

fn json_reply(content: &str, prompt: u64, completion: u64) -> Act {
    let body = json!({"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
                      "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}});
    http("200 OK", &[], "application/json", &body.to_string())
}

fn config(url: &str) -> ProviderConfig {
    let mut c = ProviderConfig::new(url, "test-model").unwrap();
    c.stream = false;
    c.backoff_base_s = 0.01;
    c.backoff_cap_s = 0.05;
    c.timeout_s = 5.0;
    c
}

fn request(text: &str) -> Request {
    Request {
        model: "test-model".into(),
        messages: vec![Message::system("be brief"), Message::user(text)],
        tools: vec![],
        params: Params { temperature: Some(0.0), max_tokens: Some(4096), seed: Some(42) },
    }
}

fn scope() -> Scope {
    Scope { problem: "level1/a.py".into(), role: "planner".into(), task: String::new() }
}

fn client(c: ProviderConfig, journal: &Path, run: i64, mode: Mode, limits: Limits) -> (Client, Arc<Meter>, Arc<Cache>) {
    let meter = Arc::new(Meter::new(limits));
    let cache = Arc::new(Cache::open(journal, run, mode).unwrap());
    (Client::new(c, meter.clone(), cache.clone()), meter, cache)
}

#[test]
fn retry_after_is_honoured_then_the_reply_comes() {
    let server = Server::start(vec![
        http("429 Too Many Requests", &["Retry-After: 1"], "application/json", "{}"),
        json_reply("ok", 3, 2),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&server.url);
    c.backoff_cap_s = 0.25;
    c.api_key = Some("sk-test".into());
    let (client, _, _) = client(c, &dir.path().join("j.db"), 1, Mode::Record, Limits::default());
    let answer = client.chat(&request("hi"), &scope()).unwrap();
    assert_eq!((answer.reply.content.as_str(), answer.attempts), ("ok", 2));
    let stats = client.stats();
    assert_eq!((stats.attempts, stats.retries, stats.calls, stats.tokens), (2, 1, 1, 5));
    let requests = server.requests();
    let waited = requests[1].at - requests[0].at;
    // Retry-After: 1, capped at 0.25 s (the base backoff alone would be 0.01 s).
    assert!(waited >= Duration::from_millis(250), "waited {waited:?}");
    assert!(waited < Duration::from_millis(1000), "the cap was not applied: {waited:?}");
    assert!(requests[0]
        .headers
        .iter()
        .any(|h| h == "authorization: Bearer sk-test" || h == "Authorization: Bearer sk-test"));
}

#[test]
fn server_errors_until_exhausted_name_the_attempts() {
    let server = Server::start(vec![
        http("503 Service Unavailable", &[], "text/plain", "overloaded"),
        http("502 Bad Gateway", &[], "text/html", "<html>bad gateway</html>"),
        http("500 Internal Server Error", &[], "application/json", r#"{"error":"CUDA out of memory"}"#),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("j.db");
    let mut c = config(&server.url);
    c.max_attempts = 3;
    let (client, meter, cache) = client(c, &journal, 1, Mode::Record, Limits::default());
    let e = client.chat(&request("hi"), &scope()).unwrap_err();
    match &e {
        LlmError::Exhausted { attempts, last, .. } => {
            assert_eq!(*attempts, 3);
            assert!(last.contains("HTTP 500") && last.contains("CUDA out of memory"), "{last}");
        }
        other => panic!("expected Exhausted, got {other}"),
    }
    assert!(e.to_string().contains("gave up after 3 attempts"), "{e}");
    assert_eq!(server.requests().len(), 3);
    assert!(cache.calls(1).unwrap().is_empty(), "errors are never cached");
    assert!(cache.failures(1).unwrap()[0].error.contains("gave up after 3 attempts"));
    assert_eq!(meter.spent().total.calls, 0);
    assert_eq!(client.stats().failures, 1);
}

#[test]
fn a_status_not_retried_fails_at_once_with_the_body() {
    let server =
        Server::start(vec![http("401 Unauthorized", &[], "application/json", r#"{"error":{"message":"bad key"}}"#)]);
    let dir = tempfile::tempdir().unwrap();
    let (client, _, _) = client(config(&server.url), &dir.path().join("j.db"), 1, Mode::Record, Limits::default());
    let e = client.chat(&request("hi"), &scope()).unwrap_err();
    assert!(matches!(&e, LlmError::Status { status: 401, body, .. } if body.contains("bad key")), "{e}");
    assert_eq!(client.stats().attempts, 1);
}

#[test]
fn a_timeout_is_retried() {
    let server = Server::start(vec![Act::Hold, json_reply("late but fine", 1, 1)]);
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&server.url);
    c.timeout_s = 0.3;
    let (client, _, _) = client(c, &dir.path().join("j.db"), 1, Mode::Record, Limits::default());
    let answer = client.chat(&request("hi"), &scope()).unwrap();
    assert_eq!((answer.reply.content.as_str(), answer.attempts), ("late but fine", 2));
    assert_eq!(client.stats().retries, 1);
    let requests = server.requests();
    assert!(requests[1].at - requests[0].at >= Duration::from_millis(300), "the retry came before the timeout");
}

#[test]
fn a_timeout_every_time_is_exhausted_and_says_so() {
    let server = Server::start(vec![Act::Hold, Act::Hold]);
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&server.url);
    c.timeout_s = 0.2;
    c.max_attempts = 2;
    let (client, _, _) = client(c, &dir.path().join("j.db"), 1, Mode::Record, Limits::default());
    let e = client.chat(&request("hi"), &scope()).unwrap_err();
    assert!(matches!(&e, LlmError::Exhausted { attempts: 2, last, .. } if last.contains("timed out")), "{e}");
}

const SSE: &str = concat!(
    ": keep-alive\r\n\r\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Writing\"}}]}\r\n\r\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_w\",\"type\":\"function\",\"function\":{\"name\":\"write_kernel\",\"arguments\":\"{\\\"co\"}}]}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"de\\\": \\\"def k\"}}]}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"(): pass\\\"}\"}}]}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":12,\"total_tokens\":42}}\n\n",
    "data: [DONE]\n\n",
);

/// A stream the server starts answering and cuts off: 40 characters of content, no finish
/// reason, no `[DONE]`.
const CUT_SSE: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"0123456789012345678901234567890123456789\"}}]}\n\n";

#[test]
fn a_stream_cut_off_is_retried_and_charged_what_arrived() {
    let server = Server::start(vec![http("200 OK", &[], "text/event-stream", CUT_SSE), json_reply("whole", 30, 5)]);
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&server.url);
    c.stream = true;
    c.price = Some(Price { input_usd_per_mtok: 1000.0, output_usd_per_mtok: 2000.0 });
    let (client, meter, cache) = client(c, &dir.path().join("j.db"), 1, Mode::Record, Limits::default());
    let req = request("go");
    let answer = client.chat(&req, &scope()).unwrap();
    assert_eq!((answer.reply.content.as_str(), answer.attempts), ("whole", 2));
    let row = &cache.calls(1).unwrap()[0];
    // The cut-off attempt: its prompt and 40 characters (10 tokens), estimated; then the reply's own.
    let wasted = wire::estimate_tokens(wire::prompt_chars(&req)) + 10;
    let stats = client.stats();
    assert_eq!((stats.tokens, stats.wasted_tokens, stats.retries), (35 + wasted, wasted, 1), "{stats:?}");
    let spent = meter.spent();
    assert_eq!((spent.total.calls, spent.total.tokens), (1, 35 + wasted));
    let wasted_usd = ((wasted - 10) as f64 * 1000.0 + 10.0 * 2000.0) / 1e6;
    assert!((spent.total.usd - ((30.0 * 1000.0 + 5.0 * 2000.0) / 1e6 + wasted_usd)).abs() < 1e-12, "{spent:?}");
    assert!((answer.usd - (30.0 * 1000.0 + 5.0 * 2000.0) / 1e6).abs() < 1e-12, "the answer's own cost");
    // The journal's row says what the call cost, the cut-off attempt's tokens in it (the report
    // and a --resume charge from the rows); the reply recorded is the whole one.
    assert_eq!((row.prompt_tokens + row.completion_tokens, row.estimated, row.attempts), (35 + wasted, true, 2));
    assert_eq!(row.reply().unwrap().usage.total(), 35);
    assert!((row.usd - spent.total.usd).abs() < 1e-12, "{} against {}", row.usd, spent.total.usd);
}

#[test]
fn attempts_cut_off_every_time_are_charged_though_the_call_fails() {
    let cut = || http("200 OK", &[], "text/event-stream", CUT_SSE);
    let server = Server::start(vec![cut(), cut()]);
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&server.url);
    c.stream = true;
    c.max_attempts = 2;
    let limits = Limits { run_tokens: Some(1_000_000), ..Limits::default() };
    let (cut_off, meter, _) = client(c, &dir.path().join("j.db"), 1, Mode::Record, limits);
    let req = request("go");
    let e = cut_off.chat(&req, &scope()).unwrap_err();
    assert!(matches!(&e, LlmError::Exhausted { attempts: 2, last, .. } if last.contains("before [DONE]")), "{e}");
    let each = wire::estimate_tokens(wire::prompt_chars(&req)) + 10;
    assert_eq!(meter.spent().total.tokens, 2 * each, "both attempts were billed");
    let stats = cut_off.stats();
    assert_eq!((stats.failures, stats.calls, stats.wasted_tokens), (1, 0, 2 * each), "{stats:?}");
    // A server that never answered (a timeout) costs nothing: nothing arrived.
    let server = Server::start(vec![Act::Hold]);
    let mut c = config(&server.url);
    (c.timeout_s, c.max_attempts) = (0.2, 1);
    let (held, meter, _) = client(c, &dir.path().join("k.db"), 1, Mode::Record, Limits::default());
    assert!(held.chat(&req, &scope()).is_err());
    assert_eq!((meter.spent().total.tokens, held.stats().wasted_tokens), (0, 0));
}

#[test]
fn a_stream_assembles_tool_call_fragments_and_reports_progress() {
    let server = Server::start(vec![http("200 OK", &[], "text/event-stream", SSE)]);
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&server.url);
    c.stream = true;
    let meter = Arc::new(Meter::new(Limits::default()));
    let cache = Arc::new(Cache::open(&dir.path().join("j.db"), 1, Mode::Record).unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let client = Client::builder(c, meter, cache)
        .progress(move |scope, p| log.lock().unwrap().push((scope.role.clone(), p.content_chars, p.argument_chars)))
        .build();
    let answer = client.chat(&request("write it"), &scope()).unwrap();
    let reply = &answer.reply;
    assert_eq!(reply.finish_reason, FinishReason::ToolCalls);
    assert_eq!(reply.tool_calls[0].id, "call_w");
    let expected = json!({"code": "def k(): pass"}).as_object().cloned().unwrap();
    assert_eq!(reply.tool_calls[0].arguments, Arguments::Object(expected));
    assert_eq!(reply.usage.total(), 42);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 6, "one progress call per chunk: {seen:?}");
    assert_eq!(seen[0], ("planner".to_string(), 7, 0));
    assert_eq!(seen[3], ("planner".to_string(), 7, r#"{"code": "def k(): pass"}"#.len()));
    let body = &server.requests()[0].body;
    assert_eq!((&body["stream"], &body["stream_options"]), (&json!(true), &json!({"include_usage": true})));
}

#[test]
fn a_rejected_seed_is_sent_once_more_without_it_and_never_again() {
    let rejected = r#"{"object":"error","message":"Unsupported parameter: 'seed' is not supported with this model.","type":"BadRequestError","code":400}"#;
    let server = Server::start(vec![
        http("400 Bad Request", &[], "application/json", rejected),
        json_reply("first", 1, 1),
        json_reply("second", 1, 1),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let (client, _, _) = client(config(&server.url), &dir.path().join("j.db"), 1, Mode::Record, Limits::default());
    let first = client.chat(&request("one"), &scope()).unwrap();
    assert_eq!((first.reply.content.as_str(), first.attempts), ("first", 2));
    let second = client.chat(&request("two"), &scope()).unwrap();
    assert_eq!((second.reply.content.as_str(), second.attempts), ("second", 1));
    let requests = server.requests();
    let seeds: Vec<Option<&Value>> = requests.iter().map(|r| r.body.get("seed")).collect();
    assert_eq!(seeds, [Some(&json!(42)), None, None]);
    let stats = client.stats();
    assert_eq!((stats.seed_rejected, stats.retries, stats.attempts), (1, 0, 3));
}

#[test]
fn a_budget_clamps_the_reply_and_stops_the_next_call() {
    let server = Server::start(vec![json_reply("spent it all", 40, 60)]);
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&server.url);
    c.price = Some(Price { input_usd_per_mtok: 1000.0, output_usd_per_mtok: 2000.0 });
    let limits = Limits { run_tokens: Some(100), ..Limits::default() };
    let (client, meter, _) = client(c, &dir.path().join("j.db"), 1, Mode::Record, limits);
    let req = request("go");
    let answer = client.chat(&req, &scope()).unwrap();
    assert!((answer.usd - (40.0 * 1000.0 + 60.0 * 2000.0) / 1e6).abs() < 1e-12);
    let prompt_estimate = wire::estimate_tokens(wire::prompt_chars(&req));
    assert_eq!(server.requests()[0].body["max_tokens"], json!(100 - prompt_estimate), "clamped to what is left");
    let e = client.chat(&request("more"), &scope()).unwrap_err();
    assert!(
        matches!(&e, LlmError::Budget { what, limit, spent } if what == "tokens of the run" && *limit == 100.0 && *spent == 100.0),
        "{e}"
    );
    assert_eq!(server.requests().len(), 1, "the refused call sent nothing");
    let spent = meter.spent();
    assert_eq!((spent.total.calls, spent.total.tokens), (1, 100));
    assert_eq!(spent.problems["level1/a.py"].tokens, 100);
}

#[test]
fn replay_answers_with_zero_tokens_and_refuses_new_requests() {
    let server = Server::start(vec![json_reply("plan A", 10, 20), json_reply("plan B", 10, 30), json_reply("", 10, 0)]);
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.db");
    let (recorder, _, cache) = client(config(&server.url), &journal, 1, Mode::Record, Limits::default());
    let req = request("plan");
    let a = recorder.chat(&req, &scope()).unwrap();
    let b = recorder.chat(&req, &scope()).unwrap();
    let empty = recorder.chat(&request("say nothing"), &scope()).unwrap();
    assert_eq!((a.reply.content.as_str(), b.reply.content.as_str()), ("plan A", "plan B"));
    assert!(empty.reply.is_empty() && empty.call == 0);
    assert_eq!(cache.calls(1).unwrap().len(), 2, "the empty reply is not cached");
    assert_eq!(cache.failures(1).unwrap()[0].error, "empty reply");
    drop(recorder);

    // Nothing listens at this URL: a replay that asked the provider would fail.
    let nowhere = config("http://127.0.0.1:9/v1");
    let limits = Limits { run_tokens: Some(1), ..Limits::default() };
    let (replayer, meter, cache) = client(nowhere.clone(), &journal, 2, Mode::Replay { from: 1 }, limits);
    let ra = replayer.chat(&req, &scope()).unwrap();
    let rb = replayer.chat(&req, &scope()).unwrap();
    assert_eq!((ra.reply.clone(), rb.reply.clone()), (a.reply, b.reply));
    assert!(ra.replayed && ra.attempts == 0 && ra.usd == 0.0);
    assert!(replayer.chat(&request("say nothing"), &scope()).unwrap().reply.is_empty(), "replayed as it was");
    let e = replayer.chat(&request("something new"), &scope()).unwrap_err();
    assert!(
        matches!(&e, LlmError::NotRecorded { run: 1, occurrence: 0, problem, role, .. } if problem == "level1/a.py" && role == "planner"),
        "{e}"
    );
    let stats = replayer.stats();
    assert_eq!((stats.calls, stats.replayed, stats.failures, stats.attempts, stats.tokens), (3, 3, 1, 0, 0));
    assert_eq!(meter.spent().total.tokens, 0);
    let rows = cache.calls(2).unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r.replayed && r.prompt_tokens == 0 && r.run == 2));
    drop(replayer);

    // The replayed run is itself replayable.
    let (again, _, _) = client(nowhere, &journal, 3, Mode::Replay { from: 2 }, Limits::default());
    assert_eq!(again.chat(&req, &scope()).unwrap().reply.content, "plan A");
    assert_eq!(again.chat(&req, &scope()).unwrap().reply.content, "plan B");
}

#[test]
fn resume_answers_what_the_killed_run_recorded_and_asks_the_rest() {
    let server = Server::start(vec![json_reply("before the kill", 10, 10), json_reply("after", 5, 5)]);
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.db");
    let (first, _, _) = client(config(&server.url), &journal, 1, Mode::Record, Limits::default());
    first.chat(&request("step 1"), &scope()).unwrap();
    drop(first);
    let (resumed, meter, cache) = client(config(&server.url), &journal, 2, Mode::Resume { from: 1 }, Limits::default());
    let one = resumed.chat(&request("step 1"), &scope()).unwrap();
    assert!(one.replayed && one.reply.content == "before the kill");
    let two = resumed.chat(&request("step 2"), &scope()).unwrap();
    assert!(!two.replayed && two.reply.content == "after");
    assert_eq!(server.requests().len(), 2);
    assert_eq!(meter.spent().total.tokens, 30, "the budget counts what the killed run spent");
    assert_eq!(resumed.stats().tokens, 10, "this process spent only the new call");
    assert_eq!(cache.calls(2).unwrap().len(), 2);
}

#[test]
fn a_server_that_cannot_be_reached_is_retried_then_named() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    drop(listener);
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&url);
    c.max_attempts = 2;
    let (client, _, _) = client(c, &dir.path().join("j.db"), 1, Mode::Record, Limits::default());
    let e = client.chat(&request("hi"), &scope()).unwrap_err();
    assert!(
        matches!(&e, LlmError::Exhausted { attempts: 2, url: u, .. } if u.ends_with("/v1/chat/completions")),
        "{e}"
    );
}

#[test]
fn callers_in_parallel_cannot_together_pass_a_budget() {
    // The first admitted call holds the whole run's allowance until it is charged, so exactly
    // one call reaches the server however the four threads interleave.
    let server = Server::start(vec![json_reply("one", 40, 60)]);
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits { run_tokens: Some(100), ..Limits::default() };
    let (client, meter, cache) = client(config(&server.url), &dir.path().join("j.db"), 1, Mode::Record, limits);
    let client = Arc::new(client);
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let client = client.clone();
            std::thread::spawn(move || client.chat(&request(&format!("executor {i}")), &scope()))
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let answered = results.iter().filter(|r| r.is_ok()).count();
    let refused = results.iter().filter(|r| matches!(r, Err(LlmError::Budget { .. }))).count();
    assert_eq!((answered, refused), (1, 3), "{results:?}");
    assert_eq!(server.requests().len(), 1);
    assert_eq!(meter.spent().total.tokens, 100);
    assert_eq!(cache.calls(1).unwrap().len(), 1);
}

#[test]
fn a_200_carrying_a_rate_limit_error_is_retried() {
    let error = r#"{"error":{"message":"Rate limit exceeded: free-models-per-min","code":429},"user_id":"u"}"#;
    let server = Server::start(vec![http("200 OK", &[], "application/json", error), json_reply("ok", 1, 1)]);
    let dir = tempfile::tempdir().unwrap();
    let (client, _, _) = client(config(&server.url), &dir.path().join("j.db"), 1, Mode::Record, Limits::default());
    let answer = client.chat(&request("hi"), &scope()).unwrap();
    assert_eq!((answer.reply.content.as_str(), answer.attempts), ("ok", 2));
}

#[test]
fn a_server_ignoring_stream_still_replies() {
    let server = Server::start(vec![json_reply("not streamed", 2, 2)]);
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&server.url);
    c.stream = true;
    let (client, _, _) = client(c, &dir.path().join("j.db"), 1, Mode::Record, Limits::default());
    assert_eq!(client.chat(&request("hi"), &scope()).unwrap().reply.content, "not streamed");
}

#[test]
fn resume_within_the_same_run_records_nothing_twice() {
    let server = Server::start(vec![json_reply("a", 1, 1), json_reply("b", 1, 1)]);
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.db");
    let (first, _, _) = client(config(&server.url), &journal, 7, Mode::Record, Limits::default());
    let a = first.chat(&request("a"), &scope()).unwrap();
    drop(first);
    let (resumed, _, cache) = client(config(&server.url), &journal, 7, Mode::Resume { from: 7 }, Limits::default());
    let again = resumed.chat(&request("a"), &scope()).unwrap();
    assert_eq!((again.call, again.reply.content.as_str()), (a.call, "a"));
    resumed.chat(&request("b"), &scope()).unwrap();
    let rows = cache.calls(7).unwrap();
    let contents: Vec<String> = rows.iter().map(|r| r.reply().unwrap().content).collect();
    assert_eq!(contents, ["a", "b"]);
}

#[test]
fn a_reasoning_model_gets_max_completion_tokens_and_no_temperature() {
    let server = Server::start(vec![json_reply("thought", 1, 1)]);
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&server.url);
    c.reasoning = true;
    let (client, _, _) = client(c, &dir.path().join("j.db"), 1, Mode::Record, Limits::default());
    client.chat(&request("think"), &scope()).unwrap();
    let body = &server.requests()[0].body;
    assert_eq!((body.get("temperature"), body.get("max_tokens")), (None, None));
    assert_eq!(
        (&body["max_completion_tokens"], &body["seed"], &body["model"]),
        (&json!(4096), &json!(42), &json!("test-model"))
    );
}
