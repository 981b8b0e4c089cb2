//! GPU memory for admission: the sampler thread that reports each device's free/total memory and
//! each process's use as [`Event::GpuMemory`] (NVML, or the `--debug-gpu-memory` file: a test
//! hook), and [`OomScanner`], which tells from a job's stderr that CUDA ran out of memory.
//!
//! Sampling runs on its own thread, never on the event loop's; what admission does with the
//! samples is the state machine's (`state/memory.rs`).

use crate::event::{Event, Inbound, MemorySample, ProcessMemory};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

/// How often devices are sampled.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(250);

/// What in a job's stderr means CUDA ran out of memory (PyTorch, the runtime API, the driver API).
pub const OOM_MARKERS: [&[u8]; 4] =
    [b"CUDA out of memory", b"torch.OutOfMemoryError", b"cudaErrorMemoryAllocation", b"CUDA_ERROR_OUT_OF_MEMORY"];

/// Scans a stream chunk by chunk for [`OOM_MARKERS`], also across chunk boundaries; keeps only a
/// short tail between chunks.
#[derive(Default)]
pub struct OomScanner {
    tail: Vec<u8>,
    seen: bool,
}

impl OomScanner {
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.seen {
            return;
        }
        let longest = OOM_MARKERS.iter().map(|m| m.len()).max().unwrap_or(0);
        self.tail.extend_from_slice(chunk);
        self.seen = OOM_MARKERS.iter().any(|m| self.tail.windows(m.len()).any(|w| w == *m));
        let keep = longest.saturating_sub(1).min(self.tail.len());
        self.tail.drain(..self.tail.len() - keep);
    }

    pub fn seen(&self) -> bool {
        self.seen
    }
}

/// Where samples come from.
#[derive(Debug, Clone)]
pub enum MemorySource {
    /// NVML, for the GPU devices.
    Nvml,
    /// A JSON file, re-read at every sample (the test hook `--debug-gpu-memory`): an object from
    /// device name to `{"total": bytes, "free": bytes, "processes": [{"pid": N, "used": bytes}]}`.
    /// Devices it does not name get no samples.
    File(PathBuf),
}

/// A device the sampler looks at: its index in the state machine, its name, its NVML index, and
/// whether a region is being entered, held or left on it (set by the device's thread): NVML's
/// process queries are not made on a device while a region holds it — the measured code is the
/// only GPU client then, the daemon included. Admission meanwhile sees the device's last sample,
/// at most one `SAMPLE_INTERVAL` older than the region.
pub struct SampledDevice {
    pub index: usize,
    pub name: String,
    pub nvml_index: Option<u32>,
    pub in_region: Arc<AtomicBool>,
}

/// The devices to sample now: those no region holds.
fn quiet(devices: &[SampledDevice]) -> Vec<&SampledDevice> {
    devices.iter().filter(|d| !d.in_region.load(Ordering::Acquire)).collect()
}

#[derive(Deserialize)]
struct FakeDevice {
    total: u64,
    free: u64,
    #[serde(default)]
    processes: Vec<FakeProcess>,
}

#[derive(Deserialize)]
struct FakeProcess {
    pid: u32,
    used: u64,
}

/// Start the sampler; it stops when the event loop is gone.
pub fn spawn_sampler(source: MemorySource, devices: Vec<SampledDevice>, events: Sender<Inbound>) {
    if matches!(source, MemorySource::Nvml) && devices.iter().all(|d| d.nvml_index.is_none()) {
        return;
    }
    let spawned = std::thread::Builder::new().name("kforge-memory".into()).spawn(move || {
        let nvml = match source {
            MemorySource::Nvml => match nvml_wrapper::Nvml::init() {
                Ok(n) => Some(n),
                Err(e) => {
                    eprintln!("kforge daemon: NVML: {e}: admission does not look at GPU memory");
                    return;
                }
            },
            MemorySource::File(_) => None,
        };
        let mut last_error = String::new();
        loop {
            let due = quiet(&devices);
            let samples = match (&source, &nvml) {
                (MemorySource::File(path), _) => match read_fake(path, &due) {
                    Ok(s) => s,
                    Err(e) => {
                        if e != last_error {
                            eprintln!("kforge daemon: --debug-gpu-memory {}: {e}", path.display());
                            last_error = e;
                        }
                        Vec::new()
                    }
                },
                (MemorySource::Nvml, Some(n)) => sample_nvml(n, &due),
                (MemorySource::Nvml, None) => Vec::new(),
            };
            for (device, sample) in samples {
                if events.send(Event::GpuMemory { device, sample }.into()).is_err() {
                    return;
                }
            }
            std::thread::sleep(SAMPLE_INTERVAL);
        }
    });
    if let Err(e) = spawned {
        eprintln!("kforge daemon: cannot start the memory sampler: {e}");
    }
}

