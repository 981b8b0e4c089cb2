//! Gate 1 static check: each exploit pattern is reported under its rule with its line; an honest
//! Triton candidate has no finding; the policy relaxes what it says.

use kforge_verify::{
    check_static, check_static_for, problem_dtypes, problem_interface, reference_torch_calls, reference_vendor_calls,
    CompileMode, Finding, Policy, Precision, Rule, TorchPolicy, VendorCall, VendorFamily,
};

const HONEST: &str = r#"
import torch
import triton
import triton.language as tl

@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.dot(x, y, input_precision="ieee"), mask=mask)

class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        out = torch.empty_like(x)
        n = out.numel()
        add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        return out.view(x.shape).contiguous()
"#;

fn rules(src: &str) -> Vec<(Rule, usize)> {
    check_static(src, &Policy::default()).unwrap().into_iter().map(|f: Finding| (f.rule, f.line)).collect()
}

#[test]
fn honest_candidate_passes() {
    assert_eq!(rules(HONEST), vec![]);
    // A module-level table that is only read (autotuning configurations, sizes) is no cache.
    let table = "import triton\nCONFIGS = [triton.Config({'B': 64}), triton.Config({'B': 128})]\nSIZES = {'small': 64}\ndef pick(n):\n    return SIZES['small'] if n < 100 else CONFIGS[0]\n";
    assert_eq!(rules(table), vec![]);
    // Keeping an nn layer for its parameters (the kernel reads self.l.weight) is fine.
    let params = "import torch\nclass ModelNew(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.l = torch.nn.Linear(4, 4)\n    def forward(self, x):\n        return my_kernel(x, self.l.weight, self.l.bias)\n";
    assert_eq!(rules(params), vec![]);
}

