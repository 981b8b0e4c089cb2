//! Verification of kernel candidates (`kforge verify`).
//!
//! This crate holds the parts that need no GPU: the per-problem [`Policy`] (a TOML file) and
//! gate 1's static check, [`check_static`], which parses the candidate with a real Python parser
//! (rustpython-parser) and reports every construct that lets a candidate pass a benchmark without
//! doing the work itself, each with its rule and line. The runtime gates (multi-seed
//! correctness, model level, performance, exploit checks) run the candidate in a separate process.

pub mod verdict;

use rustpython_ast::Visitor;
use rustpython_parser::ast::{self, Expr, Ranged, Stmt};
use rustpython_parser::Parse;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Precision policy of a problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    /// No lower-precision compute than the problem's dtype (no TF32 for fp32, no casts down).
    #[default]
    Strict,
    /// TF32 matmuls allowed for fp32 problems; no casts to 16-bit types.
    Tf32Allowed,
    /// Anything goes (casts to fp16/bf16/fp8 allowed); tolerances must then be set to match.
    LowAllowed,
}

/// What the candidate may leave to torch: the policy's presets (`kforge verify --policy NAME`),
/// also its `torch_policy` key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum TorchPolicy {
    /// Vendor-library calls the reference itself makes (its GEMMs, convolutions, fused attention:
    /// cuBLAS, cuDNN) stay allowed in the candidate; any other torch compute is a finding.
    #[default]
    DispatchAware,
    /// No torch compute at all outside `allowed_torch_ops` (the rules before dispatch-aware).
    StrictNoTorch,
    /// The candidate may compute with what the reference computes with: the torch calls its
    /// source makes (statically) and the aten ops its forward dispatches (in the dispatch
    /// record), besides its vendor calls. For candidates that are torch code by design — `kforge
    /// optimize`'s dispatch results (the reference's forward, eager or compiled in another mode);
    /// correctness, exploits and gate 4 judge them as any other.
    ReferenceOps,
}

impl TorchPolicy {
    /// Every preset with its name, as `--policy` takes it.
    pub const PRESETS: [(&'static str, TorchPolicy); 3] = [
        ("dispatch-aware", TorchPolicy::DispatchAware),
        ("strict-no-torch", TorchPolicy::StrictNoTorch),
        ("reference-ops", TorchPolicy::ReferenceOps),
    ];
}

/// The `torch.compile` mode gate 4's baseline is compiled in (`baseline_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum CompileMode {
    #[default]
    Default,
    ReduceOverhead,
    MaxAutotune,
    MaxAutotuneNoCudagraphs,
}

/// A family of vendor-library calls: what a dispatch-aware policy allows when the reference makes
/// one call of the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VendorFamily {
    /// cuBLAS GEMMs: `matmul`, `@`, `mm`, `bmm`, `addmm`, `baddbmm`, `addbmm`, `einsum`,
    /// `tensordot`, `F.linear`, an `nn.Linear` layer called.
    Gemm,
    /// cuDNN convolutions: `F.conv1d`…`F.conv3d`, `F.conv_transpose1d`…`3d`, `nn.Conv*` layers.
    Conv,
    /// Fused attention: `F.scaled_dot_product_attention`.
    Attention,
}

/// One vendor-library call of the reference (`Model` and the module's helper functions).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VendorCall {
    pub family: VendorFamily,
    /// The call as written, aliases resolved (`torch.nn.functional.linear`, `torch.nn.Linear`, `@`).
    pub call: String,
    /// 1-based line in the problem's source.
    pub line: usize,
}

/// A verification policy (TOML), per problem or per run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// Fully qualified torch calls the candidate may use although they compute (for parts that
    /// are not under test), e.g. `["torch.nn.functional.relu"]`.
    pub allowed_torch_ops: Vec<String>,
    /// Aten ops the candidate's forward may dispatch although they compute, named as the dispatch
    /// record names them (`mul`: no namespace, no overload), e.g. the ops a `kforge optimize`
    /// rewrite introduced beside the reference's own. The dispatch record only: the static gate
    /// reads torch calls, not aten ops.
    pub allowed_aten_ops: Vec<String>,
    /// `dispatch-aware` (default) or `strict-no-torch`.
    pub torch_policy: TorchPolicy,
    /// The reference's vendor-library calls ([`Policy::for_problem`]; never read from a file):
    /// under `dispatch-aware` their families are allowed, statically and in the dispatch record.
    #[serde(skip_deserializing)]
    pub reference_vendor_calls: Vec<VendorCall>,
    /// The torch calls the reference's source makes ([`Policy::for_problem`]; never read from a
    /// file): under `reference-ops` the candidate may make them too.
    #[serde(skip_deserializing)]
    pub reference_torch_calls: Vec<String>,
    pub precision: Precision,
    /// Relative and absolute tolerance per dtype name (`float32`, `float16`, `bfloat16`).
    pub rtol: HashMap<String, f64>,
    pub atol: HashMap<String, f64>,
    /// Correctness seeds (gate 2), at least 3.
    pub seeds: u32,
    /// Interleaved timing rounds (gate 4).
    pub rounds: u32,
    /// The mode gate 4's baseline is compiled in (`torch.compile(reference, mode=...)`).
    pub baseline_mode: CompileMode,
    /// Ragged sizes: module-level size variables of the problem that only shape its inputs, with
    /// a value to try besides the problem's own (e.g. `N = 4000` for `N = 4096`): gate 2 then also
    /// checks the candidate on those shapes.
    pub ragged: std::collections::BTreeMap<String, i64>,
    /// FLOPs any correct candidate must perform, for the plausibility check of gate 4. Default:
    /// the reference's analytic count; 0 for a problem with a legitimate algebraic shortcut.
    pub flops: Option<u64>,
}

