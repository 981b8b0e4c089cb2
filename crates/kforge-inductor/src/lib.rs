//! Parse TorchInductor *wrapper code* into an [`Inventory`].
//!
//! `torch._inductor.utils.run_and_get_code(fn, *args)` (or `TORCH_LOGS=output_code`) yields a
//! Python module that defines every generated Triton kernel as
//! `name = async_compile.triton('name', '''<source>''', device_str='cuda')` and then launches
//! kernels, vendor-library calls (`extern_kernels.mm`, ...) and aten fallbacks from
//! `call(args)`. kforge keeps the vendor calls and searches only the generated Triton kernels;
//! this crate turns the wrapper into a structured inventory of both.
//!
//! # Parser choice
//!
//! The wrapper (and every kernel source inside it) is parsed with **`rustpython-parser` 0.4**
//! (the last release of the RustPython parser; pure Rust, pre-generated LALRPOP tables, builds on
//! Rust 1.95 with the lightweight `num-bigint` backend instead of `malachite`). Nothing here is
//! regex-based: kernel definitions, decorators, launches, buffer allocations and the Python
//! literal dicts (`triton_meta`, `inductor_meta`, `size_hints`) are all read from the AST.
//! `tree-sitter-python` would keep comments, but it needs a C toolchain build step and yields an
//! untyped CST; rustpython gives a typed AST with byte ranges, which is all we need.
//! The AST drops comments, so provenance comments (`# kernel path: ...`,
//! `# Topologically Sorted Source Nodes: [...], Original ATen: [...]`, older
//! `# Source Nodes: ...`) are recovered by pairing each kernel definition statement with the
//! comment lines that lie between the previous top-level statement and it (comment text is
//! free-form, so reading it with string operations is appropriate).
//!
//! # What is recognised
//!
//! * `call`: a module-level `def call(args)` (torch ≤ 2.7) or a `call(self, args)` method of a
//!   module-level class (`class Runner`, torch ≥ 2.8). With graph partitions
//!   (`runner = Runner(partitions=[partition_0, ...])`, used with CUDA graphs), a call of
//!   `self.partitions[i](...)` or of any module-level function is inlined at that point, so
//!   launches come out in execution order.
//! * Triton launches: `kernel.run(a, b, ..., xnumel, stream=stream0)` (and the older
//!   `grid=grid(n)` / `grid=...mm_grid(...)` keyword). Positional arguments are split with the
//!   kernel's `@triton.jit` signature (constexpr parameters excluded): arguments bound to a
//!   parameter whose name ends in `numel` go to `numels`, others to `args`; extra trailing
//!   positional arguments (newer template launches pass the grid as `..., 8, 1, 1`) become
//!   `grid` as a tuple text `"(8, 1, 1)"`. A `*args` launch keeps everything in `args`.
//! * A `name.run(...)` launch of a name never defined by `async_compile.triton` is an **error**
//!   ([`ParseError::UndefinedKernel`]): the wrapper would fail at run time with a `NameError`,
//!   so an inventory of it is not trustworthy.
//! * Extern calls: any call whose callee text starts with `extern_kernels.`; `out` is the `out=`
//!   keyword, or else the assignment target (`buf0 = extern_kernels.convolution(...)`).
//!   Keyword arguments other than `out` are kept in `args` as `name=value` text.
//! * Aten fallbacks: callee text starting with `aten.` or `torch.ops.`.
//! * Buffers: `bufN = empty_strided_<dev>(shape, stride, dtype)` and the older
//!   `empty_strided(shape, stride, device='cuda', dtype=...)`. `reinterpret_tensor` views and
//!   `alloc_from_pool` are not allocations and are not listed.
//! * CPU (`cpp_fused_*`) kernel calls and MPS kernels are not part of the inventory.

use std::collections::{HashMap, HashSet};

pub mod inspect;
pub mod profile;

use rustpython_parser::ast::{self, Constant, Expr, Ranged, Stmt};
use rustpython_parser::Parse;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Inventory of one Inductor wrapper module.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    /// Triton kernels defined with `async_compile.triton`, in definition order.
    pub kernels: Vec<TritonKernel>,
    /// Launches in `call()` execution order (partitions inlined).
    pub launches: Vec<Launch>,
    /// Buffers allocated in `call()` (and inlined partitions), in order.
    pub buffers: Vec<Buffer>,
}

/// The `@triton_heuristics.<kind>(...)` decorator of a kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KernelCategory {
    Pointwise,
    Reduction,
    PersistentReduction,
    Template,
    Foreach,
    UserAutotune,
    /// Any other heuristics (`split_scan`, `cooperative_reduction`, ...) by name, or `"none"`
    /// when the kernel has no `triton_heuristics` decorator.
    Other(String),
}

