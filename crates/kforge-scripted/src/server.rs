//! The server: an accept thread, a thread per connection, keep-alive, and per request the first
//! rule of the script that matches and has uses left.

use crate::http::{self, HttpRequest, Incoming};
use crate::respond::{self, Turn};
use crate::script::{Rule, Script};
use serde_json::{json, Value};
use std::fs::File;
use std::io::{self, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A running scripted endpoint. Dropping it shuts it down.
pub struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

/// What every connection thread shares.
struct Shared {
    script: Script,
    /// Uses left per rule (`u64::MAX`: unlimited); taking a use holds the lock, so concurrent
    /// requests never take the same one.
    uses: Mutex<Vec<u64>>,
    /// Requests read so far (chat completions and the other routes); the next one's number is this + 1.
    requests: AtomicU64,
    /// The model of the latest chat request (what GET /v1/models lists).
    model: Mutex<Option<String>>,
    log: Option<Mutex<File>>,
    stopping: AtomicBool,
    /// Woken at shutdown, so scripted delays end early.
    stop_signal: (Mutex<()>, Condvar),
    /// Each open connection (a handle to shut its socket down) and its thread.
    connections: Mutex<Vec<(TcpStream, JoinHandle<()>)>>,
}

/// How a served request ended for the connection.
enum After {
    KeepOpen,
    Close,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Server {
    /// Serve `script` on `listener` (already bound) until [`Server::shutdown`]. With `log`, every
    /// request is appended to that file (created, or appended to) as one JSON line, flushed,
    /// when it is read (before any scripted delay): `{"n", "path", "rule" (its name or null),
    /// "rule_index" (its index in the script or null),
    /// "status" (null when dropped), "dropped", "stream", "seed_sent", "request" (the body's
    /// JSON; its text when not JSON; null for GET routes)}`.
    pub fn start(listener: TcpListener, script: Script, log: Option<PathBuf>) -> io::Result<Server> {
        let addr = listener.local_addr()?;
        let log = match log {
            Some(path) => Some(Mutex::new(File::options().create(true).append(true).open(path)?)),
            None => None,
        };
        let uses = script.rules.iter().map(|r| if r.times == 0 { u64::MAX } else { r.times }).collect();
        let shared = Arc::new(Shared {
            script,
            uses: Mutex::new(uses),
            requests: AtomicU64::new(0),
            model: Mutex::new(None),
            log,
            stopping: AtomicBool::new(false),
            stop_signal: (Mutex::new(()), Condvar::new()),
            connections: Mutex::new(Vec::new()),
        });
        let accept_shared = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("scripted-accept".into())
            .spawn(move || accept_loop(listener, accept_shared))?;
        Ok(Server { addr, shared, accept: Some(accept) })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL a client is given: `http://ADDR/v1`.
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// How many requests it has read (every route, answered or not).
    pub fn requests_served(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Stop accepting, close every open connection (a scripted delay in progress ends early) and
    /// join the threads.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(accept) = self.accept.take() else { return };
        self.shared.stopping.store(true, Ordering::SeqCst);
        {
            let _guard = lock(&self.shared.stop_signal.0);
            self.shared.stop_signal.1.notify_all();
        }
        // Wake the accept thread: it sees `stopping` on the next connection.
        let _ = TcpStream::connect_timeout(&reachable(self.addr), Duration::from_secs(5));
        let _ = accept.join();
        let connections = std::mem::take(&mut *lock(&self.shared.connections));
        for (stream, _) in &connections {
            let _ = stream.shutdown(Shutdown::Both);
        }
        for (_, thread) in connections {
            let _ = thread.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An address that reaches a listener bound to `addr` (the loopback for an unspecified one).
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port()),
        _ => addr,
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else {
            // Out of descriptors or the like: back off a little instead of spinning.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let Ok(handle) = stream.try_clone() else { continue };
        let conn_shared = Arc::clone(&shared);
        let Ok(thread) = std::thread::Builder::new()
            .name("scripted-conn".into())
            .spawn(move || serve_connection(stream, conn_shared))
        else {
            continue;
        };
        let mut connections = lock(&shared.connections);
        connections.retain(|(_, t)| !t.is_finished());
        connections.push((handle, thread));
    }
}

/// Serve requests on one connection until the client closes it or asks to.
fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let Ok(write_half) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    let mut out = io::BufWriter::new(write_half);
    serve_requests(&mut reader, &mut out, &shared);
    // The accept thread keeps a handle to this socket (for shutdown): close it explicitly.
    let _ = out.get_ref().shutdown(Shutdown::Both);
}

/// Answer requests until the client closes the connection, asks to, or the server stops.
fn serve_requests(reader: &mut BufReader<TcpStream>, out: &mut io::BufWriter<TcpStream>, shared: &Shared) {
    loop {
        let after = match http::read_request(reader, out) {
            Ok(Incoming::Request(request)) => shared.answer(request, out),
            Ok(Incoming::Bad { status, message }) => {
                let body =
                    respond::error_body(&format!("scripted endpoint: {message}"), "invalid_request_error", None, None);
                http::write_response(out, status, "application/json", &[], body.to_string().as_bytes(), true)
                    .map(|_| After::Close)
            }
            Ok(Incoming::Closed) | Err(_) => return,
        };
        if !matches!(after, Ok(After::KeepOpen)) || shared.stopping.load(Ordering::SeqCst) {
            return;
        }
    }
}

/// What the chat route decided for one request, before it is written.
enum Answer<'a> {
    /// A whole body: JSON, or a rule's `body_raw` (`event_stream`: sent as text/event-stream,
    /// for a streamed request).
    Body { status: u16, body: Vec<u8>, retry_after_s: Option<u64>, event_stream: bool },
    /// A streamed reply: its server-sent events, `rule.chunk_delay_ms` apart.
    Stream { rule: &'a Rule, events: Vec<String> },
    /// Close the connection without answering.
    Drop,
}

impl Answer<'_> {
    /// An OpenAI-style JSON error.
    fn error(status: u16, message: &str, param: Option<&str>, code: Option<&str>) -> Answer<'static> {
        let body = respond::error_body(message, respond::error_kind(status), param, code);
        Answer::Body { status, body: body.to_string().into_bytes(), retry_after_s: None, event_stream: false }
    }

    /// The same answer with a `Retry-After` header (a body only).
    fn with_retry_after(mut self, seconds: Option<u64>) -> Self {
        if let Answer::Body { retry_after_s, .. } = &mut self {
            *retry_after_s = seconds;
        }
        self
    }

    /// The status logged (none for a dropped connection).
    fn status(&self) -> Option<u16> {
        match self {
            Answer::Body { status, .. } => Some(*status),
            Answer::Stream { .. } => Some(200),
            Answer::Drop => None,
        }
    }
}

/// One log line's facts besides the request body.
struct Logged<'a> {
    n: u64,
    path: &'a str,
    rule: Option<&'a Rule>,
    status: Option<u16>,
    stream: bool,
    seed_sent: bool,
}

