//! The script: which reply each request gets. Loaded from a JSON file; file paths inside it
//! (`content_file`, `arguments_files`) are relative to the script's directory and read at load
//! time, so a served reply never touches the disk.

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// Why a script could not be loaded; every variant names the script file.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("script {}: cannot read it: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("script {}: not valid JSON: {source}", path.display())]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("script {}: {problem}", path.display())]
    Top { path: PathBuf, problem: String },
    /// One rule is wrong: its index in `rules` (from 0), its name when it has one, the problem.
    #[error("script {}: rule {index}{}: {problem}", path.display(), name.as_ref().map(|n| format!(" ({n})")).unwrap_or_default())]
    Rule { path: PathBuf, index: usize, name: Option<String>, problem: String },
}

/// A whole script: the rules in file order and whether requests with `seed` are refused.
///
/// ```json
/// {"reject_seed": false,
///  "rules": [{"name": "plan-1", "when": ["kforge planner", "vector_add"], "times": 1,
///             "reply": {"content": "…", "tool_calls": [{"name": "submit_plans", "arguments": {"plans": []}}]}},
///            {"name": "busy", "status": 429, "retry_after_s": 1}]}
/// ```
///
/// Each request is served by the first rule, in file order, whose every `when` string occurs
/// (case-sensitively) in the request's messages text and that has uses left; taking the use is
/// atomic, so concurrent requests never share a single use. No such rule: a 400 naming the
/// request. Unknown keys are errors, so a typo does not silently change a behaviour.
#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    /// Answer a request that carries `seed` with 400 "Unsupported parameter: 'seed'" (as some
    /// servers do) without consuming a rule.
    pub reject_seed: bool,
    pub rules: Vec<Rule>,
}

/// One scripted behaviour: which requests it serves (`when`), how often, and what they get.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Shown in the request log and in errors.
    #[serde(default)]
    pub name: Option<String>,
    /// Every string must occur in the request's messages text (all contents and tool-call
    /// arguments concatenated). Empty: every request matches.
    #[serde(default)]
    pub when: Vec<String>,
    /// How many requests this rule serves; 0: unlimited.
    #[serde(default = "one")]
    pub times: u64,
    /// The HTTP status. Not 2xx: an OpenAI-style error body (unless `body_raw`).
    #[serde(default = "ok")]
    pub status: u16,
    /// Sent as a `Retry-After` header (seconds).
    #[serde(default)]
    pub retry_after_s: Option<u64>,
    /// Wait this long before answering (lets a client time out). The rule's use is taken when
    /// the request arrives, so a client's retry gets the next rule.
    #[serde(default)]
    pub delay_ms: u64,
    /// Wait this long between the chunks of a streamed reply (a slow stream).
    #[serde(default)]
    pub chunk_delay_ms: u64,
    /// Close the connection without answering (after `delay_ms`).
    #[serde(default)]
    pub drop_connection: bool,
    /// Serve exactly these bytes as the body (malformed JSON, odd error bodies).
    #[serde(default)]
    pub body_raw: Option<String>,
    /// The assistant's turn (2xx only).
    #[serde(default)]
    pub reply: Option<ScriptedReply>,
}

/// The assistant's turn a rule serves.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ScriptedReply {
    /// The text (after loading: `content_file`'s text when that was given).
    #[serde(default)]
    pub content: Option<String>,
    /// Read into `content` at load time (relative to the script's directory).
    #[serde(default)]
    pub content_file: Option<PathBuf>,
    /// Send the content as `[{"type": "text", "text": …}]` instead of a string (not streamed
    /// replies: their content deltas are strings).
    #[serde(default)]
    pub content_parts: bool,
    /// A reasoning model's `reasoning_content`.
    #[serde(default)]
    pub reasoning_content: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ScriptedToolCall>,
    /// Absent: the natural one (`tool_calls` when there are some, else `stop`); `null`: sent as
    /// null; a string: sent as written.
    #[serde(default, deserialize_with = "present")]
    pub finish_reason: Option<Option<String>>,
    /// Absent: counted as characters / 4 of the request and the reply; `null`: omitted.
    #[serde(default, deserialize_with = "present")]
    pub usage: Option<Option<ScriptedUsage>>,
}