impl KernelCategory {
    fn from_heuristic(name: &str) -> Self {
        match name {
            "pointwise" => Self::Pointwise,
            "reduction" => Self::Reduction,
            "persistent_reduction" => Self::PersistentReduction,
            "template" => Self::Template,
            "foreach" => Self::Foreach,
            "user_autotune" => Self::UserAutotune,
            other => Self::Other(other.to_string()),
        }
    }
}

/// One generated Triton kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TritonKernel {
    /// The module global the kernel is bound to (what `call()` launches).
    pub name: String,
    pub category: KernelCategory,
    /// The kernel's Python source (the triple-quoted string).
    pub source: String,
    pub size_hints: Option<Value>,
    pub triton_meta: Option<Value>,
    pub inductor_meta: Option<Value>,
    /// `triton.Config(...)` calls found in the source (as `{"kwargs": {...}, "num_warps": ..}`)
    /// and the entries of a `user_autotune(configs=[...])` decorator.
    pub autotune_configs: Vec<Value>,
    /// From the `# ... Source Nodes: [...]` comment above the definition.
    pub source_nodes: Vec<String>,
    /// From the `Original ATen: [...]` part of that comment.
    pub aten_ops: Vec<String>,
    /// From the `# kernel path: ...` comment.
    pub kernel_path: Option<String>,
    /// 1-based line of the `name = async_compile.triton(` statement.
    pub def_line: usize,
    /// Runtime parameters of the `@triton.jit` function in order (constexpr ones excluded);
    /// used to split launch arguments into `args` and `numels`.
    pub params: Vec<String>,
}

/// One launch inside `call()`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Launch {
    Triton {
        kernel: String,
        /// Argument expressions (source text) bound to non-`*numel` parameters.
        args: Vec<String>,
        /// Argument expressions bound to `xnumel`/`ynumel`/`r0_numel`/... parameters.
        numels: Vec<String>,
        stream: Option<String>,
        /// `grid=` keyword text (older torch), or extra trailing positional grid arguments as a
        /// tuple text (newer template launches); `None` otherwise.
        grid: Option<String>,
        line: usize,
    },
    Extern {
        /// Callee text, e.g. `extern_kernels.mm`.
        op: String,
        args: Vec<String>,
        out: Option<String>,
        line: usize,
    },
    Aten {
        op: String,
        args: Vec<String>,
        line: usize,
    },
}

impl Launch {
    pub fn line(&self) -> usize {
        match self {
            Launch::Triton { line, .. } | Launch::Extern { line, .. } | Launch::Aten { line, .. } => *line,
        }
    }
}

/// One buffer allocation in `call()`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    pub name: String,
    /// Size expressions as source text (symbolic sizes such as `s0` stay symbolic).
    pub shape: Vec<String>,
    pub stride: Vec<String>,
    /// Dtype expression text, e.g. `torch.float32`.
    pub dtype: String,
    /// `cuda`, `cpu` (also for `empty_strided_cpu_pinned`), or another device type.
    pub device: String,
    pub line: usize,
}

/// Why a wrapper could not be inventoried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum ParseError {
    #[error("Python syntax error in wrapper at line {line}, column {col}: {message}")]
    Syntax { line: usize, col: usize, message: String },
    #[error(
        "no call() function: the wrapper defines neither a module-level `def call(args)` nor a \
         `call(self, args)` method on a module-level class"
    )]
    NoCallFunction,
    #[error(
        "Python syntax error in the source of Triton kernel `{kernel}` at wrapper line {line}, \
         column {col}: {message}"
    )]
    KernelSyntax { kernel: String, line: usize, col: usize, message: String },
    #[error("malformed async_compile.triton definition of `{kernel}` at line {line}: {reason}")]
    MalformedKernel { kernel: String, line: usize, reason: String },
    #[error(
        "Triton kernel `{kernel}` is launched at line {line} but never defined with \
         async_compile.triton(...)"
    )]
    UndefinedKernel { kernel: String, line: usize },
}

/// Replaceability verdicts for [`Inventory::replaceable`].
pub const WHY_TEMPLATE: &str = "template GEMM: policy choice";
pub const WHY_GENERATED: &str = "generated Triton: replaceable";
pub const WHY_USER: &str = "user-defined Triton kernel: kept as written";
pub const WHY_OTHER: &str = "unrecognised heuristics: not classified";

