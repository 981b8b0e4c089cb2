//! Devices a daemon manages: the `cpu` device always, NVIDIA GPUs through NVML when present.

use crate::DaemonError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Gpu,
}

impl DeviceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Gpu => "gpu",
        }
    }
}

#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// `"cpu"` or the GPU's NVML index as a string (`"0"`).
    pub name: String,
    pub kind: DeviceKind,
    pub description: String,
    /// Value of `CUDA_VISIBLE_DEVICES` for jobs on this device (empty for cpu: no GPU visible).
    pub cuda_visible: String,
}

/// Which GPUs to manage (`--gpus`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSelection {
    /// Every GPU NVML reports; none when NVML is absent.
    All,
    /// No GPUs: the cpu device only.
    None,
    /// Exactly these indices; an error if NVML is absent or an index does not exist.
    List(Vec<u32>),
}

impl GpuSelection {
    pub fn parse(s: &str) -> Result<GpuSelection, DaemonError> {
        match s.trim() {
            "all" => Ok(GpuSelection::All),
            "none" | "" => Ok(GpuSelection::None),
            list => {
                let mut v = Vec::new();
                for part in list.split(',') {
                    let i = part.trim().parse::<u32>().map_err(|_| {
                        DaemonError::Config(format!("--gpus: {part:?} is not a GPU index (use all, none or e.g. 0,2)"))
                    })?;
                    if !v.contains(&i) {
                        v.push(i);
                    }
                }
                Ok(GpuSelection::List(v))
            }
        }
    }
}

/// The cpu device plus the selected GPUs.
pub fn discover(sel: &GpuSelection) -> Result<Vec<DeviceInfo>, DaemonError> {
    let mut out = vec![DeviceInfo {
        name: "cpu".into(),
        kind: DeviceKind::Cpu,
        description: format!("host CPU ({} cores online)", kforge_cores::online_cpus().map(|c| c.len()).unwrap_or(0)),
        cuda_visible: String::new(),
    }];
    if *sel == GpuSelection::None {
        return Ok(out);
    }
    let nvml = match nvml_wrapper::Nvml::init() {
        Ok(n) => n,
        Err(e) => {
            if let GpuSelection::List(_) = sel {
                return Err(DaemonError::Config(format!("--gpus asks for GPUs but NVML is unavailable: {e}")));
            }
            return Ok(out);
        }
    };
    let count = nvml.device_count().map_err(|e| DaemonError::Config(format!("NVML device count: {e}")))?;
    let wanted: Vec<u32> = match sel {
        GpuSelection::All => (0..count).collect(),
        GpuSelection::List(v) => v.clone(),
        GpuSelection::None => vec![],
    };
    for i in wanted {
        if i >= count {
            return Err(DaemonError::Config(format!("--gpus: GPU {i} does not exist (NVML reports {count})")));
        }
        let d = nvml.device_by_index(i).map_err(|e| DaemonError::Config(format!("NVML GPU {i}: {e}")))?;
        let name = d.name().unwrap_or_else(|_| "NVIDIA GPU".into());
        let uuid = d.uuid().ok();
        let mem = d.memory_info().map(|m| m.total / (1 << 30)).unwrap_or(0);
        out.push(DeviceInfo {
            name: i.to_string(),
            kind: DeviceKind::Gpu,
            description: format!("{name}, {mem} GiB{}", uuid.as_deref().map(|u| format!(", {u}")).unwrap_or_default()),
            cuda_visible: uuid.unwrap_or_else(|| i.to_string()),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn parse_selection() {
        assert_eq!(GpuSelection::parse("all").unwrap(), GpuSelection::All);
        assert_eq!(GpuSelection::parse("none").unwrap(), GpuSelection::None);
        assert_eq!(GpuSelection::parse("0, 2,2").unwrap(), GpuSelection::List(vec![0, 2]));
        let e = GpuSelection::parse("0,x").unwrap_err().to_string();
        assert!(e.contains("\"x\""), "{e}");
    }
    #[test]
    fn cpu_is_always_there() {
        let d = discover(&GpuSelection::None).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].name, "cpu");
        assert_eq!(d[0].cuda_visible, "");
    }
}