/// Tokens reported in `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// One tool call of a scripted reply.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedToolCall {
    pub name: String,
    /// The arguments object (merged with `arguments_files`).
    #[serde(default)]
    pub arguments: Map<String, Value>,
    /// Argument name → file whose text becomes that argument's string value (read at load time).
    #[serde(default)]
    pub arguments_files: Map<String, Value>,
    /// Send this text as the arguments string, as given (malformed arguments).
    #[serde(default)]
    pub arguments_raw: Option<String>,
    /// Send the arguments as a JSON object instead of a string holding one.
    #[serde(default)]
    pub arguments_as_object: bool,
}

impl ScriptedToolCall {
    /// The `arguments` value as sent: the raw string, the object, or the object as a string.
    pub fn wire_arguments(&self) -> Value {
        if let Some(raw) = &self.arguments_raw {
            return Value::String(raw.clone());
        }
        let object = Value::Object(self.arguments.clone());
        if self.arguments_as_object {
            object
        } else {
            Value::String(object.to_string())
        }
    }
}

fn one() -> u64 {
    1
}

fn ok() -> u16 {
    200
}

/// `Some(value)` for a present key (also `null`), `None` (the default) for an absent one.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

impl Script {
    /// Read and check the script at `path`.
    pub fn load(path: &Path) -> Result<Script, ScriptError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read { path: path.into(), source })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        Script::parse(&text, path, dir)
    }

    /// Parse and check a script's text; `path` names it in errors and `dir` anchors its file
    /// paths.
    pub fn parse(text: &str, path: &Path, dir: &Path) -> Result<Script, ScriptError> {
        let top_error = |problem: String| ScriptError::Top { path: path.into(), problem };
        let value: Value =
            serde_json::from_str(text).map_err(|source| ScriptError::Json { path: path.into(), source })?;
        let Value::Object(mut top) = value else {
            return Err(top_error("the top level must be an object {\"rules\": [...]}".into()));
        };
        let reject_seed = match top.remove("reject_seed") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => b,
            Some(other) => return Err(top_error(format!("reject_seed must be true or false, not {other}"))),
        };
        let rules = match top.remove("rules") {
            Some(Value::Array(rules)) => rules,
            Some(other) => return Err(top_error(format!("rules must be an array, not {other}"))),
            None => return Err(top_error("no \"rules\" array".into())),
        };
        if let Some(key) = top.keys().next() {
            return Err(top_error(format!("unknown key {key:?} (expected reject_seed, rules)")));
        }
        let rules = rules
            .into_iter()
            .enumerate()
            .map(|(index, value)| {
                load_rule(value, dir).map_err(|(name, problem)| rule_error(path, index, name, problem))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Script { reject_seed, rules })
    }
}

fn rule_error(path: &Path, index: usize, name: Option<String>, problem: String) -> ScriptError {
    ScriptError::Rule { path: path.into(), index, name, problem }
}

/// One rule, checked and with its files read; on error the rule's name (if readable) and the problem.
fn load_rule(value: Value, dir: &Path) -> Result<Rule, (Option<String>, String)> {
    let name = value.get("name").and_then(Value::as_str).map(str::to_owned);
    let fail = |problem: String| (name.clone(), problem);
    let mut rule: Rule = serde_json::from_value(value).map_err(|e| fail(e.to_string()))?;
    check_rule(&rule).map_err(fail)?;
    if let Some(reply) = &mut rule.reply {
        read_reply_files(reply, dir).map_err(fail)?;
    }
    Ok(rule)
}