impl Inventory {
    /// Per kernel: (name, replaceable, why). Pointwise, reduction, persistent-reduction and
    /// foreach kernels are generated Triton and replaceable. Templates (`triton_tem_*`, a GEMM
    /// or convolution Inductor chose over cuBLAS/cuDNN under max-autotune) are reported as not
    /// replaceable by default: whether to search them is a policy choice of the caller. User
    /// kernels and unknown heuristics are not replaceable. Extern calls are not kernels here;
    /// the caller reports them from [`Inventory::launches`].
    pub fn replaceable(&self) -> Vec<(&str, bool, &'static str)> {
        self.kernels
            .iter()
            .map(|k| {
                let (ok, why) = match &k.category {
                    KernelCategory::Template => (false, WHY_TEMPLATE),
                    KernelCategory::Pointwise
                    | KernelCategory::Reduction
                    | KernelCategory::PersistentReduction
                    | KernelCategory::Foreach => (true, WHY_GENERATED),
                    KernelCategory::UserAutotune => (false, WHY_USER),
                    KernelCategory::Other(_) => (false, WHY_OTHER),
                };
                (k.name.as_str(), ok, why)
            })
            .collect()
    }

    pub fn kernel(&self, name: &str) -> Option<&TritonKernel> {
        self.kernels.iter().find(|k| k.name == name)
    }
}

// ---------------------------------------------------------------------------------------------
// Source helpers

struct Src<'a> {
    text: &'a str,
    line_starts: Vec<usize>,
}

impl<'a> Src<'a> {
    fn new(text: &'a str) -> Self {
        let mut line_starts = vec![0];
        for (i, b) in text.bytes().enumerate() {
            if b == b'\n' {
                line_starts.push(i + 1);
            }
        }
        Src { text, line_starts }
    }

    /// 1-based (line, column) of a byte offset; column counts characters.
    fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let idx = match self.line_starts.binary_search(&offset) {
            Ok(i) => i,
            Err(i) => i - 1,
        };
        let start = self.line_starts[idx];
        let col = self.text.get(start..offset).map(|s| s.chars().count()).unwrap_or(0) + 1;
        (idx + 1, col)
    }

    fn line_of<T: Ranged>(&self, node: &T) -> usize {
        self.line_col(node.start().to_usize()).0
    }

    fn text_of<T: Ranged>(&self, node: &T) -> String {
        let r = node.range();
        self.text.get(r.start().to_usize()..r.end().to_usize()).unwrap_or_default().to_string()
    }

    /// Text of 1-based line `n` without its newline.
    fn line(&self, n: usize) -> &'a str {
        let start = self.line_starts[n - 1];
        let end = self.line_starts.get(n).copied().unwrap_or(self.text.len());
        self.text[start..end].trim_end_matches(['\n', '\r'])
    }
}

/// Dotted text of a name/attribute chain (`torch.ops.aten.mm.default`); `None` otherwise.
fn dotted(e: &Expr) -> Option<String> {
    match e {
        Expr::Name(n) => Some(n.id.as_str().to_string()),
        Expr::Attribute(a) => dotted(&a.value).map(|v| format!("{v}.{}", a.attr.as_str())),
        _ => None,
    }
}

fn str_const(e: &Expr) -> Option<&str> {
    match e {
        Expr::Constant(c) => match &c.value {
            Constant::Str(s) => Some(s.as_str()),
            _ => None,
        },
        _ => None,
    }
}

fn keyword<'e>(call: &'e ast::ExprCall, name: &str) -> Option<&'e Expr> {
    call.keywords.iter().find(|k| k.arg.as_ref().map(|a| a.as_str()) == Some(name)).map(|k| &k.value)
}

// ---------------------------------------------------------------------------------------------
// Python literal -> JSON

