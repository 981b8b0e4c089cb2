use kforge_inductor::{parse_wrapper, Inventory, KernelCategory, Launch, ParseError};
use serde_json::json;

fn fixture(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn parse(name: &str) -> Inventory {
    parse_wrapper(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Compact launch sequence: "T:name" / "E:op" / "A:op".
fn sequence(inv: &Inventory) -> Vec<String> {
    inv.launches
        .iter()
        .map(|l| match l {
            Launch::Triton { kernel, .. } => format!("T:{kernel}"),
            Launch::Extern { op, .. } => format!("E:{op}"),
            Launch::Aten { op, .. } => format!("A:{op}"),
        })
        .collect()
}

/// (kernel, args, numels, stream, grid, line)
type TritonView<'a> = (&'a str, &'a [String], &'a [String], Option<&'a str>, Option<&'a str>, usize);

fn triton(l: &Launch) -> TritonView<'_> {
    match l {
        Launch::Triton { kernel, args, numels, stream, grid, line } => {
            (kernel, args, numels, stream.as_deref(), grid.as_deref(), *line)
        }
        other => panic!("expected a Triton launch, got {other:?}"),
    }
}

#[test]
fn pointwise_only_model() {
    let src = fixture("pointwise_only_t26.py");
    let inv = parse_wrapper(&src).unwrap();
    let names: Vec<_> = inv.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["triton_poi_fused_add_relu_0", "triton_poi_fused_clone_mul_sigmoid_1"]);
    assert!(inv.kernels.iter().all(|k| k.category == KernelCategory::Pointwise));

    let k0 = &inv.kernels[0];
    assert_eq!(k0.source_nodes, ["add", "relu"]);
    assert_eq!(k0.aten_ops, ["aten.add", "aten.relu"]);
    assert_eq!(
        k0.kernel_path.as_deref(),
        Some("/tmp/torchinductor_kforge/x4/cx4kq2m6yqjv5b2dqz7f3lq6hrtd2ngqwmkcbgwzfwfyfdzn6l3k.py")
    );
    assert_eq!(k0.size_hints, Some(json!({"x": 65536})));
    assert_eq!(k0.params, ["in_ptr0", "in_ptr1", "out_ptr0", "xnumel"]);
    let tm = k0.triton_meta.as_ref().unwrap();
    assert_eq!(tm["signature"]["in_ptr0"], "*fp32");
    assert_eq!(tm["signature"]["xnumel"], "i32");
    assert_eq!(tm["constants"], json!({}));
    assert!(tm["device"].as_str().unwrap().starts_with("DeviceProperties(type='cuda', index=0"));
    let im = k0.inductor_meta.as_ref().unwrap();
    assert_eq!(im["kernel_name"], "triton_poi_fused_add_relu_0");
    assert_eq!(im["autotune_hints"], "set()");
    assert_eq!(im["autotune_remote_cache"], serde_json::Value::Null);
    assert_eq!(im["optimize_mem"], true);
    assert!(k0
        .source
        .contains("def triton_poi_fused_add_relu_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr):"));
    assert!(k0.autotune_configs.is_empty());
    // def_line is the `name = async_compile.triton(` line.
    assert!(src
        .lines()
        .nth(k0.def_line - 1)
        .unwrap()
        .starts_with("triton_poi_fused_add_relu_0 = async_compile.triton("));

    let k1 = &inv.kernels[1];
    assert_eq!(k1.size_hints, Some(json!({"y": 256, "x": 256})));
    assert_eq!(k1.source_nodes, ["mul", "sigmoid", "transpose"]);

    assert_eq!(sequence(&inv), ["T:triton_poi_fused_add_relu_0", "T:triton_poi_fused_clone_mul_sigmoid_1"]);
    let (_, args, numels, stream, grid, line) = triton(&inv.launches[0]);
    assert_eq!(args, ["arg0_1", "arg1_1", "buf0"]);
    assert_eq!(numels, ["65536"]);
    assert_eq!(stream, Some("stream0"));
    assert_eq!(grid, None);
    assert!(src.lines().nth(line - 1).unwrap().trim().starts_with("triton_poi_fused_add_relu_0.run("));
    let (_, args, numels, ..) = triton(&inv.launches[1]);
    assert_eq!(args, ["buf0", "buf1"]);
    assert_eq!(numels, ["256", "256"], "ynumel and xnumel");

    assert_eq!(inv.buffers.len(), 2);
    assert_eq!(inv.buffers[1].name, "buf1");
    assert_eq!(inv.buffers[1].shape, ["256", "256"]);
    assert_eq!(inv.buffers[1].stride, ["1", "256"]);
    assert_eq!(inv.buffers[1].dtype, "torch.float32");
    assert_eq!(inv.buffers[1].device, "cuda");

    assert!(inv.replaceable().iter().all(|(_, ok, why)| *ok && *why == "generated Triton: replaceable"));
}