/// Keep the connection open unless the client asked to close it.
fn after(close: bool) -> After {
    if close {
        After::Close
    } else {
        After::KeepOpen
    }
}

impl Shared {
    /// Route and answer one request.
    fn answer(&self, request: HttpRequest, out: &mut impl Write) -> io::Result<After> {
        let n = self.requests.fetch_add(1, Ordering::SeqCst) + 1;
        let (status, body) = match (request.method.as_str(), request.path.as_str()) {
            ("POST", "/v1/chat/completions" | "/chat/completions") => return self.chat(n, &request, out),
            ("GET", "/v1/models" | "/models") => {
                let model = lock(&self.model).clone().unwrap_or_else(|| "scripted".into());
                let entry = json!({"id": model, "object": "model", "created": 0, "owned_by": "kforge-scripted"});
                (200, json!({"object": "list", "data": [entry]}))
            }
            ("GET", "/health" | "/v1/health") => (200, json!({"status": "ok"})),
            (method, path) => {
                let routes = "POST /v1/chat/completions, GET /v1/models, GET /health";
                let message = format!("scripted endpoint: no route {method} {path} ({routes})");
                (404, respond::error_body(&message, "invalid_request_error", None, None))
            }
        };
        let logged =
            Logged { n, path: &request.path, rule: None, status: Some(status), stream: false, seed_sent: false };
        self.log(&logged, Value::Null)?;
        http::write_response(out, status, "application/json", &[], body.to_string().as_bytes(), request.close)?;
        Ok(after(request.close))
    }

    /// POST /v1/chat/completions: decide, log, wait the rule's delay, write.
    fn chat(&self, n: u64, request: &HttpRequest, out: &mut impl Write) -> io::Result<After> {
        let body: Value = match serde_json::from_slice(&request.body) {
            Ok(body) => body,
            Err(e) => {
                let message = format!("scripted endpoint: request {n}: the body is not valid JSON: {e}");
                let logged =
                    Logged { n, path: &request.path, rule: None, status: Some(400), stream: false, seed_sent: false };
                self.log(&logged, Value::String(String::from_utf8_lossy(&request.body).into_owned()))?;
                return self.write(Answer::error(400, &message, None, None), out, request.close);
            }
        };
        let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
        let seed_sent = body.get("seed").is_some_and(|s| !s.is_null());
        let (rule, answer) = self.decide(n, &body, stream, seed_sent);
        // Logged before the delay: a client that times out and retries finds its first attempt
        // in the log already.
        self.log(&Logged { n, path: &request.path, rule, status: answer.status(), stream, seed_sent }, body)?;
        if let Some(rule) = rule {
            self.pause(rule.delay_ms);
        }
        self.write(answer, out, request.close)
    }

