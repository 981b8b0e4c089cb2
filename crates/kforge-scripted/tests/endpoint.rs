//! The scripted endpoint over real HTTP: a small raw std client speaks to a running server.

use kforge_scripted::{Script, Server};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A running server over a script written into a temporary directory, with its log.
struct Fixture {
    server: Server,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Fixture {
    /// Start a server for `script`; `files` are written next to it first.
    fn start(script: Value, files: &[(&str, &str)]) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let path = dir.path().join("script.json");
        std::fs::write(&path, script.to_string()).unwrap();
        Fixture::load(&path, dir)
    }

    fn load(path: &Path, dir: tempfile::TempDir) -> Fixture {
        let script = Script::load(path).unwrap();
        let log = dir.path().join("requests.jsonl");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = Server::start(listener, script, Some(log.clone())).unwrap();
        Fixture { server, log, _dir: dir }
    }

    fn connect(&self) -> Client {
        Client::connect(&self.server)
    }

    /// POST a chat request on a fresh connection.
    fn chat(&self, body: &Value) -> Response {
        self.connect().post("/v1/chat/completions", body).unwrap()
    }

    fn log_lines(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }
}

/// A chat request whose system prompt is `system` and whose user message is `user`.
fn request(system: &str, user: &str) -> Value {
    json!({"model": "test-model", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]})
}

struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn message(&self) -> Value {
        self.json()["choices"][0]["message"].clone()
    }

    /// The `data:` payloads of a server-sent-events body.
    fn events(&self) -> Vec<String> {
        let text = String::from_utf8(self.body.clone()).unwrap();
        text.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_owned).collect()
    }
}

impl Client {
    fn connect(server: &Server) -> Client {
        let stream = TcpStream::connect(server.addr()).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Client { reader: BufReader::new(stream.try_clone().unwrap()), writer: stream }
    }

    fn send(&mut self, method: &str, path: &str, headers: &str, body: &[u8]) -> io::Result<Response> {
        let head = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n{headers}\r\n", body.len());
        self.writer.write_all(head.as_bytes())?;
        self.writer.write_all(body)?;
        self.read_response()
    }

    fn post(&mut self, path: &str, body: &Value) -> io::Result<Response> {
        self.send("POST", path, "Content-Type: application/json\r\n", body.to_string().as_bytes())
    }

    fn get(&mut self, path: &str) -> io::Result<Response> {
        self.send("GET", path, "", b"")
    }

    fn line(&mut self) -> io::Result<String> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
        }
        Ok(line.trim_end_matches(['\r', '\n']).to_owned())
    }

    fn read_response(&mut self) -> io::Result<Response> {
        let status_line = self.line()?;
        let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status line");
        let mut headers = Vec::new();
        loop {
            let line = self.line()?;
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').unwrap();
            headers.push((name.trim().to_owned(), value.trim().to_owned()));
        }
        let mut response = Response { status, headers, body: Vec::new() };
        if status < 200 {
            // An interim answer (100 Continue) has no body.
        } else if let Some(length) = response.header("content-length") {
            response.body = vec![0; length.parse().unwrap()];
            self.reader.read_exact(&mut response.body)?;
        } else if response.header("transfer-encoding") == Some("chunked") {
            loop {
                let size = usize::from_str_radix(&self.line()?, 16).unwrap();
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk)?;
                if size == 0 {
                    break;
                }
                response.body.extend_from_slice(&chunk[..size]);
            }
        } else {
            self.reader.read_to_end(&mut response.body)?;
        }
        Ok(response)
    }

    /// True when the server closed the connection (a read gives end of input).
    fn closed_by_server(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.reader.read(&mut byte), Ok(0))
    }
}