#[test]
fn extern_gemm_epilogue_and_softmax() {
    let src = fixture("mlp_softmax_t210.py");
    let inv = parse_wrapper(&src).unwrap();
    assert_eq!(inv.kernels.len(), 2);
    let (poi, per) = (&inv.kernels[0], &inv.kernels[1]);
    assert_eq!(poi.name, "triton_poi_fused_addmm_relu_0");
    assert_eq!(poi.category, KernelCategory::Pointwise);
    assert_eq!(poi.aten_ops, ["aten.addmm", "aten.relu"]);
    assert_eq!(per.name, "triton_per_fused__softmax_1");
    assert_eq!(per.category, KernelCategory::PersistentReduction);
    assert_eq!(per.source_nodes, ["softmax"]);
    assert_eq!(per.aten_ops, ["aten._softmax"]);
    assert_eq!(per.size_hints, Some(json!({"x": 16, "r0_": 1024})));
    assert_eq!(per.params, ["in_ptr0", "out_ptr2", "xnumel", "r0_numel"]);
    // Tuple dict keys become their source text; nested lists convert faithfully.
    let cfg = &per.triton_meta.as_ref().unwrap()["configs"][0];
    assert_eq!(cfg["(0,)"], json!([["tt.divisibility", 16]]));
    assert_eq!(per.inductor_meta.as_ref().unwrap()["kernel_num_gb"], json!(0.000131072));
    assert_eq!(per.inductor_meta.as_ref().unwrap()["no_x_dim"], serde_json::Value::Null);

    // Launch order interleaves extern and Triton calls exactly as in call().
    assert_eq!(
        sequence(&inv),
        [
            "E:extern_kernels.mm",
            "T:triton_poi_fused_addmm_relu_0",
            "E:extern_kernels.addmm",
            "T:triton_per_fused__softmax_1"
        ]
    );
    // The benchmark harness `def call(args)` inside the kernel source is not the wrapper's call().
    assert!(inv
        .launches
        .iter()
        .all(|l| !matches!(l, Launch::Triton { args, .. } if args.iter().any(|a| a == "*args"))));
    let lines: Vec<usize> = inv.launches.iter().map(Launch::line).collect();
    assert!(lines.windows(2).all(|w| w[0] < w[1]));

    match &inv.launches[0] {
        Launch::Extern { op, args, out, line } => {
            assert_eq!(op, "extern_kernels.mm");
            assert_eq!(args, &["arg1_1", "reinterpret_tensor(arg0_1, (1024, 4096), (1, 1024), 0)"]);
            assert_eq!(out.as_deref(), Some("buf0"));
            assert!(src.lines().nth(line - 1).unwrap().trim().starts_with("extern_kernels.mm("));
        }
        other => panic!("{other:?}"),
    }
    match &inv.launches[2] {
        Launch::Extern { op, args, out, .. } => {
            assert_eq!(op, "extern_kernels.addmm");
            assert_eq!(
                args,
                &["arg4_1", "buf1", "reinterpret_tensor(arg3_1, (4096, 1024), (1, 4096), 0)", "alpha=1", "beta=1"]
            );
            assert_eq!(out.as_deref(), Some("buf2"));
        }
        other => panic!("{other:?}"),
    }
    let (k, args, numels, stream, ..) = triton(&inv.launches[1]);
    assert_eq!(
        (k, args, numels, stream),
        (
            "triton_poi_fused_addmm_relu_0",
            &["buf1".to_string(), "arg2_1".to_string()][..],
            &["65536".to_string()][..],
            Some("stream0")
        )
    );
    let (_, args, numels, ..) = triton(&inv.launches[3]);
    assert_eq!(args, ["buf2", "buf5"]);
    assert_eq!(numels, ["16", "1024"]);

    let bufs: Vec<(&str, Vec<String>)> = inv.buffers.iter().map(|b| (b.name.as_str(), b.shape.clone())).collect();
    assert_eq!(
        bufs,
        [
            ("buf0", vec!["16".to_string(), "4096".to_string()]),
            ("buf2", vec!["16".to_string(), "1024".to_string()]),
            ("buf5", vec!["16".to_string(), "1024".to_string()]),
        ]
    );
    assert!(inv.buffers.iter().all(|b| b.dtype == "torch.float32" && b.device == "cuda"));
}