#[test]
fn each_exploit_is_named_with_its_line() {
    let cases: &[(&str, Rule, usize)] = &[
        ("import torch\ndef f(x):\n    try:\n        return k(x)\n    except Exception:\n        return x\n", Rule::TryFallback, 3),
        ("from reference import Model\nclass ModelNew(Model):\n    pass\n", Rule::InheritsReference, 2),
        ("import torch\ndef f(a, b):\n    return torch.matmul(a, b)\n", Rule::TorchCompute, 3),
        ("import torch.nn.functional as F\ndef f(x):\n    return F.softmax(x, -1)\n", Rule::TorchCompute, 3),
        ("def f(a, b):\n    return a @ b\n", Rule::TorchCompute, 2),
        ("import torch\nclass M(torch.nn.Module):\n    def __init__(self):\n        self.l = torch.nn.Linear(4, 4)\n    def forward(self, x):\n        return self.l(x)\n", Rule::TorchCompute, 6),
        ("from torch import nn\nconv = nn.Conv2d(3, 8, 3)\ndef f(x):\n    return conv(x)\n", Rule::TorchCompute, 4),
        ("from torch import nn\ndef f(x):\n    return nn.ReLU()(x)\n", Rule::TorchCompute, 3),
        ("def f(buf0, a, b):\n    extern_kernels.mm(a, b, out=buf0)\n", Rule::TorchCompute, 2),
        ("import torch\ndef f(a, b):\n    return torch.ops.aten.mm.default(a, b)\n", Rule::TorchCompute, 3),
        ("def f(a, b):\n    return a.matmul(b)\n", Rule::TorchCompute, 2),
        ("import torch\ns = None\ndef f(x):\n    with torch.cuda.stream(torch.cuda.Stream()):\n        k(x)\n", Rule::SideStream, 4),
        ("import threading\n", Rule::Concurrency, 1),
        ("from concurrent.futures import ThreadPoolExecutor\n", Rule::Concurrency, 1),
        ("import os\ndef f():\n    os.fork()\n", Rule::Concurrency, 3),
        ("import os\nos.system('sleep 100 &')\n", Rule::Concurrency, 2),
        ("from os import execv\nexecv('/bin/sh', ['sh'])\n", Rule::Concurrency, 2),
        ("import torch\ntorch.cuda.synchronize = lambda: None\n", Rule::MonkeyPatch, 2),
        ("import time\ntime.perf_counter = lambda: 0.0\n", Rule::MonkeyPatch, 2),
        ("import triton\nsetattr(triton.testing, 'do_bench', lambda f: 0.001)\n", Rule::MonkeyPatch, 2),
        ("import torch\nclass Lazy(torch.Tensor):\n    pass\n", Rule::TensorSubclass, 2),
        ("class T:\n    @classmethod\n    def __torch_function__(cls, f, t, a=(), k=None):\n        return 0\n", Rule::TensorSubclass, 3),
        ("_cache = {}\ndef f(x):\n    _cache[x.data_ptr()] = x\n", Rule::ModuleCache, 3),
        ("_seen = []\ndef f(x):\n    _seen.append(x)\n", Rule::ModuleCache, 3),
        ("import functools\n@functools.lru_cache(maxsize=None)\ndef f(x):\n    return x\n", Rule::ModuleCache, 2),
        ("r = None\ndef f(x):\n    global r\n    r = x\n", Rule::ModuleCache, 3),
        ("def f(x):\n    return x.half()\n", Rule::Precision, 2),
        ("import torch\ndef f(x):\n    return x.to(torch.bfloat16)\n", Rule::Precision, 3),
        ("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n", Rule::Precision, 2),
        ("import torch\ntorch.set_float32_matmul_precision('high')\n", Rule::Precision, 2),
        ("import triton.language as tl\ndef k(a, b):\n    return tl.dot(a, b, allow_tf32=True)\n", Rule::Precision, 3),
        ("import torch\ndef f(n):\n    return torch.empty(n, dtype=torch.float16)\n", Rule::Precision, 3),
        ("import inspect\ndef f():\n    return inspect.stack()[2].frame.f_locals\n", Rule::HarnessAccess, 3),
        ("import sys\nref = sys.modules['kforge_verify_problem']\n", Rule::HarnessAccess, 2),
        ("import sys\nout = sys.argv[sys.argv.index('--out') + 1]\n", Rule::HarnessAccess, 2),
        ("import ctypes\nlib = ctypes.CDLL('libcudart.so')\n", Rule::NativeAccess, 1),
        ("from cuda.bindings import runtime\n", Rule::NativeAccess, 1),
        ("import torch\ndef f():\n    torch.cuda.cudart().cudaProfilerStop()\n", Rule::NativeAccess, 3),
        // Inside keyword arguments, default values and comprehensions (the generated visitor skips them).
        ("import torch\ndef f(a, b):\n    return g(out=torch.matmul(a, b))\n", Rule::TorchCompute, 3),
        ("import torch\ndef f(a, b=torch.mm(x, y)):\n    return b\n", Rule::TorchCompute, 2),
        ("import torch\ndef f(xs):\n    return [torch.softmax(x, 0) for x in xs]\n", Rule::TorchCompute, 3),
    ];
    for (src, rule, line) in cases {
        let got = rules(src);
        assert!(got.contains(&(*rule, *line)), "{rule:?} at line {line} not found in {got:?} for:\n{src}");
    }
}

#[test]
fn inductor_kernel_sources_pass() {
    // A replacement kernel is an Inductor kernel module: its helpers (tl_math.exp, libdevice,
    // triton_helpers.maximum) are device code, not torch doing the work.
    let p =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kforge-inductor/tests/fixtures/mlp_softmax_t210.py");
    let wrapper = std::fs::read_to_string(p).unwrap();
    let start = wrapper.find("triton_per_fused__softmax_1 = async_compile.triton(").unwrap();
    let body = &wrapper[start..];
    let src = &body[body.find("'''").unwrap() + 3..];
    let src = &src[..src.find("'''").unwrap()];
    assert!(src.contains("tl_math.exp"));
    assert_eq!(rules(src), vec![]);
    // The same helper name outside a kernel is torch code again.
    assert_eq!(rules("import torch\ndef f(x):\n    return torch.exp(x)\n"), vec![(Rule::TorchCompute, 3)]);
}

