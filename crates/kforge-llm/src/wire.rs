//! The OpenAI chat-completions wire format: the request body made from a [`Request`], and a
//! [`Reply`] read tolerantly from a whole body or from a server-sent-event stream.
//!
//! Deviations of real servers this reads: content as a string, as an array of text parts or
//! `null`; `tool_calls` `null`, absent or `[]`; arguments as a JSON string or as an object;
//! tool calls without ids (named `call_{index}`); a legacy `function_call`; `finish_reason`
//! `null`, absent or unknown; no `usage` (estimated, 4 characters a token); a 200 body or a
//! stream chunk that holds `{"error": …}`; comments, keep-alives and CRLF in streams.

use serde_json::{json, Map, Value};

use crate::chat::{Arguments, FinishReason, Message, Reply, Request, Role, ToolCall, Usage};

/// Why a body is not a reply.
#[derive(Debug, Clone, PartialEq)]
pub enum WireError {
    /// The server answered with `{"error": …}` (`code`: its numeric code, when it gave one).
    Server { code: Option<u16>, message: String },
    /// Not a chat completion; what is wrong with it.
    Bad(String),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Server { code: Some(c), message } => write!(f, "the server sent an error ({c}): {message}"),
            WireError::Server { code: None, message } => write!(f, "the server sent an error: {message}"),
            WireError::Bad(p) => f.write_str(p),
        }
    }
}

/// How the body is made beyond the request itself.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BodyOptions {
    /// `max_completion_tokens` instead of `max_tokens`; no temperature.
    pub reasoning: bool,
    pub stream: bool,
    /// Send the request's seed (false once the server rejected one).
    pub seed: bool,
    /// The reply's length limit actually sent (the request's, clamped to the budget).
    pub max_tokens: Option<u64>,
}

/// The JSON body for `request`.
pub fn body(request: &Request, options: &BodyOptions) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    body.insert("messages".into(), Value::Array(request.messages.iter().map(message).collect()));
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters}})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let (Some(t), false) = (request.params.temperature, options.reasoning) {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(n) = options.max_tokens {
        let name = if options.reasoning { "max_completion_tokens" } else { "max_tokens" };
        body.insert(name.into(), json!(n));
    }
    if let (Some(s), true) = (request.params.seed, options.seed) {
        body.insert("seed".into(), json!(s));
    }
    if options.stream {
        body.insert("stream".into(), json!(true));
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Value::Object(body)
}

fn message(m: &Message) -> Value {
    let role = match m.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut out = Map::new();
    out.insert("role".into(), json!(role));
    out.insert("content".into(), json!(m.content));
    if !m.tool_calls.is_empty() {
        let calls: Vec<Value> = m
            .tool_calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": arguments_text(&c.arguments)}}))
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(id) = &m.tool_call_id {
        out.insert("tool_call_id".into(), json!(id));
    }
    Value::Object(out)
}

/// Arguments as the JSON string the wire carries (malformed ones as they came).
pub fn arguments_text(a: &Arguments) -> String {
    match a {
        Arguments::Object(map) => Value::Object(map.clone()).to_string(),
        Arguments::Malformed { raw, .. } => raw.clone(),
    }
}

/// Reads arguments sent as text: a JSON object, else why not. Empty text is no arguments.
pub fn parse_arguments(raw: &str) -> Arguments {
    if raw.trim().is_empty() {
        return Arguments::Object(Map::new());
    }
    match serde_json::from_str::<Value>(raw) {
        Ok(Value::Object(map)) => Arguments::Object(map),
        Ok(other) => {
            Arguments::Malformed { raw: raw.to_string(), problem: format!("not a JSON object but {}", kind(&other)) }
        }
        Err(e) => Arguments::Malformed { raw: raw.to_string(), problem: format!("invalid JSON: {e}") },
    }
}

fn arguments_value(v: Option<&Value>) -> Arguments {
    match v {
        None | Some(Value::Null) => Arguments::Object(Map::new()),
        Some(Value::String(s)) => parse_arguments(s),
        Some(Value::Object(map)) => Arguments::Object(map.clone()),
        Some(other) => {
            Arguments::Malformed { raw: other.to_string(), problem: format!("not a JSON object but {}", kind(other)) }
        }
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The finish reason as this client names it (known aliases of other APIs included).
pub fn finish_reason(v: Option<&Value>) -> FinishReason {
    match v.and_then(Value::as_str) {
        None => FinishReason::Missing,
        Some("stop" | "end_turn" | "stop_sequence") => FinishReason::Stop,
        Some("length" | "max_tokens") => FinishReason::Length,
        Some("tool_calls" | "function_call" | "tool_use") => FinishReason::ToolCalls,
        Some("content_filter") => FinishReason::ContentFilter,
        Some(other) => FinishReason::Other(other.to_string()),
    }
}

/// Content as a string, as text parts, or `null`.
fn content_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.as_str()),
                Value::Object(o)
                    if matches!(o.get("type").and_then(Value::as_str), Some("text" | "output_text") | None) =>
                {
                    o.get("text").and_then(Value::as_str)
                }
                _ => None,
            })
            .collect(),
        _ => String::new(),
    }
}

