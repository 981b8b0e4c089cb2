//! The agents' prompts: files under `prompts/llm/` embedded at build time, each a system prompt
//! whose first line names the role and its version (`kforge planner v1`), then a line
//! `---- user ----`, then the first user message. Both halves are `{{placeholder}}` templates
//! filled by [`render`], which refuses a missing or an unused value; [`cut`] bounds what goes in.

/// The line that separates a prompt file's system prompt from its user message.
pub const USER_MARK: &str = "---- user ----";

/// One agent's prompt file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prompt {
    /// `planner.md`: N plans for a chain, with look-up tools.
    Planner,
    /// `executor.md`: one plan written as a complete `ModelNew` file.
    Executor,
    /// `summarizer.md`: one attempt as a lesson.
    Summarizer,
    /// `synthesis.md`: a group of adjacent generated kernels as one Triton kernel.
    Synthesis,
}

/// A prompt's two halves after rendering.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The system prompt; its first line is the role and version (`kforge planner v1`).
    pub system: String,
    /// The first user message.
    pub user: String,
}

/// Why a template could not be filled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TemplateError {
    /// The template has `{{name}}` but no value was given for it.
    #[error("template {template}: no value for placeholder {{{{{name}}}}}")]
    Missing { template: String, name: String },
    /// A value was given that the template does not use.
    #[error("template {template}: value {name} is given but the template has no {{{{{name}}}}}")]
    Unused { template: String, name: String },
    /// `{{` without `}}`, or a name that is not letters, digits and `_`.
    #[error("template {template}: unterminated or malformed placeholder at byte {at}")]
    Malformed { template: String, at: usize },
    /// A prompt file without its user-message line.
    #[error("template {template}: no line {USER_MARK:?} between the system prompt and the user message")]
    NoUserMark { template: String },
}

impl Prompt {
    /// The role's name, as in the scope of its calls and the prompt's first line.
    pub fn role(self) -> &'static str {
        match self {
            Prompt::Planner => "planner",
            Prompt::Executor => "executor",
            Prompt::Summarizer => "summarizer",
            Prompt::Synthesis => "synthesis",
        }
    }

    /// The file's text as embedded.
    pub fn text(self) -> &'static str {
        match self {
            Prompt::Planner => include_str!("../../../prompts/llm/planner.md"),
            Prompt::Executor => include_str!("../../../prompts/llm/executor.md"),
            Prompt::Summarizer => include_str!("../../../prompts/llm/summarizer.md"),
            Prompt::Synthesis => include_str!("../../../prompts/llm/synthesis.md"),
        }
    }

    /// The first line: `kforge <role> v<N>`.
    pub fn version(self) -> &'static str {
        self.text().lines().next().unwrap_or("")
    }

    /// The prompt filled with `values` and split into system prompt and user message.
    pub fn render(self, values: &[(&str, String)]) -> Result<Rendered, TemplateError> {
        let filled = render(self.role(), self.text(), values)?;
        let mark = format!("\n{USER_MARK}\n");
        let (system, user) =
            filled.split_once(&mark).ok_or_else(|| TemplateError::NoUserMark { template: self.role().into() })?;
        Ok(Rendered { system: system.trim_end().to_string(), user: user.trim_end().to_string() })
    }
}

/// `template` with each `{{name}}` replaced by its value. Every placeholder needs a value and
/// every value a placeholder; `name` is letters, digits and `_`. Values are inserted verbatim (a
/// `{{` inside a value is not a placeholder).
pub fn render(name: &str, template: &str, values: &[(&str, String)]) -> Result<String, TemplateError> {
    let mut out = String::with_capacity(template.len());
    let mut used = vec![false; values.len()];
    let mut rest = template;
    let mut offset = 0;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let malformed = || TemplateError::Malformed { template: name.into(), at: offset + start };
        let end = after.find("}}").ok_or_else(malformed)?;
        let key = &after[..end];
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(malformed());
        }
        let index = values
            .iter()
            .position(|(k, _)| *k == key)
            .ok_or_else(|| TemplateError::Missing { template: name.into(), name: key.into() })?;
        used[index] = true;
        out.push_str(&values[index].1);
        let consumed = start + 2 + end + 2;
        offset += consumed;
        rest = &rest[consumed..];
    }
    out.push_str(rest);
    if let Some(i) = used.iter().position(|u| !u) {
        return Err(TemplateError::Unused { template: name.into(), name: values[i].0.into() });
    }
    Ok(out)
}

/// `text` cut to at most `limit` characters (whole characters), with a visible
/// `[… N chars cut]` marker saying how much is missing.
pub fn cut(text: &str, limit: usize) -> String {
    let total = text.chars().count();
    if total <= limit {
        return text.to_string();
    }
    let kept: String = text.chars().take(limit).collect();
    format!("{kept}\n[… {} chars cut]", total - limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
        pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
    }

    #[test]
    fn placeholders_are_filled() {
        let out = render("t", "a {{x}} b {{y_1}} {{x}}", &v(&[("x", "1"), ("y_1", "{{z}}")])).unwrap();
        assert_eq!(out, "a 1 b {{z}} 1");
    }

    #[test]
    fn a_missing_value_is_an_error() {
        let err = render("t", "a {{x}} {{y}}", &v(&[("x", "1")])).unwrap_err();
        assert_eq!(err, TemplateError::Missing { template: "t".into(), name: "y".into() });
    }

    #[test]
    fn an_unused_value_is_an_error() {
        let err = render("t", "a {{x}}", &v(&[("x", "1"), ("y", "2")])).unwrap_err();
        assert_eq!(err, TemplateError::Unused { template: "t".into(), name: "y".into() });
    }

    #[test]
    fn an_unterminated_placeholder_is_an_error() {
        assert!(matches!(render("t", "a {{x", &[]), Err(TemplateError::Malformed { at: 2, .. })));
        assert!(matches!(render("t", "a {{x y}}", &[]), Err(TemplateError::Malformed { .. })));
    }

    #[test]
    fn every_prompt_starts_with_its_role_and_version() {
        for p in [Prompt::Planner, Prompt::Executor, Prompt::Summarizer, Prompt::Synthesis] {
            let v = if p.role() == "executor" { 2 } else { 1 };
            assert_eq!(p.version(), format!("kforge {} v{v}", p.role()));
            assert!(p.text().contains(USER_MARK), "{} has no user mark", p.role());
        }
    }

    #[test]
    fn cut_marks_what_it_removed() {
        assert_eq!(cut("abcdef", 10), "abcdef");
        assert_eq!(cut("abcdef", 4), "abcd\n[… 2 chars cut]");
        assert_eq!(cut("ééé", 1), "é\n[… 2 chars cut]");
    }
}
