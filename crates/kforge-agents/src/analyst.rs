//! The strategy analyst (deterministic): a tier per kernel from its speed-of-light percentages,
//! and the Amdahl ceiling of changing only the generated kernels. Rendered into the planner's
//! prompt.

use crate::context::{KernelKind, KernelProfile, ProblemContext};
use serde::Serialize;

/// Either speed-of-light percentage above this: the kernel is near optimal.
pub const NEAR_OPTIMAL_PCT: f64 = 80.0;
/// Both percentages below this: the kernel under-utilizes the device.
pub const UNDER_UTILIZED_PCT: f64 = 40.0;
/// Without a profile, a generated kernel whose least traffic moves at this fraction of the
/// device's measured bandwidth (a copy's rate, about 88 % of an H100's nominal HBM3 rate) or more
/// is near optimal: about the memory speed-of-light percentage `NEAR_OPTIMAL_PCT` says.
pub const NEAR_OPTIMAL_BANDWIDTH: f64 = 0.9;
/// Below this fraction it under-utilizes the device (as `UNDER_UTILIZED_PCT`).
pub const UNDER_UTILIZED_BANDWIDTH: f64 = 0.45;

/// What limits a kernel (DESIGN-NOTES §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// Either SOL% > 80: little to gain.
    NearOptimal,
    /// Memory SOL% is the larger one (and ≥ 40).
    MemoryBound,
    /// Compute SOL% is the larger one (and ≥ 40).
    ComputeBound,
    /// Both SOL% < 40: latency, launch or occupancy limited.
    UnderUtilized,
    /// No profile for the kernel.
    Unknown,
}

impl Tier {
    /// The tier of one profiled kernel.
    pub fn of(p: &KernelProfile) -> Tier {
        Tier::from_percentages(p.sol_memory_pct, p.sol_compute_pct)
    }

    /// The tier of memory and compute speed-of-light percentages `m` and `c`.
    pub fn from_percentages(m: f64, c: f64) -> Tier {
        if m > NEAR_OPTIMAL_PCT || c > NEAR_OPTIMAL_PCT {
            Tier::NearOptimal
        } else if m < UNDER_UTILIZED_PCT && c < UNDER_UTILIZED_PCT {
            Tier::UnderUtilized
        } else if m >= c {
            Tier::MemoryBound
        } else {
            Tier::ComputeBound
        }
    }

    /// The tier of a generated kernel from the roofline alone (no profile: memory only): near
    /// optimal from `NEAR_OPTIMAL_BANDWIDTH` of the device's measured bandwidth, under-utilized
    /// below `UNDER_UTILIZED_BANDWIDTH`, memory-bound between (a pointwise or reduction kernel).
    pub fn from_bandwidth(of_peak: f64) -> Tier {
        if of_peak >= NEAR_OPTIMAL_BANDWIDTH {
            Tier::NearOptimal
        } else if of_peak < UNDER_UTILIZED_BANDWIDTH {
            Tier::UnderUtilized
        } else {
            Tier::MemoryBound
        }
    }

    /// The tier's name as the prompt shows it.
    pub fn name(self) -> &'static str {
        match self {
            Tier::NearOptimal => "near-optimal",
            Tier::MemoryBound => "memory-bound",
            Tier::ComputeBound => "compute-bound",
            Tier::UnderUtilized => "under-utilized",
            Tier::Unknown => "unknown",
        }
    }
}

/// One kernel's row of the analysis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelTier {
    pub name: String,
    pub kind: Option<KernelKind>,
    pub share: Option<f64>,
    pub tier: Tier,
    /// Set when the tier came from the roofline (no profile row): the fraction of the device's
    /// measured bandwidth.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_bandwidth: Option<f64>,
}

/// The analysis of a problem.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Analysis {
    /// Inventory order when there is an inventory, else profile order.
    pub kernels: Vec<KernelTier>,
    /// 1 / (1 − generated share): the most that changing the generated kernels can give (None
    /// without an inventory, or when generated kernels are all the time).
    pub amdahl_ceiling: Option<f64>,
}

/// Tiers every kernel of `ctx` and computes the Amdahl ceiling.
pub fn analyze(ctx: &ProblemContext) -> Analysis {
    let profile_of = |name: &str| ctx.profile.as_ref().and_then(|ps| ps.iter().find(|p| p.name == name));
    let Some(inventory) = &ctx.inventory else {
        let kernels = ctx
            .profile
            .iter()
            .flatten()
            .map(|p| KernelTier {
                name: p.name.clone(),
                kind: None,
                share: None,
                tier: Tier::of(p),
                from_bandwidth: None,
            })
            .collect();
        return Analysis { kernels, amdahl_ceiling: None };
    };
    let kernels = inventory
        .kernels
        .iter()
        .map(|k| {
            let (tier, from_bandwidth) = match (profile_of(&k.name), k.bandwidth_of_peak) {
                (Some(p), _) => (Tier::of(p), None),
                (None, Some(f)) if k.kind == KernelKind::Generated => (Tier::from_bandwidth(f), Some(f)),
                _ => (Tier::Unknown, None),
            };
            KernelTier { name: k.name.clone(), kind: Some(k.kind), share: Some(k.share), tier, from_bandwidth }
        })
        .collect();
    let generated: f64 = inventory.kernels.iter().filter(|k| k.kind == KernelKind::Generated).map(|k| k.share).sum();
    let amdahl_ceiling = (generated < 1.0).then(|| 1.0 / (1.0 - generated.max(0.0)));
    Analysis { kernels, amdahl_ceiling }
}