#[test]
fn policy_relaxes_what_it_names() {
    let p = Policy::from_toml("allowed_torch_ops = [\"torch.nn.functional.relu\"]\nprecision = \"tf32-allowed\"\n")
        .unwrap();
    assert_eq!(p.precision, Precision::Tf32Allowed);
    let src = "import torch\nimport torch.nn.functional as F\ntorch.backends.cuda.matmul.allow_tf32 = True\ndef f(x):\n    return F.relu(x).half()\n";
    let got: Vec<Rule> = check_static(src, &p).unwrap().into_iter().map(|f| f.rule).collect();
    // relu allowed, TF32 allowed; the cast to fp16 is still a precision cut.
    assert_eq!(got, vec![Rule::Precision]);
    let low = Policy { precision: Precision::LowAllowed, ..Policy::default() };
    assert!(check_static("def f(x):\n    return x.half()\n", &low).unwrap().is_empty());
}

#[test]
fn policy_file_errors_are_named() {
    assert!(Policy::from_toml("seeds = 2").unwrap_err().to_string().contains("seeds must be at least 3"));
    assert!(Policy::from_toml("rounds = 0").unwrap_err().to_string().contains("rounds must be at least 1"));
    assert!(Policy::from_toml("[rtol]\nfloat32 = -1.0").unwrap_err().to_string().contains("tolerance for float32"));
    assert!(Policy::from_toml("precison = \"strict\"").unwrap_err().to_string().contains("unknown field"));
    assert!(Policy::from_toml("precision = \"sloppy\"").is_err());
    assert!(Policy::from_toml("[ragged]\nN = 0").unwrap_err().to_string().contains("ragged size N must be at least 1"));
    assert_eq!(Policy::from_toml("[ragged]\nN = 4000").unwrap().ragged["N"], 4000);
    for bad in ["aten::mul", "mul.Tensor", ""] {
        let e = Policy::from_toml(&format!("allowed_aten_ops = [{bad:?}]")).unwrap_err().to_string();
        assert!(e.contains("allowed_aten_ops") && e.contains("not an aten op's name"), "{e}");
    }
    assert_eq!(
        Policy::from_toml("allowed_aten_ops = [\"mul\", \"_to_copy\"]").unwrap().allowed_aten_ops,
        ["mul", "_to_copy"]
    );
    let d = Policy::from_toml("").unwrap();
    assert_eq!((d.seeds, d.rounds, d.rtol["float32"], d.atol["bfloat16"]), (3, 5, 1e-4, 1e-2));
}

#[test]
fn syntax_errors_are_located() {
    let e = check_static("def f(:\n    pass\n", &Policy::default()).unwrap_err();
    assert_eq!(e.line, 1);
    assert!(e.to_string().contains("line 1"));
}

#[test]
fn casts_to_the_problems_own_precision_are_not_cuts() {
    let bf16_problem = "import torch\ndef get_inputs():\n    return [torch.randn(4, 4, dtype=torch.bfloat16)]\n";
    let dtypes = problem_dtypes(bf16_problem);
    assert_eq!(dtypes, vec!["bfloat16".to_string()]);
    assert_eq!(problem_dtypes("import torch\nx = torch.half\n"), vec!["float16".to_string()]);
    let cand = "import torch\ndef f(n, x):\n    y = torch.empty(n, dtype=torch.bfloat16)\n    return x.to(torch.bfloat16), x.bfloat16(), x.half()\n";
    let got: Vec<(Rule, usize)> =
        check_static_for(cand, &Policy::default(), &dtypes).unwrap().into_iter().map(|f| (f.rule, f.line)).collect();
    // bf16 is the problem's precision; fp16 is still a cut.
    assert_eq!(got, vec![(Rule::Precision, 4)]);
    assert_eq!(check_static(cand, &Policy::default()).unwrap().len(), 4);
    assert!(problem_dtypes("def f(:").is_empty());
}

