//! CPU core isolation: keep region holders on reserved cores and everything else off them.
//!
//! CPUs are identified by their kernel number (`u32`). Lists returned by this crate are sorted
//! ascending without duplicates. CPU numbers up to [`MAX_CPUS`]` - 1` are supported.

pub mod host;

use std::fs;
use std::io;

/// Number of CPU ids supported (CPU numbers `0..MAX_CPUS`), the kernel's largest `NR_CPUS`.
pub const MAX_CPUS: u32 = 8192;
const MASK_WORDS: usize = MAX_CPUS as usize / 64;

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// `sched_getaffinity`/`sched_setaffinity` failed for thread `tid` (ESRCH: no such
    /// thread, EINVAL: no usable cpu in the mask, EPERM: not allowed).
    #[error("{op} of thread {tid}: {source}")]
    Syscall {
        op: &'static str,
        tid: i32,
        #[source]
        source: io::Error,
    },
    /// Reading a file failed.
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    /// A cpu list string could not be parsed.
    #[error("bad cpu list {input:?}: {reason}")]
    Parse { input: String, reason: String },
    /// A cpu number is `>= MAX_CPUS`.
    #[error("cpu {0} out of range (max {max})", max = MAX_CPUS - 1)]
    CpuOutOfRange(u32),
    /// An empty cpu set was given where at least one cpu is needed.
    #[error("empty cpu set")]
    Empty,
    /// [`split`] was asked to reserve all (or more than all) cpus.
    #[error("cannot reserve {reserve} of {available} cpus: at least one must stay for jobs")]
    TooManyReserved { reserve: usize, available: usize },
    /// The process does not exist (or has no readable threads).
    #[error("no such process {0}")]
    NoSuchProcess(i32),
    /// A cpu asked for region holders is not one this process may use.
    #[error("cpu {cpu} is not usable here (usable: {usable})")]
    NotUsable { cpu: u32, usable: String },
    /// Two cpus asked for region holders are one physical core's (SMT siblings).
    #[error("cpus {0} and {1} are one physical core's: give one cpu per core")]
    SameCore(u32, u32),
}

fn sorted(cpus: &[u32]) -> Vec<u32> {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

/// The cpus this process may run on: the affinity mask of the calling thread, or, if that
/// cannot be read, `/sys/devices/system/cpu/online`. Errors only if both fail.
pub fn online_cpus() -> Result<Vec<u32>, CoreError> {
    affinity(0).or_else(|_| {
        let path = "/sys/devices/system/cpu/online";
        let text = fs::read_to_string(path).map_err(|source| CoreError::Io { path: path.into(), source })?;
        parse_cpu_list(&text)
    })
}

/// Pin thread `tid` (0 = the calling thread) to `cpus` with `sched_setaffinity`.
///
/// Errors: [`CoreError::Empty`] for no cpus, [`CoreError::CpuOutOfRange`], and
/// [`CoreError::Syscall`] (e.g. ESRCH for a thread that does not exist, EINVAL when none of
/// `cpus` is online or allowed by the thread's cpuset).
pub fn set_affinity(tid: i32, cpus: &[u32]) -> Result<(), CoreError> {
    if cpus.is_empty() {
        return Err(CoreError::Empty);
    }
    let mut mask = [0u64; MASK_WORDS];
    for &cpu in cpus {
        if cpu >= MAX_CPUS {
            return Err(CoreError::CpuOutOfRange(cpu));
        }
        mask[cpu as usize / 64] |= 1 << (cpu % 64);
    }
    // SAFETY: the kernel reads size_of_val(&mask) bytes from a live buffer; cpu_set_t is just
    // a bit array, so a larger buffer is a valid (bigger) cpu set.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&mask), mask.as_ptr().cast()) };
    if rc != 0 {
        return Err(CoreError::Syscall { op: "sched_setaffinity", tid, source: io::Error::last_os_error() });
    }
    Ok(())
}

/// The affinity of thread `tid` (0 = the calling thread), sorted. Fails with
/// [`CoreError::Syscall`] (ESRCH for a thread that does not exist).
pub fn affinity(tid: i32) -> Result<Vec<u32>, CoreError> {
    let mut mask = [0u64; MASK_WORDS];
    // SAFETY: the kernel writes at most size_of_val(&mask) bytes into the live buffer.
    let rc = unsafe { libc::sched_getaffinity(tid, std::mem::size_of_val(&mask), mask.as_mut_ptr().cast()) };
    if rc != 0 {
        return Err(CoreError::Syscall { op: "sched_getaffinity", tid, source: io::Error::last_os_error() });
    }
    Ok((0..MAX_CPUS).filter(|&c| mask[c as usize / 64] & (1 << (c % 64)) != 0).collect())
}

/// Split usable `cpus` into `(reserved, rest)`: the `reserve` LOWEST-numbered cpus go to
/// region holders, the others to jobs. Input order and duplicates do not matter; both parts
/// come back sorted. `reserve == 0` gives `(vec![], all)`. Fails with
/// [`CoreError::TooManyReserved`] if `reserve >= ` the number of distinct cpus, since at
/// least one cpu must stay for jobs (so an empty `cpus` always fails).
pub fn split(cpus: &[u32], reserve: usize) -> Result<(Vec<u32>, Vec<u32>), CoreError> {
    let mut all = sorted(cpus);
    if reserve >= all.len() {
        return Err(CoreError::TooManyReserved { reserve, available: all.len() });
    }
    let rest = all.split_off(reserve);
    Ok((all, rest))
}

/// How the usable cpus are split when each region core must be a whole physical core.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CoreSplit {
    /// One cpu per physical core, for region holders' measuring threads.
    pub reserved: Vec<u32>,
    /// The reserved cpus' SMT siblings: given to nobody, so no job thread shares a physical core
    /// (its execution units, its L1 and L2) with a measuring thread.
    pub idle_siblings: Vec<u32>,
    /// Everything else, for jobs.
    pub jobs: Vec<u32>,
    /// The reserved cpus' SMT siblings that jobs run on after all: keeping them idle would have
    /// left no cpu for jobs (a machine of too few cores), so the split is [`split`]'s.
    pub shared_siblings: Vec<u32>,
}

