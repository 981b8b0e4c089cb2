//! The OpenAI-style bodies the endpoint sends: a chat completion, its streamed chunks, errors.

use crate::script::{ScriptedReply, ScriptedUsage};
use serde_json::{json, Map, Value};

/// The characters of a streamed content piece or argument fragment.
pub(crate) const PIECE_CHARS: usize = 16;

/// What a reply's body depends on besides the rule: the request's number, model and text.
pub(crate) struct Turn<'a> {
    pub n: u64,
    pub model: &'a str,
    /// The request's messages text (for the counted usage).
    pub prompt: &'a str,
}

/// An OpenAI-style error body.
pub(crate) fn error_body(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

/// The error type OpenAI uses for a status.
pub(crate) fn error_kind(status: u16) -> &'static str {
    match status {
        429 => "rate_limit_error",
        401 | 403 => "authentication_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    }
}

/// The finish reason sent: the scripted one (`null` included), else the natural one.
fn finish_reason(reply: &ScriptedReply) -> Value {
    match &reply.finish_reason {
        Some(Some(reason)) => Value::String(reason.clone()),
        Some(None) => Value::Null,
        None if reply.tool_calls.is_empty() => Value::String("stop".into()),
        None => Value::String("tool_calls".into()),
    }
}

/// Tokens as characters / 4, rounded up.
fn tokens(chars: usize) -> u64 {
    chars.div_ceil(4) as u64
}

/// The usage sent, or `None` when the script omits it.
fn usage(reply: &ScriptedReply, turn: &Turn) -> Option<Value> {
    let ScriptedUsage { prompt_tokens, completion_tokens } = match reply.usage {
        Some(Some(usage)) => usage,
        Some(None) => return None,
        None => {
            let text = |s: &Option<String>| s.as_deref().map_or(0, |s| s.chars().count());
            let arguments: usize =
                reply.tool_calls.iter().map(|c| c.wire_arguments().to_string().chars().count()).sum();
            let reply_chars = text(&reply.content) + text(&reply.reasoning_content) + arguments;
            ScriptedUsage { prompt_tokens: tokens(turn.prompt.chars().count()), completion_tokens: tokens(reply_chars) }
        }
    };
    Some(json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}))
}

fn call_id(turn: &Turn, index: usize) -> String {
    format!("call_{}_{index}", turn.n)
}

/// The whole (non-streamed) chat completion.
pub(crate) fn completion(reply: &ScriptedReply, turn: &Turn) -> Value {
    let mut message = Map::new();
    message.insert("role".into(), "assistant".into());
    let content = match (&reply.content, reply.content_parts) {
        (Some(text), true) => json!([{"type": "text", "text": text}]),
        (Some(text), false) => Value::String(text.clone()),
        (None, true) => json!([]),
        (None, false) => Value::Null,
    };
    message.insert("content".into(), content);
    if let Some(reasoning) = &reply.reasoning_content {
        message.insert("reasoning_content".into(), Value::String(reasoning.clone()));
    }
    if !reply.tool_calls.is_empty() {
        let calls: Vec<Value> = reply
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                json!({"id": call_id(turn, i), "type": "function",
                       "function": {"name": call.name, "arguments": call.wire_arguments()}})
            })
            .collect();
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    let mut body = json!({
        "id": format!("chatcmpl-scripted-{}", turn.n),
        "object": "chat.completion",
        "created": 0,
        "model": turn.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(reply)}],
    });
    if let Some(usage) = usage(reply, turn) {
        body["usage"] = usage;
    }
    body
}

/// `text` in pieces of [`PIECE_CHARS`] characters (none for empty text).
pub(crate) fn pieces(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(PIECE_CHARS).map(|c| c.iter().collect()).collect()
}