#[test]
fn review_cases_order_aliases_targets_and_containers() {
    let found = |src: &str, rule: Rule, line: usize| {
        let got = rules(src);
        assert!(got.contains(&(rule, line)), "{rule:?} at line {line} not in {got:?} for:\n{src}");
    };
    // Use before definition: forward above __init__, F used above its import.
    found("import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return self.fc(x)\n    def __init__(self):\n        self.fc = torch.nn.Linear(4, 4)\n", Rule::TorchCompute, 4);
    found("def f(x):\n    return F.relu(x)\nimport torch.nn.functional as F\n", Rule::TorchCompute, 2);
    // Rebinding, star import.
    found("import torch\nmm = torch.mm\ndef f(a, b):\n    return mm(a, b)\n", Rule::TorchCompute, 4);
    found("from torch import *\n", Rule::TorchCompute, 1);
    // Tuple and annotated targets.
    found("import torch\ntorch.cuda.synchronize, _ = (lambda: None), 0\n", Rule::MonkeyPatch, 2);
    found("import torch\ntorch.mm: object = None\n", Rule::MonkeyPatch, 2);
    // Containers through aliases, annotations, nested subscripts.
    found(
        "from collections import defaultdict\nA = defaultdict(list)\ndef f(k):\n    A[k].append(1)\n    A[k] = 2\n",
        Rule::ModuleCache,
        5,
    );
    found("B: dict = {}\ndef f(k, v):\n    B[k] = v\n", Rule::ModuleCache, 3);
    found("C = {}\ndef f(k, v):\n    C[k][0] = v\n", Rule::ModuleCache, 3);
}

#[test]
fn review_cases_that_must_not_fire() {
    assert_eq!(rules("import torch\ntorch.backends.cuda.matmul.allow_tf32 = False\n"), vec![]);
    assert_eq!(rules("import torch\ntorch.set_float32_matmul_precision('highest')\n"), vec![]);
    assert_eq!(rules("def f(k):\n    try:\n        return k()\n    finally:\n        pass\n"), vec![]);
    // A bf16 problem whose dtype appears only inside a with-item still counts as bf16.
    let problem = "import torch\ndef get_inputs():\n    with torch.autocast('cuda', dtype=torch.bfloat16):\n        return [torch.randn(4)]\n";
    assert_eq!(problem_dtypes(problem), vec!["bfloat16".to_string()]);
}

#[test]
fn review_cases_positions_and_limits() {
    // Columns count characters, not bytes.
    let f = check_static("s = 'ééééé'; y = torch.mm(a, b)\nimport torch\n", &Policy::default()).unwrap();
    assert_eq!((f[0].line, f[0].col), (1, 18));
    // A lone carriage return ends a line.
    let f = check_static("import torch\rx = torch.mm(a, b)\r", &Policy::default()).unwrap();
    assert_eq!(f[0].line, 2);
    // Deep nesting within the size limit: no crash.
    let deep = format!("x = {}1\n", "1 + ".repeat(20_000));
    assert!(check_static(&deep, &Policy::default()).unwrap().is_empty());
    // Over the limit: a clear error.
    let big = "#".repeat(kforge_verify::MAX_SOURCE_BYTES + 1);
    assert!(check_static(&big, &Policy::default()).unwrap_err().message.contains("limit"));
}

#[test]
fn triton_casts_to_lower_precision_are_cuts() {
    let kernel = "import triton\nimport triton.language as tl\n@triton.jit\ndef k(p):\n    x = tl.load(p)\n    y = x.to(tl.float16)\n    z = x.to(tl.float32)\n    return y, z\n";
    assert_eq!(rules(kernel), vec![(Rule::Precision, 6)]);
    // An accumulator allocated in fp16 is a cut too; Inductor's boolean stores through int8 are not.
    let acc = "import triton.language as tl\ndef k(x):\n    acc = tl.zeros([16], dtype=tl.float16)\n    m = (x > 0).to(tl.int8)\n    return acc, m\n";
    assert_eq!(rules(acc), vec![(Rule::Precision, 3)]);
    // A bf16 problem's kernels store in bf16: that is its own precision.
    let bf16 = problem_dtypes("import torch\nx = torch.randn(2, dtype=torch.bfloat16)\n");
    let store = "import triton.language as tl\ndef k(x):\n    return x.to(tl.bfloat16), x.to(tl.float8e4nv)\n";
    let got: Vec<Rule> =
        check_static_for(store, &Policy::default(), &bf16).unwrap().into_iter().map(|f| f.rule).collect();
    assert_eq!(got, vec![Rule::Precision]);
    // The captured Inductor epilogue of the corpus' replacement-kernel cheat.
    let src = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/candidates/gemm_bias_relu/cheat_kernel_fp16.py"
    ))
    .unwrap();
    assert_eq!(rules(&src).iter().map(|r| r.0).collect::<Vec<_>>(), vec![Rule::Precision, Rule::Precision]);
    let honest = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/candidates/gemm_bias_relu/honest_kernel.py"
    ))
    .unwrap();
    assert_eq!(rules(&honest), vec![]);
}