impl Default for Policy {
    fn default() -> Self {
        let tol = |a: f64, b: f64| {
            HashMap::from([("float32".to_string(), a), ("float16".to_string(), b), ("bfloat16".to_string(), b)])
        };
        Policy {
            allowed_torch_ops: Vec::new(),
            allowed_aten_ops: Vec::new(),
            torch_policy: TorchPolicy::DispatchAware,
            reference_vendor_calls: Vec::new(),
            reference_torch_calls: Vec::new(),
            precision: Precision::Strict,
            rtol: tol(1e-4, 1e-2),
            atol: tol(1e-4, 1e-2),
            seeds: 3,
            rounds: 5,
            baseline_mode: CompileMode::Default,
            ragged: Default::default(),
            flops: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("policy file: {0}")]
    Toml(#[from] toml::de::Error),
    #[error("policy file: seeds must be at least 3, got {0}")]
    Seeds(u32),
    #[error("policy file: rounds must be at least 1, got {0}")]
    Rounds(u32),
    #[error("policy file: ragged size {name} must be at least 1, got {value}")]
    Ragged { name: String, value: i64 },
    #[error("policy file: tolerance for {dtype} must be a finite number >= 0, got {value}")]
    Tolerance { dtype: String, value: f64 },
    #[error("policy file: allowed_aten_ops: {0:?} is not an aten op's name (letters, digits and _, without aten:: or an overload: \"mul\")")]
    AtenOp(String),
    #[error("policy {spec:?}: neither a preset (dispatch-aware, strict-no-torch, reference-ops) nor a readable file: {source}")]
    Read { spec: String, source: std::io::Error },
}

impl Policy {
    pub fn from_toml(text: &str) -> Result<Policy, PolicyError> {
        let p: Policy = toml::from_str(text)?;
        if p.seeds < 3 {
            return Err(PolicyError::Seeds(p.seeds));
        }
        if p.rounds < 1 {
            return Err(PolicyError::Rounds(p.rounds));
        }
        if let Some((name, v)) = p.ragged.iter().find(|(_, v)| **v < 1) {
            return Err(PolicyError::Ragged { name: name.clone(), value: *v });
        }
        let aten_name = |n: &str| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if let Some(bad) = p.allowed_aten_ops.iter().find(|n| !aten_name(n)) {
            return Err(PolicyError::AtenOp(bad.clone()));
        }
        for (dtype, value) in p.rtol.iter().chain(p.atol.iter()) {
            if !value.is_finite() || *value < 0.0 {
                return Err(PolicyError::Tolerance { dtype: dtype.clone(), value: *value });
            }
        }
        Ok(p)
    }

    /// A preset by name (`dispatch-aware`, `strict-no-torch`): the default policy with that
    /// `torch_policy`.
    pub fn preset(name: &str) -> Option<Policy> {
        let (_, torch_policy) = TorchPolicy::PRESETS.iter().find(|(n, _)| *n == name)?;
        Some(Policy { torch_policy: *torch_policy, ..Policy::default() })
    }

    /// What `kforge verify --policy SPEC` names: a preset, else a TOML file.
    pub fn load(spec: &str) -> Result<Policy, PolicyError> {
        if let Some(p) = Policy::preset(spec) {
            return Ok(p);
        }
        let text = std::fs::read_to_string(spec).map_err(|source| PolicyError::Read { spec: spec.into(), source })?;
        Policy::from_toml(&text)
    }

    /// This policy for one problem: under `dispatch-aware` it learns the vendor-library calls
    /// the problem's reference makes ([`reference_vendor_calls`]); under `strict-no-torch` none.
    pub fn for_problem(mut self, problem_source: &str) -> Policy {
        self.reference_vendor_calls = match self.torch_policy {
            TorchPolicy::DispatchAware | TorchPolicy::ReferenceOps => reference_vendor_calls(problem_source),
            TorchPolicy::StrictNoTorch => Vec::new(),
        };
        self.reference_torch_calls = match self.torch_policy {
            TorchPolicy::ReferenceOps => reference_torch_calls(problem_source),
            _ => Vec::new(),
        };
        self
    }

    /// The vendor families the candidate may call: those of the reference's calls, under
    /// `dispatch-aware`.
    pub fn allowed_families(&self) -> std::collections::BTreeSet<VendorFamily> {
        match self.torch_policy {
            TorchPolicy::DispatchAware | TorchPolicy::ReferenceOps => {
                self.reference_vendor_calls.iter().map(|c| c.family).collect()
            }
            TorchPolicy::StrictNoTorch => Default::default(),
        }
    }
}

/// The static rules of gate 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// `try`/`except` around custom code: a failure falls back to something else.
    TryFallback,
    /// A class deriving from the reference `Model`.
    InheritsReference,
    /// A torch / aten / extern_kernels compute op, an `nn` compute layer or `@` doing the work.
    TorchCompute,
    /// Work on a side stream (`torch.cuda.Stream`, `torch.cuda.stream(...)`, `set_stream`).
    SideStream,
    /// Threads, processes or async execution.
    Concurrency,
    /// Assigning to attributes of torch / time / triton / kforge / builtins (timers, sync, ops).
    MonkeyPatch,
    /// A `torch.Tensor` subclass or `__torch_function__` / `__torch_dispatch__`.
    TensorSubclass,
    /// State kept across calls at module level (mutable globals, `global`, memoizing decorators).
    ModuleCache,
    /// An explicit precision cut (casts to 16-bit/8-bit types, TF32 switches, `allow_tf32=True`).
    Precision,
    /// Reading the harness: stack frames, the garbage collector's objects, loaded modules.
    HarnessAccess,
    /// Native escapes: ctypes/cffi, the CUDA runtime or driver bindings (L2 persistence windows,
    /// stream attributes, raw launches the gate and the profiler cannot attribute).
    NativeAccess,
    /// torch (or the harness) reached through a name computed at run time: `getattr(torch, name)`
    /// with a name that is not a literal, `operator.attrgetter` / `methodcaller` with such a name
    /// or a compute op's name, `vars(torch)` / `torch.__dict__`, `globals()[...]` / `vars()[...]`
    /// / `locals()[...]` lookups by a computed name or of a torch alias.
    DynamicAccess,
    /// Modules loaded by a name computed at run time: `importlib.*`, `__import__`, `imp`, `runpy`.
    DynamicImport,
    /// Code compiled at run time: `eval`, `exec`, `compile`, `types.CodeType` / `FunctionType`.
    DynamicCode,
}

/// One finding of the static check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub rule: Rule,
    /// 1-based line and column.
    pub line: usize,
    pub col: usize,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[error("Python syntax error at line {line}, column {col}: {message}")]
pub struct SyntaxError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

const COMPUTE_FUNCS: &[&str] = &[
    "matmul",
    "mm",
    "bmm",
    "addmm",
    "addbmm",
    "baddbmm",
    "einsum",
    "tensordot",
    "linear",
    "bilinear",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "softmax",
    "log_softmax",
    "layer_norm",
    "group_norm",
    "batch_norm",
    "instance_norm",
    "rms_norm",
    "relu",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "exp",
    "log",
    "sum",
    "mean",
    "var",
    "std",
    "amax",
    "amin",
    "max",
    "min",
    "cumsum",
    "cumprod",
    "logsumexp",
    "sort",
    "topk",
    "add",
    "sub",
    "mul",
    "div",
    "pow",
    "sqrt",
    "rsqrt",
    "where",
    "scaled_dot_product_attention",
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "cross_entropy",
    "mse_loss",
    "nll_loss",
    "l1_loss",
    "smooth_l1_loss",
    "kl_div",
    "cosine_similarity",
    "normalize",
    "dropout",
    "embedding",
    "clamp",
    "abs",
];
const COMPUTE_METHODS: &[&str] =
    &["matmul", "mm", "bmm", "addmm", "baddbmm", "softmax", "log_softmax", "einsum", "conv2d"];
const NN_LAYERS: &[&str] = &[
    "Linear",
    "Bilinear",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "LayerNorm",
    "GroupNorm",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "RMSNorm",
    "MultiheadAttention",
    "LSTM",
    "GRU",
    "RNN",
    "Embedding",
    "Softmax",
    "LogSoftmax",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "Transformer",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "ReLU",
    "GELU",
    "SiLU",
    "Sigmoid",
    "Tanh",
];
const HARNESS_CALLS: &[&str] = &[
    "inspect.stack",
    "inspect.currentframe",
    "inspect.getouterframes",
    "sys._getframe",
    "gc.get_objects",
    "gc.get_referrers",
    "sys.modules.get",
    "traceback.extract_stack",
];
const NATIVE_MODULES: &[&str] = &["ctypes", "cffi", "cupy", "pycuda", "cuda", "numba"];
const CONCURRENCY_MODULES: &[&str] =
    &["threading", "multiprocessing", "concurrent", "subprocess", "asyncio", "_thread"];
const PATCHED_ROOTS: &[&str] = &["torch", "time", "triton", "kforge", "builtins", "np", "numpy", "os", "F"];
const LOW_DTYPES: &[&str] =
    &["float16", "half", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "int8"];
const LOW_CASTS: &[&str] = &["half", "bfloat16"];
/// Triton's low-precision element types (`tl.float16`, …): a kernel casting to one of those
/// computes below the problem's precision.
/// (Not `int8`: Inductor stores booleans and signs through `.to(tl.int8)`.)
const TL_LOW_DTYPES: &[&str] =
    &["float16", "bfloat16", "float8e4nv", "float8e5", "float8e4b15", "float8e4b8", "float8e5b16"];
/// Gate-1 spelling of the dispatch record's own machinery: a candidate switching the record off.
const DISPATCH_MACHINERY: &[&str] = &[
    "_python_dispatch",
    "_disable_current_modes",
    "_pop_mode",
    "_push_mode",
    "_pop_torch_dispatch_stack",
    "_push_on_torch_dispatch_stack",
    "_set_torch_function_mode",
    "_unset_dispatch_mode",
    "_DisableTorchDispatch",
    "DisableTorchFunction",
    "_len_torch_dispatch_stack",
];
/// The harness's modules: the kforge package and the problem and candidate as the runner loads them.
fn harness_module(module: &str) -> bool {
    let root = module.split('.').next().unwrap_or("");
    root == "kforge" || root.starts_with("kforge_verify_")
}

const GEMM_CALLS: &[&str] = &["matmul", "mm", "bmm", "addmm", "addbmm", "baddbmm", "einsum", "tensordot", "linear"];
const CONV_CALLS: &[&str] = &["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"];

/// The vendor family of a call as the static gate names it: a torch function
/// (`torch.nn.functional.linear`), a tensor method (`Tensor.mm`), an nn layer
/// (`torch.nn.Conv2d`) or `@` (`torch.matmul`).
pub fn vendor_family(name: &str) -> Option<VendorFamily> {
    let last = name.rsplit('.').next().unwrap_or(name);
    if !(name.starts_with("torch.") || name.starts_with("Tensor.")) || name.starts_with("torch.cuda.") {
        return None;
    }
    if let Some(m) = name.strip_prefix("Tensor.") {
        // Tensor methods that are GEMMs (`x.linear` is no tensor method: `self.linear(x)` is a layer).
        return ["matmul", "mm", "bmm", "addmm", "addbmm", "baddbmm", "__matmul__"]
            .contains(&m)
            .then_some(VendorFamily::Gemm);
    }
    if GEMM_CALLS.contains(&last) || last == "Linear" {
        Some(VendorFamily::Gemm)
    } else if CONV_CALLS.contains(&last) || (last.starts_with("Conv") && NN_LAYERS.contains(&last)) {
        Some(VendorFamily::Conv)
    } else if last == "scaled_dot_product_attention" {
        Some(VendorFamily::Attention)
    } else {
        None
    }
}

const MEMO_DECORATORS: &[&str] = &["lru_cache", "cache", "functools.lru_cache", "functools.cache", "cached_property"];

/// Visitor methods for the nodes rustpython-ast's generated visitor does not descend into (with
/// items, keyword arguments, comprehensions, argument defaults, match cases): every expression
/// of the file must be seen, by every visitor here.
macro_rules! descend_everywhere {
    () => {
        fn visit_withitem(&mut self, node: ast::WithItem) {
            self.visit_expr(node.context_expr);
            if let Some(v) = node.optional_vars {
                self.visit_expr(*v);
            }
        }
        fn visit_keyword(&mut self, node: ast::Keyword) {
            self.visit_expr(node.value);
        }
        fn visit_comprehension(&mut self, node: ast::Comprehension) {
            self.visit_expr(node.target);
            self.visit_expr(node.iter);
            for e in node.ifs {
                self.visit_expr(e);
            }
        }
        fn visit_arguments(&mut self, node: ast::Arguments) {
            for a in node.posonlyargs.into_iter().chain(node.args).chain(node.kwonlyargs) {
                if let Some(d) = a.default {
                    self.visit_expr(*d);
                }
            }
        }
        fn visit_match_case(&mut self, node: ast::MatchCase) {
            if let Some(g) = node.guard {
                self.visit_expr(*g);
            }
            for s in node.body {
                self.visit_stmt(s);
            }
        }
    };
}

struct Lines<'a> {
    src: &'a str,
    starts: Vec<usize>,
}

