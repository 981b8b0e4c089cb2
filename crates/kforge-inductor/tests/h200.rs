//! Captures of `kforge inspect` on the H200 (torch 2.11, Triton 3.6; bench/results/inspect-suite,
//! pass 1): the report built here from each capture must agree with the one the device run
//! wrote, and every inventory entry must be complete.

use kforge_inductor::inspect::{report, Capture};
use kforge_inductor::{KernelCategory, Launch};
use serde_json::Value;
use std::path::PathBuf;

fn fixtures() -> Vec<(String, Capture, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h200");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let Some(stem) = name.strip_suffix(".capture.json") else { continue };
        let cap: Capture =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let expect: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{stem}.expect.json"))).unwrap()).unwrap();
        out.push((stem.to_string(), cap, expect));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn h200_captures_give_the_device_reports() {
    let all = fixtures();
    assert!(all.len() >= 10, "at least 10 H200 captures, found {}", all.len());
    for (name, cap, want) in &all {
        assert!(cap.device.as_deref().unwrap_or("").starts_with("NVIDIA H200"), "{name}");
        let r = report(cap).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.graphs as u64, want["graphs"].as_u64().unwrap(), "{name}: graphs");
        assert_eq!(r.triton_kernels as u64, want["triton_kernels"].as_u64().unwrap(), "{name}: Triton kernels");
        assert_eq!(r.template_kernels as u64, want["template_kernels"].as_u64().unwrap(), "{name}: template kernels");
        assert_eq!(r.vendor_calls as u64, want["vendor_calls"].as_u64().unwrap(), "{name}: vendor calls");
        let (total, share) = (want["total_us"].as_f64().unwrap(), want["replaceable_share"].as_f64().unwrap());
        assert!(
            (r.attribution.total_us - total).abs() <= 1e-6 * total.max(1.0),
            "{name}: total {} vs {total}",
            r.attribution.total_us
        );
        assert!(
            (r.attribution.replaceable_share - share).abs() < 1e-9,
            "{name}: share {} vs {share}",
            r.attribution.replaceable_share
        );
        // Every Triton launch names a kernel defined in the inventory, with its source and params.
        for l in &r.inventory.launches {
            if let Launch::Triton { kernel, args, .. } = l {
                let k = r
                    .inventory
                    .kernels
                    .iter()
                    .find(|k| &k.name == kernel)
                    .unwrap_or_else(|| panic!("{name}: {kernel} undefined"));
                assert!(k.source.contains("@triton.jit"), "{name}: {kernel} without source");
                assert!(!args.is_empty(), "{name}: {kernel} launched without buffers");
                assert!(
                    !k.aten_ops.is_empty() || k.category == KernelCategory::Template,
                    "{name}: {kernel} without provenance"
                );
            }
        }
        // Templates only where max-autotune put them.
        let templates = r.inventory.kernels.iter().filter(|k| k.category == KernelCategory::Template).count();
        assert!(templates == 0 || name.starts_with("max-autotune"), "{name}: template kernel in mode {}", cap.mode);
    }
    // The masked attention under max-autotune: a Triton GEMM template kernel beside cuBLAS.
    let (_, cap, _) = all.iter().find(|(n, ..)| n == "max-autotune_007_masked_softmax_attention_bf16").unwrap();
    let r = report(cap).unwrap();
    assert_eq!(r.template_kernels, 1);
    assert!(r
        .inventory
        .kernels
        .iter()
        .any(|k| k.name.starts_with("triton_tem_") && k.category == KernelCategory::Template));
}