#[test]
fn dynamic_access_to_torch_is_named_with_its_line() {
    let cases: &[(&str, Rule, usize)] = &[
        ("import torch\ndef f(x, y):\n    return getattr(torch, 'ad' + 'd')(x, y)\n", Rule::DynamicAccess, 3),
        (
            "import torch.nn.functional as F\nop = 'relu'\ndef f(x):\n    return getattr(F, op)(x)\n",
            Rule::DynamicAccess,
            4,
        ),
        ("import torch\ndef f(a, b):\n    return getattr(torch, 'mm')(a, b)\n", Rule::TorchCompute, 3),
        ("def f(a, b):\n    return getattr(a, 'matmul')(b)\n", Rule::TorchCompute, 2),
        (
            "import importlib\ndef f(x, y):\n    return importlib.import_module('tor' + 'ch').add(x, y)\n",
            Rule::DynamicImport,
            3,
        ),
        ("def f(x, y):\n    return __import__('torch').add(x, y)\n", Rule::DynamicImport, 2),
        ("import torch\ndef f(x, y):\n    return eval('torch.add(x, y)')\n", Rule::DynamicCode, 3),
        ("def f(src):\n    exec(src)\n", Rule::DynamicCode, 2),
        ("def f(src):\n    return compile(src, 'x', 'exec')\n", Rule::DynamicCode, 2),
        (
            "import operator, torch\ndef f(x, y):\n    return operator.attrgetter('ad' + 'd')(torch)(x, y)\n",
            Rule::DynamicAccess,
            3,
        ),
        ("import operator\ndef f(a, b):\n    return operator.methodcaller('matmul', b)(a)\n", Rule::DynamicAccess, 3),
        ("import sys\ndef f(x, y):\n    return sys.modules['tor' + 'ch'].add(x, y)\n", Rule::HarnessAccess, 3),
        ("import torch\ndef f(x):\n    return vars(torch)['relu'](x)\n", Rule::DynamicAccess, 3),
        ("import torch\ndef f(x):\n    return torch.__dict__['relu'](x)\n", Rule::DynamicAccess, 3),
        ("import torch\ndef f(x, name):\n    return globals()[name](x)\n", Rule::DynamicAccess, 3),
        ("import torch as T\ndef f(x):\n    return globals()['T'].relu(x)\n", Rule::DynamicAccess, 3),
        ("def f(x, name):\n    return globals().get(name)(x)\n", Rule::DynamicAccess, 2),
        ("import kforge.harness\n", Rule::HarnessAccess, 1),
        ("from kforge.harness import compare\n", Rule::HarnessAccess, 1),
        ("from kforge_verify_problem import Model\n", Rule::HarnessAccess, 1),
        ("from torch.utils._python_dispatch import _disable_current_modes\n", Rule::HarnessAccess, 1),
        ("import torch\ndef f():\n    torch._C._unset_dispatch_mode(0)\n", Rule::HarnessAccess, 3),
    ];
    for (src, rule, line) in cases {
        let got = rules(src);
        assert!(got.contains(&(*rule, *line)), "{src:?}: expected {rule:?} at line {line}, got {got:?}");
    }
}

#[test]
fn honest_dynamic_looking_code_is_not_flagged() {
    let ok = [
        // getattr on the module itself, with a literal or a computed name.
        "class M:\n    def forward(self, x):\n        w = getattr(self, 'weight')\n        return getattr(self, f'b{0}', None)\n",
        // getattr / attrgetter with names that compute nothing.
        "import torch, operator\ndef f(x):\n    return getattr(torch, 'float32'), operator.attrgetter('shape')(x)\n",
        // tl.* inside a Triton kernel, re.compile and torch.compile are not the builtin compile.
        "import re\nimport triton\nimport triton.language as tl\n@triton.jit\ndef k(p, BLOCK: tl.constexpr):\n    tl.store(p + tl.arange(0, BLOCK), tl.exp(tl.load(p + tl.arange(0, BLOCK))))\npat = re.compile('x')\n",
        "from re import compile\npat = compile('x')\n",
        // globals() lookups of names that are not torch.
        "SIZES = {'a': 1}\ndef f():\n    return globals()['SIZES'], globals().get('SIZES')\n",
    ];
    for src in ok {
        assert_eq!(rules(src), vec![], "{src}");
    }
}

