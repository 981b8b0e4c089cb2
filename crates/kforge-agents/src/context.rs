//! What the agents know about a problem: its source, the baseline to beat, the compiled
//! baseline's kernel inventory and profile (when the inspect step produced them), the device.
//! Plain data, read from JSON by the caller.

use serde::{Deserialize, Serialize};

/// One problem as the agents see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProblemContext {
    /// The problem's label, e.g. `level1/003_x.py` (the scope of every call).
    pub problem: String,
    /// The KernelBench problem file: `class Model`, `get_inputs`, `get_init_inputs`.
    pub source: String,
    pub baseline: BaselineInfo,
    #[serde(default)]
    pub inventory: Option<Inventory>,
    #[serde(default)]
    pub profile: Option<Vec<KernelProfile>>,
    /// The device the candidates are judged on, e.g. `cuda:0` or `cpu`.
    pub device: String,
}

/// What to beat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineInfo {
    /// The baseline's source: the compiler's result file, or the problem itself.
    pub source: String,
    /// What it is, e.g. `torch.compile max-autotune`.
    pub label: String,
    /// Its time per forward, when measured.
    #[serde(default)]
    pub time_ms: Option<f64>,
}

/// The compiled baseline's kernels in launch order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    pub kernels: Vec<KernelInfo>,
}

/// One kernel of the inventory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelInfo {
    pub name: String,
    pub kind: KernelKind,
    /// Its share of the GPU time (0..1).
    pub share: f64,
    /// Its source (generated kernels).
    #[serde(default)]
    pub source: Option<String>,
    /// The rate its least traffic moves at as a fraction of the device's measured bandwidth
    /// (`kforge inspect`'s roofline, python/kforge/inspect/roofline.py), where that estimate
    /// holds: the analyst's tier when no profile row has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_of_peak: Option<f64>,
}

/// Who wrote a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelKind {
    /// A Triton kernel the compiler generated: what the agents may change.
    Generated,
    /// A vendor-library call (cuBLAS, cuDNN).
    Vendor,
    /// An aten fallback.
    Aten,
}

/// One kernel's profile: speed-of-light percentages and occupancy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelProfile {
    pub name: String,
    pub sol_memory_pct: f64,
    pub sol_compute_pct: f64,
    #[serde(default)]
    pub occupancy_pct: Option<f64>,
    /// Achieved DRAM bandwidth as a percentage of the device's measured copy peak.
    #[serde(default)]
    pub dram_of_peak_pct: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_is_read_from_json_with_optional_parts_left_out() {
        let json = r#"{"problem": "level1/003_x.py", "source": "class Model: ...", "device": "cpu",
            "baseline": {"source": "class ModelNew: ...", "label": "torch.compile default"},
            "inventory": {"kernels": [{"name": "triton_poi_0", "kind": "generated", "share": 0.25},
                                      {"name": "extern_mm", "kind": "vendor", "share": 0.75}]}}"#;
        let ctx: ProblemContext = serde_json::from_str(json).unwrap();
        assert_eq!(ctx.baseline.time_ms, None);
        assert_eq!(ctx.profile, None);
        let kernels = &ctx.inventory.unwrap().kernels;
        assert_eq!(kernels[1].kind, KernelKind::Vendor);
        assert_eq!(kernels[0].source, None);
    }
}
