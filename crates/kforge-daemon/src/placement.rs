//! Where a submitted job runs.
//!
//! A device named by the job is taken as named. For `auto`: without a GPU group, the least loaded
//! GPU (jobs running plus queued; the lowest index on a tie); with one, the GPU the group is bound
//! to — where its first job went, or where a job of the group was last sent by name — for as long
//! as the daemon remembers the group; with no GPU at all, the cpu device. Candidates an agent
//! compares against each other (one operator's variants) share a GPU group, so they are timed on
//! one GPU: on a 2×H200 host the same command's isolated time differs between the two GPUs by
//! ~4 % at p95 over a whole workload, ~9 % for 0.1–1 ms kernels
//! (bench/results/2026-11-30-issue5-eval, third pass) — more than many candidate pairs differ by.
//!
//! Choosing never binds: the daemon binds a group only once its job is accepted. The memory is
//! bounded: past its capacity ([`DEFAULT_CAPACITY`] groups) the least recently used binding is forgotten (its
//! next job is placed afresh). Pure bookkeeping: the daemon's state machine owns one.

use std::collections::{BTreeMap, HashMap};

/// Longest GPU group name accepted (bytes).
pub const MAX_GROUP_LEN: usize = 256;

/// Groups remembered by default.
pub const DEFAULT_CAPACITY: usize = 16_384;

/// One device as placement sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLoad<'a> {
    pub name: &'a str,
    pub gpu: bool,
    /// Jobs running plus queued.
    pub load: usize,
}

#[derive(Debug)]
pub struct Placement {
    /// Group → (device index, stamp of its last use).
    bound: HashMap<String, (usize, u64)>,
    /// Stamp of last use → group: the least recently used first.
    by_use: BTreeMap<u64, String>,
    next_stamp: u64,
    capacity: usize,
}

impl Default for Placement {
    fn default() -> Self {
        Placement::with_capacity(DEFAULT_CAPACITY)
    }
}

/// Why a GPU group name is refused.
pub fn check_group(group: &str) -> Result<(), String> {
    if group.is_empty() {
        return Err("the GPU group is empty".into());
    }
    if group.len() > MAX_GROUP_LEN {
        return Err(format!("the GPU group is {} bytes long; at most {MAX_GROUP_LEN}", group.len()));
    }
    Ok(())
}

impl Placement {
    pub fn with_capacity(capacity: usize) -> Placement {
        Placement { bound: HashMap::new(), by_use: BTreeMap::new(), next_stamp: 0, capacity: capacity.max(1) }
    }

    /// Groups bound now.
    pub fn len(&self) -> usize {
        self.bound.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bound.is_empty()
    }

    /// The device a group is bound to, if remembered.
    pub fn bound(&self, group: &str) -> Option<usize> {
        self.bound.get(group).map(|b| b.0)
    }

    /// Groups bound to `device` now.
    pub fn bound_to(&self, device: usize) -> usize {
        self.bound.values().filter(|b| b.0 == device).count()
    }

    /// The device (an index into `devices`) a job for device `name` of `group` would run on;
    /// `None` when `name` is neither `auto` nor one of the devices, or `auto` finds no device.
    pub fn choose(&self, devices: &[DeviceLoad], name: &str, group: Option<&str>) -> Option<usize> {
        if name != "auto" {
            return devices.iter().position(|d| d.name == name);
        }
        let gpus = || devices.iter().enumerate().filter(|(_, d)| d.gpu);
        if let Some(d) = group.and_then(|g| self.bound(g)).filter(|&d| devices.get(d).is_some_and(|x| x.gpu)) {
            return Some(d);
        }
        gpus().min_by_key(|(i, d)| (d.load, *i)).map(|(i, _)| i).or_else(|| devices.iter().position(|d| !d.gpu))
    }