const GEMM_PROBLEM: &str = r#"
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, i, o):
        super().__init__()
        self.linear = nn.Linear(i, o)
        self.unused = nn.Conv2d(3, 3, 3)

    def forward(self, x):
        return torch.relu(self.linear(x))
"#;

const DISPATCH_AWARE: &str = r#"
import torch
import torch.nn as nn
import torch.nn.functional as F

class ModelNew(nn.Module):
    def __init__(self, i, o):
        super().__init__()
        self.linear = nn.Linear(i, o)

    def forward(self, x):
        y = F.linear(x, self.linear.weight)
        z = x @ self.linear.weight.t()
        w = self.linear(x)
        return epilogue(y, self.linear.bias)
"#;

#[test]
fn dispatch_aware_allows_the_references_vendor_calls_only() {
    let calls = reference_vendor_calls(GEMM_PROBLEM);
    // nn.Linear used in forward; the Conv2d is constructed but never read outside __init__.
    assert_eq!(calls, vec![VendorCall { family: VendorFamily::Gemm, call: "torch.nn.Linear".into(), line: 8 }]);
    let aware = Policy::default().for_problem(GEMM_PROBLEM);
    assert_eq!(aware.torch_policy, TorchPolicy::DispatchAware);
    let got: Vec<(Rule, usize)> =
        check_static(DISPATCH_AWARE, &aware).unwrap().into_iter().map(|f| (f.rule, f.line)).collect();
    assert_eq!(got, vec![], "the GEMM family is the reference's: F.linear, @ and the layer call pass");
    // Anything else torch computes stays a finding; so does a family the reference does not use.
    let relu = "import torch\nimport torch.nn.functional as F\ndef f(x, w):\n    return torch.relu(F.linear(x, w))\ndef g(x, k):\n    return F.conv2d(x, k)\n";
    let got: Vec<(Rule, usize)> = check_static(relu, &aware).unwrap().into_iter().map(|f| (f.rule, f.line)).collect();
    assert_eq!(got, vec![(Rule::TorchCompute, 4), (Rule::TorchCompute, 6)]);
    let f = check_static(relu, &aware).unwrap();
    assert!(f[1].message.contains("the reference makes no conv call"), "{}", f[1].message);
    // strict-no-torch: today's rules, every GEMM spelling a finding.
    let strict = Policy::load("strict-no-torch").unwrap().for_problem(GEMM_PROBLEM);
    assert!(strict.reference_vendor_calls.is_empty());
    let got: Vec<(Rule, usize)> =
        check_static(DISPATCH_AWARE, &strict).unwrap().into_iter().map(|f| (f.rule, f.line)).collect();
    assert_eq!(got, vec![(Rule::TorchCompute, 12), (Rule::TorchCompute, 13), (Rule::TorchCompute, 14)]);
    assert!(check_static(DISPATCH_AWARE, &strict).unwrap()[0].message.contains("strict-no-torch"));
}

#[test]
fn reference_ops_allows_what_the_reference_computes_with_and_nothing_else() {
    let problem = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\nclass Model(nn.Module):\n    def forward(self, x, w):\n        return torch.softmax(F.linear(x, w), dim=-1).sum(-1)\n";
    let calls = reference_torch_calls(problem);
    for c in ["torch.softmax", "torch.nn.functional.linear"] {
        assert!(calls.iter().any(|n| n == c), "{c} in {calls:?}");
    }
    assert!(reference_torch_calls("def f(:").is_empty());
    let p = Policy::load("reference-ops").unwrap().for_problem(problem);
    assert_eq!(p.torch_policy, TorchPolicy::ReferenceOps);
    assert_eq!(p.allowed_families(), [VendorFamily::Gemm].into_iter().collect());
    // The reference's own computation passes; torch.relu, which the reference never calls, does not.
    let candidate = "import torch\nimport torch.nn.functional as F\ndef f(x, w):\n    y = torch.softmax(F.linear(x, w), dim=-1).sum(-1)\n    return torch.relu(y)\n";
    let got: Vec<(Rule, usize)> = check_static(candidate, &p).unwrap().into_iter().map(|f| (f.rule, f.line)).collect();
    assert_eq!(got, vec![(Rule::TorchCompute, 5)]);
    // Under the default policy the softmax is a finding too (the GEMM is the reference's vendor call).
    let aware = Policy::default().for_problem(problem);
    let got: Vec<(Rule, usize)> =
        check_static(candidate, &aware).unwrap().into_iter().map(|f| (f.rule, f.line)).collect();
    assert_eq!(got, vec![(Rule::TorchCompute, 4), (Rule::TorchCompute, 5)]);
    // The learned calls are never read from a file.
    assert!(Policy::from_toml("reference_torch_calls = []\n").is_err());
}