/// Split usable `cpus` like [`split`], but by physical core: the region cpus are the lowest-
/// numbered cpus of the `reserve` physical cores whose lowest usable cpu is lowest, and their
/// usable SMT siblings (`siblings_of(cpu)`, the cpu itself included or not) are kept idle. Without
/// SMT (each cpu its own sibling list) this is [`split`]. Where whole cores would leave no cpu for
/// jobs, the region cpus stay on distinct cores and their siblings go to jobs; where there are
/// fewer cores than region cpus, it is [`split`]; either way the siblings that could not be kept
/// idle are in `shared_siblings`. Fails with [`CoreError::TooManyReserved`] when [`split`] does.
pub fn split_whole_cores(
    cpus: &[u32],
    reserve: usize,
    siblings_of: impl Fn(u32) -> Vec<u32>,
) -> Result<CoreSplit, CoreError> {
    let all = sorted(cpus);
    let mut whole = CoreSplit::default();
    let mut taken: Vec<u32> = Vec::new();
    for &cpu in &all {
        if whole.reserved.len() == reserve {
            break;
        }
        if taken.contains(&cpu) {
            continue;
        }
        let core: Vec<u32> = sorted(&[siblings_of(cpu), vec![cpu]].concat())
            .into_iter()
            .filter(|c| all.contains(c) && !taken.contains(c))
            .collect();
        whole.reserved.push(cpu);
        whole.idle_siblings.extend(core.iter().copied().filter(|&c| c != cpu));
        taken.extend(core);
    }
    whole.idle_siblings = sorted(&whole.idle_siblings);
    whole.jobs = all.iter().copied().filter(|c| !taken.contains(c)).collect();
    if whole.reserved.len() == reserve && !whole.jobs.is_empty() {
        return Ok(whole);
    }
    if whole.reserved.len() == reserve && !whole.idle_siblings.is_empty() {
        // Enough cores for the region cpus, too few to keep their siblings idle: the region cpus
        // stay on distinct cores, their siblings go to jobs.
        let jobs = sorted(&whole.idle_siblings);
        return Ok(CoreSplit {
            reserved: whole.reserved,
            idle_siblings: Vec::new(),
            jobs: jobs.clone(),
            shared_siblings: jobs,
        });
    }
    let (reserved, jobs) = split(&all, reserve)?;
    let shared = reserved.iter().flat_map(|&c| siblings_of(c)).filter(|c| jobs.contains(c)).collect::<Vec<_>>();
    Ok(CoreSplit { reserved, idle_siblings: Vec::new(), jobs, shared_siblings: sorted(&shared) })
}

