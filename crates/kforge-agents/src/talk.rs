//! Talking to the model: one [`Conversation`] per agent task (its messages and tools), the
//! environment every task shares ([`Env`]: the chat, the observer, counters, the stop flag), and
//! the parallel map the search runs tasks with (results in input order, never completion order).

use crate::candidate::Judge;
use crate::context::ProblemContext;
use crate::prompt::{Prompt, Rendered};
use crate::search::{LoopConfig, Observer};
use kforge_llm::{Arguments, Chat, LlmError, Message, Reply, Request, Scope, Tool, ToolCall};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Why a task stopped before its end.
#[derive(Debug)]
pub(crate) enum Halt {
    /// The provider failed (or a budget was spent) on this task's call.
    Llm(LlmError),
    /// Another task's call failed: no new call is started.
    Stopped,
}

/// Counts kept while tasks run on several threads.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub calls: AtomicU64,
    pub malformed: AtomicU64,
}

impl Counters {
    pub fn malformed(&self) {
        self.malformed.fetch_add(1, Ordering::SeqCst);
    }
}

/// What every agent task shares.
pub(crate) struct Env<'a> {
    pub ctx: &'a ProblemContext,
    pub cfg: &'a LoopConfig,
    pub chat: &'a dyn Chat,
    pub judge: &'a dyn Judge,
    pub observer: &'a dyn Observer,
    pub counters: Counters,
    /// Set by the first failed call: tasks start no new call after it.
    pub stop: AtomicBool,
}

impl Env<'_> {
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// One agent task's conversation with the model.
pub(crate) struct Conversation {
    prompt: Prompt,
    /// Which task the calls belong to (see [`Observer::on_call`]).
    task: String,
    messages: Vec<Message>,
    tools: Vec<Tool>,
}

impl Conversation {
    pub fn new(prompt: Prompt, task: String, rendered: Rendered, tools: Vec<Tool>) -> Conversation {
        let messages = vec![Message::system(rendered.system), Message::user(rendered.user)];
        Conversation { prompt, task, messages, tools }
    }

    /// Sends the conversation, tells the observer, and appends the assistant's turn.
    pub fn send(&mut self, env: &Env) -> Result<Reply, Halt> {
        // A replay still asks what the recorded run asked before it stopped (nothing is spent,
        // and which calls a stop overtook depends on the threads): the records decide.
        let replay = env.chat.recorded_only();
        if env.stopped() && !replay {
            return Err(Halt::Stopped);
        }
        let request = Request {
            model: env.cfg.model.clone(),
            messages: self.messages.clone(),
            tools: self.tools.clone(),
            params: env.cfg.params.clone(),
        };
        let scope =
            Scope { problem: env.ctx.problem.clone(), role: self.prompt.role().into(), task: self.task.clone() };
        env.counters.calls.fetch_add(1, Ordering::SeqCst);
        let result = env.chat.chat(&request, &scope);
        env.observer.on_call(&scope, &self.task, &request, result.as_ref());
        match result {
            Ok(answer) => {
                self.messages.push(Message::assistant(&answer.reply));
                Ok(answer.reply)
            }
            Err(LlmError::NotRecorded { .. }) if replay && env.stopped() => Err(Halt::Stopped),
            Err(e) => {
                env.stop.store(true, Ordering::SeqCst);
                Err(Halt::Llm(e))
            }
        }
    }

    /// Answers tool call `id`.
    pub fn answer(&mut self, id: &str, text: impl Into<String>) {
        self.messages.push(Message::tool(id, text));
    }

    /// Adds a user message.
    pub fn tell(&mut self, text: impl Into<String>) {
        self.messages.push(Message::user(text));
    }
}

/// A tool call's arguments as an object, or what is wrong with them.
pub(crate) fn object(call: &ToolCall) -> Result<&serde_json::Map<String, serde_json::Value>, String> {
    match &call.arguments {
        Arguments::Object(map) => Ok(map),
        Arguments::Malformed { problem, .. } => {
            Err(format!("the arguments of {} are not a JSON object ({problem})", call.name))
        }
    }
}

/// A non-empty string field of a tool call's arguments.
pub(crate) fn text_field(map: &serde_json::Map<String, serde_json::Value>, field: &str) -> Result<String, String> {
    match map.get(field) {
        Some(serde_json::Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
        Some(serde_json::Value::String(_)) => Err(format!("`{field}` is empty")),
        Some(_) => Err(format!("`{field}` must be a string")),
        None => Err(format!("`{field}` is missing")),
    }
}

/// A tool definition with string parameters (`required` names which must be given).
pub(crate) fn tool(name: &str, description: &str, properties: serde_json::Value, required: &[&str]) -> Tool {
    Tool {
        name: name.into(),
        description: description.into(),
        parameters: serde_json::json!({"type": "object", "properties": properties, "required": required}),
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `f` over `items` on up to `threads` threads taking items from a shared queue; the results in
/// the order of `items`.
pub(crate) fn parallel_map<T: Sync, R: Send>(items: &[T], threads: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = threads.clamp(1, items.len().max(1));
    if threads == 1 {
        return items.iter().map(f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Mutex<Vec<Option<R>>> = Mutex::new(items.iter().map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                lock(&results)[i] = Some(r);
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner());
    results.into_iter().map(|r| r.expect("every index below len was taken by exactly one thread")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_map_keeps_the_input_order() {
        let items: Vec<u64> = (0..50).collect();
        let out = parallel_map(&items, 4, |x| x * 2);
        assert_eq!(out, items.iter().map(|x| x * 2).collect::<Vec<_>>());
        assert!(parallel_map(&Vec::<u64>::new(), 4, |x| *x).is_empty());
    }
}
