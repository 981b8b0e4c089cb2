//! Where a job submitted for device `auto` runs.
//!
//! Without a GPU group: the least loaded GPU (jobs running plus queued; the lowest index on a
//! tie). With one: the GPU the first job of that group was placed on, for as long as the daemon
//! remembers the group. Candidates an agent compares against each other (one operator's variants)
//! share a GPU group, so they are timed on one GPU: on a 2×H200 host the same command's isolated time
//! differs between the two GPUs by up to ~4 % at p95 (bench/results/2026-11-30-issue5-eval,
//! third pass), more than many candidate pairs differ by.
//!
//! The memory is bounded: past [`Placement::capacity`] groups the oldest binding is forgotten (its
//! next job is placed afresh). Pure bookkeeping: the daemon's state machine owns one.

use std::collections::{HashMap, VecDeque};

/// Longest GPU group name accepted (bytes).
pub const MAX_GROUP_LEN: usize = 256;

/// Groups remembered by default.
pub const DEFAULT_CAPACITY: usize = 16_384;

#[derive(Debug)]
pub struct Placement {
    bound: HashMap<String, usize>,
    /// Groups in the order they were bound (oldest first), for forgetting.
    order: VecDeque<String>,
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
        Placement { bound: HashMap::new(), order: VecDeque::new(), capacity: capacity.max(1) }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
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
        self.bound.get(group).copied()
    }

    /// Choose among `loads` — (device index, jobs running plus queued) of every device an `auto`
    /// job may run on — and bind `group` to the choice. `None` when `loads` is empty.
    pub fn place(&mut self, group: Option<&str>, loads: &[(usize, usize)]) -> Option<usize> {
        let least = loads.iter().min_by_key(|(i, load)| (*load, *i)).map(|(i, _)| *i)?;
        let Some(group) = group else { return Some(least) };
        if let Some(d) = self.bound.get(group).copied() {
            if loads.iter().any(|(i, _)| *i == d) {
                return Some(d);
            }
        }
        self.bind(group, least);
        Some(least)
    }

    /// Bind `group` to `device` (a job of the group was sent to that device by name).
    pub fn bind(&mut self, group: &str, device: usize) {
        if self.bound.insert(group.to_string(), device).is_none() {
            self.order.push_back(group.to_string());
        }
        while self.bound.len() > self.capacity {
            match self.order.pop_front() {
                Some(old) => {
                    self.bound.remove(&old);
                }
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_key_the_least_loaded_device_lowest_index_on_a_tie() {
        let mut p = Placement::default();
        assert_eq!(p.place(None, &[(1, 3), (2, 1), (3, 1)]), Some(2));
        assert_eq!(p.place(None, &[(1, 0), (2, 0)]), Some(1));
        assert_eq!(p.place(None, &[]), None);
        assert!(p.is_empty(), "no group, nothing bound");
    }

    #[test]
    fn a_key_follows_its_first_placement_whatever_the_load() {
        let mut p = Placement::default();
        assert_eq!(p.place(Some("softmax/g1"), &[(1, 0), (2, 0)]), Some(1));
        // Device 1 is now much busier; the group stays, another group goes to the idle device.
        assert_eq!(p.place(Some("softmax/g1"), &[(1, 7), (2, 0)]), Some(1));
        assert_eq!(p.place(Some("matmul/g4"), &[(1, 7), (2, 0)]), Some(2));
        assert_eq!(p.place(None, &[(1, 7), (2, 2)]), Some(2));
        assert_eq!((p.bound("softmax/g1"), p.bound("matmul/g4"), p.len()), (Some(1), Some(2), 2));
    }

    #[test]
    fn a_key_bound_to_a_device_not_offered_is_placed_afresh() {
        let mut p = Placement::default();
        assert_eq!(p.place(Some("k"), &[(1, 0), (2, 5)]), Some(1));
        assert_eq!(p.place(Some("k"), &[(2, 5), (3, 1)]), Some(3));
        assert_eq!(p.bound("k"), Some(3));
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn the_oldest_binding_is_forgotten_past_the_capacity() {
        let mut p = Placement::with_capacity(2);
        p.place(Some("a"), &[(1, 0), (2, 1)]);
        p.place(Some("b"), &[(1, 1), (2, 0)]);
        p.place(Some("a"), &[(1, 9), (2, 0)]); // still bound: no new binding, order unchanged
        p.place(Some("c"), &[(1, 0), (2, 0)]);
        assert_eq!((p.bound("a"), p.bound("b"), p.bound("c"), p.len()), (None, Some(2), Some(1), 2));
        // Forgotten: "a" is placed by load again.
        assert_eq!(p.place(Some("a"), &[(1, 4), (2, 3)]), Some(2));
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
