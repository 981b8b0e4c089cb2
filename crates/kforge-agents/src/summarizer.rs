//! The summarizer: one lesson per judged attempt, from a record_experience call, or — when the
//! reply is malformed or `summarize` is off — a deterministic lesson made from the verdict.

use crate::candidate::{Candidate, Judgement};
use crate::prompt::{cut, Prompt};
use crate::talk::{object, text_field, tool, Conversation, Env, Halt};

/// A lesson and whether it is the deterministic fallback.
pub(crate) struct Lesson {
    pub text: String,
    pub fallback: bool,
}

/// The lesson of one attempt.
pub(crate) fn lesson(env: &Env, c: &Candidate, j: &Judgement) -> Result<Lesson, Halt> {
    if !env.cfg.summarize {
        return Ok(Lesson { text: fallback(c, j), fallback: false });
    }
    let rendered = Prompt::Summarizer
        .render(&[
            ("problem", env.ctx.problem.clone()),
            ("strategy", c.strategy.clone()),
            ("change", cut(&c.change, 500)),
            ("verdict", j.verdict.describe()),
            ("feedback", cut(&j.feedback, env.cfg.bounds.feedback_chars)),
        ])
        .expect("the embedded summarizer prompt has exactly these placeholders (every prompt is rendered in tests)");
    let string = serde_json::json!({"type": "string"});
    let tools = vec![tool(
        "record_experience",
        "Record the lesson of this attempt.",
        serde_json::json!({"lesson": string, "strategy": string}),
        &["lesson", "strategy"],
    )];
    let mut conv = Conversation::new(Prompt::Summarizer, c.id.clone(), rendered, tools);
    let reply = conv.send(env)?;
    let recorded = reply
        .tool_calls
        .iter()
        .find(|call| call.name == "record_experience")
        .and_then(|call| object(call).ok())
        .and_then(|args| text_field(args, "lesson").ok());
    match recorded {
        Some(text) => Ok(Lesson { text: cut(text.trim(), 1000), fallback: false }),
        None => {
            env.counters.malformed();
            Ok(Lesson { text: fallback(c, j), fallback: true })
        }
    }
}

/// The lesson made from the verdict alone: `STRATEGY (CHANGE): VERDICT`.
pub fn fallback(c: &Candidate, j: &Judgement) -> String {
    format!("{} ({}): {}", c.strategy, cut(&c.change, 160), cut(&j.verdict.describe(), 300))
}