#[test]
fn max_autotune_template_with_grid_launches() {
    let inv = parse("max_autotune_template_t25.py");
    let cats: Vec<_> = inv.kernels.iter().map(|k| (k.name.as_str(), k.category.clone())).collect();
    assert_eq!(
        cats,
        [
            ("triton_poi_fused__to_copy_0", KernelCategory::Pointwise),
            ("triton_tem_fused_addmm_gelu_1", KernelCategory::Template),
            ("triton_red_fused_sum_2", KernelCategory::Reduction),
        ]
    );
    // torch 2.5 style: `# Source Nodes:`, list size_hints, integer signature keys.
    let tem = inv.kernel("triton_tem_fused_addmm_gelu_1").unwrap();
    assert_eq!(tem.source_nodes, ["gelu", "linear"]);
    assert_eq!(tem.aten_ops, ["aten.addmm", "aten.gelu"]);
    assert_eq!(tem.params, ["in_ptr0", "arg_A", "arg_B", "out_ptr1"]);
    assert_eq!(tem.size_hints, None);
    assert_eq!(tem.triton_meta.as_ref().unwrap()["signature"]["1"], "*fp16");
    assert_eq!(
        tem.triton_meta.as_ref().unwrap()["configs"][0],
        "AttrsDescriptor(divisible_by_16=(0, 1, 2, 3), equal_to_1=())"
    );
    let red = inv.kernel("triton_red_fused_sum_2").unwrap();
    assert_eq!(red.size_hints, Some(json!([64, 4096])));
    let copy = inv.kernel("triton_poi_fused__to_copy_0").unwrap();
    assert!(copy.source_nodes.is_empty() && copy.aten_ops.is_empty());
    assert!(copy.kernel_path.as_deref().unwrap().ends_with("colx3vj2dgk6qcwzv4fjbnx5tzwm2m3yh6l6ghcqrd7b5s3yf3we.py"));

    assert_eq!(
        sequence(&inv),
        ["T:triton_poi_fused__to_copy_0", "T:triton_tem_fused_addmm_gelu_1", "T:triton_red_fused_sum_2"]
    );
    let (_, args, numels, stream, grid, _) = triton(&inv.launches[0]);
    assert_eq!(args, ["arg0_1", "buf0"]);
    assert_eq!(numels, ["4194304"]);
    assert_eq!(grid, Some("grid(4194304)"));
    assert_eq!(stream, Some("stream0"));
    let (_, args, numels, _, grid, _) = triton(&inv.launches[1]);
    assert_eq!(args, ["arg1_1", "arg2_1", "reinterpret_tensor(buf0, (1024, 4096), (1, 1024), 0)", "buf1"]);
    assert!(numels.is_empty(), "templates have no numel parameters");
    assert_eq!(grid, Some("torch._inductor.kernel.mm_common.mm_grid(64, 4096, meta0)"));
    let (_, _, numels, _, grid, _) = triton(&inv.launches[2]);
    assert_eq!(numels, ["64", "4096"]);
    assert_eq!(grid, Some("grid(64)"));

    assert_eq!(inv.buffers[0].dtype, "torch.float16");
    assert_eq!(inv.buffers[2].shape, ["64"]);
    assert_eq!(inv.buffers[2].dtype, "torch.float32");

    let rep = inv.replaceable();
    assert_eq!(
        rep,
        vec![
            ("triton_poi_fused__to_copy_0", true, "generated Triton: replaceable"),
            ("triton_tem_fused_addmm_gelu_1", false, "template GEMM: policy choice"),
            ("triton_red_fused_sum_2", true, "generated Triton: replaceable"),
        ]
    );
}