impl<'a> Lines<'a> {
    fn new(src: &'a str) -> Self {
        // Line ends: \n, \r\n, or a lone \r (as Python's tokenizer counts them).
        let b = src.as_bytes();
        let mut starts = vec![0];
        for (i, &c) in b.iter().enumerate() {
            if c == b'\n' || (c == b'\r' && b.get(i + 1) != Some(&b'\n')) {
                starts.push(i + 1);
            }
        }
        Lines { src, starts }
    }
    /// 1-based line and column (in characters) of a byte offset.
    fn at(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.src.len());
        let line = self.starts.partition_point(|s| *s <= offset).max(1);
        let start = self.starts[line - 1];
        let col = self.src.get(start..offset).map(|s| s.chars().count()).unwrap_or(offset - start);
        (line, col + 1)
    }
}

/// Dotted name of `e` (`torch.nn.functional.relu`) with import aliases resolved, if it is one.
fn dotted(e: &Expr, aliases: &HashMap<String, String>) -> Option<String> {
    match e {
        Expr::Name(n) => Some(aliases.get(n.id.as_str()).cloned().unwrap_or_else(|| n.id.to_string())),
        Expr::Attribute(a) => dotted(&a.value, aliases).map(|b| format!("{b}.{}", a.attr)),
        _ => None,
    }
}

struct Checker<'a> {
    lines: &'a Lines<'a>,
    policy: &'a Policy,
    aliases: HashMap<String, String>,
    findings: Vec<Finding>,
    /// Low-precision dtypes the problem itself uses (`bfloat16` for a bf16 problem): casting to
    /// those is the problem's precision, not a cut.
    problem_dtypes: &'a [String],
    /// Module-level mutable containers (see [`module_containers`]).
    containers: std::collections::HashSet<String>,
    /// Names (`self.linear`, `proj`) bound to an nn layer, with the layer: calling them computes.
    layers: HashMap<String, String>,
    /// The nn layer constructed by the call just checked (taken by the enclosing assignment).
    layer_ctor: Option<String>,
    /// Inside a `@triton.jit` function: device code, where `tl_math.exp` or `triton_helpers.*`
    /// (Inductor's kernel helpers) are the kernel's own arithmetic, not torch doing the work.
    in_kernel: usize,
    /// Vendor families the policy allows ([`Policy::allowed_families`]).
    families: std::collections::BTreeSet<VendorFamily>,
    /// Every compute name the policy did not allow, where one was asked about (for
    /// [`reference_torch_calls`]: what a reference computes with).
    denied: std::cell::RefCell<std::collections::BTreeSet<String>>,
}

