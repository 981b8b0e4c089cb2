//! A candidate (one attempt's source and where it came from), its verdict, the [`Judge`] that
//! gives it (the caller's: `kforge verify`), the static pre-checks done here before judging, and
//! the hash of normalized source that de-duplicates candidates.

use rustpython_parser::ast::{self, Stmt};
use rustpython_parser::Parse;
use serde::{Deserialize, Serialize};

/// One attempt at a kernel: its source and its place in the search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// Stable across runs: `i{iteration}-c{chain}-p{plan}-a{attempt}` (iteration 0 is the
    /// synthesis step).
    pub id: String,
    pub problem: String,
    /// 1-based; 0 for the synthesis step.
    pub iteration: u32,
    /// 0-based index of the chain within its iteration.
    pub chain: u32,
    /// 0-based index of the plan within its chain's plans.
    pub plan: u32,
    /// 1-based attempt of the plan.
    pub attempt: u32,
    /// The plan's strategy, normalized (kebab-case).
    pub strategy: String,
    /// The plan's one change, as planned.
    pub change: String,
    /// The complete `ModelNew` file.
    pub source: String,
    /// [`source_hash`] of `source`.
    pub hash: String,
    /// The chain's kernel that this candidate changed (None: the baseline).
    pub parent: Option<String>,
    /// An earlier candidate with the same hash, whose verdict this one got without judging.
    pub duplicate_of: Option<String>,
}

/// What the harness said about a candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Verdict {
    /// Correct, and not slower than the harness allows. `speedup` over the baseline; None when
    /// not timed (the CPU device).
    Accepted { speedup: Option<f64> },
    /// The candidate failed a gate (`exploit`: it was caught cheating).
    Rejected { gate: String, reason: String, exploit: bool },
    /// The environment failed, not the candidate.
    CouldNotRun { reason: String },
}

/// A verdict and the text the executor gets back about it (compiler or verifier errors).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judgement {
    pub verdict: Verdict,
    pub feedback: String,
}

/// Judges candidates: only it declares a candidate correct or faster. Called from several
/// executor threads at once.
pub trait Judge: Send + Sync {
    /// The verdict on `candidate` (its source, already through the static pre-checks) and the
    /// text to feed back to the executor.
    fn judge(&self, candidate: &Candidate) -> Judgement;
}

impl Verdict {
    /// The speedup of an accepted, timed candidate.
    pub fn speedup(&self) -> Option<f64> {
        match self {
            Verdict::Accepted { speedup } => *speedup,
            _ => None,
        }
    }

    /// Whether the harness accepted the candidate.
    pub fn accepted(&self) -> bool {
        matches!(self, Verdict::Accepted { .. })
    }

    /// One line for prompts and lessons.
    pub fn describe(&self) -> String {
        match self {
            Verdict::Accepted { speedup: Some(s) } => format!("accepted, {s:.3}x the baseline"),
            Verdict::Accepted { speedup: None } => "accepted (correct; not timed on this device)".into(),
            Verdict::Rejected { gate, reason, exploit: true } => format!("rejected by {gate} as an exploit: {reason}"),
            Verdict::Rejected { gate, reason, .. } => format!("rejected by {gate}: {reason}"),
            Verdict::CouldNotRun { reason } => format!("could not run: {reason}"),
        }
    }
}

/// The source with comments, trailing whitespace and blank lines removed: what the hash is of.
/// A comment is a `#` outside a string literal opened on the same line (triple-quoted strings
/// spanning lines are kept as written).
pub fn normalize(source: &str) -> String {
    let mut lines = Vec::new();
    for line in source.lines() {
        let code = strip_comment(line).trim_end();
        if !code.is_empty() {
            lines.push(code);
        }
    }
    lines.join("\n")
}

fn strip_comment(line: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None if c == '#' => return &line[..i],
            None if c == '"' || c == '\'' => quote = Some(c),
            None => {}
        }
    }
    line
}