#[test]
fn cudagraph_partitions_are_inlined_in_order() {
    let inv = parse("cudagraph_partitions_t211.py");
    assert_eq!(
        sequence(&inv),
        [
            "T:add_kernel_0",
            "T:triton_poi_fused_gt_0",
            "A:torch.ops.aten.nonzero.default",
            "A:aten.copy_",
            "T:triton_per_fused_sum_1"
        ]
    );
    let user = inv.kernel("add_kernel_0").unwrap();
    assert_eq!(user.category, KernelCategory::UserAutotune);
    assert_eq!(user.params, ["in_ptr0", "in_ptr1", "out_ptr", "n_elements"]);
    assert_eq!(
        user.autotune_configs,
        vec![
            json!({"num_warps": 4, "num_stages": 3, "kwargs": {"BLOCK_SIZE": 128}}),
            json!({"num_warps": 8, "num_stages": 2, "kwargs": {"BLOCK_SIZE": 1024}}),
        ]
    );
    assert!(user.source_nodes.is_empty());
    // Newer launches pass the grid as trailing positional arguments.
    let (_, args, numels, _, grid, _) = triton(&inv.launches[0]);
    assert_eq!(args, ["arg0_1", "arg1_1", "buf1", "4096"]);
    assert!(numels.is_empty());
    assert_eq!(grid, Some("(32, 1, 1)"));
    // Dynamic size: ks0 is an argument, r0_numel is the symbol s0; xnumel is 1.
    let (_, args, numels, ..) = triton(&inv.launches[4]);
    assert_eq!(args, ["buf3", "buf5", "s0"]);
    assert_eq!(numels, ["1", "s0"]);
    match &inv.launches[3] {
        Launch::Aten { op, args, .. } => {
            assert_eq!(op, "aten.copy_");
            assert_eq!(args, &["buf4", "reinterpret_tensor(buf3, (2, ), (1, ), 0)", "non_blocking=True"]);
        }
        other => panic!("{other:?}"),
    }
    let b: Vec<_> = inv.buffers.iter().map(|b| (b.name.as_str(), b.dtype.as_str(), b.device.as_str())).collect();
    assert_eq!(
        b,
        [
            ("buf1", "torch.float32", "cuda"),
            ("buf2", "torch.bool", "cuda"),
            ("buf4", "torch.int64", "cpu"),
            ("buf5", "torch.float32", "cuda"),
        ]
    );
    assert!(inv.buffers[3].shape.is_empty());
    let rep = inv.replaceable();
    assert_eq!(rep[0], ("add_kernel_0", false, "user-defined Triton kernel: kept as written"));
}

