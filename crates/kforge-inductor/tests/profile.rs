//! GPU-time attribution over a parsed wrapper (launch order: mm, relu, addmm, softmax).

use kforge_inductor::parse_wrapper;
use kforge_inductor::profile::{attribute, KernelEvent};

fn inv() -> kforge_inductor::Inventory {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mlp_softmax_t210.py");
    parse_wrapper(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn ev(name: &str, dur_us: f64) -> KernelEvent {
    KernelEvent { name: name.into(), dur_us }
}

#[test]
fn kernels_go_to_their_launches() {
    let inv = inv();
    let iteration = |gemm: f64| {
        vec![
            ev("sm90_xmma_gemm_bf16bf16_tn", gemm),
            ev("triton_poi_fused_addmm_relu_0", 20.0),
            ev("nvjet_hsh_splitk", 80.0),
            ev("splitKreduce_kernel", 5.0), // second kernel of the same addmm
            ev("triton_per_fused__softmax_1", 10.0),
            ev("vectorized_elementwise_kernel", 5.0), // after the last launch: no owner
        ]
    };
    let a = attribute(&inv, &[iteration(100.0), iteration(120.0)]);
    assert_eq!(a.iterations, 2);
    assert!((a.total_us - 230.0).abs() < 1e-9, "{}", a.total_us);
    let t: Vec<(&str, &str, f64)> = a.launches.iter().map(|l| (l.kind.as_str(), l.label.as_str(), l.gpu_us)).collect();
    assert_eq!(
        t,
        [
            ("extern", "extern_kernels.mm", 110.0),
            ("triton", "triton_poi_fused_addmm_relu_0", 20.0),
            ("extern", "extern_kernels.addmm", 85.0),
            ("triton", "triton_per_fused__softmax_1", 10.0),
        ]
    );
    assert_eq!(a.launches[2].gpu_kernels, ["nvjet_hsh_splitk", "splitKreduce_kernel"]);
    assert!(a.launches[1].replaceable && !a.launches[0].replaceable);
    assert!(a.launches[0].why.contains("vendor"));
    assert!((a.replaceable_share - 30.0 / 230.0).abs() < 1e-12);
    assert_eq!(a.unattributed, vec![("vectorized_elementwise_kernel".to_string(), 5.0)]);
    assert_eq!(a.missing_triton_launches, 0);
    let shares: f64 = a.launches.iter().map(|l| l.share).sum::<f64>() + 5.0 / 230.0;
    assert!((shares - 1.0).abs() < 1e-12);
}

#[test]
fn a_triton_launch_absent_from_the_profile_is_counted() {
    let inv = inv();
    let a = attribute(&inv, &[vec![ev("gemm", 1.0), ev("triton_poi_fused_addmm_relu_0", 2.0), ev("gemm2", 3.0)]]);
    assert_eq!(a.missing_triton_launches, 1);
    assert_eq!(a.launches[3].gpu_us, 0.0);
    // The second GEMM kernel goes to addmm, the next vendor call in order.
    assert_eq!(a.launches[2].gpu_us, 3.0);
}

#[test]
fn no_profile_gives_zero_times() {
    let a = attribute(&inv(), &[]);
    assert_eq!((a.iterations, a.total_us, a.missing_triton_launches), (0, 0.0, 0));
    assert!(a.launches.iter().all(|l| l.gpu_us == 0.0 && l.share == 0.0));
}