impl Checker<'_> {
    fn add(&mut self, rule: Rule, at: &impl Ranged, message: String) {
        let (line, col) = self.lines.at(at.range().start().to_usize());
        self.findings.push(Finding { rule, line, col, message });
    }

    /// A compute call the policy allows: named in `allowed_torch_ops`, or of a vendor family
    /// the reference calls (dispatch-aware).
    fn allowed(&self, name: &str) -> bool {
        let ok = self.policy.allowed_torch_ops.iter().any(|a| a == name)
            || vendor_family(name).is_some_and(|f| self.families.contains(&f))
            || (self.policy.torch_policy == TorchPolicy::ReferenceOps
                && self.policy.reference_torch_calls.iter().any(|a| a == name));
        if !ok {
            self.denied.borrow_mut().insert(name.to_string());
        }
        ok
    }

    /// Why a vendor call is not allowed: the policy, or a reference that makes no such call.
    fn vendor_hint(&self, n: &str) -> String {
        match (vendor_family(n), self.policy.torch_policy) {
            (Some(_), TorchPolicy::StrictNoTorch) => " (policy strict-no-torch: no vendor call allowed)".into(),
            (Some(f), TorchPolicy::DispatchAware | TorchPolicy::ReferenceOps) => {
                let f = serde_json::to_value(f).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
                format!(" (dispatch-aware: the reference makes no {f} call)")
            }
            (None, _) => String::new(),
        }
    }

    fn low_dtype(&self, e: &Expr) -> Option<String> {
        let d = dotted(e, &self.aliases)?;
        let last = d.rsplit('.').next()?;
        let own = self.problem_dtypes.iter().any(|p| canonical_dtype(p) == canonical_dtype(last));
        let low = (d.starts_with("torch.") && LOW_DTYPES.contains(&last))
            || (d.starts_with("triton.language.") && TL_LOW_DTYPES.contains(&last));
        (low && !own).then_some(d)
    }

    fn check_call(&mut self, c: &ast::ExprCall) {
        if let Expr::Attribute(a) = c.func.as_ref() {
            if matches!(a.attr.as_str(), "get" | "__getitem__" | "pop" | "setdefault") {
                self.rule_for_namespace_lookup(c, &a.value, c.args.first());
            }
        }
        let name = dotted(&c.func, &self.aliases);
        if let Some(n) = &name {
            self.rules_for_named_call(c, n);
        }
        self.rule_for_constructed_layer_call(c);
        if let Expr::Attribute(a) = c.func.as_ref() {
            self.rules_for_method_call(c, a, name.as_deref());
        }
        self.rules_for_keywords(c, name.as_deref());
    }

    /// The rules that look at the dotted name of the called function (`torch.mm`, `os.fork`, …).
    fn rules_for_named_call(&mut self, c: &ast::ExprCall, n: &str) {
        self.rule_for_torch_call(c, n);
        self.rule_for_side_stream(c, n);
        self.rule_for_concurrency(c, n);
        self.rule_for_native_access(c, n);
        if HARNESS_CALLS.contains(&n) {
            self.add(Rule::HarnessAccess, c, format!("{n}(...) reads the harness instead of the inputs"));
        }
        self.rule_for_setattr(c, n);
        self.rule_for_matmul_precision(c, n);
        self.rules_for_dynamic_access(c, n);
    }

    /// A dotted name that is torch or the harness (`torch`, `F`, `torch.nn`, `kforge`, `builtins`).
    fn torch_or_harness(&self, e: &Expr) -> Option<String> {
        let d = dotted(e, &self.aliases)?;
        let root = d.split('.').next().unwrap_or("");
        (root == "torch" || harness_module(&d) || matches!(root, "builtins" | "__builtins__")).then_some(d)
    }

    /// Names computed at run time: `getattr` on torch, `operator.attrgetter` / `methodcaller`,
    /// `vars(torch)`, dynamic imports and run-time code.
    fn rules_for_dynamic_access(&mut self, c: &ast::ExprCall, n: &str) {
        let literal = |e: Option<&Expr>| match e {
            Some(Expr::Constant(k)) => match &k.value {
                ast::Constant::Str(s) => Some(s.to_string()),
                _ => None,
            },
            _ => None,
        };
        let compute_name =
            |s: &str| s.split('.').any(|part| COMPUTE_FUNCS.contains(&part) || COMPUTE_METHODS.contains(&part));
        if n == "getattr" || n == "builtins.getattr" {
            let (obj, name) = (c.args.first(), literal(c.args.get(1)));
            if let Some(target) = obj.and_then(|o| self.torch_or_harness(o)) {
                match name {
                    None => self.add(
                        Rule::DynamicAccess,
                        c,
                        format!("getattr({target}, <computed name>) reaches torch by a name built at run time"),
                    ),
                    Some(lit) if compute_name(&lit) && !self.allowed(&format!("{target}.{lit}")) => self.add(
                        Rule::TorchCompute,
                        c,
                        format!("getattr({target}, {lit:?}) computes with torch instead of the candidate's kernel"),
                    ),
                    Some(_) => {}
                }
            } else if let Some(lit) = name {
                let on_triton = obj
                    .and_then(|o| dotted(o, &self.aliases))
                    .is_some_and(|d| d.starts_with("triton") || d.starts_with("tl"));
                if COMPUTE_METHODS.contains(&lit.as_str()) && !on_triton && !self.allowed(&format!("Tensor.{lit}")) {
                    self.add(Rule::TorchCompute, c, format!("getattr(..., {lit:?}) calls a torch compute method"));
                }
            }
        }
        if n == "operator.attrgetter" || n == "operator.methodcaller" {
            let names: Vec<Option<String>> = if n == "operator.methodcaller" {
                vec![literal(c.args.first())]
            } else {
                c.args.iter().map(|a| literal(Some(a))).collect()
            };
            for lit in names {
                match lit {
                    None => self.add(
                        Rule::DynamicAccess,
                        c,
                        format!("{n}(<computed name>): an attribute by a name built at run time"),
                    ),
                    Some(l)
                        if compute_name(&l)
                            && !self.allowed(&format!("Tensor.{l}"))
                            && !self.allowed(&format!("torch.{l}")) =>
                    {
                        self.add(Rule::DynamicAccess, c, format!("{n}({l:?}) reaches a torch compute op by name"))
                    }
                    Some(_) => {}
                }
            }
        }
        if n == "vars" {
            if let Some(target) = c.args.first().and_then(|o| self.torch_or_harness(o)) {
                self.add(Rule::DynamicAccess, c, format!("vars({target}): torch's namespace looked up by key"));
            }
        }
        if n == "__import__"
            || n == "builtins.__import__"
            || ["importlib.", "imp.", "runpy."].iter().any(|p| n.starts_with(p))
        {
            self.add(Rule::DynamicImport, c, format!("{n}(...) loads a module by a name the static check cannot see"));
        }
        if matches!(
            n,
            "eval"
                | "exec"
                | "compile"
                | "builtins.eval"
                | "builtins.exec"
                | "builtins.compile"
                | "types.CodeType"
                | "types.FunctionType"
        ) {
            self.add(Rule::DynamicCode, c, format!("{n}(...) runs code the static check cannot see"));
        }
    }

    /// Torch, vendor and functional compute outside a kernel; an nn layer constructed or called.
    fn rule_for_torch_call(&mut self, c: &ast::ExprCall, n: &str) {
        let last = n.rsplit('.').next().unwrap_or(n);
        let torch_fn = n.starts_with("torch.") && !n.starts_with("torch.cuda.") && COMPUTE_FUNCS.contains(&last);
        let vendor = n.starts_with("torch.ops.") || n.starts_with("extern_kernels.") || n.starts_with("torch._C.");
        let functional = n.starts_with("torch.nn.functional.");
        // Constructing an nn layer only holds parameters (KernelBench candidates keep
        // `self.linear = nn.Linear(...)` for its weight); calling it computes (below).
        let layer = n.starts_with("torch.nn.") && NN_LAYERS.contains(&last);
        if (torch_fn || vendor || functional) && self.in_kernel == 0 && !self.allowed(n) {
            let why = self.vendor_hint(n);
            self.add(
                Rule::TorchCompute,
                c,
                format!("{n}(...) computes with torch instead of the candidate's kernel{why}"),
            );
        }
        if layer && self.in_kernel == 0 && !self.allowed(n) {
            self.layer_ctor = Some(n.to_string());
        }
        if let Some(layer) = self.layers.get(n).cloned() {
            if !self.allowed(&layer) {
                self.add(Rule::TorchCompute, c, format!("{n}(...) runs the {layer} layer: torch does the work"));
            }
        }
    }

    fn rule_for_side_stream(&mut self, c: &ast::ExprCall, n: &str) {
        if n == "torch.cuda.Stream"
            || n == "torch.cuda.stream"
            || n == "torch.cuda.set_stream"
            || n.ends_with("ExternalStream")
        {
            self.add(Rule::SideStream, c, format!("{n}(...): work on a side stream escapes the timed stream"));
        }
    }

    /// Processes, threads and executors: work that runs outside the timed call.
    fn rule_for_concurrency(&mut self, c: &ast::ExprCall, n: &str) {
        let os_process = matches!(
            n,
            "os.fork" | "os.forkpty" | "os.system" | "os.popen" | "os.posix_spawn" | "os.posix_spawnp" | "pty.spawn"
        ) || n.starts_with("os.spawn")
            || n.starts_with("os.exec");
        if os_process
            || n.starts_with("threading.")
            || n.starts_with("multiprocessing.")
            || n.starts_with("subprocess.")
            || n.starts_with("concurrent.")
        {
            self.add(Rule::Concurrency, c, format!("{n}(...) runs work outside the timed call"));
        }
    }

    fn rule_for_native_access(&mut self, c: &ast::ExprCall, n: &str) {
        if n == "torch.cuda.cudart"
            || n.starts_with("torch.cuda.cudart.")
            || (n.starts_with("torch._C._cuda") && n.contains("Persist"))
        {
            self.add(Rule::NativeAccess, c, format!("{n}(...) reaches the CUDA runtime directly"));
        }
    }

    /// `setattr(torch, ...)` and the like: replacing a library function.
    fn rule_for_setattr(&mut self, c: &ast::ExprCall, n: &str) {
        if n == "setattr" {
            if let Some(target) = c.args.first().and_then(|t| dotted(t, &self.aliases)) {
                if PATCHED_ROOTS.contains(&target.split('.').next().unwrap_or("")) {
                    self.add(Rule::MonkeyPatch, c, format!("setattr on {target} replaces a library function"));
                }
            }
        }
    }

    fn rule_for_matmul_precision(&mut self, c: &ast::ExprCall, n: &str) {
        let highest = matches!(c.args.first(), Some(Expr::Constant(k)) if matches!(&k.value, ast::Constant::Str(s) if s == "highest"));
        if self.policy.precision == Precision::Strict && n == "torch.set_float32_matmul_precision" && !highest {
            self.add(Rule::Precision, c, "torch.set_float32_matmul_precision lowers fp32 matmul precision".into());
        }
    }

    fn rule_for_constructed_layer_call(&mut self, c: &ast::ExprCall) {
        if let Expr::Call(inner) = c.func.as_ref() {
            // nn.Linear(...)(x): constructed and called at once.
            if let Some(n) = dotted(&inner.func, &self.aliases) {
                if n.starts_with("torch.nn.")
                    && NN_LAYERS.contains(&n.rsplit('.').next().unwrap_or(""))
                    && !self.allowed(&n)
                {
                    self.add(Rule::TorchCompute, c, format!("{n}(...)(...) runs an nn layer: torch does the work"));
                }
            }
        }
    }

    /// `x.m(...)`: module-container writes, tensor compute methods and low-precision casts.
    fn rules_for_method_call(&mut self, c: &ast::ExprCall, a: &ast::ExprAttribute, name: Option<&str>) {
        let m = a.attr.as_str();
        if let Expr::Name(n) = a.value.as_ref() {
            if self.containers.contains(n.id.as_str()) && MUTATORS.contains(&m) {
                self.add(
                    Rule::ModuleCache,
                    c,
                    format!("{}.{m}(...) writes into a module-level container: state kept across calls", n.id),
                );
            }
        }
        let on_module =
            name.is_some_and(|n| n.starts_with("torch.") || n.starts_with("tl.") || n.starts_with("triton."));
        if COMPUTE_METHODS.contains(&m) && !on_module && !self.allowed(&format!("Tensor.{m}")) {
            self.add(Rule::TorchCompute, c, format!(".{m}(...) on a tensor computes with torch"));
        }
        if self.policy.precision != Precision::LowAllowed {
            self.rules_for_cast_method(c, m, on_module);
        }
    }

    /// `.half()`, `.to(torch.float16)`, `.type(dtype=...)`: casts below the problem's own dtypes.
    fn rules_for_cast_method(&mut self, c: &ast::ExprCall, m: &str, on_module: bool) {
        let own = self.problem_dtypes.iter().any(|p| canonical_dtype(p) == canonical_dtype(m));
        if LOW_CASTS.contains(&m) && c.args.is_empty() && !on_module && !own {
            self.add(Rule::Precision, c, format!(".{m}() casts to a 16-bit type"));
        }
        if m == "to" || m == "type" {
            if let Some(d) = c
                .args
                .iter()
                .chain(c.keywords.iter().filter(|k| k.arg.as_deref() == Some("dtype")).map(|k| &k.value))
                .find_map(|e| self.low_dtype(e))
            {
                self.add(Rule::Precision, c, format!(".{m}({d}) casts to lower precision"));
            }
        }
    }

    /// `allow_tf32=True`, `input_precision="tf32"`, `dtype=torch.float16` passed to a call.
    fn rules_for_keywords(&mut self, c: &ast::ExprCall, name: Option<&str>) {
        for k in &c.keywords {
            let key = k.arg.as_deref().unwrap_or("");
            let tf32 = (key == "allow_tf32"
                && matches!(&k.value, Expr::Constant(x) if x.value == ast::Constant::Bool(true)))
                || (key == "input_precision"
                    && matches!(&k.value, Expr::Constant(x) if matches!(&x.value, ast::Constant::Str(s) if s.starts_with("tf32"))));
            if tf32 && self.policy.precision == Precision::Strict {
                self.add(Rule::Precision, k, format!("{key}= selects TF32 for fp32 data"));
            }
            if key == "dtype" && self.policy.precision != Precision::LowAllowed {
                if let (Some(d), Some(n)) = (self.low_dtype(&k.value), name) {
                    if n.starts_with("torch.") || n.starts_with("triton.language.") {
                        self.add(Rule::Precision, k, format!("{n}(..., dtype={d}) computes in lower precision"));
                    }
                }
            }
        }
    }

    /// `globals()[name]`, `vars()[...]`, `locals().get(...)`: a lookup by a computed name, or of a
    /// name bound to torch. `namespace` is the call that made the namespace, `key` the key.
    fn rule_for_namespace_lookup(&mut self, at: &impl Ranged, namespace: &Expr, key: Option<&Expr>) {
        let Expr::Call(inner) = namespace else { return };
        let Some(f) = dotted(&inner.func, &self.aliases) else { return };
        if !matches!(f.as_str(), "globals" | "locals" | "vars") || !inner.args.is_empty() {
            return;
        }
        let key = match key {
            Some(Expr::Constant(k)) => match &k.value {
                ast::Constant::Str(s) => Some(s.to_string()),
                _ => None,
            },
            _ => None,
        };
        match key {
            None => self.add(
                Rule::DynamicAccess,
                at,
                format!("{f}()[<computed name>]: a global by a name built at run time"),
            ),
            Some(k) if self.aliases.get(&k).is_some_and(|t| t.starts_with("torch")) || k == "torch" => {
                self.add(Rule::DynamicAccess, at, format!("{f}()[{k:?}]: torch looked up by key"))
            }
            Some(_) => {}
        }
    }

    /// Writing into a module-level container: `CACHE[k] = v`, `CACHE.setdefault(...)`, ….
    fn mutation(&mut self, t: &Expr) {
        let mut base = t;
        let mut subscripted = false;
        while let Expr::Subscript(s) = base {
            base = s.value.as_ref();
            subscripted = true;
        }
        if let (true, Expr::Name(n)) = (subscripted, base) {
            if self.containers.contains(n.id.as_str()) {
                self.add(Rule::ModuleCache, t, format!("writes into module-level {}: state kept across calls", n.id));
            }
        }
    }

    fn check_target(&mut self, t: &Expr, value: Option<&Expr>) {
        if let Expr::Tuple(tu) = t {
            for e in &tu.elts {
                self.check_target(e, None);
            }
            return;
        }
        if let Expr::List(li) = t {
            for e in &li.elts {
                self.check_target(e, None);
            }
            return;
        }
        self.mutation(t);
        if let Some(n) = dotted(t, &self.aliases) {
            let root = n.split('.').next().unwrap_or("");
            if n.contains('.') && PATCHED_ROOTS.contains(&root) {
                if n.contains("allow_tf32")
                    || n.contains("allow_fp16_reduced_precision")
                    || n.contains("allow_bf16_reduced_precision")
                {
                    let switched_off =
                        matches!(value, Some(Expr::Constant(c)) if c.value == ast::Constant::Bool(false));
                    if self.policy.precision == Precision::Strict && !switched_off {
                        self.add(Rule::Precision, t, format!("{n} = ... switches reduced-precision math on"));
                    }
                } else {
                    self.add(Rule::MonkeyPatch, t, format!("assigning {n} replaces a library attribute"));
                }
            }
        }
    }
}