/// Convert a Python literal expression to JSON. Dicts, lists, tuples, sets, strings, numbers,
/// booleans and `None` convert faithfully (non-string dict keys become their source text);
/// anything else (calls such as `DeviceProperties(...)`, names, `set()`) becomes its source
/// text as a JSON string. Note: `serde_json` maps are key-sorted unless the workspace enables
/// `preserve_order`, so dict key order is not kept (use `TritonKernel::params` for order).
fn py_to_json(e: &Expr, src: &Src) -> Value {
    match e {
        Expr::Constant(c) => const_to_json(&c.value).unwrap_or_else(|| Value::String(src.text_of(e))),
        Expr::Dict(d) => {
            let mut map = serde_json::Map::new();
            for (k, v) in d.keys.iter().zip(&d.values) {
                let key = match k {
                    Some(k) => match str_const(k) {
                        Some(s) => s.to_string(),
                        None => src.text_of(k),
                    },
                    None => format!("**{}", src.text_of(v)),
                };
                map.insert(key, py_to_json(v, src));
            }
            Value::Object(map)
        }
        Expr::List(l) => Value::Array(l.elts.iter().map(|x| py_to_json(x, src)).collect()),
        Expr::Tuple(t) => Value::Array(t.elts.iter().map(|x| py_to_json(x, src)).collect()),
        Expr::Set(s) => Value::Array(s.elts.iter().map(|x| py_to_json(x, src)).collect()),
        Expr::UnaryOp(u) if matches!(u.op, ast::UnaryOp::USub) => {
            if let Expr::Constant(c) = u.operand.as_ref() {
                let neg = match &c.value {
                    Constant::Int(i) => int_to_json(&format!("-{i}")),
                    Constant::Float(f) => serde_json::Number::from_f64(-f).map(Value::Number),
                    _ => None,
                };
                if let Some(v) = neg {
                    return v;
                }
            }
            Value::String(src.text_of(e))
        }
        _ => Value::String(src.text_of(e)),
    }
}

fn int_to_json(s: &str) -> Option<Value> {
    if let Ok(i) = s.parse::<i64>() {
        return Some(Value::from(i));
    }
    if let Ok(u) = s.parse::<u64>() {
        return Some(Value::from(u));
    }
    Some(Value::String(s.to_string()))
}