/// A 64-bit FNV-1a hash of [`normalize`]d source, as 16 hex digits.
pub fn source_hash(source: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in normalize(source).bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The static pre-checks of a candidate against its problem: it parses, defines `class
/// ModelNew`, and its `__init__` and `forward` take the same parameters as the problem's
/// `Model` (names, order, kinds, which have defaults). The error says what is wrong. A problem
/// that does not parse (or has no `Model`) is not compared.
pub fn check_static(problem: &str, candidate: &str) -> Result<(), String> {
    let suite = ast::Suite::parse(candidate, "<candidate>")
        .map_err(|e| format!("the file does not parse as Python: {}", e.error))?;
    let new = find_class(&suite, "ModelNew").ok_or("the file defines no `class ModelNew` at module level")?;
    let Ok(problem_suite) = ast::Suite::parse(problem, "<problem>") else { return Ok(()) };
    let Some(model) = find_class(&problem_suite, "Model") else { return Ok(()) };
    for method in ["__init__", "forward"] {
        let want = signature(model, method);
        let got = signature(new, method);
        if want != got {
            let show = |s: &Option<String>| s.clone().unwrap_or_else(|| "(not defined)".into());
            return Err(format!(
                "ModelNew.{method}{} must take the same parameters as Model.{method}{}",
                show(&got),
                show(&want)
            ));
        }
    }
    Ok(())
}

fn find_class<'a>(suite: &'a [Stmt], name: &str) -> Option<&'a ast::StmtClassDef> {
    suite.iter().find_map(|s| match s {
        Stmt::ClassDef(c) if c.name.as_str() == name => Some(c),
        _ => None,
    })
}

/// A method's parameter list as text, e.g. `(self, a, b=…, *args, k, **kw)`.
fn signature(class: &ast::StmtClassDef, method: &str) -> Option<String> {
    let args = class.body.iter().find_map(|s| match s {
        Stmt::FunctionDef(f) if f.name.as_str() == method => Some(&f.args),
        Stmt::AsyncFunctionDef(f) if f.name.as_str() == method => Some(&f.args),
        _ => None,
    })?;
    let with_default = |a: &ast::ArgWithDefault| {
        if a.default.is_some() {
            format!("{}=…", a.def.arg)
        } else {
            a.def.arg.to_string()
        }
    };
    let mut parts: Vec<String> = args.posonlyargs.iter().map(with_default).collect();
    if !args.posonlyargs.is_empty() {
        parts.push("/".into());
    }
    parts.extend(args.args.iter().map(with_default));
    match &args.vararg {
        Some(v) => parts.push(format!("*{}", v.arg)),
        None if !args.kwonlyargs.is_empty() => parts.push("*".into()),
        None => {}
    }
    parts.extend(args.kwonlyargs.iter().map(with_default));
    if let Some(k) = &args.kwarg {
        parts.push(format!("**{}", k.arg));
    }
    Some(format!("({})", parts.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROBLEM: &str = "import torch\nclass Model(torch.nn.Module):\n    def __init__(self, dim: int):\n        super().__init__()\n    def forward(self, a, b=None):\n        return a\n";

    #[test]
    fn comments_and_blank_lines_do_not_change_the_hash() {
        let a = "x = 1  # one\n\n\ny = '#not a comment'\n";
        let b = "# header\nx = 1\ny = '#not a comment'   \n";
        assert_eq!(source_hash(a), source_hash(b));
        assert_ne!(source_hash(a), source_hash("x = 2\ny = '#not a comment'\n"));
        assert_eq!(normalize(a), "x = 1\ny = '#not a comment'");
    }

    #[test]
    fn verdicts_serialize_with_a_kind_tag_and_read_back() {
        let v = Verdict::Rejected { gate: "exploits".into(), reason: "cached output".into(), exploit: true };
        let text = serde_json::to_string(&v).unwrap();
        assert_eq!(text, r#"{"kind":"rejected","gate":"exploits","reason":"cached output","exploit":true}"#);
        assert_eq!(serde_json::from_str::<Verdict>(&text).unwrap(), v);
        let untimed: Verdict = serde_json::from_str(r#"{"kind":"accepted","speedup":null}"#).unwrap();
        assert_eq!(untimed, Verdict::Accepted { speedup: None });
        let env: Verdict = serde_json::from_str(r#"{"kind":"could_not_run","reason":"no GPU"}"#).unwrap();
        assert_eq!(env.describe(), "could not run: no GPU");
    }

    #[test]
    fn a_matching_model_new_passes() {
        let c = "class ModelNew:\n    def __init__(self, dim):\n        pass\n    def forward(self, a, b=1):\n        return a\n";
        assert_eq!(check_static(PROBLEM, c), Ok(()));
    }

    #[test]
    fn a_different_forward_is_caught() {
        let c = "class ModelNew:\n    def __init__(self, dim):\n        pass\n    def forward(self, x, b=None):\n        return x\n";
        let err = check_static(PROBLEM, c).unwrap_err();
        assert_eq!(err, "ModelNew.forward(self, x, b=…) must take the same parameters as Model.forward(self, a, b=…)");
    }

    #[test]
    fn syntax_errors_and_a_missing_class_are_caught() {
        assert!(check_static(PROBLEM, "def f(:\n").unwrap_err().contains("does not parse"));
        assert!(check_static(PROBLEM, "class Model:\n    pass\n").unwrap_err().contains("no `class ModelNew`"));
    }
}
