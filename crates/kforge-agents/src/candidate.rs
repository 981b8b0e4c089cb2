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
/// A comment is a `#` outside string literals; the lines of a triple-quoted string spanning lines
/// are content, blank or not (a CUDA source's `#define TILE 64` is not a comment).
pub fn normalize(source: &str) -> String {
    let mut lines = Vec::new();
    let mut open: Option<&'static [u8]> = None;
    for line in source.lines() {
        let started_inside = open.is_some();
        let (code, still_open) = strip_comment(line, open);
        open = still_open;
        if open.is_some() {
            lines.push(code); // ends inside a string: all of it is content
            continue;
        }
        let code = code.trim_end();
        if started_inside || !code.is_empty() {
            lines.push(code);
        }
    }
    lines.join("\n")
}

/// `line` up to its comment, given the triple quote of a string the line starts inside (if
/// any); and the triple quote still open at its end.
fn strip_comment<'a>(line: &'a str, mut open: Option<&'static [u8]>) -> (&'a str, Option<&'static [u8]>) {
    let b = line.as_bytes();
    let mut single: Option<u8> = None;
    let mut i = 0;
    while i < b.len() {
        if (open.is_some() || single.is_some()) && b[i] == b'\\' {
            i += 2;
            continue;
        }
        if let Some(q) = open {
            if b[i..].starts_with(q) {
                open = None;
                i += 3;
                continue;
            }
        } else if let Some(q) = single {
            if b[i] == q {
                single = None;
            }
        } else if b[i] == b'#' {
            return (&line[..i], None);
        } else if b[i] == b'"' || b[i] == b'\'' {
            let triple: &'static [u8] = if b[i] == b'"' { b"\"\"\"" } else { b"'''" };
            if b[i..].starts_with(triple) {
                open = Some(triple);
                i += 3;
                continue;
            }
            single = Some(b[i]);
        }
        i += 1;
    }
    (line, open)
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
/// `Model` (names, order, kinds, which have defaults). A method a class does not define is looked
/// up in its bases defined in the same file (`class ModelNew(Model)` with a copy of `Model`
/// above it), `nn.Module`'s `__init__` being `(self)`; behind a base defined elsewhere the
/// method is not compared (the verifier's dry run judges it). The error says what is wrong. A
/// problem that does not parse (or has no `Model`) is not compared.
pub fn check_static(problem: &str, candidate: &str) -> Result<(), String> {
    let suite = ast::Suite::parse(candidate, "<candidate>")
        .map_err(|e| format!("the file does not parse as Python: {}", e.error))?;
    let new = find_class(&suite, "ModelNew").ok_or("the file defines no `class ModelNew` at module level")?;
    let Ok(problem_suite) = ast::Suite::parse(problem, "<problem>") else { return Ok(()) };
    let Some(model) = find_class(&problem_suite, "Model") else { return Ok(()) };
    for method in ["__init__", "forward"] {
        let (Sig::Known(want), Sig::Known(got)) =
            (resolve(&problem_suite, model, method, 0), resolve(&suite, new, method, 0))
        else {
            continue;
        };
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

/// A method's parameters as a class has it: known (its text, `None` for not defined at all), or
/// unknown behind a base class defined in another module.
enum Sig {
    Known(Option<String>),
    Unknown,
}

/// `torch.nn.Module`, `nn.Module` or `Module`.
fn is_module(base: &ast::Expr) -> bool {
    match base {
        ast::Expr::Name(n) => n.id.as_str() == "Module",
        ast::Expr::Attribute(a) => a.attr.as_str() == "Module",
        _ => false,
    }
}

/// `method` of `class` through its bases, left to right (Python's order for these simple
/// hierarchies), depth-bounded against a cycle of names.
fn resolve(suite: &[Stmt], class: &ast::StmtClassDef, method: &str, depth: usize) -> Sig {
    if let Some(sig) = signature(class, method) {
        return Sig::Known(Some(sig));
    }
    if depth > 8 {
        return Sig::Unknown;
    }
    for base in &class.bases {
        if is_module(base) {
            continue;
        }
        let found = match base {
            ast::Expr::Name(n) => find_class(suite, n.id.as_str()).filter(|c| c.name != class.name),
            _ => None,
        };
        match found.map(|c| resolve(suite, c, method, depth + 1)) {
            Some(Sig::Known(None)) => {}
            Some(sig) => return sig,
            None => return Sig::Unknown,
        }
    }
    let module_init = class.bases.iter().any(is_module) && method == "__init__";
    Sig::Known(module_init.then(|| "(self)".to_string()))
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
    fn lines_inside_triple_quoted_strings_are_content() {
        let cuda = |tile: u32| {
            format!("src = \"\"\"\n#include <cuda.h>\n#define TILE {tile}   \n\n\"\"\"  # the kernel\nx = 1 # one\n")
        };
        assert_ne!(source_hash(&cuda(32)), source_hash(&cuda(64)), "a #define is no comment");
        assert_eq!(normalize(&cuda(32)), "src = \"\"\"\n#include <cuda.h>\n#define TILE 32   \n\n\"\"\"\nx = 1");
        let single = "s = '''a # b''' # c\nt = \"it's # here\"\nu = 'esc \\' # still' # gone\n";
        assert_eq!(normalize(single), "s = '''a # b'''\nt = \"it's # here\"\nu = 'esc \\' # still'");
        assert_eq!(normalize("é = '\\é' # x\n"), "é = '\\é'", "an escape before a multi-byte char");
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
    fn inherited_methods_are_looked_up_in_the_files_own_bases() {
        let copy = "import torch\nclass Model(torch.nn.Module):\n    def __init__(self, dim: int):\n        super().__init__()\n    def forward(self, a, b=None):\n        return a\n";
        let sub = format!("{copy}class ModelNew(Model):\n    def forward(self, a, b=None):\n        return a * 1\n");
        assert_eq!(check_static(PROBLEM, &sub), Ok(()));
        let wrong = format!("{copy}class ModelNew(Model):\n    def forward(self, a):\n        return a\n");
        assert!(check_static(PROBLEM, &wrong).unwrap_err().contains("ModelNew.forward(self, a) must"));
        // Two levels, and a base from another module: not compared.
        let deep = format!("{copy}class Mid(Model):\n    pass\nclass ModelNew(Mid):\n    pass\n");
        assert_eq!(check_static(PROBLEM, &deep), Ok(()));
        let imported = "from elsewhere import Base\nclass ModelNew(Base):\n    pass\n";
        assert_eq!(check_static(PROBLEM, imported), Ok(()));
        // nn.Module's __init__ takes nothing: a problem whose Model takes `dim` needs ModelNew's own.
        let bare =
            "import torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, a, b=None):\n        return a\n";
        let err = check_static(PROBLEM, bare).unwrap_err();
        assert_eq!(err, "ModelNew.__init__(self) must take the same parameters as Model.__init__(self, dim)");
        let plain = "class ModelNew:\n    def forward(self, a, b=None):\n        return a\n";
        assert!(check_static(PROBLEM, plain).unwrap_err().contains("ModelNew.__init__(not defined)"));
        let cycle = "class ModelNew(ModelNew):\n    pass\n";
        assert_eq!(check_static(PROBLEM, cycle), Ok(()), "its own base: a NameError the dry run reports");
    }

    #[test]
    fn syntax_errors_and_a_missing_class_are_caught() {
        assert!(check_static(PROBLEM, "def f(:\n").unwrap_err().contains("does not parse"));
        assert!(check_static(PROBLEM, "class Model:\n    pass\n").unwrap_err().contains("no `class ModelNew`"));
    }
}