fn const_to_json(c: &Constant) -> Option<Value> {
    match c {
        Constant::None => Some(Value::Null),
        Constant::Bool(b) => Some(Value::Bool(*b)),
        Constant::Str(s) => Some(Value::String(s.clone())),
        Constant::Int(i) => int_to_json(&i.to_string()),
        Constant::Float(f) => serde_json::Number::from_f64(*f).map(Value::Number),
        Constant::Tuple(t) => t.iter().map(const_to_json).collect::<Option<Vec<_>>>().map(Value::Array),
        Constant::Bytes(_) | Constant::Complex { .. } | Constant::Ellipsis => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Kernel definitions

fn syntax_error(e: &rustpython_parser::ParseError, src: &Src) -> (usize, usize, String) {
    let (line, col) = src.line_col(e.offset.to_usize());
    (line, col, e.error.to_string())
}

/// Provenance from the comment lines between `from_line` (exclusive) and `to_line` (exclusive).
fn provenance(src: &Src, from_line: usize, to_line: usize) -> (Option<String>, Vec<String>, Vec<String>) {
    let mut path = None;
    let mut nodes = Vec::new();
    let mut aten = Vec::new();
    for n in (from_line + 1)..to_line {
        let l = src.line(n).trim();
        let Some(c) = l.strip_prefix('#') else { continue };
        let c = c.trim();
        if let Some(p) = c.strip_prefix("kernel path:") {
            path = Some(p.trim().to_string());
        } else if let Some((n, a)) = parse_source_nodes(c) {
            nodes = n;
            aten = a;
        }
    }
    (path, nodes, aten)
}

/// `Topologically Sorted Source Nodes: [a, b], Original ATen: [aten.x, aten.y]` (or the older
/// `Source Nodes: ...`).
fn parse_source_nodes(c: &str) -> Option<(Vec<String>, Vec<String>)> {
    let rest = c.strip_prefix("Topologically Sorted Source Nodes:").or_else(|| c.strip_prefix("Source Nodes:"))?;
    let (nodes_part, aten_part) = match rest.find("Original ATen:") {
        Some(i) => (&rest[..i], Some(&rest[i + "Original ATen:".len()..])),
        None => (rest, None),
    };
    Some((bracket_list(nodes_part), aten_part.map(bracket_list).unwrap_or_default()))
}

fn bracket_list(s: &str) -> Vec<String> {
    let s = s.trim().trim_end_matches(',').trim();
    let inner = match (s.find('['), s.rfind(']')) {
        (Some(a), Some(b)) if b > a => &s[a + 1..b],
        _ => s,
    };
    inner.split(',').map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect()
}

fn is_jit(dec: &Expr) -> bool {
    let f = match dec {
        Expr::Call(c) => c.func.as_ref(),
        other => other,
    };
    matches!(dotted(f).as_deref(), Some("triton.jit") | Some("jit"))
}

fn heuristic_of(dec: &Expr) -> Option<(&str, &ast::ExprCall)> {
    let Expr::Call(c) = dec else { return None };
    let Expr::Attribute(a) = c.func.as_ref() else { return None };
    if dotted(&a.value).as_deref() == Some("triton_heuristics") {
        Some((a.attr.as_str(), c))
    } else {
        None
    }
}

fn collect_configs(e: &Expr, src: &Src, out: &mut Vec<Value>) {
    match e {
        Expr::Call(c) => {
            if matches!(dotted(&c.func).as_deref(), Some("triton.Config") | Some("Config")) {
                let mut m = serde_json::Map::new();
                if let Some(first) = c.args.first() {
                    m.insert("kwargs".into(), py_to_json(first, src));
                }
                for k in &c.keywords {
                    let key = k.arg.as_ref().map(|a| a.as_str().to_string()).unwrap_or_else(|| "**".into());
                    m.insert(key, py_to_json(&k.value, src));
                }
                out.push(Value::Object(m));
                return;
            }
            for a in &c.args {
                collect_configs(a, src, out);
            }
            for k in &c.keywords {
                collect_configs(&k.value, src, out);
            }
        }
        Expr::List(l) => l.elts.iter().for_each(|x| collect_configs(x, src, out)),
        Expr::Tuple(t) => t.elts.iter().for_each(|x| collect_configs(x, src, out)),
        Expr::Dict(d) => d.values.iter().for_each(|x| collect_configs(x, src, out)),
        _ => {}
    }
}

struct KernelInfo {
    category: KernelCategory,
    size_hints: Option<Value>,
    triton_meta: Option<Value>,
    inductor_meta: Option<Value>,
    autotune_configs: Vec<Value>,
    params: Vec<String>,
}

fn analyze_kernel_source(var: &str, declared: &str, ksrc: &Src, suite: &[Stmt]) -> KernelInfo {
    let defs: Vec<&ast::StmtFunctionDef> = suite
        .iter()
        .filter_map(|s| match s {
            Stmt::FunctionDef(f) if f.decorator_list.iter().any(is_jit) => Some(f),
            _ => None,
        })
        .collect();
    let def = defs
        .iter()
        .find(|f| f.name.as_str() == var || f.name.as_str() == declared)
        .or_else(|| defs.iter().find(|f| f.decorator_list.iter().any(|d| heuristic_of(d).is_some())))
        .or(defs.first())
        .copied();

    let mut info = KernelInfo {
        category: KernelCategory::Other("none".into()),
        size_hints: None,
        triton_meta: None,
        inductor_meta: None,
        autotune_configs: Vec::new(),
        params: Vec::new(),
    };
    let mut configs = Vec::new();
    // Module-level `configs = [triton.Config(...)]` style assignments in the kernel source.
    for s in suite {
        if let Stmt::Assign(a) = s {
            collect_configs(&a.value, ksrc, &mut configs);
        }
    }
    if let Some(def) = def {
        for d in &def.decorator_list {
            if let Some((kind, call)) = heuristic_of(d) {
                info.category = KernelCategory::from_heuristic(kind);
                info.size_hints = keyword(call, "size_hints").map(|e| py_to_json(e, ksrc));
                info.triton_meta = keyword(call, "triton_meta").map(|e| py_to_json(e, ksrc));
                info.inductor_meta = keyword(call, "inductor_meta").map(|e| py_to_json(e, ksrc));
                if let Some(Expr::List(l)) = keyword(call, "configs") {
                    for c in &l.elts {
                        match c {
                            Expr::Call(_) => collect_configs(c, ksrc, &mut configs),
                            other => configs.push(py_to_json(other, ksrc)),
                        }
                    }
                }
            } else {
                collect_configs(d, ksrc, &mut configs);
            }
        }
        let a = &def.args;
        info.params = a
            .posonlyargs
            .iter()
            .chain(&a.args)
            .filter(|p| {
                !p.def.annotation.as_ref().map(|ann| ksrc.text_of(ann.as_ref()).contains("constexpr")).unwrap_or(false)
            })
            .map(|p| p.def.arg.as_str().to_string())
            .collect();
    }
    info.autotune_configs = configs;
    info
}

fn parse_kernels(suite: &[Stmt], src: &Src) -> Result<Vec<TritonKernel>, ParseError> {
    let mut kernels = Vec::new();
    let mut prev_end_line = 0usize;
    for stmt in suite {
        let start_line = src.line_of(stmt);
        let this_prev = prev_end_line;
        prev_end_line = src.line_col(stmt.end().to_usize()).0;
        let Stmt::Assign(a) = stmt else { continue };
        let (Some(Expr::Name(target)), Expr::Call(call)) = (a.targets.first(), a.value.as_ref()) else {
            continue;
        };
        if a.targets.len() != 1 || dotted(&call.func).as_deref() != Some("async_compile.triton") {
            continue;
        }
        let name = target.id.as_str().to_string();
        let malformed = |reason: &str| ParseError::MalformedKernel {
            kernel: name.clone(),
            line: start_line,
            reason: reason.to_string(),
        };
        let declared = call.args.first().and_then(str_const).unwrap_or(&name).to_string();
        let src_expr = call
            .args
            .get(1)
            .or_else(|| keyword(call, "source_code"))
            .ok_or_else(|| malformed("missing kernel source argument"))?;
        let source = str_const(src_expr).ok_or_else(|| malformed("kernel source is not a string literal"))?.to_string();
        let ksrc = Src::new(&source);
        let ksuite = ast::Suite::parse(&source, &name).map_err(|e| {
            let (kl, kc, message) = syntax_error(&e, &ksrc);
            // The string body starts right after the opening quotes on the literal's line.
            let lit_line = src.line_of(src_expr);
            ParseError::KernelSyntax { kernel: name.clone(), line: lit_line + kl - 1, col: kc, message }
        })?;
        let info = analyze_kernel_source(&name, &declared, &ksrc, &ksuite);
        let (kernel_path, source_nodes, aten_ops) = provenance(src, this_prev, start_line);
        kernels.push(TritonKernel {
            name,
            category: info.category,
            source,
            size_hints: info.size_hints,
            triton_meta: info.triton_meta,
            inductor_meta: info.inductor_meta,
            autotune_configs: info.autotune_configs,
            source_nodes,
            aten_ops,
            kernel_path,
            def_line: start_line,
            params: info.params,
        });
    }
    Ok(kernels)
}

// ---------------------------------------------------------------------------------------------
// call() walking

struct Walker<'a> {
    src: &'a Src<'a>,
    kernels: HashMap<&'a str, &'a TritonKernel>,
    functions: HashMap<&'a str, &'a ast::StmtFunctionDef>,
    partitions: Vec<String>,
    active: HashSet<String>,
    launches: Vec<Launch>,
    buffers: Vec<Buffer>,
}

impl<'a> Walker<'a> {
    fn walk(&mut self, body: &'a [Stmt]) -> Result<(), ParseError> {
        for s in body {
            match s {
                Stmt::Expr(e) => self.expr_stmt(&e.value, None)?,
                Stmt::Assign(a) => {
                    let target = match a.targets.as_slice() {
                        [Expr::Name(n)] => Some(n.id.as_str()),
                        _ => None,
                    };
                    if let (Some(t), Expr::Call(c)) = (target, a.value.as_ref()) {
                        if self.buffer(t, c) {
                            continue;
                        }
                    }
                    self.expr_stmt(
                        &a.value,
                        target.map(str::to_string).or_else(|| a.targets.first().map(|t| self.src.text_of(t))),
                    )?
                }
                Stmt::With(w) => self.walk(&w.body)?,
                Stmt::If(i) => {
                    self.walk(&i.body)?;
                    self.walk(&i.orelse)?;
                }
                Stmt::For(f) => {
                    self.walk(&f.body)?;
                    self.walk(&f.orelse)?;
                }
                Stmt::While(w) => {
                    self.walk(&w.body)?;
                    self.walk(&w.orelse)?;
                }
                Stmt::Try(t) => {
                    self.walk(&t.body)?;
                    for ast::ExceptHandler::ExceptHandler(h) in &t.handlers {
                        self.walk(&h.body)?;
                    }
                    self.walk(&t.orelse)?;
                    self.walk(&t.finalbody)?;
                }
                Stmt::Return(r) => {
                    if let Some(v) = &r.value {
                        self.expr_stmt(v, None)?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn buffer(&mut self, target: &str, c: &ast::ExprCall) -> bool {
        let Some(func) = dotted(&c.func) else { return false };
        let func = func.strip_prefix("torch.").unwrap_or(&func);
        let device = if let Some(dev) = func.strip_prefix("empty_strided_") {
            dev.split('_').next().unwrap_or(dev).to_string()
        } else if func == "empty_strided" {
            match keyword(c, "device") {
                Some(e) => match e {
                    Expr::Call(dc) => keyword(dc, "type")
                        .or(dc.args.first())
                        .and_then(str_const)
                        .map(|s| s.to_string())
                        .unwrap_or_else(|| self.src.text_of(e)),
                    other => str_const(other)
                        .map(|s| s.split(':').next().unwrap_or(s).to_string())
                        .unwrap_or_else(|| self.src.text_of(other)),
                },
                None => "cpu".to_string(),
            }
        } else {
            return false;
        };
        let elts = |e: Option<&Expr>| -> Vec<String> {
            match e {
                Some(Expr::Tuple(t)) => t.elts.iter().map(|x| self.src.text_of(x)).collect(),
                Some(Expr::List(l)) => l.elts.iter().map(|x| self.src.text_of(x)).collect(),
                Some(other) => vec![self.src.text_of(other)],
                None => Vec::new(),
            }
        };
        let shape = elts(c.args.first().or_else(|| keyword(c, "size")));
        let stride = elts(c.args.get(1).or_else(|| keyword(c, "stride")));
        let dtype = c.args.get(2).or_else(|| keyword(c, "dtype")).map(|e| self.src.text_of(e)).unwrap_or_default();
        self.buffers.push(Buffer { name: target.to_string(), shape, stride, dtype, device, line: self.src.line_of(c) });
        true
    }

    fn expr_stmt(&mut self, value: &'a Expr, target: Option<String>) -> Result<(), ParseError> {
        let Expr::Call(c) = value else { return Ok(()) };
        let line = self.src.line_of(value);

        if let Expr::Subscript(s) = c.func.as_ref() {
            return self.partition_call(s);
        }

        let Some(func) = dotted(&c.func) else { return Ok(()) };

        // Triton launch: `kernel.run(...)`.
        if let Expr::Attribute(a) = c.func.as_ref() {
            if a.attr.as_str() == "run" {
                if let Expr::Name(n) = a.value.as_ref() {
                    let kname = n.id.as_str();
                    let Some(kernel) = self.kernels.get(kname).copied() else {
                        return Err(ParseError::UndefinedKernel { kernel: kname.to_string(), line });
                    };
                    self.triton_launch(kernel, c, line);
                    return Ok(());
                }
            }
        }

        if func.starts_with("extern_kernels.") {
            self.extern_launch(c, func, target, line);
            return Ok(());
        }

        if func.starts_with("aten.") || func.starts_with("torch.ops.") {
            self.aten_launch(c, func, line);
            return Ok(());
        }

        // Direct call of a module-level function (e.g. `partition_0(args)`).
        if let Expr::Name(n) = c.func.as_ref() {
            if self.functions.contains_key(n.id.as_str()) {
                return self.inline(n.id.as_str());
            }
        }
        Ok(())
    }

    /// Partition call: `self.partitions[i](...)` inlines partition `i`; other subscripted calls
    /// launch nothing.
    fn partition_call(&mut self, s: &ast::ExprSubscript) -> Result<(), ParseError> {
        if dotted(&s.value).as_deref() == Some("self.partitions") {
            if let Expr::Constant(k) = s.slice.as_ref() {
                if let Constant::Int(i) = &k.value {
                    let idx: usize = i.to_string().parse().unwrap_or(usize::MAX);
                    if let Some(name) = self.partitions.get(idx).cloned() {
                        return self.inline(&name);
                    }
                }
            }
        }
        Ok(())
    }

    /// A vendor library call `extern_kernels.mm(a, b, out=buf)`; without `out=` its result is the
    /// assignment's `target`.
    fn extern_launch(&mut self, c: &ast::ExprCall, func: String, target: Option<String>, line: usize) {
        let mut args: Vec<String> = c.args.iter().map(|x| self.src.text_of(x)).collect();
        let mut out = None;
        for k in &c.keywords {
            match k.arg.as_ref().map(|a| a.as_str()) {
                Some("out") => out = Some(self.src.text_of(&k.value)),
                Some(name) => args.push(format!("{name}={}", self.src.text_of(&k.value))),
                None => args.push(format!("**{}", self.src.text_of(&k.value))),
            }
        }
        self.launches.push(Launch::Extern { op: func, args, out: out.or(target), line });
    }

    /// An aten fallback call: `aten.*` or `torch.ops.*`.
    fn aten_launch(&mut self, c: &ast::ExprCall, func: String, line: usize) {
        let mut args: Vec<String> = c.args.iter().map(|x| self.src.text_of(x)).collect();
        for k in &c.keywords {
            let v = self.src.text_of(&k.value);
            args.push(match &k.arg {
                Some(a) => format!("{}={v}", a.as_str()),
                None => format!("**{v}"),
            });
        }
        self.launches.push(Launch::Aten { op: func, args, line });
    }

    fn inline(&mut self, name: &str) -> Result<(), ParseError> {
        let Some(f) = self.functions.get(name).copied() else { return Ok(()) };
        if !self.active.insert(name.to_string()) {
            return Ok(()); // recursion guard
        }
        let r = self.walk(&f.body);
        self.active.remove(name);
        r
    }

    fn triton_launch(&mut self, kernel: &TritonKernel, c: &ast::ExprCall, line: usize) {
        let mut args = Vec::new();
        let mut numels = Vec::new();
        let mut extra = Vec::new();
        let starred = c.args.iter().any(|a| matches!(a, Expr::Starred(_)));
        for (i, a) in c.args.iter().enumerate() {
            let text = self.src.text_of(a);
            if starred || kernel.params.is_empty() {
                args.push(text);
            } else {
                match kernel.params.get(i) {
                    Some(p) if p.ends_with("numel") => numels.push(text),
                    Some(_) => args.push(text),
                    None => extra.push(text),
                }
            }
        }
        let stream = keyword(c, "stream").map(|e| self.src.text_of(e));
        let grid = keyword(c, "grid").map(|e| self.src.text_of(e)).or_else(|| {
            if extra.is_empty() {
                None
            } else {
                Some(format!("({})", extra.join(", ")))
            }
        });
        self.launches.push(Launch::Triton { kernel: kernel.name.clone(), args, numels, stream, grid, line });
    }
}

/// Find the partition list of `Runner(partitions=[partition_0, ...])` at module level.
fn partition_list(suite: &[Stmt]) -> Vec<String> {
    for s in suite {
        if let Stmt::Assign(a) = s {
            if let Expr::Call(c) = a.value.as_ref() {
                if let Some(Expr::List(l)) = keyword(c, "partitions") {
                    return l.elts.iter().filter_map(dotted).collect();
                }
            }
        }
    }
    Vec::new()
}

/// Parse Inductor wrapper code into an [`Inventory`].
pub fn parse_wrapper(source: &str) -> Result<Inventory, ParseError> {
    let src = Src::new(source);
    let suite = ast::Suite::parse(source, "<inductor wrapper>").map_err(|e| {
        let (line, col, message) = syntax_error(&e, &src);
        ParseError::Syntax { line, col, message }
    })?;

    let mut functions: HashMap<&str, &ast::StmtFunctionDef> = HashMap::new();
    let mut call_fn: Option<&ast::StmtFunctionDef> = None;
    let mut method_call: Option<&ast::StmtFunctionDef> = None;
    for s in &suite {
        match s {
            Stmt::FunctionDef(f) => {
                if f.name.as_str() == "call" {
                    call_fn = Some(f);
                } else {
                    functions.insert(f.name.as_str(), f);
                }
            }
            Stmt::ClassDef(cls) if method_call.is_none() => {
                method_call = cls.body.iter().find_map(|m| match m {
                    Stmt::FunctionDef(f) if f.name.as_str() == "call" => Some(f),
                    _ => None,
                });
            }
            _ => {}
        }
    }
    let call_fn = call_fn.or(method_call).ok_or(ParseError::NoCallFunction)?;

    let kernels = parse_kernels(&suite, &src)?;
    let mut walker = Walker {
        src: &src,
        kernels: kernels.iter().map(|k| (k.name.as_str(), k)).collect(),
        functions,
        partitions: partition_list(&suite),
        active: HashSet::new(),
        launches: Vec::new(),
        buffers: Vec::new(),
    };
    walker.active.insert("call".to_string());
    walker.walk(&call_fn.body)?;
    let (launches, buffers) = (walker.launches, walker.buffers);
    Ok(Inventory { kernels, launches, buffers })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_nodes_comment_variants() {
        let (n, a) = parse_source_nodes("Source Nodes: [relu, add], Original ATen: [aten.relu, aten.add]").unwrap();
        assert_eq!(n, vec!["relu", "add"]);
        assert_eq!(a, vec!["aten.relu", "aten.add"]);
        let (n, a) = parse_source_nodes("Topologically Sorted Source Nodes: [], Original ATen: []").unwrap();
        assert!(n.is_empty() && a.is_empty());
        assert!(parse_source_nodes("Graph fragment:").is_none());
    }

    #[test]
    fn literal_conversion() {
        let text = "x = {'a': [1, -2, 3.5, None, True], 0: (1, 2), 'd': DeviceProperties(type='cuda'), 's': set(), 'big': 123456789012345678901234567890}";
        let suite = ast::Suite::parse(text, "t").unwrap();
        let Stmt::Assign(a) = &suite[0] else { panic!() };
        let src = Src::new(text);
        let v = py_to_json(&a.value, &src);
        assert_eq!(v["a"], serde_json::json!([1, -2, 3.5, null, true]));
        assert_eq!(v["0"], serde_json::json!([1, 2]));
        assert_eq!(v["d"], serde_json::json!("DeviceProperties(type='cuda')"));
        assert_eq!(v["s"], serde_json::json!("set()"));
        assert_eq!(v["big"], serde_json::json!("123456789012345678901234567890"));
    }
}