fn read_fake(path: &std::path::Path, devices: &[&SampledDevice]) -> Result<Vec<(usize, MemorySample)>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        // Not written yet: no samples.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.to_string()),
    };
    let fake: BTreeMap<String, FakeDevice> = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    if let Some(name) = fake.keys().find(|n| !devices.iter().any(|d| &d.name == *n)) {
        return Err(format!("names device {name:?}, which this daemon does not have"));
    }
    Ok(devices
        .iter()
        .filter_map(|d| {
            let f = fake.get(&d.name)?;
            let processes =
                f.processes.iter().map(|p| ProcessMemory { pid: p.pid, pgid: pgid_of(p.pid), used: p.used }).collect();
            Some((d.index, MemorySample { total: f.total, free: f.free.min(f.total), processes }))
        })
        .collect())
}

fn sample_nvml(n: &nvml_wrapper::Nvml, devices: &[&SampledDevice]) -> Vec<(usize, MemorySample)> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    devices
        .iter()
        .filter_map(|d| {
            let dev = n.device_by_index(d.nvml_index?).ok()?;
            let info = dev.memory_info().ok()?;
            let processes = dev
                .running_compute_processes()
                .unwrap_or_default()
                .into_iter()
                .map(|p| ProcessMemory {
                    pid: p.pid,
                    pgid: pgid_of(p.pid),
                    used: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => b,
                        UsedGpuMemory::Unavailable => 0,
                    },
                })
                .collect();
            Some((d.index, MemorySample { total: info.total, free: info.free, processes }))
        })
        .collect()
}

/// The process group of a pid this namespace can see.
pub fn pgid_of(pid: u32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit(')').next()?.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_is_found_across_chunks_and_plain_output_is_not_one() {
        let mut s = OomScanner::default();
        s.feed(b"step 1 ok\nRuntimeError: CUDA out of me");
        assert!(!s.seen());
        s.feed(b"mory. Tried to allocate 2.00 GiB\n");
        assert!(s.seen());
        let mut plain = OomScanner::default();
        for _ in 0..100 {
            plain.feed(b"out of memory? no: CUDA is fine\n");
        }
        assert!(!plain.seen());
        assert!(plain.tail.len() < 32, "the tail stays short");
    }

    #[test]
    fn the_fake_file_gives_samples_for_the_devices_it_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mem.json");
        let devs = [device(0, "cpu", None), device(1, "0", Some(0))];
        let devs: Vec<&SampledDevice> = devs.iter().collect();
        assert_eq!(read_fake(&path, &devs), Ok(vec![]), "no file yet: no samples");
        let me = std::process::id();
        std::fs::write(
            &path,
            format!(r#"{{"0": {{"total": 100, "free": 40, "processes": [{{"pid": {me}, "used": 7}}]}}}}"#),
        )
        .unwrap();
        let got = read_fake(&path, &devs).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, 1);
        assert_eq!((got[0].1.total, got[0].1.free), (100, 40));
        assert_eq!(got[0].1.processes[0].used, 7);
        assert_eq!(got[0].1.processes[0].pgid, pgid_of(me));
        std::fs::write(&path, r#"{"7": {"total": 1, "free": 1}}"#).unwrap();
        assert!(read_fake(&path, &devs).unwrap_err().contains("\"7\""));
    }

    fn device(index: usize, name: &str, nvml_index: Option<u32>) -> SampledDevice {
        SampledDevice { index, name: name.into(), nvml_index, in_region: Arc::new(AtomicBool::new(false)) }
    }

    #[test]
    fn a_device_held_by_a_region_is_not_sampled_until_the_region_is_left() {
        let devs = [device(0, "cpu", None), device(1, "0", Some(0)), device(2, "1", Some(1))];
        let names = |d: Vec<&SampledDevice>| d.iter().map(|d| d.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(quiet(&devs)), ["cpu", "0", "1"]);
        devs[1].in_region.store(true, Ordering::Release);
        assert_eq!(names(quiet(&devs)), ["cpu", "1"], "GPU 0 holds a region: only the others are sampled");
        devs[1].in_region.store(false, Ordering::Release);
        assert_eq!(names(quiet(&devs)), ["cpu", "0", "1"]);
    }
}