fn check_rule(rule: &Rule) -> Result<(), String> {
    if !(100..=599).contains(&rule.status) {
        return Err(format!("status {} is not an HTTP status (100-599)", rule.status));
    }
    let success = (200..300).contains(&rule.status);
    if !success && rule.reply.is_some() {
        return Err(format!(
            "a reply is served only with a 2xx status, not {} (use body_raw for a custom body)",
            rule.status
        ));
    }
    if success && rule.reply.is_none() && rule.body_raw.is_none() && !rule.drop_connection {
        return Err("nothing to serve: give a reply, body_raw, drop_connection or an error status".into());
    }
    if rule.body_raw.is_some() && rule.reply.is_some() {
        return Err("body_raw and reply exclude each other".into());
    }
    let Some(reply) = &rule.reply else { return Ok(()) };
    if reply.content.is_some() && reply.content_file.is_some() {
        return Err("content and content_file exclude each other".into());
    }
    for (i, call) in reply.tool_calls.iter().enumerate() {
        check_tool_call(call).map_err(|problem| format!("tool call {i} ({}): {problem}", call.name))?;
    }
    Ok(())
}

fn check_tool_call(call: &ScriptedToolCall) -> Result<(), String> {
    if call.arguments_raw.is_some() {
        if call.arguments_as_object {
            return Err("arguments_raw is sent as a string; it excludes arguments_as_object".into());
        }
        if !call.arguments.is_empty() || !call.arguments_files.is_empty() {
            return Err("arguments_raw excludes arguments and arguments_files".into());
        }
    }
    if let Some(key) = call.arguments_files.keys().find(|k| call.arguments.contains_key(*k)) {
        return Err(format!("argument {key:?} is given both in arguments and in arguments_files"));
    }
    Ok(())
}

fn read_reply_files(reply: &mut ScriptedReply, dir: &Path) -> Result<(), String> {
    if let Some(file) = reply.content_file.take() {
        reply.content = Some(read_text(dir, &file, "content_file")?);
        reply.content_file = Some(file);
    }
    for (i, call) in reply.tool_calls.iter_mut().enumerate() {
        let files = std::mem::take(&mut call.arguments_files);
        for (key, file) in &files {
            let Value::String(file) = file else {
                return Err(format!("tool call {i}: arguments_files.{key} must be a file path, not {file}"));
            };
            let what = format!("tool call {i}: arguments_files.{key}");
            call.arguments.insert(key.clone(), Value::String(read_text(dir, Path::new(file), &what)?));
        }
        call.arguments_files = files;
    }
    Ok(())
}

