//! Fakes for the search tests: a chat that answers from an in-memory script (by role and by
//! what the request says) and logs every request, and a judge that reads the verdict off the
//! candidate's source.
#![allow(dead_code)]

use kforge_agents::{BaselineInfo, Candidate, Judge, Judgement, LoopConfig, ProblemContext, Verdict};
use kforge_llm::{Answer, Arguments, Chat, FinishReason, LlmError, Reply, Request, Role, Scope, ToolCall, Usage};
use std::sync::Mutex;

pub type Handler = Box<dyn Fn(&Request, &Scope) -> Result<Reply, LlmError> + Send + Sync>;

/// A chat answering from a script; every request is logged with its role.
pub struct Scripted {
    handler: Handler,
    pub log: Mutex<Vec<(String, Request)>>,
}

impl Scripted {
    pub fn new(handler: impl Fn(&Request, &Scope) -> Result<Reply, LlmError> + Send + Sync + 'static) -> Scripted {
        Scripted { handler: Box::new(handler), log: Mutex::new(Vec::new()) }
    }

    /// The logged requests of `role`, in the order they came.
    pub fn requests(&self, role: &str) -> Vec<Request> {
        self.log.lock().unwrap().iter().filter(|(r, _)| r == role).map(|(_, q)| q.clone()).collect()
    }

    /// Every request as JSON text, sorted (the order threads sent them in does not matter).
    pub fn texts(&self) -> Vec<String> {
        let mut t: Vec<String> =
            self.log.lock().unwrap().iter().map(|(_, q)| serde_json::to_string(q).unwrap()).collect();
        t.sort();
        t
    }
}

impl Chat for Scripted {
    fn chat(&self, request: &Request, scope: &Scope) -> Result<Answer, LlmError> {
        assert!(
            request.messages[0].content.starts_with(&format!("kforge {} v", scope.role)),
            "the system prompt names the role and version"
        );
        self.log.lock().unwrap().push((scope.role.clone(), request.clone()));
        let reply = (self.handler)(request, scope)?;
        Ok(Answer { reply, attempts: 1, replayed: false, usd: 0.0, call: 0 })
    }
}

/// A reply with one tool call (id `call-N`, N = the assistant turns before it).
pub fn call(request: &Request, name: &str, args: serde_json::Value) -> Reply {
    let arguments = match args {
        serde_json::Value::Object(map) => Arguments::Object(map),
        other => Arguments::Malformed { raw: other.to_string(), problem: "not an object".into() },
    };
    let id = format!("call-{}", turns(request));
    reply(String::new(), vec![ToolCall { id, name: name.into(), arguments }])
}

/// A reply whose one tool call's arguments could not be read.
pub fn malformed_call(request: &Request, name: &str) -> Reply {
    let id = format!("call-{}", turns(request));
    let arguments = Arguments::Malformed { raw: "{\"plans\": [".into(), problem: "EOF while parsing".into() };
    reply(String::new(), vec![ToolCall { id, name: name.into(), arguments }])
}

pub fn text(content: &str) -> Reply {
    reply(content.into(), Vec::new())
}

fn reply(content: String, tool_calls: Vec<ToolCall>) -> Reply {
    Reply { content, tool_calls, finish_reason: FinishReason::Stop, usage: Usage::default() }
}

/// Assistant turns already in the conversation.
pub fn turns(request: &Request) -> usize {
    request.messages.iter().filter(|m| m.role == Role::Assistant).count()
}

/// The first user message (what the prompt was rendered into).
pub fn first_user(request: &Request) -> &str {
    &request.messages[1].content
}

/// The last message's text.
pub fn last(request: &Request) -> &str {
    &request.messages.last().unwrap().content
}

/// submit_plans with `(strategy, change)` pairs.
pub fn plans(request: &Request, items: &[(&str, &str)]) -> Reply {
    let plans: Vec<serde_json::Value> =
        items.iter().map(|(s, c)| serde_json::json!({"strategy": s, "change": c, "rationale": "because"})).collect();
    call(request, "submit_plans", serde_json::json!({ "plans": plans }))
}

/// A ModelNew with the problem's signature; `verdict` is read by [`SourceJudge`]: `SPEED=x`,
/// `SPEED=none` (untimed), or `BROKEN`.
pub fn kernel(tag: &str, verdict: &str) -> String {
    format!(
        "import torch\n\nclass ModelNew(torch.nn.Module):\n    def __init__(self, dim):\n        super().__init__()\n\n    def forward(self, a, b):\n        return a + b\n\nTAG = '{tag}'\nVERDICT = '{verdict}'\n"
    )
}

pub fn submit(request: &Request, source: &str) -> Reply {
    call(request, "submit_kernel", serde_json::json!({ "source": source }))
}

pub const PROBLEM: &str = "import torch\n\nclass Model(torch.nn.Module):\n    def __init__(self, dim):\n        super().__init__()\n\n    def forward(self, a, b):\n        return a + b\n\ndef get_inputs():\n    return [torch.randn(4), torch.randn(4)]\n\ndef get_init_inputs():\n    return [4]\n";

pub fn context() -> ProblemContext {
    ProblemContext {
        problem: "level1/001_add.py".into(),
        source: PROBLEM.into(),
        baseline: BaselineInfo { source: PROBLEM.into(), label: "torch.compile default".into(), time_ms: Some(1.5) },
        inventory: None,
        profile: None,
        device: "cuda:0".into(),
    }
}

pub fn config() -> LoopConfig {
    LoopConfig { model: "fake-model".into(), summarize: false, ..LoopConfig::default() }
}

/// Reads `VERDICT = '…'` off the source; logs every id it judged.
#[derive(Default)]
pub struct SourceJudge {
    pub judged: Mutex<Vec<String>>,
}

impl Judge for SourceJudge {
    fn judge(&self, c: &Candidate) -> Judgement {
        self.judged.lock().unwrap().push(c.id.clone());
        let tag = c
            .source
            .lines()
            .find_map(|l| l.strip_prefix("VERDICT = '"))
            .map(|t| t.trim_end_matches('\''))
            .unwrap_or("missing");
        let verdict = match tag {
            "BROKEN" => {
                Verdict::Rejected { gate: "correctness".into(), reason: "output 0 differs".into(), exploit: false }
            }
            "none" => Verdict::Accepted { speedup: None },
            t => match t.strip_prefix("SPEED=").and_then(|x| x.parse().ok()) {
                Some(x) => Verdict::Accepted { speedup: Some(x) },
                None => Verdict::CouldNotRun { reason: format!("no verdict tag in {}", c.id) },
            },
        };
        let feedback = match &verdict {
            Verdict::Rejected { .. } => format!("max abs diff 0.5 at output 0 of {}", c.id),
            _ => String::new(),
        };
        Judgement { verdict, feedback }
    }
}

impl SourceJudge {
    pub fn judged(&self) -> Vec<String> {
        let mut j = self.judged.lock().unwrap().clone();
        j.sort();
        j
    }
}