/// The streamed reply as server-sent events, each `data: …\n\n`, ending with `data: [DONE]`:
/// the role, the reasoning and content in pieces, each tool call's id and name then its argument
/// fragments, the finish reason, and the usage when `include_usage`.
pub(crate) fn stream_events(reply: &ScriptedReply, turn: &Turn, include_usage: bool) -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": format!("chatcmpl-scripted-{}", turn.n), "object": "chat.completion.chunk", "created": 0,
               "model": turn.model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut chunks = vec![chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
    for piece in reply.reasoning_content.as_deref().map(pieces).unwrap_or_default() {
        chunks.push(chunk(json!({"reasoning_content": piece}), Value::Null));
    }
    for piece in reply.content.as_deref().map(pieces).unwrap_or_default() {
        chunks.push(chunk(json!({"content": piece}), Value::Null));
    }
    for (index, call) in reply.tool_calls.iter().enumerate() {
        let first = json!({"index": index, "id": call_id(turn, index), "type": "function",
                           "function": {"name": call.name, "arguments": ""}});
        chunks.push(chunk(json!({"tool_calls": [first]}), Value::Null));
        let fragments = match call.wire_arguments() {
            Value::String(text) => pieces(&text).into_iter().map(Value::String).collect(),
            object => vec![object],
        };
        for fragment in fragments {
            let delta = json!({"index": index, "function": {"arguments": fragment}});
            chunks.push(chunk(json!({"tool_calls": [delta]}), Value::Null));
        }
    }
    chunks.push(chunk(json!({}), finish_reason(reply)));
    if include_usage {
        if let Some(usage) = usage(reply, turn) {
            chunks.push(json!({"id": format!("chatcmpl-scripted-{}", turn.n), "object": "chat.completion.chunk",
                               "created": 0, "model": turn.model, "choices": [], "usage": usage}));
        }
    }
    let mut events: Vec<String> = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    events.push("data: [DONE]\n\n".into());
    events
}

/// The request's messages text: every message's content (a string, or the text of its parts)
/// and its tool calls' names and arguments, one per line. Rules match against it.
pub(crate) fn messages_text(messages: &[Value]) -> String {
    let mut text = String::new();
    for message in messages {
        push_content(&mut text, message.get("content"));
        for call in message.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            let function = call.get("function");
            if let Some(name) = function.and_then(|f| f.get("name")).and_then(Value::as_str) {
                text.push_str(name);
                text.push('\n');
            }
            match function.and_then(|f| f.get("arguments")) {
                Some(Value::String(arguments)) => text.push_str(arguments),
                Some(other) => text.push_str(&other.to_string()),
                None => {}
            }
            text.push('\n');
        }
    }
    text
}

fn push_content(text: &mut String, content: Option<&Value>) {
    match content {
        Some(Value::String(s)) => text.push_str(s),
        Some(Value::Array(parts)) => {
            for part in parts {
                if let Some(s) = part.get("text").and_then(Value::as_str) {
                    text.push_str(s);
                }
            }
        }
        _ => return,
    }
    text.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_keep_characters_whole() {
        let text = "é".repeat(20);
        let p = pieces(&text);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].chars().count(), PIECE_CHARS);
        assert_eq!(p.concat(), text);
        assert!(pieces("").is_empty());
    }

    #[test]
    fn messages_text_includes_parts_and_arguments() {
        let messages = vec![
            json!({"role": "system", "content": "kforge planner v1"}),
            json!({"role": "user", "content": [{"type": "text", "text": "vector_add"}]}),
            json!({"role": "assistant", "content": null,
                   "tool_calls": [{"id": "c", "type": "function", "function": {"name": "read_kernel", "arguments": "{\"name\":\"k1\"}"}}]}),
        ];
        let text = messages_text(&messages);
        assert!(text.contains("kforge planner v1\nvector_add\nread_kernel\n{\"name\":\"k1\"}"), "{text}");
    }

    #[test]
    fn usage_is_counted_unless_scripted() {
        let reply = ScriptedReply { content: Some("12345678".into()), ..Default::default() };
        let turn = Turn { n: 1, model: "m", prompt: "abcde" };
        let body = completion(&reply, &turn);
        assert_eq!(body["usage"], json!({"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}));
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        let reply = ScriptedReply { usage: Some(None), finish_reason: Some(None), ..reply };
        let body = completion(&reply, &turn);
        assert!(body.get("usage").is_none());
        assert_eq!(body["choices"][0]["finish_reason"], Value::Null);
    }
}