    /// Bind `group` to `device` (a job of the group was accepted there), refreshing its use.
    pub fn bind(&mut self, group: &str, device: usize) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        if let Some((_, old)) = self.bound.insert(group.to_string(), (device, stamp)) {
            self.by_use.remove(&old);
        }
        self.by_use.insert(stamp, group.to_string());
        while self.bound.len() > self.capacity {
            let Some((_, oldest)) = self.by_use.pop_first() else { break };
            self.bound.remove(&oldest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devs<'a>(loads: &[(&'a str, bool, usize)]) -> Vec<DeviceLoad<'a>> {
        loads.iter().map(|&(name, gpu, load)| DeviceLoad { name, gpu, load }).collect()
    }

    #[test]
    fn without_a_group_auto_takes_the_least_loaded_gpu_lowest_index_on_a_tie() {
        let p = Placement::default();
        let d = devs(&[("cpu", false, 0), ("0", true, 3), ("1", true, 1), ("2", true, 1)]);
        assert_eq!(p.choose(&d, "auto", None), Some(2));
        assert_eq!(p.choose(&devs(&[("cpu", false, 9), ("0", true, 0), ("1", true, 0)]), "auto", None), Some(1));
        // No GPU: the cpu device, wherever it is listed; no device at all: none.
        assert_eq!(p.choose(&devs(&[("x", false, 0)]), "auto", Some("g")), Some(0));
        assert_eq!(p.choose(&[], "auto", None), None);
        // A name is taken as named, whatever the load; an unknown name is none.
        assert_eq!(p.choose(&d, "0", Some("g")), Some(1));
        assert_eq!(p.choose(&d, "cpu", None), Some(0));
        assert_eq!(p.choose(&d, "7", None), None);
    }

    #[test]
    fn auto_follows_the_groups_binding_whatever_the_load() {
        let mut p = Placement::default();
        let idle = devs(&[("cpu", false, 0), ("0", true, 0), ("1", true, 0)]);
        let g1 = p.choose(&idle, "auto", Some("softmax/g1")).unwrap();
        assert_eq!(g1, 1);
        assert!(p.is_empty(), "choosing binds nothing");
        p.bind("softmax/g1", g1);
        // GPU 0 is now much busier; the group stays, another group goes to the idle GPU.
        let busy = devs(&[("cpu", false, 0), ("0", true, 7), ("1", true, 0)]);
        assert_eq!(p.choose(&busy, "auto", Some("softmax/g1")), Some(1));
        assert_eq!(p.choose(&busy, "auto", Some("matmul/g4")), Some(2));
        assert_eq!(p.choose(&busy, "auto", None), Some(2));
        // A job of the group sent to GPU 1 by name and accepted moves the binding.
        p.bind("softmax/g1", 2);
        assert_eq!(p.choose(&busy, "auto", Some("softmax/g1")), Some(2));
        assert_eq!(p.len(), 1);
        p.bind("matmul/g4", 2);
        p.bind("ln/g2", 1);
        assert_eq!((p.bound_to(0), p.bound_to(1), p.bound_to(2)), (0, 1, 2));
    }

    #[test]
    fn a_binding_to_no_gpu_is_not_followed() {
        let mut p = Placement::default();
        p.bind("k", 0); // the cpu device
        p.bind("gone", 9); // past the device list
        let d = devs(&[("cpu", false, 0), ("0", true, 5), ("1", true, 1)]);
        assert_eq!(p.choose(&d, "auto", Some("k")), Some(2));
        assert_eq!(p.choose(&d, "auto", Some("gone")), Some(2));
    }

    #[test]
    fn the_least_recently_used_binding_is_forgotten_past_the_capacity() {
        let mut p = Placement::with_capacity(2);
        p.bind("a", 1);
        p.bind("b", 2);
        p.bind("a", 1); // used again: "b" is now the least recently used
        p.bind("c", 1);
        assert_eq!((p.bound("a"), p.bound("b"), p.bound("c"), p.len()), (Some(1), None, Some(1), 2));
        p.bind("d", 2);
        assert_eq!((p.bound("a"), p.bound("c"), p.bound("d")), (None, Some(1), Some(2)));
        // Forgotten: "a" is placed by load again.
        let d = devs(&[("cpu", false, 0), ("0", true, 4), ("1", true, 3)]);
        assert_eq!(p.choose(&d, "auto", Some("a")), Some(2));
    }

    #[test]
    fn group_names_are_checked() {
        assert!(check_group("matmul/g1").is_ok());
        assert_eq!(check_group("").unwrap_err(), "the GPU group is empty");
        let long = "x".repeat(MAX_GROUP_LEN + 1);
        assert!(check_group(&long).unwrap_err().contains("257 bytes long; at most 256"));
        assert!(check_group(&"x".repeat(MAX_GROUP_LEN)).is_ok());
    }
}