/// Split usable `cpus` like [`split_whole_cores`], but with the region cpus `chosen` by the user
/// (`kforge daemon --region-cpus`: away from the cpu that takes the interrupts, or near the GPU),
/// each on its own physical core (`siblings_of`), their usable SMT siblings kept idle — given to
/// jobs after all where that would leave none (`shared_siblings`). Errors: a chosen cpu not in
/// `cpus` ([`CoreError::NotUsable`]), two on one core ([`CoreError::SameCore`]), none given
/// ([`CoreError::Empty`]), or no cpu left for jobs ([`CoreError::TooManyReserved`]).
pub fn split_chosen_cores(
    cpus: &[u32],
    chosen: &[u32],
    siblings_of: impl Fn(u32) -> Vec<u32>,
) -> Result<CoreSplit, CoreError> {
    let (all, reserved) = (sorted(cpus), sorted(chosen));
    if reserved.is_empty() {
        return Err(CoreError::Empty);
    }
    if let Some(&cpu) = reserved.iter().find(|c| !all.contains(c)) {
        return Err(CoreError::NotUsable { cpu, usable: format_cpu_list(&all) });
    }
    let mut idle: Vec<u32> = Vec::new();
    for &cpu in &reserved {
        let others: Vec<u32> = siblings_of(cpu).into_iter().filter(|&c| c != cpu).collect();
        if let Some(&other) = reserved.iter().find(|c| others.contains(c)) {
            return Err(CoreError::SameCore(cpu.min(other), cpu.max(other)));
        }
        idle.extend(others.into_iter().filter(|c| all.contains(c)));
    }
    let idle = sorted(&idle);
    let jobs: Vec<u32> = all.iter().copied().filter(|c| !reserved.contains(c) && !idle.contains(c)).collect();
    if !jobs.is_empty() {
        return Ok(CoreSplit { reserved, idle_siblings: idle, jobs, shared_siblings: vec![] });
    }
    if idle.is_empty() {
        return Err(CoreError::TooManyReserved { reserve: reserved.len(), available: all.len() });
    }
    Ok(CoreSplit { reserved, idle_siblings: vec![], jobs: idle.clone(), shared_siblings: idle })
}

/// The SMT siblings of `cpu` (itself included) as the kernel lists them under `sys_root`
/// (normally `/sys`): `devices/system/cpu/cpuN/topology/thread_siblings_list`, or `core_cpus_list`
/// where only the newer name exists; just `cpu` when neither can be read (no topology exposed, as
/// in some virtual machines and containers).
pub fn smt_siblings(sys_root: &std::path::Path, cpu: u32) -> Vec<u32> {
    let dir = sys_root.join(format!("devices/system/cpu/cpu{cpu}/topology"));
    ["thread_siblings_list", "core_cpus_list"]
        .iter()
        .find_map(|name| fs::read_to_string(dir.join(name)).ok())
        .and_then(|text| parse_cpu_list(&text).ok())
        .filter(|list| !list.is_empty())
        .unwrap_or_else(|| vec![cpu])
}

fn list_tasks(pid: i32) -> Option<Vec<i32>> {
    let dir = if pid == 0 { "/proc/self/task".to_string() } else { format!("/proc/{pid}/task") };
    let entries = fs::read_dir(dir).ok()?;
    let mut tids: Vec<i32> = entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    tids.sort_unstable();
    Some(tids)
}

/// Thread ids of process `pid` (0 = this process) from `/proc/<pid>/task`, sorted; empty if
/// the process does not exist (or is not visible). The listing is read until two reads agree
/// (at most 8 reads more; if they never agree, the union of the reads, which may name threads
/// that have exited since): the kernel ends a task listing early when the thread it has just
/// listed exits before the next is looked up, so one read can miss live threads created after
/// an exiting one. Two equal reads cannot both be cut short, since the thread that ended the
/// first is gone from the second.
pub fn threads(pid: i32) -> Vec<i32> {
    let mut last = list_tasks(pid);
    let mut union: Vec<i32> = last.clone().unwrap_or_default();
    for _ in 0..8 {
        let next = list_tasks(pid);
        if next == last {
            return last.unwrap_or_default();
        }
        union.extend(next.iter().flatten());
        last = next;
    }
    union.sort_unstable();
    union.dedup();
    union
}

