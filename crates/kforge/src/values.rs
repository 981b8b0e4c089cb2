//! The closed sets of values flags take (`clap::ValueEnum`), each mapped onto its library type:
//! clap stays in the binary.

use clap::ValueEnum;

/// Isolation policy (`kforge_proto::Policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    Region,
    Command,
    None,
}

impl From<PolicyArg> for kforge_proto::Policy {
    fn from(p: PolicyArg) -> Self {
        match p {
            PolicyArg::Region => kforge_proto::Policy::Region,
            PolicyArg::Command => kforge_proto::Policy::Command,
            PolicyArg::None => kforge_proto::Policy::None,
        }
    }
}

/// Which sibling jobs a region freezes (`kforge_daemon::FreezeScope`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FreezeScopeArg {
    None,
    Device,
    Node,
}

impl From<FreezeScopeArg> for kforge_daemon::FreezeScope {
    fn from(s: FreezeScopeArg) -> Self {
        match s {
            FreezeScopeArg::None => kforge_daemon::FreezeScope::None,
            FreezeScopeArg::Device => kforge_daemon::FreezeScope::Device,
            FreezeScopeArg::Node => kforge_daemon::FreezeScope::Node,
        }
    }
}

/// Freeze mechanism (`kforge_freeze::MechanismKind`), or `auto`: detected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MechanismArg {
    Auto,
    Cgroup2,
    Cgroup1,
    Signals,
}

impl MechanismArg {
    /// The mechanism forced, None for auto-detection.
    pub fn forced(self) -> Option<kforge_freeze::MechanismKind> {
        match self {
            MechanismArg::Auto => None,
            MechanismArg::Cgroup2 => Some(kforge_freeze::MechanismKind::CgroupV2),
            MechanismArg::Cgroup1 => Some(kforge_freeze::MechanismKind::CgroupV1),
            MechanismArg::Signals => Some(kforge_freeze::MechanismKind::Signals),
        }
    }
}

/// Workload profile (`kforge_eval::workload::Profile`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProfileArg {
    /// Stdlib-Python kernels on the `cpu` device: runs anywhere (CI).
    Cpu,
    /// Triton kernels of six operators on a GPU.
    Gpu,
}

impl From<ProfileArg> for kforge_eval::workload::Profile {
    fn from(p: ProfileArg) -> Self {
        match p {
            ProfileArg::Cpu => kforge_eval::workload::Profile::Cpu,
            ProfileArg::Gpu => kforge_eval::workload::Profile::Gpu,
        }
    }
}

/// Ablation step under the region policy (`kforge_eval::runner::Ablation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AblationArg {
    /// Close the submission gate only: no drain, no freeze, no core isolation, no settle.
    Gate,
    /// + wait for managed processes to drain their in-flight GPU work.
    Drain,
    /// + freeze sibling jobs (and settle the GPU's clocks).
    Freeze,
    /// + pin the measuring thread to a reserved core (everything but warm workers).
    Isolate,
    /// + run commands in warm workers.
    Warm,
}

impl From<AblationArg> for kforge_eval::runner::Ablation {
    fn from(a: AblationArg) -> Self {
        use kforge_eval::runner::Ablation;
        match a {
            AblationArg::Gate => Ablation::Gate,
            AblationArg::Drain => Ablation::Drain,
            AblationArg::Freeze => Ablation::Freeze,
            AblationArg::Isolate => Ablation::Isolate,
            AblationArg::Warm => Ablation::Warm,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value a flag accepts names the library value of the same name.
    #[test]
    fn flag_values_map_onto_the_library_values_of_the_same_name() {
        for p in PolicyArg::value_variants() {
            assert_eq!(p.to_possible_value().unwrap().get_name(), kforge_proto::Policy::from(*p).as_str());
        }
        for s in FreezeScopeArg::value_variants() {
            assert_eq!(s.to_possible_value().unwrap().get_name(), kforge_daemon::FreezeScope::from(*s).as_str());
        }
        for m in MechanismArg::value_variants() {
            let name = m.to_possible_value().unwrap().get_name().to_string();
            assert_eq!(m.forced().map_or("auto", |k| k.as_str()), name);
        }
        for a in AblationArg::value_variants() {
            assert_eq!(a.to_possible_value().unwrap().get_name(), kforge_eval::runner::Ablation::from(*a).as_str());
        }
        for p in ProfileArg::value_variants() {
            let (script, _) = kforge_eval::workload::Profile::from(*p).script();
            assert_eq!(script, format!("eval_{}.py", p.to_possible_value().unwrap().get_name()));
        }
    }
}

/// What `kforge optimize` is measured against (`kforge_optimize::Baseline`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BaselineArg {
    MaxAutotune,
    Default,
}

impl From<BaselineArg> for kforge_optimize::Baseline {
    fn from(b: BaselineArg) -> Self {
        match b {
            BaselineArg::MaxAutotune => kforge_optimize::Baseline::MaxAutotune,
            BaselineArg::Default => kforge_optimize::Baseline::Default,
        }
    }
}