/// The characters of a request that count as its prompt (for estimated usage).
pub fn prompt_chars(request: &Request) -> usize {
    let messages: usize = request
        .messages
        .iter()
        .map(|m| m.content.chars().count() + m.tool_calls.iter().map(call_chars).sum::<usize>())
        .sum();
    let tools: usize =
        request.tools.iter().map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len()).sum();
    messages + tools
}

fn call_chars(c: &ToolCall) -> usize {
    c.name.len() + arguments_text(&c.arguments).chars().count()
}

/// Tokens estimated from characters (4 a token, rounded up).
pub fn estimate_tokens(chars: usize) -> u64 {
    chars.div_ceil(4) as u64
}

/// What an attempt that gave no reply used, estimated: its prompt and the `completion_chars`
/// that arrived before it was cut off.
pub fn partial_usage(prompt_chars: usize, completion_chars: usize) -> Usage {
    Usage {
        prompt_tokens: estimate_tokens(prompt_chars),
        completion_tokens: estimate_tokens(completion_chars),
        estimated: true,
    }
}

fn estimated_usage(prompt_chars: usize, content: &str, calls: &[ToolCall]) -> Usage {
    let completion = content.chars().count() + calls.iter().map(call_chars).sum::<usize>();
    Usage {
        prompt_tokens: estimate_tokens(prompt_chars),
        completion_tokens: estimate_tokens(completion),
        estimated: true,
    }
}

/// The usage the server reported (`prompt_tokens`/`completion_tokens`, or `input_tokens`/
/// `output_tokens`), when it reported one.
fn reported_usage(v: Option<&Value>) -> Option<Usage> {
    let u = v?.as_object()?;
    let get = |a: &str, b: &str| u.get(a).or_else(|| u.get(b)).and_then(Value::as_u64);
    let prompt = get("prompt_tokens", "input_tokens");
    let completion = get("completion_tokens", "output_tokens");
    if prompt.is_none() && completion.is_none() {
        return None;
    }
    Some(Usage { prompt_tokens: prompt.unwrap_or(0), completion_tokens: completion.unwrap_or(0), estimated: false })
}

/// `{"error": …}` in a body, as a [`WireError::Server`].
fn server_error(v: &Value) -> Option<WireError> {
    let e = v.get("error")?;
    if e.is_null() {
        return None;
    }
    let message = match e {
        Value::String(s) => s.clone(),
        Value::Object(o) => {
            o.get("message").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| e.to_string())
        }
        other => other.to_string(),
    };
    let code = e
        .get("code")
        .and_then(|c| c.as_u64().or_else(|| c.as_str().and_then(|s| s.parse().ok())))
        .and_then(|c| u16::try_from(c).ok());
    Some(WireError::Server { code, message })
}

