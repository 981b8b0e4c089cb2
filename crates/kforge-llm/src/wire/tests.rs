//! Fixtures are bodies as real servers write them (trimmed), each with the quirk it shows.

use super::*;
use crate::chat::{Params, Tool};

fn obj(v: Value) -> Map<String, Value> {
    v.as_object().cloned().expect("fixture: an object")
}

const VLLM_TOOL_CALL: &str = r#"{"id":"chatcmpl-9a","object":"chat.completion","created":1733000000,"model":"Qwen/Qwen2.5-Coder-32B-Instruct",
 "choices":[{"index":0,"message":{"role":"assistant","reasoning_content":null,"content":null,
   "tool_calls":[{"id":"chatcmpl-tool-1f2e","type":"function","function":{"name":"read_kernel","arguments":"{\"name\": \"triton_poi_0\"}"}}]},
   "logprobs":null,"finish_reason":"tool_calls","stop_reason":null}],
 "usage":{"prompt_tokens":812,"total_tokens":840,"completion_tokens":28,"prompt_tokens_details":null},"prompt_logprobs":null}"#;

#[test]
fn vllm_tool_call_with_null_content() {
    let r = parse_reply(VLLM_TOOL_CALL, 0).unwrap();
    assert_eq!(r.content, "");
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    assert_eq!(r.tool_calls.len(), 1);
    assert_eq!(r.tool_calls[0].id, "chatcmpl-tool-1f2e");
    assert_eq!(r.tool_calls[0].name, "read_kernel");
    assert_eq!(r.tool_calls[0].arguments, Arguments::Object(obj(json!({"name": "triton_poi_0"}))));
    assert_eq!(r.usage, Usage { prompt_tokens: 812, completion_tokens: 28, estimated: false });
    assert!(!r.is_empty());
}

// ollama's OpenAI endpoint: arguments as an object (older versions), finish_reason "stop"
// beside tool calls, no ids on some versions.
const OLLAMA: &str = r#"{"id":"chatcmpl-310","object":"chat.completion","created":1733000001,"model":"qwen2.5-coder:7b","system_fingerprint":"fp_ollama",
 "choices":[{"index":0,"message":{"role":"assistant","content":"","tool_calls":[
   {"function":{"name":"read_profile","arguments":{"top":5}}},
   {"function":{"name":"read_kernel","arguments":{"name":"k1"}}}]},"finish_reason":"stop"}],
 "usage":{"prompt_tokens":300,"completion_tokens":40,"total_tokens":340}}"#;

#[test]
fn ollama_object_arguments_and_missing_ids() {
    let r = parse_reply(OLLAMA, 0).unwrap();
    let ids: Vec<&str> = r.tool_calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["call_0", "call_1"]);
    assert_eq!(r.tool_calls[0].arguments, Arguments::Object(obj(json!({"top": 5}))));
    assert_eq!(r.finish_reason, FinishReason::Stop);
}

// LM Studio: numeric-string ids, `tool_calls: []` beside plain content, no usage.
const LM_STUDIO: &str = r#"{"id":"chatcmpl-x1","object":"chat.completion","created":1733000002,"model":"lmstudio-community/qwen2.5-7b-instruct",
 "choices":[{"index":0,"logprobs":null,"finish_reason":"stop","message":{"role":"assistant","content":"Plan: fuse the two pointwise kernels.","tool_calls":[]}}],
 "system_fingerprint":"lmstudio-community/qwen2.5-7b-instruct"}"#;

#[test]
fn lm_studio_empty_tool_calls_and_no_usage_is_estimated() {
    let r = parse_reply(LM_STUDIO, 40).unwrap();
    assert!(r.tool_calls.is_empty());
    assert_eq!(r.content, "Plan: fuse the two pointwise kernels.");
    // 37 characters → 10 tokens; 40 prompt characters → 10 tokens.
    assert_eq!(r.usage, Usage { prompt_tokens: 10, completion_tokens: 10, estimated: true });
}

// OpenRouter: content as text parts from some upstreams, extra fields, finish_reason null.
const OPENROUTER_PARTS: &str = r#"{"id":"gen-17","provider":"Mistral","model":"mistralai/codestral","object":"chat.completion","created":1733000003,
 "choices":[{"logprobs":null,"finish_reason":null,"native_finish_reason":null,"index":0,
   "message":{"role":"assistant","content":[{"type":"text","text":"def kernel("},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"x):"}],"refusal":null,"reasoning":null}}],
 "usage":{"prompt_tokens":10,"completion_tokens":4,"total_tokens":14}}"#;

#[test]
fn openrouter_text_parts_and_null_finish_reason() {
    let r = parse_reply(OPENROUTER_PARTS, 0).unwrap();
    assert_eq!(r.content, "def kernel(x):");
    assert_eq!(r.finish_reason, FinishReason::Missing);
}