#[test]
fn a_plain_reply_with_a_tool_call_from_a_file() {
    let kernel = "class ModelNew:\n    pass\n";
    let f = Fixture::start(
        json!({"rules": [{"name": "exec", "when": ["kforge executor", "vector_add"],
                          "reply": {"content": "done", "tool_calls": [{"name": "submit_kernel",
                                    "arguments_files": {"source": "kernels/ok.py"}}]}}]}),
        &[("kernels/ok.py", kernel)],
    );
    let r = f.chat(&request("kforge executor v1\nWrite the kernel.", "problem vector_add"));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body = r.json();
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["object"], "chat.completion");
    let message = r.message();
    assert_eq!(message["content"], "done");
    let call = &message["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "submit_kernel");
    let arguments: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"source": kernel}));
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    let usage = &body["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 0);
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap())
    );
    let log = f.log_lines();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["n"], 1);
    assert_eq!(log[0]["rule"], "exec");
    assert_eq!(log[0]["rule_index"], 0);
    assert_eq!(log[0]["status"], 200);
    assert_eq!(log[0]["stream"], false);
    assert_eq!(log[0]["seed_sent"], false);
    assert_eq!(log[0]["request"]["messages"][1]["content"], "problem vector_add");
    assert_eq!(f.server.requests_served(), 1);
}

#[test]
fn content_parts_reasoning_and_scripted_finish_and_usage() {
    let f = Fixture::start(
        json!({"rules": [
            {"reply": {"content": "in parts", "content_parts": true, "reasoning_content": "thinking",
                       "finish_reason": "eos", "usage": {"prompt_tokens": 10, "completion_tokens": 20}}},
            {"reply": {"content": "bare", "finish_reason": null, "usage": null}}]}),
        &[],
    );
    let r = f.chat(&request("kforge planner v1", "x"));
    let message = r.message();
    assert_eq!(message["content"], json!([{"type": "text", "text": "in parts"}]));
    assert_eq!(message["reasoning_content"], "thinking");
    assert!(message.get("tool_calls").is_none());
    let body = r.json();
    assert_eq!(body["choices"][0]["finish_reason"], "eos");
    assert_eq!(body["usage"], json!({"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}));
    let body = f.chat(&request("kforge planner v1", "x")).json();
    assert_eq!(body["choices"][0]["finish_reason"], Value::Null);
    assert!(body.get("usage").is_none());
}

#[test]
fn malformed_arguments_and_arguments_as_an_object() {
    let f = Fixture::start(
        json!({"rules": [
            {"when": ["raw"], "times": 0, "reply": {"tool_calls": [{"name": "submit_kernel", "arguments_raw": "{not json"}]}},
            {"when": ["object"], "times": 0, "reply": {"tool_calls": [{"name": "read_kernel",
                "arguments": {"name": "triton_poi_0"}, "arguments_as_object": true}]}}]}),
        &[],
    );
    let call = f.chat(&request("kforge executor v1", "raw")).message()["tool_calls"][0].clone();
    assert_eq!(call["function"]["arguments"], "{not json");
    let call = f.chat(&request("kforge planner v1", "object")).message()["tool_calls"][0].clone();
    assert_eq!(call["function"]["arguments"], json!({"name": "triton_poi_0"}));
}

#[test]
fn error_statuses_with_retry_after_then_success() {
    let f = Fixture::start(
        json!({"rules": [
            {"name": "limited", "status": 429, "retry_after_s": 7},
            {"name": "broken", "status": 500},
            {"name": "unavailable", "status": 503},
            {"name": "ok", "reply": {"content": "finally"}}]}),
        &[],
    );
    let r = f.chat(&request("kforge planner v1", "x"));
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("7"));
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("rule limited answers 429"));
    let r = f.chat(&request("kforge planner v1", "x"));
    assert_eq!(r.status, 500);
    assert_eq!(r.header("retry-after"), None);
    assert_eq!(r.json()["error"]["type"], "server_error");
    assert_eq!(f.chat(&request("kforge planner v1", "x")).status, 503);
    assert_eq!(f.chat(&request("kforge planner v1", "x")).message()["content"], "finally");
    let statuses: Vec<Value> = f.log_lines().iter().map(|l| l["status"].clone()).collect();
    assert_eq!(statuses, vec![json!(429), json!(500), json!(503), json!(200)]);
}

#[test]
fn a_dropped_connection_answers_nothing() {
    let f = Fixture::start(json!({"rules": [{"name": "drop", "drop_connection": true}]}), &[]);
    let mut client = f.connect();
    let error = client.post("/v1/chat/completions", &request("kforge planner v1", "x")).err().expect("no answer");
    assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
    let log = f.log_lines();
    assert_eq!(log[0]["rule"], "drop");
    assert_eq!(log[0]["status"], Value::Null);
    assert_eq!(log[0]["dropped"], true);
}

#[test]
fn body_raw_is_served_as_given() {
    let f = Fixture::start(
        json!({"rules": [{"body_raw": "{\"choices\": [ {\"mess"}, {"status": 502, "body_raw": "<html>bad gateway</html>"}]}),
        &[],
    );
    let r = f.chat(&request("kforge planner v1", "x"));
    assert_eq!((r.status, r.body.as_slice()), (200, &b"{\"choices\": [ {\"mess"[..]));
    let r = f.chat(&request("kforge planner v1", "x"));
    assert_eq!((r.status, r.body.as_slice()), (502, &b"<html>bad gateway</html>"[..]));
}

#[test]
fn a_delay_lets_the_client_time_out() {
    let f = Fixture::start(json!({"rules": [{"name": "slow", "delay_ms": 60000, "reply": {"content": "late"}}]}), &[]);
    let mut client = f.connect();
    client.writer.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let started = Instant::now();
    let error = client.post("/v1/chat/completions", &request("kforge planner v1", "x")).err().expect("a timeout");
    assert!(matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut), "{error}");
    assert!(started.elapsed() < Duration::from_secs(30));
    // Shutting down ends the scripted delay instead of waiting it out.
    let started = Instant::now();
    f.server.shutdown();
    assert!(started.elapsed() < Duration::from_secs(30));
    let log = std::fs::read_to_string(&f.log).unwrap();
    let lines: Vec<Value> = log.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["rule"], "slow");
}