/// Reads a whole (non-streamed) body. `prompt_chars`: the request's, to estimate usage when
/// the server reports none.
pub fn parse_reply(body: &str, prompt_chars: usize) -> Result<Reply, WireError> {
    let v: Value = serde_json::from_str(body).map_err(|e| WireError::Bad(format!("invalid JSON: {e}")))?;
    if let Some(e) = server_error(&v) {
        return Err(e);
    }
    let Some(obj) = v.as_object() else {
        return Err(WireError::Bad(format!("the body is {}, not an object", kind(&v))));
    };
    let choice = match obj.get("choices") {
        Some(Value::Array(c)) if !c.is_empty() => &c[0],
        Some(Value::Array(_)) => return Err(WireError::Bad("no choices (`choices` is empty)".into())),
        Some(other) => return Err(WireError::Bad(format!("`choices` is {}, not an array", kind(other)))),
        None => return Err(WireError::Bad("no choices (the body has no `choices`)".into())),
    };
    let Some(message) = choice.get("message").filter(|m| m.is_object()) else {
        return Err(WireError::Bad("choices[0] has no `message` object".into()));
    };
    let content = content_text(message.get("content"));
    let mut tool_calls = match message.get("tool_calls") {
        Some(Value::Array(calls)) => calls.iter().enumerate().map(|(i, c)| tool_call(i, c)).collect(),
        _ => Vec::new(),
    };
    if let (true, Some(f)) = (tool_calls.is_empty(), message.get("function_call").filter(|f| f.is_object())) {
        tool_calls.push(tool_call(0, &json!({"function": f})));
    }
    let usage =
        reported_usage(obj.get("usage")).unwrap_or_else(|| estimated_usage(prompt_chars, &content, &tool_calls));
    Ok(Reply { content, tool_calls, finish_reason: finish_reason(choice.get("finish_reason")), usage })
}

fn tool_call(index: usize, c: &Value) -> ToolCall {
    let function = c.get("function");
    let name = function.and_then(|f| f.get("name")).and_then(Value::as_str).unwrap_or_default().to_string();
    ToolCall {
        id: call_id(c.get("id"), index),
        name,
        arguments: arguments_value(function.and_then(|f| f.get("arguments"))),
    }
}

fn call_id(v: Option<&Value>, index: usize) -> String {
    match v.and_then(Value::as_str) {
        Some(id) if !id.is_empty() => id.to_string(),
        _ => format!("call_{index}"),
    }
}

/// A reply being read from a server-sent-event stream, one line at a time.
#[derive(Debug, Default)]
pub struct Stream {
    content: String,
    calls: Vec<PartialCall>,
    finish: Option<Value>,
    usage: Option<Usage>,
    chunks: usize,
    done: bool,
}

#[derive(Debug, Default)]
struct PartialCall {
    index: Option<u64>,
    id: String,
    name: String,
    arguments: String,
}

/// What one line of a stream did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// Nothing (a blank line, a comment, an event name, a keep-alive).
    Nothing,
    /// A chunk was read.
    Chunk,
    /// `data: [DONE]`: the stream is over.
    Done,
}

impl Stream {
    /// Reads one line (its `\r\n` or `\n` included or not).
    pub fn line(&mut self, line: &str) -> Result<Line, WireError> {
        let line = line.trim_end_matches(['\r', '\n']);
        let Some(data) = line.strip_prefix("data:") else {
            return Ok(Line::Nothing);
        };
        let data = data.trim();
        if data.is_empty() {
            return Ok(Line::Nothing);
        }
        if data == "[DONE]" {
            self.done = true;
            return Ok(Line::Done);
        }
        let v: Value = serde_json::from_str(data)
            .map_err(|e| WireError::Bad(format!("a stream chunk is not JSON ({e}): {}", excerpt(data, 200))))?;
        if let Some(e) = server_error(&v) {
            return Err(e);
        }
        self.chunk(&v);
        Ok(Line::Chunk)
    }