// OpenRouter passes an upstream's rate limit as a 200 whose body is an error.
const OPENROUTER_ERROR: &str = r#"{"error":{"message":"Rate limit exceeded: free-models-per-min","code":429,"metadata":{"headers":{"X-RateLimit-Limit":"20"}}},"user_id":"user_2x"}"#;

#[test]
fn a_200_holding_an_error_is_an_error_with_its_code() {
    let e = parse_reply(OPENROUTER_ERROR, 0).unwrap_err();
    assert_eq!(e, WireError::Server { code: Some(429), message: "Rate limit exceeded: free-models-per-min".into() });
    let e = parse_reply(r#"{"error":"model not loaded"}"#, 0).unwrap_err();
    assert_eq!(e, WireError::Server { code: None, message: "model not loaded".into() });
}

// OpenAI reasoning model: reasoning tokens inside completion_tokens, an unknown finish reason.
const OPENAI_REASONING: &str = r#"{"id":"chatcmpl-B1","object":"chat.completion","created":1733000004,"model":"o4-mini-2025-04-16",
 "choices":[{"index":0,"message":{"role":"assistant","content":"Use a single reduction.","refusal":null,"annotations":[]},"finish_reason":"stop"}],
 "usage":{"prompt_tokens":95,"completion_tokens":1210,"total_tokens":1305,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},
  "completion_tokens_details":{"reasoning_tokens":1152,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},
 "service_tier":"default","system_fingerprint":null}"#;