impl Visitor for Checker<'_> {
    fn visit_stmt_try(&mut self, node: ast::StmtTry) {
        if !node.handlers.is_empty() {
            self.add(Rule::TryFallback, &node, "try/except: a failing kernel would silently fall back".into());
        }
        self.generic_visit_stmt_try(node)
    }
    fn visit_stmt_try_star(&mut self, node: ast::StmtTryStar) {
        self.add(Rule::TryFallback, &node, "try/except*: a failing kernel would silently fall back".into());
        self.generic_visit_stmt_try_star(node)
    }
    fn visit_stmt_class_def(&mut self, node: ast::StmtClassDef) {
        for b in &node.bases {
            let base = dotted(b, &self.aliases).unwrap_or_default();
            if base == "Model" || base.ends_with(".Model") {
                self.add(Rule::InheritsReference, b, format!("class {} derives from the reference Model", node.name));
            } else if base == "torch.Tensor" || base == "torch._C.TensorBase" {
                self.add(Rule::TensorSubclass, b, format!("class {} subclasses torch.Tensor", node.name));
            }
        }
        for s in &node.body {
            if let Stmt::FunctionDef(f) = s {
                if matches!(f.name.as_str(), "__torch_function__" | "__torch_dispatch__") {
                    self.add(Rule::TensorSubclass, f, format!("{} intercepts torch calls", f.name));
                }
            }
        }
        self.generic_visit_stmt_class_def(node)
    }
    fn visit_stmt_function_def(&mut self, node: ast::StmtFunctionDef) {
        let kernel = node.decorator_list.iter().any(|d| {
            let target = if let Expr::Call(c) = d { c.func.as_ref() } else { d };
            dotted(target, &self.aliases).is_some_and(|n| n == "triton.jit" || n.ends_with(".triton.jit"))
        });
        for d in &node.decorator_list {
            let target = if let Expr::Call(c) = d { c.func.as_ref() } else { d };
            if let Some(n) = dotted(target, &self.aliases) {
                if MEMO_DECORATORS.contains(&n.as_str()) {
                    self.add(Rule::ModuleCache, d, format!("@{n} on {} memoizes results across calls", node.name));
                }
            }
        }
        self.in_kernel += usize::from(kernel);
        self.generic_visit_stmt_function_def(node);
        self.in_kernel -= usize::from(kernel);
    }
    fn visit_stmt_global(&mut self, node: ast::StmtGlobal) {
        self.add(
            Rule::ModuleCache,
            &node,
            format!(
                "global {}: state kept across calls",
                node.names.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", ")
            ),
        );
        self.generic_visit_stmt_global(node)
    }
    fn visit_stmt_import(&mut self, node: ast::StmtImport) {
        for a in &node.names {
            let full = a.name.to_string();
            if CONCURRENCY_MODULES.contains(&full.split('.').next().unwrap_or("")) {
                self.add(Rule::Concurrency, &node, format!("import {full}: threads or processes"));
            }
            if NATIVE_MODULES.contains(&full.split('.').next().unwrap_or("")) {
                self.add(Rule::NativeAccess, &node, format!("import {full}: native access around the harness"));
            }
            if harness_module(&full) {
                self.add(Rule::HarnessAccess, &node, format!("import {full}: the harness's own modules"));
            }
            if DISPATCH_MACHINERY.iter().any(|m| full.contains(m)) {
                self.add(Rule::HarnessAccess, &node, format!("import {full}: the dispatch record's machinery"));
            }
            let local = a
                .asname
                .as_ref()
                .map(|x| x.to_string())
                .unwrap_or_else(|| full.split('.').next().unwrap_or(&full).to_string());
            let target = if a.asname.is_some() { full.clone() } else { local.clone() };
            self.aliases.insert(local, target);
        }
        self.generic_visit_stmt_import(node)
    }
    fn visit_stmt_import_from(&mut self, node: ast::StmtImportFrom) {
        let module = node.module.as_ref().map(|m| m.to_string()).unwrap_or_default();
        if CONCURRENCY_MODULES.contains(&module.split('.').next().unwrap_or("")) {
            self.add(Rule::Concurrency, &node, format!("from {module} import ...: threads or processes"));
        }
        if NATIVE_MODULES.contains(&module.split('.').next().unwrap_or("")) {
            self.add(Rule::NativeAccess, &node, format!("from {module} import ...: native access around the harness"));
        }
        if harness_module(&module) || (node.level.is_some_and(|l| l.to_u32() > 0)) {
            self.add(Rule::HarnessAccess, &node, format!("from {module} import ...: the harness's own modules"));
        }
        if DISPATCH_MACHINERY.iter().any(|m| module.contains(m))
            || node.names.iter().any(|a| DISPATCH_MACHINERY.contains(&a.name.as_str()))
        {
            self.add(Rule::HarnessAccess, &node, format!("from {module} import ...: the dispatch record's machinery"));
        }
        for a in &node.names {
            if a.name.as_str() == "*" && (module == "torch" || module.starts_with("torch.")) {
                self.add(
                    Rule::TorchCompute,
                    &node,
                    format!("from {module} import *: torch operations called unqualified"),
                );
                continue;
            }
            let local = a.asname.as_ref().unwrap_or(&a.name).to_string();
            self.aliases.insert(local, format!("{module}.{}", a.name));
        }
        self.generic_visit_stmt_import_from(node)
    }
    fn visit_stmt_assign(&mut self, node: ast::StmtAssign) {
        for t in &node.targets {
            self.check_target(t, Some(&node.value));
        }
        // `mm = torch.mm`: the name is an alias of what it is bound to.
        if let (Some(v), [Expr::Name(n)]) = (dotted(&node.value, &self.aliases), node.targets.as_slice()) {
            if v.starts_with("torch.") || v.starts_with("extern_kernels.") {
                self.aliases.insert(n.id.to_string(), v);
            }
        }
        let targets: Vec<String> = node.targets.iter().filter_map(|t| dotted(t, &HashMap::new())).collect();
        self.layer_ctor = None;
        self.generic_visit_stmt_assign(node);
        if let Some(layer) = self.layer_ctor.take() {
            for t in targets {
                self.layers.insert(t, layer.clone());
            }
        }
    }
    fn visit_stmt_aug_assign(&mut self, node: ast::StmtAugAssign) {
        self.check_target(&node.target, None);
        self.generic_visit_stmt_aug_assign(node)
    }
    fn visit_stmt_ann_assign(&mut self, node: ast::StmtAnnAssign) {
        self.check_target(&node.target, node.value.as_deref());
        self.generic_visit_stmt_ann_assign(node)
    }
    fn visit_expr_bin_op(&mut self, node: ast::ExprBinOp) {
        if node.op == ast::Operator::MatMult && !self.allowed("torch.matmul") {
            self.add(Rule::TorchCompute, &node, "a @ b computes the matmul with torch".into());
        }
        self.generic_visit_expr_bin_op(node)
    }
    fn visit_expr_call(&mut self, node: ast::ExprCall) {
        self.check_call(&node);
        self.generic_visit_expr_call(node)
    }
    fn visit_expr_attribute(&mut self, node: ast::ExprAttribute) {
        let d = dotted(&Expr::Attribute(node.clone()), &self.aliases);
        if matches!(d.as_deref(), Some("sys.argv" | "sys.orig_argv")) {
            self.add(
                Rule::HarnessAccess,
                &node,
                "sys.argv: the harness's command line (where it reads and writes its results)".into(),
            );
        }
        if node.attr.as_str() == "__dict__" {
            if let Some(target) = self.torch_or_harness(&node.value) {
                self.add(Rule::DynamicAccess, &node, format!("{target}.__dict__: torch's namespace looked up by key"));
            }
        }
        if DISPATCH_MACHINERY.contains(&node.attr.as_str()) {
            self.add(
                Rule::HarnessAccess,
                &node,
                format!("{}: the dispatch record's machinery", d.as_deref().unwrap_or(node.attr.as_str())),
            );
        }
        self.generic_visit_expr_attribute(node)
    }
    fn visit_expr_subscript(&mut self, node: ast::ExprSubscript) {
        if dotted(&node.value, &self.aliases).as_deref() == Some("sys.modules") {
            self.add(Rule::HarnessAccess, &node, "sys.modules[...] reaches into the harness's modules".into());
        }
        self.rule_for_namespace_lookup(&node, &node.value, Some(&node.slice));
        self.generic_visit_expr_subscript(node)
    }
    descend_everywhere!();
}