fn read_text(dir: &Path, file: &Path, what: &str) -> Result<String, String> {
    let full = dir.join(file);
    std::fs::read_to_string(&full).map_err(|e| format!("{what}: cannot read {}: {e}", full.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Script, ScriptError> {
        Script::parse(text, Path::new("s.json"), Path::new("/nonexistent-dir"))
    }

    fn message(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn defaults_and_absent_versus_null() {
        let s = parse(r#"{"rules": [{"reply": {"content": "hi"}}, {"reply": {"content": "x", "finish_reason": null, "usage": null}}]}"#)
            .unwrap();
        assert!(!s.reject_seed);
        let r = &s.rules[0];
        assert_eq!((r.times, r.status, r.delay_ms, r.drop_connection), (1, 200, 0, false));
        let reply = r.reply.as_ref().unwrap();
        assert_eq!(reply.finish_reason, None);
        assert_eq!(reply.usage, None);
        let reply = s.rules[1].reply.as_ref().unwrap();
        assert_eq!(reply.finish_reason, Some(None));
        assert_eq!(reply.usage, Some(None));
    }

    #[test]
    fn bad_json_names_the_file() {
        let m = message("{rules");
        assert!(m.starts_with("script s.json: not valid JSON"), "{m}");
    }

    #[test]
    fn top_level_problems() {
        assert!(message("[]").contains("top level must be an object"));
        assert!(message("{}").contains("no \"rules\" array"));
        assert!(message(r#"{"rules": {}}"#).contains("rules must be an array"));
        assert!(message(r#"{"rules": [], "reject_seed": 1}"#).contains("reject_seed must be true or false"));
        assert!(message(r#"{"rules": [], "rule": []}"#).contains("unknown key \"rule\""));
    }

    #[test]
    fn rule_errors_name_index_and_rule() {
        let m = message(r#"{"rules": [{"reply": {"content": "a"}}, {"name": "p2", "reply": {"contnt": "a"}}]}"#);
        assert!(m.starts_with("script s.json: rule 1 (p2): unknown field `contnt`"), "{m}");
        let m = message(r#"{"rules": [{"status": 700}]}"#);
        assert!(m.contains("rule 0: status 700 is not an HTTP status"), "{m}");
        let m = message(r#"{"rules": [{"times": "x", "reply": {}}]}"#);
        assert!(m.contains("rule 0: invalid type"), "{m}");
    }

    #[test]
    fn inconsistent_rules_are_refused() {
        assert!(message(r#"{"rules": [{}]}"#).contains("nothing to serve"));
        assert!(message(r#"{"rules": [{"status": 429, "reply": {}}]}"#).contains("only with a 2xx status"));
        assert!(message(r#"{"rules": [{"body_raw": "x", "reply": {}}]}"#).contains("body_raw and reply exclude"));
        assert!(message(r#"{"rules": [{"reply": {"content": "a", "content_file": "f"}}]}"#)
            .contains("content and content_file exclude"));
        let m = message(
            r#"{"rules": [{"reply": {"tool_calls": [{"name": "t", "arguments_raw": "{", "arguments_as_object": true}]}}]}"#,
        );
        assert!(m.contains("tool call 0 (t): arguments_raw is sent as a string"), "{m}");
        let m = message(
            r#"{"rules": [{"reply": {"tool_calls": [{"name": "t", "arguments": {"a": 1}, "arguments_files": {"a": "f"}}]}}]}"#,
        );
        assert!(m.contains("argument \"a\" is given both"), "{m}");
    }

    #[test]
    fn missing_files_are_named() {
        let m = message(r#"{"rules": [{"name": "k", "reply": {"content_file": "kernels/ok.py"}}]}"#);
        assert!(m.contains("rule 0 (k): content_file: cannot read /nonexistent-dir/kernels/ok.py"), "{m}");
        let m = message(
            r#"{"rules": [{"reply": {"tool_calls": [{"name": "t", "arguments_files": {"source": "a.py"}}]}}]}"#,
        );
        assert!(m.contains("tool call 0: arguments_files.source: cannot read /nonexistent-dir/a.py"), "{m}");
    }

    #[test]
    fn files_are_read_relative_to_the_script() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("k")).unwrap();
        std::fs::write(dir.path().join("k/ok.py"), "def f(): pass\n").unwrap();
        let script = dir.path().join("s.json");
        std::fs::write(
            &script,
            r#"{"rules": [{"reply": {"content_file": "k/ok.py",
                "tool_calls": [{"name": "submit_kernel", "arguments": {"n": 1}, "arguments_files": {"source": "k/ok.py"}}]}}]}"#,
        )
        .unwrap();
        let s = Script::load(&script).unwrap();
        let reply = s.rules[0].reply.as_ref().unwrap();
        assert_eq!(reply.content.as_deref(), Some("def f(): pass\n"));
        let args = reply.tool_calls[0].wire_arguments();
        let args: Value = serde_json::from_str(args.as_str().unwrap()).unwrap();
        assert_eq!(args, serde_json::json!({"n": 1, "source": "def f(): pass\n"}));
    }

    #[test]
    fn unreadable_script_is_named() {
        let m = Script::load(Path::new("/nonexistent-dir/s.json")).unwrap_err().to_string();
        assert!(m.starts_with("script /nonexistent-dir/s.json: cannot read it"), "{m}");
    }
}