/// Set the affinity of every thread of process `pid` to `cpus` (used to move a job off the
/// reserved cores). Threads that exit meanwhile are skipped; the thread list is re-read until
/// it shows no new thread, so threads created during the call are covered too (a new thread
/// inherits its creator's mask). Returns the number of threads updated.
///
/// Errors: [`CoreError::NoSuchProcess`] if the process has no threads (gone), otherwise as
/// [`set_affinity`] (the first failure other than a vanished thread).
pub fn set_process_affinity(pid: i32, cpus: &[u32]) -> Result<usize, CoreError> {
    let mut done: Vec<i32> = Vec::new();
    // Bounded: a process spawning threads faster than we can pin them is not chased forever.
    for _ in 0..16 {
        let new: Vec<i32> = threads(pid).into_iter().filter(|t| !done.contains(t)).collect();
        if new.is_empty() {
            break;
        }
        for tid in new {
            match set_affinity(tid, cpus) {
                Ok(()) => done.push(tid),
                Err(CoreError::Syscall { source, .. }) if source.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(e),
            }
        }
    }
    if done.is_empty() {
        return Err(CoreError::NoSuchProcess(pid));
    }
    Ok(done.len())
}

/// Format cpus in the kernel's list syntax, e.g. `[0, 1, 2, 3, 6]` → `"0-3,6"`. Order and
/// duplicates in the input do not matter; an empty slice gives `""`.
pub fn format_cpu_list(cpus: &[u32]) -> String {
    let mut parts = Vec::new();
    let cpus = sorted(cpus);
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        while i + 1 < cpus.len() && cpus[i + 1] == cpus[i] + 1 {
            i += 1;
        }
        parts.push(if cpus[i] == start { start.to_string() } else { format!("{start}-{}", cpus[i]) });
        i += 1;
    }
    parts.join(",")
}

/// Parse the kernel's cpu list syntax (`"0-3,6"`, as in `/sys/devices/system/cpu/online`),
/// ignoring surrounding whitespace; the blank string is the empty list. Result is sorted and
/// deduplicated. Fails with [`CoreError::Parse`] for anything else (empty items, reversed
/// ranges, non-numbers, strides) and [`CoreError::CpuOutOfRange`] for cpus `>= MAX_CPUS`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<u32>, CoreError> {
    let input = s.trim();
    if input.is_empty() {
        return Ok(Vec::new());
    }
    let bad = |reason: String| CoreError::Parse { input: input.to_string(), reason };
    let num = |t: &str| -> Result<u32, CoreError> {
        let t = t.trim();
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(format!("{t:?} is not a cpu number")));
        }
        match t.parse::<u32>() {
            Ok(n) if n < MAX_CPUS => Ok(n),
            _ => Err(CoreError::CpuOutOfRange(t.parse().unwrap_or(u32::MAX))),
        }
    };
    let mut cpus = Vec::new();
    for item in input.split(',') {
        let (lo, hi) = match item.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(item)?, num(item)?),
        };
        if lo > hi {
            return Err(bad(format!("reversed range {:?}", item.trim())));
        }
        cpus.extend(lo..=hi);
    }
    Ok(sorted(&cpus))
}

#[cfg(test)]
mod smt_tests {
    use super::*;

    #[test]
    fn chosen_region_cpus_keep_their_siblings_idle_and_bad_choices_are_named() {
        let cpus: Vec<u32> = (0..8).collect();
        let s = split_chosen_cores(&cpus, &[6, 3], paired).unwrap();
        assert_eq!(
            s,
            CoreSplit {
                reserved: vec![3, 6],
                idle_siblings: vec![2, 7],
                jobs: vec![0, 1, 4, 5],
                shared_siblings: vec![]
            }
        );
        let err = |chosen: &[u32], cpus: &[u32]| split_chosen_cores(cpus, chosen, paired).unwrap_err().to_string();
        assert_eq!(err(&[9], &cpus), "cpu 9 is not usable here (usable: 0-7)");
        assert_eq!(err(&[1, 5], &cpus), "cpus 1 and 5 are one physical core's: give one cpu per core");
        assert_eq!(err(&[], &cpus), "empty cpu set");
        // Two cpus on two cores: the siblings go to jobs after all; one cpu alone: nothing for jobs.
        let two = split_chosen_cores(&[0, 4], &[0], paired).unwrap();
        assert_eq!((two.jobs, two.shared_siblings), (vec![4], vec![4]));
        assert!(err(&[0], &[0]).contains("cannot reserve 1 of 1 cpus"));
    }

    /// 8 cpus on 4 physical cores, siblings i and i + 4 (the common Linux numbering).
    fn paired(cpu: u32) -> Vec<u32> {
        vec![cpu % 4, cpu % 4 + 4]
    }