/// Names bound at module level to a mutable container (`{}`, `[]`, `set()`, `dict()`, …). A
/// constant table such as a list of autotuning configs is fine; *writing* into one of these
/// from the candidate's code is a cache that survives between calls (see `Checker::mutation`).
fn module_containers(suite: &[Stmt], aliases: &HashMap<String, String>) -> std::collections::HashSet<String> {
    let mut out = std::collections::HashSet::new();
    for s in suite {
        let (targets, value): (Vec<&Expr>, Option<&Expr>) = match s {
            Stmt::Assign(a) => (a.targets.iter().collect(), Some(a.value.as_ref())),
            Stmt::AnnAssign(a) => (vec![a.target.as_ref()], a.value.as_deref()),
            _ => (Vec::new(), None),
        };
        if let Some(value) = value {
            let mutable = match value {
                Expr::Dict(_) | Expr::List(_) | Expr::Set(_) => true,
                Expr::Call(c) => matches!(
                    dotted(&c.func, aliases).as_deref(),
                    Some(
                        "dict"
                            | "list"
                            | "set"
                            | "collections.OrderedDict"
                            | "collections.defaultdict"
                            | "weakref.WeakKeyDictionary"
                            | "weakref.WeakValueDictionary"
                    )
                ),
                _ => false,
            };
            if mutable {
                out.extend(targets.iter().filter_map(|t| match t {
                    Expr::Name(n) => Some(n.id.to_string()),
                    _ => None,
                }));
            }
        }
    }
    out
}