/// A tool call reassembled from a stream's deltas: id, name, arguments.
type StreamedCall = (String, String, String);

/// The content, the tool calls, the finish reason and the usage of a streamed reply.
fn reassemble(events: &[String]) -> (String, Vec<StreamedCall>, Value, Option<Value>) {
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let (mut content, mut calls, mut finish, mut usage) =
        (String::new(), Vec::<StreamedCall>::new(), Value::Null, None);
    for event in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(event).unwrap();
        assert_eq!(chunk["object"], "chat.completion.chunk");
        if chunk.get("usage").is_some() {
            usage = Some(chunk["usage"].clone());
        }
        let Some(choice) = chunk["choices"].get(0) else { continue };
        content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        for delta in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let index = delta["index"].as_u64().unwrap() as usize;
            if index == calls.len() {
                calls.push((
                    delta["id"].as_str().unwrap().into(),
                    delta["function"]["name"].as_str().unwrap().into(),
                    String::new(),
                ));
            }
            calls[index].2.push_str(delta["function"]["arguments"].as_str().unwrap());
        }
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
    }
    (content, calls, finish, usage)
}

#[test]
fn a_stream_reassembles_to_the_same_text_and_tool_call() {
    let source = "import torch\n".repeat(10);
    let script = json!({"rules": [{"name": "exec", "times": 2, "chunk_delay_ms": 5,
        "reply": {"content": "Here is a kernel that adds two vectors.",
                  "tool_calls": [{"name": "submit_kernel", "arguments": {"source": source}}]}}]});
    let f = Fixture::start(script, &[]);
    let mut body = request("kforge executor v1", "x");
    let plain = f.chat(&body);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let started = Instant::now();
    let streamed = f.chat(&body);
    let took = started.elapsed();
    assert_eq!(streamed.status, 200);
    assert_eq!(streamed.header("content-type"), Some("text/event-stream"));
    let events = streamed.events();
    let (content, calls, finish, usage) = reassemble(&events);
    let message = plain.message();
    assert_eq!(content, message["content"].as_str().unwrap());
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].1, "submit_kernel");
    assert_eq!(calls[0].2, message["tool_calls"][0]["function"]["arguments"].as_str().unwrap());
    let arguments: Value = serde_json::from_str(&calls[0].2).unwrap();
    assert_eq!(arguments["source"], source);
    assert_eq!(finish, "tool_calls");
    assert_eq!(usage, Some(plain.json()["usage"].clone()));
    // Content in pieces, arguments in fragments, a chunk delay between every two events.
    assert!(events.len() > 10, "{} events", events.len());
    assert!(took >= Duration::from_millis(5 * (events.len() as u64 - 1)), "{took:?}");
    assert_eq!(f.log_lines()[1]["stream"], true);
}