    #[test]
    fn region_cores_are_whole_physical_cores_and_their_siblings_stay_idle() {
        let cpus: Vec<u32> = (0..8).collect();
        let s = split_whole_cores(&cpus, 2, paired).unwrap();
        let whole = |reserved: Vec<u32>, idle_siblings: Vec<u32>, jobs: Vec<u32>| CoreSplit {
            reserved,
            idle_siblings,
            jobs,
            shared_siblings: vec![],
        };
        assert_eq!(s, whole(vec![0, 1], vec![4, 5], vec![2, 3, 6, 7]));
        // Adjacent numbering (siblings 2k and 2k + 1): the second region cpu is another core's.
        let adjacent = |c: u32| vec![c / 2 * 2, c / 2 * 2 + 1];
        let s = split_whole_cores(&cpus, 2, adjacent).unwrap();
        assert_eq!(s, whole(vec![0, 2], vec![1, 3], vec![4, 5, 6, 7]));
    }

    #[test]
    fn without_smt_it_is_the_plain_split_and_too_many_is_refused() {
        let cpus = [3, 1, 2, 0];
        let s = split_whole_cores(&cpus, 1, |c| vec![c]).unwrap();
        assert_eq!((s.reserved, s.jobs), split(&cpus, 1).unwrap());
        assert!(s.idle_siblings.is_empty());
        // Siblings outside the usable set are not ours to keep idle.
        let s = split_whole_cores(&[0, 1, 2], 1, paired).unwrap();
        assert_eq!(s, CoreSplit { reserved: vec![0], jobs: vec![1, 2], ..CoreSplit::default() });
        // 4 cpus on 2 cores: whole cores would leave nothing for jobs, so the siblings are shared.
        let s = split_whole_cores(&[0, 1, 4, 5], 2, paired).unwrap();
        assert_eq!(
            s,
            CoreSplit { reserved: vec![0, 1], idle_siblings: vec![], jobs: vec![4, 5], shared_siblings: vec![4, 5] }
        );
        let adjacent = |c: u32| vec![c / 2 * 2, c / 2 * 2 + 1];
        let s = split_whole_cores(&[0, 1, 2, 3], 2, adjacent).unwrap();
        let shared = |reserved: Vec<u32>, jobs: Vec<u32>| CoreSplit {
            reserved,
            idle_siblings: vec![],
            shared_siblings: jobs.clone(),
            jobs,
        };
        assert_eq!(s, shared(vec![0, 2], vec![1, 3]), "the region cpus on distinct cores");
        // More region cpus than cores: the plain split, the siblings it shares named.
        assert_eq!(split_whole_cores(&[0, 1, 2, 3], 3, adjacent).unwrap(), shared(vec![0, 1, 2], vec![3]));
        let e = split_whole_cores(&[0, 4], 2, paired).unwrap_err();
        assert!(matches!(e, CoreError::TooManyReserved { reserve: 2, available: 2 }), "{e}");
        // An inconsistent topology (cpu 1 lists cpu 0, already reserved, as its sibling): a
        // reserved cpu is never also an idle sibling.
        let odd = |c: u32| if c == 1 { vec![0, 1, 3] } else { vec![c] };
        let s = split_whole_cores(&[0, 1, 2, 3, 4], 2, odd).unwrap();
        assert_eq!(
            s,
            CoreSplit { reserved: vec![0, 1], idle_siblings: vec![3], jobs: vec![2, 4], ..CoreSplit::default() }
        );
        assert_eq!(split_whole_cores(&cpus, 0, paired).unwrap().jobs, vec![0, 1, 2, 3]);
    }

    #[test]
    fn siblings_are_read_from_the_topology_or_the_cpu_alone() {
        let root = tempfile::tempdir().unwrap();
        let topo = root.path().join("devices/system/cpu/cpu3/topology");
        std::fs::create_dir_all(&topo).unwrap();
        std::fs::write(topo.join("thread_siblings_list"), "3,67\n").unwrap();
        assert_eq!(smt_siblings(root.path(), 3), vec![3, 67]);
        let newer = root.path().join("devices/system/cpu/cpu4/topology");
        std::fs::create_dir_all(&newer).unwrap();
        std::fs::write(newer.join("core_cpus_list"), "4-5\n").unwrap();
        assert_eq!(smt_siblings(root.path(), 4), vec![4, 5]);
        assert_eq!(smt_siblings(root.path(), 9), vec![9], "no topology: the cpu alone");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_examples() {
        assert_eq!(format_cpu_list(&[]), "");
        assert_eq!(format_cpu_list(&[6, 0, 1, 2, 3, 3]), "0-3,6");
        assert_eq!(format_cpu_list(&[5]), "5");
        assert_eq!(format_cpu_list(&[1, 3, 4]), "1,3-4");
    }
}