    fn chunk(&mut self, v: &Value) {
        self.chunks += 1;
        if let Some(u) = reported_usage(v.get("usage")) {
            self.usage = Some(u);
        }
        let Some(choice) = v.get("choices").and_then(Value::as_array).and_then(|c| c.first()) else {
            return;
        };
        if let Some(f) = choice.get("finish_reason").filter(|f| !f.is_null()) {
            self.finish = Some(f.clone());
        }
        let Some(delta) = choice.get("delta").or_else(|| choice.get("message")) else {
            return;
        };
        self.content.push_str(&content_text(delta.get("content")));
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for (position, c) in calls.iter().enumerate() {
                self.call_delta(position, c);
            }
        }
    }

    /// Merges one tool-call delta: by `index`; without one, by `id`, else a new call.
    fn call_delta(&mut self, position: usize, c: &Value) {
        let index = c.get("index").and_then(Value::as_u64);
        let id = c.get("id").and_then(Value::as_str).filter(|s| !s.is_empty());
        let slot = match (index, id) {
            (Some(i), _) => self.calls.iter().position(|p| p.index == Some(i)),
            (None, Some(id)) => self.calls.iter().position(|p| p.id == id),
            (None, None) => self.calls.len().checked_sub(1).filter(|_| position == 0),
        };
        let slot = slot.unwrap_or_else(|| {
            self.calls.push(PartialCall { index, ..PartialCall::default() });
            self.calls.len() - 1
        });
        let call = &mut self.calls[slot];
        if let Some(id) = id {
            call.id = id.to_string();
        }
        let function = c.get("function");
        if let Some(name) = function.and_then(|f| f.get("name")).and_then(Value::as_str) {
            call.name.push_str(name);
        }
        match function.and_then(|f| f.get("arguments")) {
            Some(Value::String(s)) => call.arguments.push_str(s),
            Some(Value::Null) | None => {}
            Some(other) => call.arguments.push_str(&other.to_string()),
        }
    }

    /// Chunks read so far.
    pub fn chunks(&self) -> usize {
        self.chunks
    }

    /// Whether the stream said it ended: `[DONE]` or a finish reason (a connection that closes
    /// before either cut the reply short).
    pub fn ended(&self) -> bool {
        self.done || self.finish.as_ref().is_some_and(|f| !f.is_null())
    }

    /// Characters of content and of tool-call arguments so far.
    pub fn chars(&self) -> (usize, usize) {
        (self.content.chars().count(), self.calls.iter().map(|c| c.arguments.chars().count()).sum())
    }

    /// The reply the stream made. An unfinished stream (no `[DONE]`, no finish reason) is
    /// still a reply when it carried chunks; one without any chunk is not.
    pub fn finish(self, prompt_chars: usize) -> Result<Reply, WireError> {
        if self.chunks == 0 {
            return Err(WireError::Bad("the stream carried no chunk".into()));
        }
        let tool_calls: Vec<ToolCall> = self
            .calls
            .into_iter()
            .enumerate()
            .map(|(i, c)| ToolCall {
                id: if c.id.is_empty() { format!("call_{}", c.index.unwrap_or(i as u64)) } else { c.id },
                name: c.name,
                arguments: parse_arguments(&c.arguments),
            })
            .collect();
        let usage = self.usage.unwrap_or_else(|| estimated_usage(prompt_chars, &self.content, &tool_calls));
        Ok(Reply { content: self.content, tool_calls, finish_reason: finish_reason(self.finish.as_ref()), usage })
    }
}

/// At most `max` characters of `text`, marked when cut.
pub fn excerpt(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}… ({} bytes in all)", &text[..at], text.len()),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests;