#[test]
fn a_stream_without_include_usage_has_no_usage_chunk() {
    let f = Fixture::start(json!({"rules": [{"reply": {"content": "short"}}]}), &[]);
    let mut body = request("kforge planner v1", "x");
    body["stream"] = json!(true);
    let (content, calls, finish, usage) = reassemble(&f.chat(&body).events());
    assert_eq!((content.as_str(), calls.len(), finish, usage), ("short", 0, json!("stop"), None));
}

#[test]
fn no_matching_rule_is_a_400_naming_the_request() {
    let f = Fixture::start(json!({"rules": [{"when": ["kforge planner"], "reply": {"content": "p"}}]}), &[]);
    assert_eq!(f.chat(&request("kforge planner v1", "x")).status, 200);
    let r = f.chat(&request("kforge executor v1", "write the kernel for problem vector_add"));
    assert_eq!(r.status, 400);
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert_eq!(
        message,
        "scripted endpoint: no rule matches request 2; the last message begins: write the kernel for problem vector_add"
    );
    assert_eq!(f.log_lines()[1]["rule"], Value::Null);
    assert_eq!(f.log_lines()[1]["rule_index"], Value::Null);
}

#[test]
fn times_are_counted_and_zero_is_unlimited() {
    let f = Fixture::start(
        json!({"rules": [
            {"name": "twice", "when": ["kforge planner"], "times": 2, "reply": {"content": "a"}},
            {"name": "always", "when": ["kforge planner"], "times": 0, "reply": {"content": "b"}}]}),
        &[],
    );
    let contents: Vec<Value> =
        (0..5).map(|_| f.chat(&request("kforge planner v1", "x")).message()["content"].clone()).collect();
    assert_eq!(contents, ["a", "a", "b", "b", "b"].map(Value::from).to_vec());
    let rules: Vec<Value> = f.log_lines().iter().map(|l| l["rule"].clone()).collect();
    assert_eq!(rules, ["twice", "twice", "always", "always", "always"].map(Value::from).to_vec());
    let indices: Vec<Value> = f.log_lines().iter().map(|l| l["rule_index"].clone()).collect();
    assert_eq!(indices, [0, 0, 1, 1, 1].map(Value::from).to_vec());
}

#[test]
fn a_server_that_rejects_seed() {
    let f = Fixture::start(json!({"reject_seed": true, "rules": [{"name": "once", "reply": {"content": "ok"}}]}), &[]);
    let mut body = request("kforge planner v1", "x");
    body["seed"] = json!(42);
    let r = f.chat(&body);
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["message"], "Unsupported parameter: 'seed'");
    assert_eq!(r.json()["error"]["param"], "seed");
    body.as_object_mut().unwrap().remove("seed");
    // The refused request took no use of the single-use rule.
    assert_eq!(f.chat(&body).message()["content"], "ok");
    let log = f.log_lines();
    assert_eq!((log[0]["seed_sent"].clone(), log[0]["status"].clone()), (json!(true), json!(400)));
    assert_eq!((log[1]["seed_sent"].clone(), log[1]["rule"].clone()), (json!(false), json!("once")));
}

