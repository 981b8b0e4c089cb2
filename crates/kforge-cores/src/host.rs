//! What took the cpu away from a measuring thread over an interval, as Linux counts it: the time
//! the hypervisor ran something else on the cpu (steal) and the cpu's interrupt time, from
//! `/proc/stat` in USER_HZ ticks, and the thread's own time waiting on a run queue, from
//! `/proc/PID/task/TID/schedstat` in nanoseconds (zero where the kernel keeps no schedstats).
//!
//! The device machines are virtual machines: a launch-bound call's host time moved by 2× in
//! phases of about a second with the GPU's clock steady (issue 17, session 31). These counters
//! read at a region's grant and release say whether the host was taken away meanwhile.

/// The counters at one moment; a field the kernel does not expose is `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostCounters {
    /// The cpu's steal ticks (the 8th field of its `/proc/stat` line).
    pub steal_ticks: Option<u64>,
    /// The cpu's irq and softirq ticks (the 6th and 7th fields).
    pub irq_ticks: Option<u64>,
    /// The thread's run-queue wait, nanoseconds (the 2nd field of its `schedstat`).
    pub run_delay_ns: Option<u64>,
}

/// What [`HostCounters`] grew by over an interval, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HostDelta {
    pub steal_ms: Option<f64>,
    pub irq_ms: Option<f64>,
    pub run_delay_ms: Option<f64>,
}

/// `(steal, irq + softirq)` ticks of `cpu` (the `cpuN` line; `None`: the all-cpus `cpu` line)
/// in `/proc/stat`'s text; `None` when the line or its fields are missing.
pub fn cpu_ticks(proc_stat: &str, cpu: Option<u32>) -> Option<(u64, u64)> {
    let name = cpu.map_or_else(|| "cpu".to_string(), |c| format!("cpu{c}"));
    let line = proc_stat.lines().find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
    let f: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal ...
    Some((*f.get(7)?, f.get(5)? + f.get(6)?))
}

/// The run-queue wait (ns) in a `schedstat` file's text: its second field.
pub fn run_delay_ns(schedstat: &str) -> Option<u64> {
    schedstat.split_whitespace().nth(1)?.parse().ok()
}

/// The counters now for `cpu` (`None`: all cpus) and thread `tid` of process `pid`.
pub fn read(cpu: Option<u32>, pid: u32, tid: u32) -> HostCounters {
    let stat = std::fs::read_to_string("/proc/stat").ok();
    let ticks = stat.as_deref().and_then(|s| cpu_ticks(s, cpu));
    let sched = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok();
    HostCounters {
        steal_ticks: ticks.map(|t| t.0),
        irq_ticks: ticks.map(|t| t.1),
        run_delay_ns: sched.as_deref().and_then(run_delay_ns),
    }
}

/// Milliseconds per `/proc/stat` tick (USER_HZ, 100 on Linux almost everywhere).
pub fn ms_per_tick() -> f64 {
    // SAFETY: sysconf reads a constant of the running system; no memory is passed.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        1000.0 / hz as f64
    } else {
        10.0
    }
}

impl HostCounters {
    /// What grew from `before` to `self`, in milliseconds (`ms_per_tick` for the ticks); a field
    /// missing at either end, or that went backwards (another cpu, a thread gone), is `None`.
    pub fn since(&self, before: &HostCounters, ms_per_tick: f64) -> HostDelta {
        let grew = |a: Option<u64>, b: Option<u64>| a.zip(b).and_then(|(a, b)| a.checked_sub(b));
        HostDelta {
            steal_ms: grew(self.steal_ticks, before.steal_ticks).map(|t| t as f64 * ms_per_tick),
            irq_ms: grew(self.irq_ticks, before.irq_ticks).map(|t| t as f64 * ms_per_tick),
            run_delay_ms: grew(self.run_delay_ns, before.run_delay_ns).map(|ns| ns as f64 / 1e6),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  2723848 0 500567 4231429 7196 0 2026 2193 0 0\n\
                        cpu0 1181567 0 219307 2327561 2274 3 522 1096 0 0\n\
                        cpu1 1542280 0 281260 1903867 4921 0 1503 1097 0 0\n\
                        intr 12345 0 0\n";

    #[test]
    fn a_cpus_steal_and_interrupt_ticks_come_from_its_own_line() {
        assert_eq!(cpu_ticks(STAT, Some(0)), Some((1096, 525)));
        assert_eq!(cpu_ticks(STAT, Some(1)), Some((1097, 1503)));
        assert_eq!(cpu_ticks(STAT, None), Some((2193, 2026)), "the all-cpus line");
        assert_eq!(cpu_ticks(STAT, Some(2)), None, "no such cpu");
        assert_eq!(cpu_ticks("cpu0 1 2 3 4 5 6 7\n", Some(0)), None, "a kernel without the steal field");
        assert_eq!(cpu_ticks("cpu0 1 2 x 4 5 6 7 8\n", Some(0)), None, "not numbers");
    }

    #[test]
    fn a_threads_run_queue_wait_is_its_schedstat_second_field() {
        assert_eq!(run_delay_ns("123456 789 42\n"), Some(789));
        assert_eq!(run_delay_ns("123456\n"), None);
        assert_eq!(run_delay_ns(""), None);
    }

    #[test]
    fn a_delta_is_in_milliseconds_and_missing_where_either_end_is() {
        let before = HostCounters { steal_ticks: Some(100), irq_ticks: Some(7), run_delay_ns: Some(1_000_000) };
        let after = HostCounters { steal_ticks: Some(103), irq_ticks: None, run_delay_ns: Some(3_500_000) };
        let d = after.since(&before, 10.0);
        assert_eq!(d, HostDelta { steal_ms: Some(30.0), irq_ms: None, run_delay_ms: Some(2.5) });
        let back = HostCounters { steal_ticks: Some(99), ..after };
        assert_eq!(back.since(&before, 10.0).steal_ms, None, "a counter that went backwards");
    }

    #[test]
    fn this_threads_counters_read_on_linux() {
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        let c = read(Some(0), std::process::id(), tid);
        assert!(c.steal_ticks.is_some() && c.irq_ticks.is_some(), "{c:?}");
        assert!(c.run_delay_ns.is_some(), "schedstat exists even with schedstats off (zeros): {c:?}");
        assert!(ms_per_tick() > 0.0);
    }
}
