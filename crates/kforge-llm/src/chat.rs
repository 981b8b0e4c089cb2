//! The chat-completion vocabulary every part of kforge's LLM work speaks: what is sent (a
//! [`Request`]: messages, tools, parameters) and what came back (a [`Reply`], read tolerantly
//! from whatever an OpenAI-compatible server wrote). These are plain data; the wire format is
//! made and read only in the client (`crate::wire`).

use serde::{Deserialize, Serialize};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    /// The answer to one of the assistant's tool calls (`tool_call_id` names it).
    Tool,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// The assistant's tool calls (assistant messages only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call a tool message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn system(text: impl Into<String>) -> Message {
        Message { role: Role::System, content: text.into(), tool_calls: Vec::new(), tool_call_id: None }
    }
    pub fn user(text: impl Into<String>) -> Message {
        Message { role: Role::User, content: text.into(), tool_calls: Vec::new(), tool_call_id: None }
    }
    /// The assistant's turn as it came back (its text and tool calls), to continue a conversation.
    pub fn assistant(reply: &Reply) -> Message {
        Message {
            role: Role::Assistant,
            content: reply.content.clone(),
            tool_calls: reply.tool_calls.clone(),
            tool_call_id: None,
        }
    }
    /// The answer to tool call `id`.
    pub fn tool(id: impl Into<String>, text: impl Into<String>) -> Message {
        Message { role: Role::Tool, content: text.into(), tool_calls: Vec::new(), tool_call_id: Some(id.into()) }
    }
}

/// A function the model may call: its name, what it does, and its arguments' JSON schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    pub description: String,
    /// A JSON schema object (`{"type": "object", "properties": …, "required": […]}`).
    pub parameters: serde_json::Value,
}

/// One tool call of a reply. `arguments` is the parsed JSON object, or why it could not be read
/// (the raw text kept) so an agent can feed the problem back to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Arguments,
}

/// A tool call's arguments as the server sent them: a JSON object (sent as an object or as a
/// string holding one), or text that is not one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arguments {
    Object(serde_json::Map<String, serde_json::Value>),
    /// Not a JSON object: the raw text and what is wrong with it.
    Malformed {
        raw: String,
        problem: String,
    },
}

/// The sampling and length parameters of a request. `None` leaves a parameter out of the body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Params {
    pub temperature: Option<f64>,
    /// The reply's length limit (sent as `max_completion_tokens` to reasoning models, else as
    /// `max_tokens`).
    pub max_tokens: Option<u64>,
    /// Sent only while the server accepts it (a server that rejects `seed` gets requests without).
    pub seed: Option<u64>,
}

/// One chat-completion request: the model, the conversation, the tools offered, the parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub model: String,
    pub messages: Vec<Message>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    #[serde(default)]
    pub params: Params,
}

/// Why the model stopped, as far as the server said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    /// Cut at the length limit.
    Length,
    ToolCalls,
    ContentFilter,
    /// A value this client does not know, kept as written.
    Other(String),
    /// The server sent none (or `null`).
    Missing,
}

/// Tokens a call used. `estimated`: the server reported none, so they were counted from the
/// text (4 characters a token) to keep budgets honest.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    #[serde(default)]
    pub estimated: bool,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }

    /// Both calls' tokens together (estimated when either was).
    pub fn plus(&self, other: &Usage) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens + other.prompt_tokens,
            completion_tokens: self.completion_tokens + other.completion_tokens,
            estimated: self.estimated || other.estimated,
        }
    }
}

/// What came back from one call, read tolerantly: text (from a string or from text parts),
/// tool calls (none when `null`), the finish reason, the usage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    pub content: String,
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
}

impl Reply {
    /// A reply with neither text nor tool calls: never cached, and an agent counts it as malformed.
    pub fn is_empty(&self) -> bool {
        self.content.trim().is_empty() && self.tool_calls.is_empty()
    }
}