#[test]
fn reference_vendor_calls_cover_each_family_and_spelling() {
    let src = "import torch\nfrom torch import nn\nimport torch.nn.functional as F\ndef helper(a, b):\n    return torch.bmm(a, b)\nclass Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())\n    def forward(self, q, k, v, x):\n        y = self.net(x)\n        return F.scaled_dot_product_attention(q, k, v) @ v, helper(q, k), y\ndef get_inputs():\n    return [torch.matmul(torch.ones(2, 2), torch.ones(2, 2))]\n";
    let got: Vec<(VendorFamily, String, usize)> =
        reference_vendor_calls(src).into_iter().map(|c| (c.family, c.call, c.line)).collect();
    assert_eq!(
        got,
        vec![
            (VendorFamily::Gemm, "torch.bmm".into(), 5),
            (VendorFamily::Conv, "torch.nn.Conv2d".into(), 9),
            (VendorFamily::Gemm, "@".into(), 12),
            (VendorFamily::Attention, "torch.nn.functional.scaled_dot_product_attention".into(), 12),
        ]
    );
    assert!(reference_vendor_calls("def f(:").is_empty());
    // An element-wise reference makes no vendor call: dispatch-aware is then strict.
    assert!(reference_vendor_calls("import torch\nclass Model:\n    def forward(self, x, y):\n        return x + y\n")
        .is_empty());
}

#[test]
fn policy_presets_and_files() {
    assert_eq!(Policy::load("dispatch-aware").unwrap(), Policy::default());
    assert_eq!(Policy::load("strict-no-torch").unwrap().torch_policy, TorchPolicy::StrictNoTorch);
    assert_eq!(
        Policy::from_toml("torch_policy = \"strict-no-torch\"\n").unwrap().torch_policy,
        TorchPolicy::StrictNoTorch
    );
    assert!(Policy::from_toml("torch_policy = \"lenient\"\n").is_err());
    // Gate 4's baseline mode: torch.compile's modes by name, nothing else.
    assert_eq!(Policy::default().baseline_mode, CompileMode::Default);
    assert_eq!(
        Policy::from_toml("baseline_mode = \"max-autotune\"\n").unwrap().baseline_mode,
        CompileMode::MaxAutotune
    );
    assert!(Policy::from_toml("baseline_mode = \"turbo\"\n").is_err());
    // The learned calls are never read from a file.
    assert!(Policy::from_toml("reference_vendor_calls = []\n").is_err());
    let dir = std::env::temp_dir().join(format!("kforge-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("p.toml");
    std::fs::write(&f, "seeds = 4\n").unwrap();
    let p = Policy::load(f.to_str().unwrap()).unwrap();
    assert_eq!((p.seeds, p.torch_policy), (4, TorchPolicy::DispatchAware));
    let e = Policy::load("no-such-preset").unwrap_err().to_string();
    assert!(e.contains("no-such-preset") && e.contains("strict-no-torch"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_problem_file_is_told_from_other_files() {
    let ok = "import torch\nclass Model(torch.nn.Module):\n    pass\ndef get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n";
    assert_eq!(problem_interface(ok), Ok(()));
    let e = problem_interface("class Model:\n    pass\n").unwrap_err();
    assert!(e.starts_with("no get_inputs, get_init_inputs"), "{e}");
    assert!(problem_interface("def f(:\n").unwrap_err().starts_with("does not parse"));
}