impl Analysis {
    /// The analysis as prompt text: one line per kernel, then the ceiling.
    pub fn render(&self) -> String {
        if self.kernels.is_empty() {
            return "no inventory and no profile: nothing is known about the compiled kernels".into();
        }
        let mut lines: Vec<String> = self
            .kernels
            .iter()
            .map(|k| {
                let kind = match k.kind {
                    Some(KernelKind::Generated) => " generated",
                    Some(KernelKind::Vendor) => " vendor",
                    Some(KernelKind::Aten) => " aten",
                    None => "",
                };
                let share = k.share.map(|s| format!(" {:.1}% of GPU time", s * 100.0)).unwrap_or_default();
                let basis = k
                    .from_bandwidth
                    .map(|f| {
                        format!(
                            " (no profile; roofline: its least traffic at {:.0}% of the device's bandwidth)",
                            f * 100.0
                        )
                    })
                    .unwrap_or_default();
                format!("- {}{kind}{share}: {}{basis}", k.name, k.tier.name())
            })
            .collect();
        match self.amdahl_ceiling {
            Some(c) => lines.push(format!("Amdahl ceiling of changing the generated kernels only: {c:.2}x")),
            None => lines.push("Amdahl ceiling: unknown".into()),
        }
        lines.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::{BaselineInfo, Inventory, KernelInfo};

    fn profile(name: &str, m: f64, c: f64) -> KernelProfile {
        KernelProfile {
            name: name.into(),
            sol_memory_pct: m,
            sol_compute_pct: c,
            occupancy_pct: None,
            dram_of_peak_pct: None,
        }
    }

    #[test]
    fn tiers_follow_the_speed_of_light_percentages() {
        assert_eq!(Tier::of(&profile("a", 85.0, 10.0)), Tier::NearOptimal);
        assert_eq!(Tier::of(&profile("a", 10.0, 81.0)), Tier::NearOptimal);
        assert_eq!(Tier::of(&profile("a", 60.0, 20.0)), Tier::MemoryBound);
        assert_eq!(Tier::of(&profile("a", 20.0, 60.0)), Tier::ComputeBound);
        assert_eq!(Tier::of(&profile("a", 20.0, 30.0)), Tier::UnderUtilized);
    }

    /// A problem of these inventory kernels and profile rows.
    fn context(kernels: Vec<KernelInfo>, profile: Vec<KernelProfile>) -> ProblemContext {
        ProblemContext {
            problem: "p".into(),
            source: String::new(),
            baseline: BaselineInfo { source: String::new(), label: "b".into(), time_ms: None },
            inventory: Some(Inventory { kernels }),
            profile: Some(profile),
            device: "cpu".into(),
        }
    }

    fn kernel(name: &str, kind: KernelKind, share: f64, bandwidth_of_peak: Option<f64>) -> KernelInfo {
        KernelInfo { name: name.into(), kind, share, source: None, bandwidth_of_peak }
    }

    #[test]
    fn the_ceiling_comes_from_the_generated_share() {
        let ctx = context(
            vec![kernel("mm", KernelKind::Vendor, 0.75, None), kernel("t0", KernelKind::Generated, 0.25, None)],
            vec![profile("t0", 50.0, 5.0)],
        );
        let a = analyze(&ctx);
        assert_eq!(a.amdahl_ceiling, Some(1.0 / 0.75));
        assert_eq!(a.kernels[0].tier, Tier::Unknown);
        assert_eq!(a.kernels[1].tier, Tier::MemoryBound);
        let text = a.render();
        assert!(text.contains("- t0 generated 25.0% of GPU time: memory-bound"), "{text}");
        assert!(text.contains("1.33x"), "{text}");
    }

    #[test]
    fn without_a_profile_row_a_generated_kernel_is_tiered_by_its_roofline() {
        let generated = |name: &str, f: f64| kernel(name, KernelKind::Generated, 0.25, Some(f));
        let ctx = context(
            vec![
                generated("silu", 1.022),
                generated("norm", 0.62),
                generated("tiny", 0.2),
                kernel("mm", KernelKind::Vendor, 0.25, Some(0.95)), // a vendor call is not tiered by it
                generated("profiled", 0.99),
            ],
            vec![profile("profiled", 50.0, 5.0)], // a profile row wins
        );
        let a = analyze(&ctx);
        let tiers: Vec<Tier> = a.kernels.iter().map(|k| k.tier).collect();
        assert_eq!(
            tiers,
            [Tier::NearOptimal, Tier::MemoryBound, Tier::UnderUtilized, Tier::Unknown, Tier::MemoryBound]
        );
        let text = a.render();
        assert!(
            text.contains(
                "- silu generated 25.0% of GPU time: near-optimal (no profile; roofline: its least traffic at 102% of \
                 the device's bandwidth)"
            ),
            "{text}"
        );
        assert!(text.contains("- profiled generated 25.0% of GPU time: memory-bound\n"), "{text}");
    }
}