#[test]
fn keep_alive_serves_several_requests_on_one_connection() {
    let f = Fixture::start(json!({"rules": [{"times": 0, "reply": {"content": "again"}}]}), &[]);
    let mut client = f.connect();
    for _ in 0..2 {
        let r = client.post("/v1/chat/completions", &request("kforge planner v1", "x")).unwrap();
        assert_eq!(r.header("connection"), Some("keep-alive"));
        assert_eq!(r.message()["content"], "again");
    }
    let mut body = request("kforge planner v1", "x");
    body["stream"] = json!(true);
    assert_eq!(reassemble(&client.post("/chat/completions", &body).unwrap().events()).0, "again");
    let r = client.send("GET", "/health", "Connection: close\r\n", b"").unwrap();
    assert_eq!((r.status, r.header("connection")), (200, Some("close")));
    assert!(client.closed_by_server());
    assert_eq!(f.server.requests_served(), 4);
}

#[test]
fn concurrent_requests_never_share_a_single_use_rule() {
    const N: usize = 8;
    let rules: Vec<Value> = (0..N)
        .map(|i| json!({"name": format!("r{i}"), "when": ["kforge executor"], "reply": {"content": format!("{i}")}}))
        .collect();
    let f = Fixture::start(json!({"rules": rules}), &[]);
    let barrier = std::sync::Barrier::new(N);
    let contents: BTreeSet<String> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..N)
            .map(|_| {
                s.spawn(|| {
                    let mut client = f.connect();
                    barrier.wait();
                    let r = client.post("/v1/chat/completions", &request("kforge executor v1", "x")).unwrap();
                    r.message()["content"].as_str().unwrap().to_owned()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert_eq!(contents, (0..N).map(|i| i.to_string()).collect());
    assert_eq!(f.chat(&request("kforge executor v1", "x")).status, 400);
}

#[test]
fn other_routes_and_bad_requests() {
    let f = Fixture::start(json!({"rules": [{"times": 0, "reply": {"content": "c"}}]}), &[]);
    let mut client = f.connect();
    assert_eq!(client.get("/health").unwrap().json(), json!({"status": "ok"}));
    assert_eq!(client.get("/v1/models").unwrap().json()["data"][0]["id"], "scripted");
    client.post("/v1/chat/completions", &request("kforge planner v1", "x")).unwrap();
    assert_eq!(client.get("/v1/models").unwrap().json()["data"][0]["id"], "test-model");
    let r = client.get("/v2/other").unwrap();
    assert_eq!(r.status, 404);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("no route GET /v2/other"));
    let r = client.send("POST", "/v1/chat/completions", "", b"{nope").unwrap();
    assert_eq!(r.status, 400);
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.starts_with("scripted endpoint: request 6: the body is not valid JSON"), "{message}");
    assert_eq!(f.log_lines()[5]["request"], "{nope");
    let r = client.post("/v1/chat/completions", &json!({"model": "m"})).unwrap();
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("no \"messages\" array"));
    let r = client.send("POST", "/v1/chat/completions", "Transfer-Encoding: chunked\r\n", b"").unwrap();
    assert_eq!(r.status, 411);
    assert!(client.closed_by_server());
}