const MUTATORS: &[&str] = &[
    "append",
    "extend",
    "insert",
    "update",
    "setdefault",
    "add",
    "pop",
    "popitem",
    "clear",
    "remove",
    "discard",
    "__setitem__",
];

/// Gate 1's static check of a candidate's source. Findings are sorted by line.
fn canonical_dtype(d: &str) -> &str {
    match d {
        "half" => "float16",
        "float8e4nv" => "float8_e4m3fn",
        "float8e5" => "float8_e5m2",
        other => other,
    }
}

/// Low-precision torch dtypes (`torch.bfloat16`, `torch.half`, …) a problem's source mentions:
/// the precision the problem itself computes in. A source that does not parse mentions none.
pub fn problem_dtypes(problem_source: &str) -> Vec<String> {
    let Ok(suite) = ast::Suite::parse(problem_source, "<problem>") else { return Vec::new() };
    struct Dtypes(Vec<String>);
    impl Visitor for Dtypes {
        fn visit_expr_attribute(&mut self, node: ast::ExprAttribute) {
            if matches!(node.value.as_ref(), Expr::Name(n) if n.id.as_str() == "torch")
                && LOW_DTYPES.contains(&node.attr.as_str())
            {
                let d = canonical_dtype(node.attr.as_str()).to_string();
                if !self.0.contains(&d) {
                    self.0.push(d);
                }
            }
            self.generic_visit_expr_attribute(node)
        }
        descend_everywhere!();
    }
    let mut v = Dtypes(Vec::new());
    for s in suite {
        v.visit_stmt(s);
    }
    v.0
}

/// Whether `source` is a KernelBench-format problem: it parses, and defines `class Model`,
/// `get_inputs()` and `get_init_inputs()` at module level. The error names what is missing.
pub fn problem_interface(source: &str) -> Result<(), String> {
    let suite = ast::Suite::parse(source, "<problem>").map_err(|e| format!("does not parse: {}", e.error))?;
    let defined = |name: &str| {
        suite.iter().any(|s| match s {
            ast::Stmt::ClassDef(c) => c.name.as_str() == name,
            ast::Stmt::FunctionDef(f) => f.name.as_str() == name,
            _ => false,
        })
    };
    let missing: Vec<&str> = ["Model", "get_inputs", "get_init_inputs"].into_iter().filter(|n| !defined(n)).collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "no {} (a KernelBench problem defines class Model, get_inputs() and get_init_inputs())",
            missing.join(", ")
        ))
    }
}