#[test]
fn json_round_trip() {
    for f in
        ["pointwise_only_t26.py", "mlp_softmax_t210.py", "max_autotune_template_t25.py", "cudagraph_partitions_t211.py"]
    {
        let inv = parse(f);
        let text = serde_json::to_string_pretty(&inv).unwrap();
        let back: Inventory = serde_json::from_str(&text).unwrap();
        assert_eq!(back, inv, "{f}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(v["launches"].as_array().unwrap().iter().all(|l| l["kind"].is_string()));
    }
    // Through a file as well.
    let inv = parse("mlp_softmax_t210.py");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("inv.json");
    std::fs::write(&p, serde_json::to_vec(&inv).unwrap()).unwrap();
    let back: Inventory = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    assert_eq!(back.launches, inv.launches);
    assert_eq!(back.kernels[1].category, KernelCategory::PersistentReduction);
}

#[test]
fn syntax_error_reports_line() {
    let mut src = fixture("pointwise_only_t26.py");
    src = src.replacen("    return (buf1, )", "    return (buf1, ", 1);
    let err = parse_wrapper(&src).unwrap_err();
    match &err {
        ParseError::Syntax { line, col, message } => {
            let want = src.lines().position(|l| l.contains("return (buf1, ")).unwrap() + 1;
            assert!(*line >= want, "line {line} < {want}");
            assert!(*col >= 1);
            assert!(!message.is_empty());
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("syntax error"));

    let err = parse_wrapper("x = 1\ndef call(args):\n    y = (\n").unwrap_err();
    assert!(matches!(err, ParseError::Syntax { .. }), "{err:?}");

    let err = parse_wrapper("import torch\n\ndef call(args)\n    return ()\n").unwrap_err();
    match err {
        ParseError::Syntax { line, .. } => assert_eq!(line, 3),
        other => panic!("{other:?}"),
    }
}

#[test]
fn kernel_source_syntax_error_is_located_in_wrapper() {
    let src = "k0 = async_compile.triton('k0', '''\nimport triton\n@triton.jit\ndef k0(x\n    pass\n''', device_str='cuda')\n\ndef call(args):\n    k0.run(args[0], stream=stream0)\n";
    match parse_wrapper(src).unwrap_err() {
        ParseError::KernelSyntax { kernel, line, .. } => {
            assert_eq!(kernel, "k0");
            assert!((4..=5).contains(&line), "line {line}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn missing_call_function() {
    let src = fixture("pointwise_only_t26.py").replace("def call(args):", "def kall(args):");
    let err = parse_wrapper(&src).unwrap_err();
    assert_eq!(err, ParseError::NoCallFunction);
    assert!(err.to_string().contains("no call() function"));
    assert_eq!(parse_wrapper("").unwrap_err(), ParseError::NoCallFunction);
}

#[test]
fn launched_but_undefined_kernel_is_an_error() {
    let src =
        fixture("mlp_softmax_t210.py").replace("triton_per_fused__softmax_1.run(", "triton_per_fused__softmax_9.run(");
    let err = parse_wrapper(&src).unwrap_err();
    match &err {
        ParseError::UndefinedKernel { kernel, line } => {
            assert_eq!(kernel, "triton_per_fused__softmax_9");
            assert!(src.lines().nth(line - 1).unwrap().contains("triton_per_fused__softmax_9.run("));
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("never defined"));
}

#[test]
fn triton_config_and_older_empty_strided() {
    let src = r#"
k = async_compile.triton('k', '''
import triton
import triton.language as tl
@triton.autotune(configs=[triton.Config({'BLOCK': 64}, num_warps=2), triton.Config({'BLOCK': 128}, num_warps=4, num_stages=3)], key=['n'])
@triton.jit
def k(x_ptr, n, BLOCK: tl.constexpr):
    pass
''', device_str='cuda')

def call(args):
    arg0_1, = args
    buf0 = empty_strided((8, 16), (16, 1), device='cuda', dtype=torch.float16)
    k.run(arg0_1, 128, grid=grid(2), stream=stream0)
    buf1 = aten.bernoulli(buf0, -0.5)
    return (buf0, )
"#;
    let inv = parse_wrapper(src).unwrap();
    let k = &inv.kernels[0];
    assert_eq!(k.category, KernelCategory::Other("none".into()));
    assert_eq!(
        k.autotune_configs,
        vec![
            json!({"kwargs": {"BLOCK": 64}, "num_warps": 2}),
            json!({"kwargs": {"BLOCK": 128}, "num_warps": 4, "num_stages": 3}),
        ]
    );
    assert_eq!(inv.buffers[0].device, "cuda");
    assert_eq!(inv.buffers[0].dtype, "torch.float16");
    assert_eq!(inv.buffers[0].shape, ["8", "16"]);
    assert_eq!(sequence(&inv), ["T:k", "A:aten.bernoulli"]);
    let (_, args, numels, ..) = triton(&inv.launches[0]);
    assert_eq!(args, ["arg0_1", "128"], "`n` is not a *numel parameter");
    assert!(numels.is_empty());
    assert_eq!(inv.replaceable(), vec![("k", false, "unrecognised heuristics: not classified")]);
}

#[test]
fn real_cpu_wrapper_from_torch_2_15() {
    // Unedited Inductor output (CPU, torch 2.15): Runner class, `del async_compile`, a C++ kernel
    // (not inventoried) and one extern addmm.
    let inv = parse("cpu_linear_softmax_t215.py");
    assert!(inv.kernels.is_empty());
    assert_eq!(sequence(&inv), ["E:extern_kernels.addmm"]);
    match &inv.launches[0] {
        Launch::Extern { out, args, .. } => {
            assert_eq!(out.as_deref(), Some("buf0"));
            assert!(args.iter().any(|a| a == "alpha=1"));
        }
        other => panic!("{other:?}"),
    }
    assert!(inv.buffers.iter().any(|b| b.name == "buf0" && b.device == "cpu"), "{:?}", inv.buffers);
}

/// Every real wrapper of the CPU sweep (38 Inductor wrappers of suite problems, torch 2.15, see
/// the file headers) parses, and its launches and buffers agree with a plain text count of the
/// call sites in the source — an independent check of the AST walk on real output.
#[test]
fn real_cpu_sweep_wrappers_parse_and_agree_with_a_text_count() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cpu_t215");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 30, "{} wrappers", files.len());
    let mut externs_total = 0;
    for f in &files {
        let src = std::fs::read_to_string(f).unwrap();
        let inv = parse_wrapper(&src).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(inv.kernels.is_empty(), "{}: CPU wrappers have no Triton kernels", f.display());
        let body = &src[src.find("def call(").unwrap()..];
        let body = &body[..body.find("\ndef ").or_else(|| body.find("\nrunner = ")).unwrap_or(body.len())];
        let code_lines = || body.lines().map(str::trim_start).filter(|l| !l.starts_with('#'));

        // A call site: the statement starts with the callee or assigns its result (a name inside
        // a string, as in assert_tensor_metadata(..., 'torch.ops.aten.x.default'), is none).
        let calls = |l: &str, p: &str| l.starts_with(p) || l.contains(&format!("= {p}"));
        let text_aten = code_lines().filter(|l| calls(l, "torch.ops.aten.") || calls(l, "aten.")).count();
        let text_externs = code_lines().filter(|l| calls(l, "extern_kernels.")).count();
        let text_buffers = code_lines().filter(|l| l.contains("= empty_strided_cpu(")).count();
        let externs = inv.launches.iter().filter(|l| matches!(l, Launch::Extern { .. })).count();
        let aten = inv.launches.iter().filter(|l| matches!(l, Launch::Aten { .. })).count();
        assert_eq!((externs, aten, inv.buffers.len()), (text_externs, text_aten, text_buffers), "{}", f.display());
        externs_total += externs;
    }
    assert!(externs_total >= 20, "the sweep covers GEMMs and convolutions: {externs_total} extern calls");
}
