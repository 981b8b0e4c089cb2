//! Tests against the real scheduler and /proc.

use kforge_cores::*;

#[test]
fn online_cpus_are_sorted_and_nonempty() {
    let cpus = online_cpus().unwrap();
    assert!(!cpus.is_empty());
    assert!(cpus.windows(2).all(|w| w[0] < w[1]), "{cpus:?}");
}

/// Runs on its own thread so restoring the mask cannot disturb other tests.
#[test]
fn affinity_round_trip_on_current_thread() {
    std::thread::spawn(|| {
        let original = affinity(0).unwrap();
        let last = *original.last().unwrap();
        set_affinity(0, &[last]).unwrap();
        assert_eq!(affinity(0).unwrap(), vec![last]);
        // The caller's tid addresses the same thread as 0.
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        assert_eq!(affinity(tid).unwrap(), vec![last]);
        set_affinity(0, &original).unwrap();
        assert_eq!(affinity(0).unwrap(), original);
    })
    .join()
    .unwrap();
}

#[test]
fn affinity_errors_are_typed() {
    assert!(matches!(set_affinity(0, &[]), Err(CoreError::Empty)));
    assert!(matches!(set_affinity(0, &[MAX_CPUS]), Err(CoreError::CpuOutOfRange(c)) if c == MAX_CPUS));
    // A cpu that exists in the mask syntax but is not online: EINVAL from the kernel.
    assert!(matches!(set_affinity(0, &[MAX_CPUS - 1]), Err(CoreError::Syscall { .. })));
    // Thread ids above pid_max never exist.
    let gone = 0x3fff_ffff;
    assert!(matches!(affinity(gone), Err(CoreError::Syscall { tid, .. }) if tid == gone));
    assert!(matches!(set_process_affinity(gone, &[0]), Err(CoreError::NoSuchProcess(p)) if p == gone));
}

#[test]
fn process_affinity_covers_all_threads() {
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id() as i32;
    let target = *online_cpus().unwrap().last().unwrap();
    let n = set_process_affinity(pid, &[target]);
    let after = affinity(pid);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(n.unwrap(), 1);
    assert_eq!(after.unwrap(), vec![target]);
}

#[test]
fn split_edge_cases() {
    assert_eq!(split(&[0, 1, 2, 3], 0).unwrap(), (vec![], vec![0, 1, 2, 3]));
    assert_eq!(split(&[3, 1, 0, 2], 1).unwrap(), (vec![0], vec![1, 2, 3]));
    assert_eq!(split(&[0, 1, 2, 3], 3).unwrap(), (vec![0, 1, 2], vec![3]));
    assert_eq!(split(&[4, 4, 9], 1).unwrap(), (vec![4], vec![9]));
    assert!(matches!(split(&[0, 1], 2), Err(CoreError::TooManyReserved { reserve: 2, available: 2 })));
    assert!(split(&[0, 1], 5).is_err());
    assert!(split(&[0, 0], 1).is_err(), "duplicates are one cpu");
    assert!(split(&[], 0).is_err(), "no cpu left for jobs");
}

#[test]
fn parse_format_round_trip() {
    for s in ["", "0", "0-3,6", "1,3-4,8-15", "0-8191"] {
        let cpus = parse_cpu_list(s).unwrap();
        assert_eq!(format_cpu_list(&cpus), s);
    }
    assert_eq!(parse_cpu_list(" 0-2, 7 ,1\n").unwrap(), vec![0, 1, 2, 7]);
    assert_eq!(parse_cpu_list("3-3").unwrap(), vec![3]);
    let sparse = vec![0, 2, 4, 5, 6, 100];
    assert_eq!(parse_cpu_list(&format_cpu_list(&sparse)).unwrap(), sparse);
}

#[test]
fn parse_rejects_bad_input() {
    for s in ["a", "1,,2", "1-", "-1", "3-1", "1-2-3", "0-7:2", "+1", "1 2", ","] {
        assert!(matches!(parse_cpu_list(s), Err(CoreError::Parse { .. })), "{s:?}");
    }
    for s in ["8192", "0-99999999999", "4294967296"] {
        assert!(matches!(parse_cpu_list(s), Err(CoreError::CpuOutOfRange(_))), "{s:?}");
    }
}

#[test]
fn threads_include_current_tid() {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    assert!(threads(0).contains(&tid));
    assert!(threads(std::process::id() as i32).contains(&tid));
    assert!(threads(0x3fff_ffff).is_empty());
}

/// The kernel cuts a `/proc/<pid>/task` listing short when the thread just listed exits, so a
/// thread created after exiting ones is missed by a single read (seen on CI). Each round parks
/// eight threads, starts a checker after them, and lets the eight exit while the checker lists.
#[test]
fn threads_include_current_tid_while_older_threads_exit() {
    let mut missed = 0;
    for _ in 0..500 {
        let (release, parked) = std::sync::mpsc::channel::<()>();
        let parked = std::sync::Arc::new(std::sync::Mutex::new(parked));
        let older: Vec<_> = (0..8)
            .map(|_| {
                let parked = parked.clone();
                std::thread::spawn(move || drop(parked.lock().map(|rx| rx.recv())))
            })
            .collect();
        let checker = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            drop(release);
            (0..20).filter(|_| !threads(0).contains(&tid)).count()
        });
        missed += checker.join().unwrap();
        for t in older {
            t.join().unwrap();
        }
    }
    assert_eq!(missed, 0, "listings that missed the listing thread");
}