    /// Write an answer (or, for [`Answer::Drop`], nothing).
    fn write(&self, answer: Answer, out: &mut impl Write, close: bool) -> io::Result<After> {
        match answer {
            Answer::Drop => return Ok(After::Close),
            Answer::Body { status, body, retry_after_s, event_stream } => {
                let extra: Vec<(&str, String)> =
                    retry_after_s.map(|s| ("Retry-After", s.to_string())).into_iter().collect();
                let kind = if event_stream { "text/event-stream" } else { "application/json" };
                http::write_response(out, status, kind, &extra, &body, close)?;
            }
            Answer::Stream { rule, events } => {
                http::start_chunked(out, "text/event-stream", close)?;
                for (i, event) in events.iter().enumerate() {
                    if i > 0 {
                        self.pause(rule.chunk_delay_ms);
                    }
                    http::write_chunk(out, event.as_bytes())?;
                }
                http::end_chunks(out)?;
            }
        }
        Ok(after(close))
    }

    /// The rule taken (if any) and the answer for a parsed chat request.
    fn decide(&self, n: u64, body: &Value, stream: bool, seed_sent: bool) -> (Option<&Rule>, Answer<'_>) {
        let Some(messages) = body.get("messages").and_then(Value::as_array) else {
            let message = format!("scripted endpoint: request {n}: the body has no \"messages\" array");
            return (None, Answer::error(400, &message, Some("messages"), None));
        };
        if self.script.reject_seed && seed_sent {
            let refusal = "Unsupported parameter: 'seed'";
            return (None, Answer::error(400, refusal, Some("seed"), Some("unsupported_parameter")));
        }
        let model = body.get("model").and_then(Value::as_str).unwrap_or("scripted").to_owned();
        *lock(&self.model) = Some(model.clone());
        let text = respond::messages_text(messages);
        let Some(rule) = self.take_rule(&text) else {
            let last = messages.last().map(|m| respond::messages_text(std::slice::from_ref(m))).unwrap_or_default();
            let begins: String = last.trim().chars().take(120).collect();
            let message = format!("scripted endpoint: no rule matches request {n}; the last message begins: {begins}");
            return (None, Answer::error(400, &message, None, None));
        };
        let include_usage = body.pointer("/stream_options/include_usage").and_then(Value::as_bool) == Some(true);
        let turn = Turn { n, model: &model, prompt: &text };
        (Some(rule), serve(rule, &turn, stream, include_usage))
    }

    /// The first rule, in file order, whose every `when` string occurs in `text` and that has a
    /// use left; one use is taken.
    fn take_rule(&self, text: &str) -> Option<&Rule> {
        let mut uses = lock(&self.uses);
        let (i, rule) = self
            .script
            .rules
            .iter()
            .enumerate()
            .find(|(i, rule)| uses[*i] > 0 && rule.when.iter().all(|w| text.contains(w.as_str())))?;
        if uses[i] != u64::MAX {
            uses[i] -= 1;
        }
        Some(rule)
    }

    /// Wait `ms` milliseconds, or less when the server shuts down.
    fn pause(&self, ms: u64) {
        if ms == 0 {
            return;
        }
        let deadline = Instant::now() + Duration::from_millis(ms);
        let (mutex, condvar) = &self.stop_signal;
        let mut guard = lock(mutex);
        while !self.stopping.load(Ordering::SeqCst) {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            guard = condvar.wait_timeout(guard, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Append one line to the log (when there is one), flushed.
    fn log(&self, logged: &Logged, request: Value) -> io::Result<()> {
        let Some(log) = &self.log else { return Ok(()) };
        let line = json!({
            "n": logged.n,
            "path": logged.path,
            "rule": logged.rule.and_then(|r| r.name.as_deref()),
            "rule_index": logged.rule.and_then(|rule| self.script.rules.iter().position(|r| std::ptr::eq(r, rule))),
            "status": logged.status,
            "dropped": logged.status.is_none(),
            "stream": logged.stream,
            "seed_sent": logged.seed_sent,
            "request": request,
        });
        let mut file = lock(log);
        file.write_all(format!("{line}\n").as_bytes())?;
        file.flush()
    }
}

/// What `rule` answers: nothing, its raw body, its reply (whole or streamed), or its error status.
fn serve<'a>(rule: &'a Rule, turn: &Turn, stream: bool, include_usage: bool) -> Answer<'a> {
    let success = (200..300).contains(&rule.status);
    if rule.drop_connection {
        return Answer::Drop;
    }
    if let Some(raw) = &rule.body_raw {
        let body = raw.clone().into_bytes();
        return Answer::Body {
            status: rule.status,
            body,
            retry_after_s: rule.retry_after_s,
            event_stream: stream && success,
        };
    }
    match &rule.reply {
        Some(reply) if success && stream => {
            Answer::Stream { rule, events: respond::stream_events(reply, turn, include_usage) }
        }
        Some(reply) if success => {
            let body = respond::completion(reply, turn).to_string().into_bytes();
            Answer::Body { status: rule.status, body, retry_after_s: rule.retry_after_s, event_stream: false }
        }
        _ => {
            let name = rule.name.as_deref().unwrap_or("(unnamed)");
            let message =
                format!("scripted endpoint: rule {name} answers {} {}", rule.status, http::reason(rule.status));
            let code = (rule.status == 429).then_some("rate_limit_exceeded");
            Answer::error(rule.status, &message, None, code).with_retry_after(rule.retry_after_s)
        }
    }
}