#[test]
fn openai_reasoning_usage_counts_reasoning_tokens() {
    let r = parse_reply(OPENAI_REASONING, 0).unwrap();
    assert_eq!(r.usage.completion_tokens, 1210);
    assert_eq!(r.finish_reason, FinishReason::Stop);
    let odd = OPENAI_REASONING.replace(r#""finish_reason":"stop""#, r#""finish_reason":"eos""#);
    assert_eq!(parse_reply(&odd, 0).unwrap().finish_reason, FinishReason::Other("eos".into()));
    let absent = OPENAI_REASONING.replace(r#","finish_reason":"stop""#, "");
    assert_eq!(parse_reply(&absent, 0).unwrap().finish_reason, FinishReason::Missing);
}

#[test]
fn malformed_arguments_keep_raw_text_and_say_why() {
    let body = |args: &str| {
        json!({"choices":[{"message":{"content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"write_kernel","arguments":args}}]},"finish_reason":"tool_calls"}]}).to_string()
    };
    let r = parse_reply(&body("{\"code\": \"def k(:"), 0).unwrap();
    match &r.tool_calls[0].arguments {
        Arguments::Malformed { raw, problem } => {
            assert_eq!(raw, "{\"code\": \"def k(:");
            assert!(problem.starts_with("invalid JSON"), "{problem}");
        }
        other => panic!("expected malformed, got {other:?}"),
    }
    let r = parse_reply(&body("[1, 2]"), 0).unwrap();
    assert_eq!(
        r.tool_calls[0].arguments,
        Arguments::Malformed { raw: "[1, 2]".into(), problem: "not a JSON object but an array".into() }
    );
}

#[test]
fn legacy_function_call_is_a_tool_call() {
    let b = r#"{"choices":[{"message":{"role":"assistant","content":null,"function_call":{"name":"read_memory","arguments":"{}"}},"finish_reason":"function_call"}]}"#;
    let r = parse_reply(b, 0).unwrap();
    assert_eq!(r.tool_calls[0].name, "read_memory");
    assert_eq!(r.tool_calls[0].id, "call_0");
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
}

#[test]
fn bodies_that_are_not_replies_say_what_is_missing() {
    let problem = |b: &str| match parse_reply(b, 0).unwrap_err() {
        WireError::Bad(p) => p,
        other => panic!("{other:?}"),
    };
    assert!(problem(r#"{"id":"x","choices":[]}"#).contains("`choices` is empty"));
    assert!(problem(r#"{"id":"x"}"#).contains("no `choices`"));
    assert!(problem(r#"{"choices":[{"text":"legacy"}]}"#).contains("no `message`"));
    assert!(problem("<html>502 Bad Gateway</html>").starts_with("invalid JSON"));
    assert!(problem("[]").contains("not an object"));
}

#[test]
fn empty_reply_is_empty() {
    let r = parse_reply(r#"{"choices":[{"message":{"content":"  \n"},"finish_reason":"stop"}]}"#, 0).unwrap();
    assert!(r.is_empty());
}

fn request() -> Request {
    let reply = Reply {
        content: String::new(),
        tool_calls: vec![ToolCall {
            id: "call_9".into(),
            name: "read_kernel".into(),
            arguments: Arguments::Object(obj(json!({"name": "k"}))),
        }],
        finish_reason: FinishReason::ToolCalls,
        usage: Usage::default(),
    };
    Request {
        model: "m".into(),
        messages: vec![
            Message::system("be brief"),
            Message::user("go"),
            Message::assistant(&reply),
            Message::tool("call_9", "def k(): pass"),
        ],
        tools: vec![Tool {
            name: "read_kernel".into(),
            description: "reads a kernel".into(),
            parameters: json!({"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}),
        }],
        params: Params { temperature: Some(0.2), max_tokens: Some(4096), seed: Some(7) },
    }
}

#[test]
fn body_has_tool_calls_tool_messages_and_parameters() {
    let b = body(&request(), &BodyOptions { reasoning: false, stream: false, seed: true, max_tokens: Some(100) });
    let expected = json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "read_kernel", "arguments": "{\"name\":\"k\"}"}}]},
            {"role": "tool", "content": "def k(): pass", "tool_call_id": "call_9"}
        ],
        "tools": [{"type": "function", "function": {"name": "read_kernel", "description": "reads a kernel", "parameters": {"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}}}],
        "temperature": 0.2,
        "max_tokens": 100,
        "seed": 7
    });
    assert_eq!(b, expected);
}

#[test]
fn reasoning_body_streams_without_temperature_or_seed() {
    let b = body(&request(), &BodyOptions { reasoning: true, stream: true, seed: false, max_tokens: Some(50) });
    assert_eq!(b.get("temperature"), None);
    assert_eq!(b.get("max_tokens"), None);
    assert_eq!(b["max_completion_tokens"], json!(50));
    assert_eq!(b.get("seed"), None);
    assert_eq!(b["stream"], json!(true));
    assert_eq!(b["stream_options"], json!({"include_usage": true}));
    let mut plain = request();
    plain.tools.clear();
    let b = body(&plain, &BodyOptions { reasoning: false, stream: false, seed: true, max_tokens: None });
    assert_eq!((b.get("tools"), b.get("tool_choice"), b.get("max_tokens")), (None, None, None));
}

// An OpenAI-style stream: a role chunk, tool-call fragments by index, a comment, CRLF, a
// keep-alive, the finish chunk, usage alone in the last chunk, [DONE].
const STREAM: &str = concat!(
    ": keep-alive\r\n\r\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\r\n\r\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Reading \"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\",\"type\":\"function\",\"function\":{\"name\":\"read_kernel\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\n",
    ": OPENROUTER PROCESSING\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"na\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_b\",\"function\":{\"name\":\"read_profile\",\"arguments\":\"{}\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"me\\\": \\\"k\\\"}\"}}]},\"finish_reason\":null}]}\n\n",
    "event: message\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":9,\"total_tokens\":29}}\n\n",
    "data: [DONE]\n\n",
);

fn read_stream(text: &str) -> Result<(Reply, usize), WireError> {
    let mut s = Stream::default();
    let mut chunks = 0;
    for line in text.split_inclusive('\n') {
        match s.line(line)? {
            Line::Chunk => chunks += 1,
            Line::Done => break,
            Line::Nothing => {}
        }
    }
    Ok((s.finish(8)?, chunks))
}

#[test]
fn stream_concatenates_argument_fragments_by_index() {
    let (r, chunks) = read_stream(STREAM).unwrap();
    assert_eq!(chunks, 8);
    assert_eq!(r.content, "Reading ");
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    assert_eq!(r.usage, Usage { prompt_tokens: 20, completion_tokens: 9, estimated: false });
    assert_eq!(r.tool_calls.len(), 2);
    assert_eq!((r.tool_calls[0].id.as_str(), r.tool_calls[0].name.as_str()), ("call_a", "read_kernel"));
    assert_eq!(r.tool_calls[0].arguments, Arguments::Object(obj(json!({"name": "k"}))));
    assert_eq!(r.tool_calls[1].arguments, Arguments::Object(Map::new()));
}

// ollama streams whole tool calls without index or id, and no usage unless asked.
#[test]
fn stream_without_index_or_usage() {
    let text = concat!(
        "data: {\"choices\":[{\"delta\":{\"content\":\"ab\"}}]}\n",
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]}}]}\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"cd\"},\"finish_reason\":\"stop\"}]}\n",
    );
    let (r, _) = read_stream(text).unwrap();
    assert_eq!(r.content, "abcd");
    assert_eq!(r.tool_calls[0].id, "call_0");
    assert_eq!(r.tool_calls[0].arguments, Arguments::Object(obj(json!({"x": 1}))));
    assert!(r.usage.estimated);
    assert_eq!(r.usage.prompt_tokens, 2);
}

#[test]
fn stream_errors() {
    let e = read_stream("data: {\"error\":{\"message\":\"overloaded\",\"code\":503}}\n").unwrap_err();
    assert_eq!(e, WireError::Server { code: Some(503), message: "overloaded".into() });
    assert!(matches!(read_stream(": only comments\n\n").unwrap_err(), WireError::Bad(p) if p.contains("no chunk")));
    assert!(matches!(read_stream("data: {oops\n").unwrap_err(), WireError::Bad(p) if p.contains("not JSON")));
}

#[test]
fn excerpt_cuts_long_text() {
    assert_eq!(excerpt("abc", 5), "abc");
    assert_eq!(excerpt("abcdef", 3), "abc… (6 bytes in all)");
}