/// The vendor-library calls the reference makes: calls of a [`VendorFamily`] (and `@`) in class
/// `Model` and in the module's functions (its helpers), and vendor nn layers (`nn.Linear`,
/// `nn.Conv2d`, also inside containers) that `Model` constructs and reads outside `__init__`.
/// Sorted by line, one per call spelling. A source that does not parse makes none.
pub fn reference_vendor_calls(problem_source: &str) -> Vec<VendorCall> {
    let Ok(suite) = ast::Suite::parse(problem_source, "<problem>") else { return Vec::new() };
    let lines = Lines::new(problem_source);
    let policy = Policy { torch_policy: TorchPolicy::StrictNoTorch, ..Policy::default() };
    // The problem's imports and aliases, as the static check learns them.
    let mut learn = Checker {
        lines: &lines,
        policy: &policy,
        aliases: HashMap::new(),
        findings: Vec::new(),
        problem_dtypes: &[],
        containers: Default::default(),
        layers: HashMap::new(),
        layer_ctor: None,
        in_kernel: 0,
        families: Default::default(),
        denied: Default::default(),
    };
    for s in suite.iter().cloned() {
        learn.visit_stmt(s);
    }
    struct Reference<'a> {
        lines: &'a Lines<'a>,
        aliases: HashMap<String, String>,
        calls: Vec<VendorCall>,
        /// Vendor layers constructed, with the `self.X` they are assigned to (if any).
        layers: Vec<(Option<String>, VendorCall)>,
        /// `self.X` read in a method other than `__init__`.
        read: std::collections::HashSet<String>,
        assigning: Option<String>,
        in_init: bool,
    }
    impl Reference<'_> {
        fn push(&mut self, family: VendorFamily, call: String, at: &impl Ranged) {
            let line = self.lines.at(at.range().start().to_usize()).0;
            self.calls.push(VendorCall { family, call, line });
        }
    }
    impl Visitor for Reference<'_> {
        fn visit_stmt_function_def(&mut self, node: ast::StmtFunctionDef) {
            let was = self.in_init;
            self.in_init = node.name.as_str() == "__init__";
            self.generic_visit_stmt_function_def(node);
            self.in_init = was;
        }
        fn visit_stmt_assign(&mut self, node: ast::StmtAssign) {
            self.assigning = match node.targets.as_slice() {
                [Expr::Attribute(a)] if matches!(a.value.as_ref(), Expr::Name(n) if n.id.as_str() == "self") => {
                    Some(a.attr.to_string())
                }
                _ => None,
            };
            self.visit_expr(*node.value);
            self.assigning = None;
        }
        fn visit_expr_call(&mut self, node: ast::ExprCall) {
            if let Some(n) = dotted(&node.func, &self.aliases) {
                let last = n.rsplit('.').next().unwrap_or("");
                if let Some(f) = vendor_family(&n) {
                    if n.starts_with("torch.nn.") && NN_LAYERS.contains(&last) {
                        let line = self.lines.at(node.range().start().to_usize()).0;
                        self.layers.push((self.assigning.clone(), VendorCall { family: f, call: n, line }));
                    } else {
                        self.push(f, n, &node);
                    }
                }
            }
            if let Expr::Attribute(a) = node.func.as_ref() {
                let on_module = dotted(&a.value, &self.aliases).is_some_and(|d| d.starts_with("torch"));
                if let (false, Some(f)) = (on_module, vendor_family(&format!("Tensor.{}", a.attr))) {
                    self.push(f, format!("Tensor.{}", a.attr), &node);
                }
            }
            self.generic_visit_expr_call(node)
        }
        fn visit_expr_bin_op(&mut self, node: ast::ExprBinOp) {
            if node.op == ast::Operator::MatMult {
                self.push(VendorFamily::Gemm, "@".into(), &node);
            }
            self.generic_visit_expr_bin_op(node)
        }
        fn visit_expr_attribute(&mut self, node: ast::ExprAttribute) {
            if !self.in_init && matches!(node.value.as_ref(), Expr::Name(n) if n.id.as_str() == "self") {
                self.read.insert(node.attr.to_string());
            }
            self.generic_visit_expr_attribute(node)
        }
        descend_everywhere!();
    }
    let mut r = Reference {
        lines: &lines,
        aliases: learn.aliases,
        calls: Vec::new(),
        layers: Vec::new(),
        read: Default::default(),
        assigning: None,
        in_init: false,
    };
    for s in suite {
        match &s {
            Stmt::ClassDef(c) if c.name.as_str() == "Model" => r.visit_stmt(s),
            Stmt::FunctionDef(f) if !matches!(f.name.as_str(), "get_inputs" | "get_init_inputs") => r.visit_stmt(s),
            _ => {}
        }
    }
    let layers = std::mem::take(&mut r.layers);
    for (target, call) in layers {
        if target.as_ref().is_none_or(|t| r.read.contains(t)) {
            r.calls.push(call);
        }
    }
    let mut calls = r.calls;
    calls.sort_by_key(|c| c.line);
    let mut seen = std::collections::HashSet::new();
    calls.retain(|c| seen.insert(c.call.clone()));
    calls
}

/// Gate 1's static check of a candidate's source (see [`check_static_for`]), for an fp32 problem.
pub fn check_static(source: &str, policy: &Policy) -> Result<Vec<Finding>, SyntaxError> {
    check_static_for(source, policy, &[])
}

/// Gate 1's static check of a candidate for a problem computing in `problem_dtypes` (from
/// [`problem_dtypes`]): casts to those are not precision cuts. Findings are sorted by line.
pub fn check_static_for(source: &str, policy: &Policy, problem_dtypes: &[String]) -> Result<Vec<Finding>, SyntaxError> {
    if source.len() > MAX_SOURCE_BYTES {
        return Err(SyntaxError {
            line: 1,
            col: 1,
            message: format!("{} bytes: larger than the {MAX_SOURCE_BYTES}-byte limit of a candidate", source.len()),
        });
    }
    // Parsing and visiting recurse with the nesting of the code: run them on a thread whose stack
    // the deepest source within the size limit cannot exhaust.
    let (src, pol, dts) = (source.to_string(), policy.clone(), problem_dtypes.to_vec());
    let worker = std::thread::Builder::new().stack_size(1 << 30).spawn(move || check_inner(&src, &pol, &dts));
    match worker {
        Ok(h) => h.join().unwrap_or_else(|_| {
            Err(SyntaxError { line: 1, col: 1, message: "the static check failed on this source".into() })
        }),
        Err(_) => check_inner(source, policy, problem_dtypes),
    }
}

/// Largest candidate source the static check accepts.
pub const MAX_SOURCE_BYTES: usize = 512 * 1024;

fn check_inner(source: &str, policy: &Policy, problem_dtypes: &[String]) -> Result<Vec<Finding>, SyntaxError> {
    run_checker(source, policy, problem_dtypes).map(|(findings, _)| findings)
}

/// The torch calls a reference computes with: every compute name the static check flags in the
/// problem's source under `strict-no-torch` (its `Model` and helpers; the names as the check
/// spells them, aliases resolved). A source that does not parse makes none.
pub fn reference_torch_calls(problem_source: &str) -> Vec<String> {
    let policy = Policy { torch_policy: TorchPolicy::StrictNoTorch, ..Policy::default() };
    run_checker(problem_source, &policy, &[]).map(|(_, denied)| denied.into_iter().collect()).unwrap_or_default()
}

/// The static check's two passes: the findings, sorted by line, and the compute names it denied.
fn run_checker(
    source: &str,
    policy: &Policy,
    problem_dtypes: &[String],
) -> Result<(Vec<Finding>, std::collections::BTreeSet<String>), SyntaxError> {
    let lines = Lines::new(source);
    let suite = ast::Suite::parse(source, "<candidate>").map_err(|e| {
        let (line, col) = lines.at(e.offset.to_usize());
        SyntaxError { line, col, message: e.error.to_string() }
    })?;
    let new_checker = |aliases: HashMap<String, String>, layers: HashMap<String, String>| {
        let containers = module_containers(&suite, &aliases);
        Checker {
            lines: &lines,
            policy,
            aliases,
            findings: Vec::new(),
            problem_dtypes,
            containers,
            layers,
            layer_ctor: None,
            in_kernel: 0,
            families: policy.allowed_families(),
            denied: Default::default(),
        }
    };
    // Pass 1 learns the imports, aliases and nn-layer attributes wherever they appear in the file
    // (a forward() above its __init__, an import below its use); pass 2 reports with them.
    let mut first = new_checker(HashMap::new(), HashMap::new());
    for s in suite.iter().cloned() {
        first.visit_stmt(s);
    }
    let mut ck = new_checker(first.aliases, first.layers);
    for s in suite.iter().cloned() {
        ck.visit_stmt(s);
    }
    let mut f = ck.findings;
    f.sort_by_key(|x| (x.line, x.col));
    f.dedup_by(|a, b| a.line == b.line && a.col == b.col && a.rule == b.rule);
    Ok((f, ck.denied.into_inner()))
}