#[test]
fn the_vector_add_fixture_serves_a_planner_executor_summarizer_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vector_add/script.json");
    let f = Fixture::load(&path, dir);
    let planner = request("kforge planner v1\nPlan.", "problem vector_add");
    let r = f.chat(&planner);
    assert_eq!((r.status, r.header("retry-after")), (429, Some("0")));
    let call = f.chat(&planner).message()["tool_calls"][0].clone();
    assert_eq!(call["function"]["name"], "submit_plans");
    let arguments: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    let strategies: Vec<&str> =
        arguments["plans"].as_array().unwrap().iter().map(|p| p["strategy"].as_str().unwrap()).collect();
    assert_eq!(strategies, ["triton-add", "torch-shortcut", "broken-syntax"]);
    let source = |strategy: &str| {
        let call =
            f.chat(&request("kforge executor v1", &format!("plan: {strategy}"))).message()["tool_calls"][0].clone();
        assert_eq!(call["function"]["name"], "submit_kernel");
        call["function"]["arguments"].as_str().unwrap().to_owned()
    };
    assert!(source("triton-add").contains("@triton.jit"));
    assert!(source("torch-shortcut").contains("torch.add(x, y)"));
    assert!(serde_json::from_str::<Value>(&source("broken-syntax")).is_err());
    assert!(source("broken-syntax").contains("def forward(self, x, y)\\n"));
    let call = f.chat(&request("kforge summarizer v1", "attempt")).message()["tool_calls"][0].clone();
    assert_eq!(call["function"]["name"], "record_experience");
}

#[test]
fn expect_100_continue_gets_an_interim_answer_before_the_body() {
    let f = Fixture::start(json!({"rules": [{"reply": {"content": "after continue"}}]}), &[]);
    let mut client = f.connect();
    let body = request("kforge planner v1", "x").to_string();
    let head =
        format!("POST /v1/chat/completions HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n", body.len());
    client.writer.write_all(head.as_bytes()).unwrap();
    // The body is held back until the server asks for it.
    let interim = client.read_response().unwrap();
    assert_eq!(interim.status, 100);
    client.writer.write_all(body.as_bytes()).unwrap();
    assert_eq!(client.read_response().unwrap().message()["content"], "after continue");
}

#[test]
fn a_streamed_request_gets_errors_as_json_and_body_raw_as_an_event_stream() {
    let f = Fixture::start(
        json!({"rules": [{"status": 503, "retry_after_s": 2},
                         {"body_raw": "data: {\"choices\": [{\"delta\": {\"content\": \"cut\"\n\n"},
                         {"chunk_delay_ms": 1, "reply": {"reasoning_content": "think first", "content": "answer"}}]}),
        &[],
    );
    let mut body = request("kforge planner v1", "x");
    body["stream"] = json!(true);
    let r = f.chat(&body);
    assert_eq!(
        (r.status, r.header("content-type"), r.header("retry-after")),
        (503, Some("application/json"), Some("2"))
    );
    assert_eq!(r.json()["error"]["type"], "server_error");
    let r = f.chat(&body);
    assert_eq!((r.status, r.header("content-type")), (200, Some("text/event-stream")));
    assert_eq!(r.events(), vec!["{\"choices\": [{\"delta\": {\"content\": \"cut\"".to_owned()]);
    let events = f.chat(&body).events();
    let reasoning: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(reasoning, "think first");
    assert_eq!(reassemble(&events).0, "answer");
}

#[test]
fn shutdown_closes_idle_connections_and_stops_accepting() {
    let script =
        Script::parse(r#"{"rules": [{"times": 0, "reply": {"content": "c"}}]}"#, "s.json".as_ref(), ".".as_ref())
            .unwrap();
    // Bound to the unspecified address: shutdown wakes the accept thread through the loopback.
    let server = Server::start(std::net::TcpListener::bind("0.0.0.0:0").unwrap(), script, None).unwrap();
    let port = server.addr().port();
    assert!(server.url().ends_with(&format!(":{port}/v1")));
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut client = Client { reader: BufReader::new(stream.try_clone().unwrap()), writer: stream };
    assert_eq!(client.get("/health").unwrap().status, 200);
    server.shutdown();
    assert!(client.closed_by_server());
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}
