//! End-to-end tests of the daemon through the real binary: jobs, regions, freezing, isolation,
//! faults and the protocol. Every test runs its own daemon on a private socket and store.
// Some tests leave a job's client running on purpose: the daemon kills the job tree (which
// those tests check) and the process is reaped when the test process exits.
#![allow(clippy::zombie_processes)]

mod common;
use common::*;
use kforge_proto::{Reply, Request};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(30);

fn holder_args<'a>(tag: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--device", "cpu", "--", "python3", "-c", HOLDER, tag];
    v.extend_from_slice(extra);
    v
}

#[test]
fn run_streams_output_sets_env_and_returns_exit_code() {
    let d = TestDaemon::start(&[]);
    let out = d
        .run_cmd(&["--device", "cpu", "--", "sh", "-c", "echo out:$KFORGE_JOB:$KFORGE_DEVICE:[$CUDA_VISIBLE_DEVICES]; echo err >&2; python3 -c 'import kforge; print(kforge.PROTOCOL_VERSION)'; exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines();
    let first = lines.next().unwrap();
    assert!(first.starts_with("out:") && first.ends_with(":cpu:[]"), "{stdout}");
    let version = kforge_proto::PROTOCOL_VERSION.to_string();
    assert_eq!(lines.next(), Some(version.as_str()), "kforge package importable in jobs, of this protocol: {stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("err"));
    let rep = d.report();
    assert_eq!(rep.jobs.len(), 1);
    assert_eq!(rep.jobs[0].exit_code, Some(3));
    assert!(rep.jobs[0].started_ns.is_some() && rep.jobs[0].ended_ns.is_some());
}

#[test]
fn missing_command_and_bad_device_are_clear_errors() {
    let d = TestDaemon::start(&[]);
    let out = d.run_cmd(&["--device", "cpu", "--", "/no/such/program"]).output().unwrap();
    assert_eq!(out.status.code(), Some(127));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("could not start"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = d.run_cmd(&["--device", "7", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no device \"7\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn gpu_groups_are_checked_and_fall_back_to_cpu_without_gpus() {
    let d = TestDaemon::start(&[]);
    let out = d.run_cmd(&["--gpu-group", "", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the GPU group is empty"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let long = "g".repeat(300);
    let out = d.run_cmd(&["--gpu-group", &long, "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("300 bytes long; at most 256"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // No GPU: `auto` with a group runs on the cpu device, twice, and nothing was recorded for
    // the refused submissions.
    for _ in 0..2 {
        let out = d.run_cmd(&["--gpu-group", "softmax/g1", "--", "sh", "-c", "echo $KFORGE_DEVICE"]).output().unwrap();
        assert_eq!((out.status.code(), String::from_utf8_lossy(&out.stdout).trim()), (Some(0), "cpu"));
        // The daemon echoed the group: no warning that it was ignored.
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("ignored --gpu-group"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let rep = d.report();
    assert_eq!(rep.jobs.iter().map(|j| j.device.as_str()).collect::<Vec<_>>(), ["cpu", "cpu"]);
}

#[test]
fn client_without_daemon_gets_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(KFORGE)
        .arg("--socket")
        .arg(dir.path().join("none.sock"))
        .arg("status")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the kforge daemon"));
}

#[test]
fn socket_is_owner_only_and_a_second_daemon_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let d = TestDaemon::start(&[]);
    let mode = std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let out = std::process::Command::new(KFORGE)
        .arg("--socket")
        .arg(&d.socket)
        .args(["daemon", "--gpus", "none", "--db", ":memory:"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already listens"));
    assert_eq!(d.status().devices[0].name, "cpu", "first daemon still serves");
}

fn raw(d: &TestDaemon) -> UnixStream {
    let s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn expect_error_then_close(mut s: UnixStream, code: &str) {
    let reply: Reply = kforge_proto::read_msg(&mut s).unwrap();
    match reply {
        Reply::Error { code: c, message } => assert_eq!(serde_json::to_value(c).unwrap(), code, "{message}"),
        other => panic!("expected error {code}, got {other:?}"),
    }
    let mut rest = Vec::new();
    assert_eq!(s.read_to_end(&mut rest).unwrap(), 0, "connection closed after the error");
}

#[test]
fn malformed_oversized_and_out_of_order_messages_get_errors_and_the_daemon_keeps_serving() {
    let d = TestDaemon::start(&[]);
    // Garbage JSON in a valid frame.
    let mut s = raw(&d);
    s.write_all(&5u32.to_le_bytes()).unwrap();
    s.write_all(b"{{{{{").unwrap();
    expect_error_then_close(s, "malformed");
    // Oversized length prefix.
    let mut s = raw(&d);
    s.write_all(&(64u32 << 20).to_le_bytes()).unwrap();
    expect_error_then_close(s, "oversized");
    // A request before hello.
    let mut s = raw(&d);
    kforge_proto::write_msg(&mut s, &Request::Status).unwrap();
    expect_error_then_close(s, "out_of_order");
    // Another protocol version.
    let mut s = raw(&d);
    kforge_proto::write_msg(&mut s, &Request::Hello { protocol: 999, client: "old".into() }).unwrap();
    expect_error_then_close(s, "version_mismatch");
    // Exit of a region never entered.
    let mut c = d.client();
    let e = c.request(&Request::RegionExit { region: 12345 }).unwrap_err();
    assert!(e.to_string().contains("not held on this connection"), "{e}");
    // Random garbage from several clients at once.
    let mut seed = 0x1234_5678u64;
    for _ in 0..20 {
        let mut s = raw(&d);
        let bytes: Vec<u8> = (0..64)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
    let st = d.status();
    assert_eq!(st.devices[0].name, "cpu");
    assert!(st.jobs.is_empty());
}

#[test]
fn command_policy_serializes_whole_commands() {
    let d = TestDaemon::start(&["--max-concurrent", "8"]);
    let jobs: Vec<_> = (0..4)
        .map(|i| {
            d.spawn_job(
                &format!("c{i}"),
                &["--device", "cpu", "--policy", "command", "--", "python3", "-c", "import time; time.sleep(0.15)"],
            )
        })
        .collect();
    for mut j in jobs {
        assert!(j.wait().unwrap().success());
    }
    let rep = d.report();
    let mut iv: Vec<(i64, i64)> = rep.jobs.iter().map(|j| (j.started_ns.unwrap(), j.ended_ns.unwrap())).collect();
    iv.sort();
    assert_eq!(iv.len(), 4);
    for w in iv.windows(2) {
        assert!(w[1].0 >= w[0].1, "command jobs overlapped: {iv:?}");
    }
}

#[test]
fn admission_limit_queues_fifo() {
    let d = TestDaemon::start(&["--max-concurrent", "2"]);
    let jobs: Vec<_> = (0..5)
        .map(|i| {
            let j = d.spawn_job(
                &format!("q{i}"),
                &["--device", "cpu", "--", "python3", "-c", "import time; time.sleep(0.2)"],
            );
            // Submit in a known order.
            wait_for("job queued", T, || (d.report().jobs.len() == i + 1).then_some(()));
            j
        })
        .collect();
    for mut j in jobs {
        assert!(j.wait().unwrap().success());
    }
    let rep = d.report();
    let starts: Vec<i64> = rep.jobs.iter().map(|j| j.started_ns.unwrap()).collect();
    assert!(starts.windows(2).all(|w| w[0] <= w[1]), "FIFO start order: {starts:?}");
    // Never more than 2 at once.
    for j in &rep.jobs {
        let t = j.started_ns.unwrap();
        let running = rep.jobs.iter().filter(|o| o.started_ns.unwrap() <= t && o.ended_ns.unwrap() > t).count();
        assert!(running <= 2, "{running} jobs ran at once");
    }
}

#[test]
fn exclusivity_invariant_under_load() {
    let d = TestDaemon::start(&["--max-concurrent", "16"]);
    const SCRIPT: &str = r#"
import kforge, zlib, os
data = os.urandom(200_000)
for i in range(3):
    kforge.do_bench(lambda: zlib.crc32(data), warmup=1, rep=3, name="k%d" % i)
"#;
    let jobs: Vec<_> =
        (0..50).map(|i| d.spawn_job(&format!("l{i}"), &["--device", "cpu", "--", "python3", "-c", SCRIPT])).collect();
    for (i, mut j) in jobs.into_iter().enumerate() {
        let st = j.wait().unwrap();
        assert!(st.success(), "job {i}: {}", std::fs::read_to_string(d.path(&format!("l{i}.err"))).unwrap_or_default());
    }
    let rep = d.report();
    assert_eq!(rep.jobs.len(), 50);
    assert_eq!(rep.regions.len(), 150);
    assert!(rep.regions.iter().all(|r| r.released_ns.is_some() && r.exclusive && !r.revoked));
    assert_eq!(kforge_eval::stats::overlapping_pairs(&rep.regions), 0);
    assert_eq!(rep.measurements.len(), 150);
    // Under the none policy the same workload does overlap (the check can fail).
    let jobs: Vec<_> = (0..8)
        .map(|i| {
            d.spawn_job(
                &format!("n{i}"),
                &[
                    "--device",
                    "cpu",
                    "--policy",
                    "none",
                    "--",
                    "python3",
                    "-c",
                    "import kforge, time\nwith kforge.region('x'):\n    time.sleep(0.3)",
                ],
            )
        })
        .collect();
    for mut j in jobs {
        assert!(j.wait().unwrap().success());
    }
    let none: Vec<_> = d.report().regions.into_iter().filter(|r| r.policy == "none").collect();
    assert!(kforge_eval::stats::overlapping_pairs(&none) > 0);
}

/// A counting sibling makes no progress while another job holds a region, with each freeze
/// mechanism the host offers.
fn frozen_sibling_makes_no_progress(mechanism: &str) {
    let d = match TestDaemon::try_start(&["--freeze-mechanism", mechanism]) {
        Ok(d) => d,
        Err(log) => {
            eprintln!("skipping {mechanism}: this host does not offer it ({})", log.trim());
            return;
        }
    };
    assert!(d.status().freeze_mechanism.starts_with(mechanism));
    let mut sib = d.spawn_job("sib", &["--device", "cpu", "--", "python3", "-c", COUNTER, "sib"]);
    let count = d.path("sib.count");
    wait_for("sibling counting", T, || read_count(&count).filter(|&c| c > 10));
    let mut holder = d.spawn_job("h", &holder_args("h", &[]));
    let grant = wait_for("grant", T, || read_json(&d.path("h.in")));
    assert_eq!(grant["frozen_jobs"], 1, "{grant}");
    assert_eq!(grant["exclusive"], true);
    let st = d.status();
    let sib_job = st.jobs.iter().find(|j| j.argv.last().map(String::as_str) == Some("sib")).unwrap();
    assert!(sib_job.frozen, "status shows the sibling frozen");
    let c0 = read_count(&count).unwrap();
    std::thread::sleep(Duration::from_millis(300)); // the observation window
    let c1 = read_count(&count).unwrap();
    assert_eq!(c0, c1, "{mechanism}: frozen sibling advanced from {c0} to {c1}");
    std::fs::write(d.path("h.release"), "").unwrap();
    assert!(holder.wait().unwrap().success());
    let done = read_json(&d.path("h.done")).unwrap();
    assert_eq!(done["valid"], true);
    wait_for("sibling counting again", T, || read_count(&count).filter(|&c| c > c1 + 10));
    d.client().request(&Request::Cancel { job: sib_job.job }).unwrap();
    let st = sib.wait().unwrap();
    assert_eq!(st.code(), Some(137), "cancelled job reports SIGKILL");
}

#[test]
fn frozen_sibling_cgroup2() {
    frozen_sibling_makes_no_progress("cgroup2");
}

#[test]
fn frozen_sibling_cgroup1() {
    frozen_sibling_makes_no_progress("cgroup1");
}

#[test]
fn frozen_sibling_signals() {
    frozen_sibling_makes_no_progress("signals");
}

#[test]
fn core_isolation_pins_holder_and_keeps_jobs_off_reserved_cores() {
    let cpus = kforge_cores::online_cpus().unwrap();
    if cpus.len() < 2 {
        eprintln!("skipping: needs 2 cores");
        return;
    }
    let d = TestDaemon::start(&["--reserve-cores", "1", "--freeze", "none"]);
    let st = d.status();
    assert_eq!(st.reserved_cores, vec![cpus[0]]);
    let mut sib = d.spawn_job("sib", &["--device", "cpu", "--", "python3", "-c", COUNTER, "sib"]);
    wait_for("sibling counting", T, || read_count(&d.path("sib.count")));
    let mut holder = d.spawn_job("h", &holder_args("h", &[]));
    let g = wait_for("grant", T, || read_json(&d.path("h.in")));
    let (pid, tid) = (g["pid"].as_i64().unwrap() as i32, g["tid"].as_i64().unwrap() as i32);
    assert_eq!(g["core"], cpus[0]);
    assert_eq!(cpus_allowed(pid, tid), vec![cpus[0]], "measuring thread pinned to the reserved core");
    // No other managed thread may run on the reserved core meanwhile.
    let st = d.status();
    for j in &st.jobs {
        let root = j.pid.unwrap() as i32;
        let mut procs = descendants(root);
        procs.push(root);
        for p in procs {
            for t in kforge_cores::threads(p) {
                if (p, t) == (pid, tid) {
                    continue;
                }
                let allowed = cpus_allowed(p, t);
                assert!(
                    !allowed.is_empty() && !allowed.contains(&cpus[0]),
                    "job {} thread {p}/{t} may run on the reserved core: {allowed:?}",
                    j.job
                );
            }
        }
    }
    std::fs::write(d.path("h.release"), "").unwrap();
    assert!(holder.wait().unwrap().success());
    // What took the reserved core from the measuring thread meanwhile, stored with the release
    // (before the holder's exit was answered): that core's steal and irq, the thread's wait.
    let store = kforge_store::Store::open(&d.db).unwrap();
    let host = store.region_host(g["region"].as_u64().unwrap()).unwrap().expect("the region's host counters");
    assert_eq!(host.cpu, Some(cpus[0]));
    assert!(host.steal_ms.is_some_and(|x| x >= 0.0) && host.irq_ms.is_some_and(|x| x >= 0.0), "{host:?}");
    assert!(host.run_delay_ms.is_some_and(|x| x >= 0.0), "{host:?}");
    drop(sib.kill());
    let _ = sib.wait();
}

#[test]
fn region_cpus_chosen_by_the_user_pin_the_holder_there_and_a_cpu_not_here_is_refused() {
    let cpus = kforge_cores::online_cpus().unwrap();
    if cpus.len() < 2 {
        eprintln!("skipping: needs 2 cores");
        return;
    }
    let last = *cpus.last().unwrap();
    let d = TestDaemon::start(&["--region-cpus", &last.to_string(), "--freeze", "none"]);
    assert_eq!(d.status().reserved_cores, vec![last]);
    let mut holder = d.spawn_job("h", &holder_args("h", &[]));
    let g = wait_for("grant", T, || read_json(&d.path("h.in")));
    let (pid, tid) = (g["pid"].as_i64().unwrap() as i32, g["tid"].as_i64().unwrap() as i32);
    assert_eq!((g["core"].as_u64(), cpus_allowed(pid, tid)), (Some(u64::from(last)), vec![last]));
    std::fs::write(d.path("h.release"), "").unwrap();
    assert!(holder.wait().unwrap().success());
    let host = kforge_store::Store::open(&d.db).unwrap().region_host(g["region"].as_u64().unwrap()).unwrap();
    assert_eq!(host.clone().and_then(|h| h.cpu), Some(last), "its host counters are that cpu's");
    assert_eq!(d.report().region_host, host.into_iter().collect::<Vec<_>>(), "and in the daemon's report");
    let refused = TestDaemon::try_start(&["--region-cpus", "8191"]).err().expect("a cpu this machine lacks");
    assert!(refused.contains("--region-cpus: cpu 8191 is not usable here"), "{refused}");
    let both = TestDaemon::try_start(&["--region-cpus", "0", "--reserve-cores", "1"]).err().expect("both flags");
    assert!(both.contains("give --reserve-cores or --region-cpus, not both"), "{both}");
}

#[test]
fn killed_region_holder_releases_within_100ms() {
    // --freeze none so that the second holder can ask while the first holds the region.
    let d = TestDaemon::start(&["--freeze", "none"]);
    let mut h1 = d.spawn_job("h1", &holder_args("h1", &[]));
    let g = wait_for("first grant", T, || read_json(&d.path("h1.in")));
    let mut h2 = d.spawn_job("h2", &holder_args("h2", &[]));
    wait_for("second request queued", T, || d.status().devices[0].region_queue.first().map(|_| ()));
    let killed_ns = kforge_daemon::now_ns();
    // SAFETY: plain kill(2) of the holder's Python process.
    unsafe { libc::kill(g["pid"].as_i64().unwrap() as i32, libc::SIGKILL) };
    let g2 = wait_for("second grant", T, || read_json(&d.path("h2.in")));
    assert_eq!(g2["exclusive"], true);
    let r1 = d.report().regions.into_iter().find(|r| r.id == g["region"].as_u64().unwrap()).unwrap();
    let released = r1.released_ns.expect("first region released");
    let latency_ms = (released - killed_ns) as f64 / 1e6;
    eprintln!("region released {latency_ms:.2} ms after kill -9 of its holder");
    assert!(latency_ms < 100.0, "released {latency_ms} ms after the kill");
    assert!(!h1.wait().unwrap().success());
    std::fs::write(d.path("h2.release"), "").unwrap();
    assert!(h2.wait().unwrap().success());
}

#[test]
fn lease_overrun_revokes_and_invalidates() {
    let d = TestDaemon::start(&[]);
    let mut h = d.spawn_job("h", &holder_args("h", &["0.2"]));
    let g = wait_for("grant", T, || read_json(&d.path("h.in")));
    assert_eq!(g["lease_ms"], 200);
    let region = g["region"].as_u64().unwrap();
    // The lease runs out by itself; then a second job gets the region while the first still "measures".
    let mut h2 = d.spawn_job("h2", &holder_args("h2", &[]));
    wait_for("second grant after revocation", T, || read_json(&d.path("h2.in")));
    std::fs::write(d.path("h.release"), "").unwrap();
    std::fs::write(d.path("h2.release"), "").unwrap();
    assert!(h.wait().unwrap().success());
    assert!(h2.wait().unwrap().success());
    let done = read_json(&d.path("h.done")).unwrap();
    assert_eq!(done["revoked"], true, "{done}");
    let rep = d.report();
    let r = rep.regions.iter().find(|r| r.id == region).unwrap();
    assert!(r.revoked);
    let m = rep.measurements.iter().find(|m| m.region == Some(region)).unwrap();
    assert!(!m.valid, "measurement of a revoked region is invalid");
    let other = rep.regions.iter().find(|r| r.id != region).unwrap();
    assert!(!other.revoked);
}

#[test]
fn lost_client_cancels_job_and_kills_its_process_tree() {
    let d = TestDaemon::start(&[]);
    let mut run =
        d.spawn_job("tree", &["--device", "cpu", "--", "sh", "-c", "sleep 300 & echo $! > grandchild.pid; wait"]);
    let gc: i32 =
        wait_for("grandchild", T, || std::fs::read_to_string(d.path("grandchild.pid")).ok()?.trim().parse().ok());
    assert!(pid_alive(gc));
    run.kill().unwrap(); // the client goes away (as with Ctrl-C)
    let _ = run.wait();
    wait_for("grandchild killed", T, || (!pid_alive(gc)).then_some(()));
    let job = wait_for("job ended", T, || d.report().jobs.into_iter().find(|j| j.ended_ns.is_some()));
    assert_eq!(job.reason.as_deref(), Some("client connection lost"));
    assert_eq!(job.signal, Some(9));
}

#[test]
fn gate_holds_submitters_and_drain_acknowledges_the_epoch() {
    // --freeze none: only the gate keeps the submitter out of the region.
    let d = TestDaemon::start(&["--freeze", "none"]);
    let mut sub = d.spawn_job(
        "sub",
        &["--device", "cpu", "--", KFORGE, "debug", "submitter", "--log", "sub.log", "--in-flight-us", "3000"],
    );
    let log = d.path("sub.log");
    wait_for("submissions", T, || std::fs::read_to_string(&log).ok().filter(|s| s.lines().count() > 20));
    let mut h = d.spawn_job("h", &holder_args("h", &[]));
    let g = wait_for("grant", T, || read_json(&d.path("h.in")));
    assert_eq!(g["drain_timed_out"], false, "{g}");
    std::thread::sleep(Duration::from_millis(200)); // observation window inside the region
    std::fs::write(d.path("h.release"), "").unwrap();
    assert!(h.wait().unwrap().success());
    let done = read_json(&d.path("h.done")).unwrap();
    let (t_in, t_out) = (g["t_in"].as_u64().unwrap(), done["t_out"].as_u64().unwrap());
    wait_for("submissions after the region", T, || {
        let s = std::fs::read_to_string(&log).ok()?;
        s.lines().filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok()).any(|t| t > t_out).then_some(())
    });
    let text = std::fs::read_to_string(&log).unwrap();
    let mut acked = None;
    for l in text.lines() {
        let parts: Vec<&str> = l.split_whitespace().collect();
        let t: u64 = parts[0].parse().unwrap();
        match parts[1] {
            "submit" => assert!(!(t > t_in && t < t_out), "submission at {t} inside the region [{t_in}, {t_out}]"),
            "ack" if t < t_in => acked = Some(parts[2].parse::<u64>().unwrap()),
            _ => {}
        }
    }
    assert_eq!(acked, Some(1), "the submitter acknowledged epoch 1 before the region began");
    sub.kill().unwrap();
    let _ = sub.wait();
}

#[test]
fn a_drain_does_not_wait_again_for_a_participant_still_behind_on_one_that_timed_out() {
    let d = TestDaemon::start(&["--freeze", "none", "--drain-timeout-ms", "300"]);
    // Each fake submission stays in flight for a minute: the participant drains that long.
    let mut sub = d.spawn_job(
        "sub",
        &["--device", "cpu", "--", KFORGE, "debug", "submitter", "--log", "sub.log", "--in-flight-us", "60000000"],
    );
    let log = d.path("sub.log");
    wait_for("a submission", T, || std::fs::read_to_string(&log).ok().filter(|s| s.contains("submit")));
    let enter = |tag: &str| {
        let mut h = d.spawn_job(tag, &holder_args(tag, &[]));
        let g = wait_for("grant", T, || read_json(&d.path(&format!("{tag}.in"))));
        std::fs::write(d.path(&format!("{tag}.release")), "").unwrap();
        assert!(h.wait().unwrap().success());
        g
    };
    let first = enter("h1");
    assert_eq!((first["drain_timed_out"].as_bool(), first["tainted"].as_bool()), (Some(true), Some(true)), "{first}");
    assert!(first["drain_ms"].as_f64().unwrap() >= 300.0, "{first}");
    // Still draining for the first region: the second drain does not wait for it, and says so.
    let second = enter("h2");
    assert_eq!(
        (second["drain_timed_out"].as_bool(), second["tainted"].as_bool()),
        (Some(false), Some(true)),
        "{second}"
    );
    assert!(second["drain_ms"].as_f64().unwrap() < 300.0, "{second}");
    let st = d.status();
    assert_eq!(st.jobs.len(), 1, "only the submitter runs: {:?}", st.jobs);
    let sub_pid = st.jobs[0].pid.expect("the submitter runs");
    let behind: Vec<u32> = st.devices.iter().flat_map(|dev| dev.stragglers.iter().map(|s| s.pid)).collect();
    assert_eq!(behind, vec![sub_pid], "status names the straggler");
    let table = Command::new(KFORGE).arg("--socket").arg(&d.socket).arg("status").output().unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains(&format!("not waited for by drains (still behind, regions tainted): pid {sub_pid}")),
        "{table}"
    );
    let daemon_log = d.log();
    let line =
        daemon_log.lines().find(|l| l.contains("drain did not wait for pid")).unwrap_or_else(|| panic!("{daemon_log}"));
    assert!(line.contains(&format!("pid {sub_pid}:")), "{line}");
    sub.kill().unwrap();
    let _ = sub.wait();
}

#[test]
fn daemon_killed_mid_region_leaves_nothing_frozen() {
    for mechanism in ["cgroup2", "cgroup1", "signals"] {
        let mut d = match TestDaemon::try_start(&["--freeze-mechanism", mechanism]) {
            Ok(d) => d,
            Err(_) => {
                eprintln!("skipping {mechanism}: not offered here");
                continue;
            }
        };
        let _sib = d.spawn_job("sib", &["--device", "cpu", "--", "python3", "-c", COUNTER, "sib"]);
        wait_for("sibling counting", T, || read_count(&d.path("sib.count")));
        let sib_pid = d.status().jobs[0].pid.unwrap() as i32;
        let _h = d.spawn_job("h", &holder_args("h", &[]));
        wait_for("grant", T, || read_json(&d.path("h.in")));
        let c0 = read_count(&d.path("sib.count")).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(read_count(&d.path("sib.count")).unwrap(), c0, "{mechanism}: sibling frozen before the kill");
        d.child.kill().unwrap(); // SIGKILL
        d.child.wait().unwrap();
        let t = Instant::now();
        wait_for("sibling gone after the daemon died", T, || (!pid_alive(sib_pid)).then_some(()));
        eprintln!("{mechanism}: sibling killed {:?} after the daemon's death", t.elapsed());
        let ledger = format!("{}.d/ledger.json", d.socket.display());
        wait_for("ledger removed", T, || (!std::path::Path::new(&ledger).exists()).then_some(()));
    }
}

#[test]
fn restart_after_daemon_and_guardian_died_recovers_frozen_jobs() {
    let mut d = TestDaemon::start(&[]);
    // The counter is a grandchild: the job's direct child dies with the daemon (parent-death
    // signal), a grandchild in a frozen cgroup stays frozen until someone recovers it.
    let _sib = d.spawn_job(
        "sib",
        &["--device", "cpu", "--", "sh", "-c", "python3 -c \"$1\" sib & echo $! > sib.pid; wait", "sh", COUNTER],
    );
    wait_for("sibling counting", T, || read_count(&d.path("sib.count")));
    let sib_pid: i32 =
        wait_for("grandchild pid", T, || std::fs::read_to_string(d.path("sib.pid")).ok()?.trim().parse().ok());
    let _h = d.spawn_job("h", &holder_args("h", &[]));
    wait_for("grant", T, || read_json(&d.path("h.in")));
    let daemon_pid = d.child.id() as i32;
    let guardian = descendants(daemon_pid)
        .into_iter()
        .find(|p| std::fs::read_to_string(format!("/proc/{p}/cmdline")).unwrap_or_default().contains("__guardian"))
        .expect("guardian process");
    // SAFETY: kill(2) of our own test processes.
    unsafe { libc::kill(guardian, libc::SIGKILL) };
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    // The sibling's cgroup is still frozen: nothing else will thaw it.
    let c0 = read_count(&d.path("sib.count")).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(read_count(&d.path("sib.count")).unwrap(), c0);
    assert!(pid_alive(sib_pid));
    // A new daemon on the same socket recovers at start.
    let log = std::fs::File::create(d.path("daemon2.log")).unwrap();
    let d2 = std::process::Command::new(KFORGE)
        .arg("--socket")
        .arg(&d.socket)
        .args(["daemon", "--gpus", "none", "--db"])
        .arg(&d.db)
        .stderr(log)
        .spawn()
        .unwrap();
    wait_for("sibling killed by the new daemon's recovery", T, || (!pid_alive(sib_pid)).then_some(()));
    let text = wait_for("recovery logged", T, || {
        std::fs::read_to_string(d.path("daemon2.log")).ok().filter(|s| s.contains("recovered"))
    });
    assert!(text.contains("recovered after a dead daemon"), "{text}");
    // The new daemon serves once recovery is done; hand it to the harness, which stops it.
    wait_for("the new daemon listening", T, || kforge_client::Client::connect(&d.socket).ok().map(|_| ()));
    d.child = d2;
}

#[test]
fn jobs_start_with_no_blocked_signals() {
    // The daemon blocks SIGINT/SIGTERM for its signal thread; its jobs must not inherit that.
    let mut d = TestDaemon::start(&[]);
    let o = d
        .run_cmd(&[
            "--device",
            "cpu",
            "--",
            "python3",
            "-c",
            "import signal; print(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "[]");
    // And a job can be ended by SIGTERM: `timeout` inside a job stops its child.
    // (--timeout bounds the test if SIGTERM were blocked again: sleep would then never end.)
    let o = d.run_cmd(&["--device", "cpu", "--timeout", "10", "--", "timeout", "0.2", "sleep", "30"]).output().unwrap();
    assert_eq!(o.status.code(), Some(124), "timeout's own status when it had to stop sleep");
    d.shutdown();
}

#[test]
fn jobs_do_not_inherit_the_daemons_descriptors() {
    // A daemon started with an extra open descriptor (fd 7, as a shell redirection or a capture
    // pipe would leave it): its jobs get only stdin, stdout and stderr.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("k.sock");
    let script = format!(
        "exec 7</dev/null; exec {KFORGE} --socket {} daemon --db {} --gpus none",
        sock.display(),
        dir.path().join("k.db").display()
    );
    let mut daemon = std::process::Command::new("sh")
        .args(["-c", &script])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while kforge_client::Client::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "daemon did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    let probe = "import os\nopen_fds = []\nfor fd in range(3, 1024):\n    try:\n        os.fstat(fd)\n        open_fds.append(fd)\n    except OSError:\n        pass\nprint(open_fds)";
    let o = std::process::Command::new(KFORGE)
        .arg("--socket")
        .arg(&sock)
        .args(["run", "--device", "cpu", "--", "python3", "-c", probe])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "[]");
    let _ = kforge_client::Client::connect(&sock).unwrap().request(&kforge_proto::Request::Shutdown);
    let _ = daemon.wait();
}

#[test]
fn memory_admission_waits_retries_an_oom_alone_and_loses_nothing() {
    const G: u64 = 1 << 30;
    let mem_dir = tempfile::tempdir().unwrap();
    let mem = mem_dir.path().join("memory.json");
    write_memory(&mem, 80, &[]);
    let d = TestDaemon::start(&["--debug-gpu-memory", mem.to_str().unwrap(), "--max-concurrent", "4"]);
    let hold = "import os, time\nwhile not os.path.exists('a.release'): time.sleep(0.01)\nprint('a done')";
    let mut a = d.spawn_job("a", &["--device", "cpu", "--gpu-memory", "10", "--", "python3", "-c", hold]);
    let a_pid = wait_for("job a runs", T, || d.status().jobs.first().and_then(|j| j.pid));
    // The sibling holds 60 GiB; the daemon has seen it once status shows its peak.
    write_memory(&mem, 20, &[(a_pid, 60)]);
    wait_for("a's use sampled", T, || {
        let s = d.status();
        (s.jobs[0].memory.as_ref()?.observed_peak_bytes == 60 * G).then_some(())
    });
    // b fails like PyTorch out of memory on its first run, succeeds on its second.
    let oom_once = "import os, sys\nif os.path.exists('b.marker'):\n    print('b second run ok'); sys.exit(0)\n\
                    open('b.marker', 'w').close()\n\
                    print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 30.00 GiB', file=sys.stderr)\n\
                    sys.exit(1)";
    let mut b = d.spawn_job("b", &["--device", "cpu", "--gpu-memory", "10", "--", "python3", "-c", oom_once]);
    let b_job = wait_for("b queued again, to run alone", T, || {
        let s = d.status();
        s.jobs.iter().find(|j| j.state == "queued" && j.memory.as_ref().is_some_and(|m| m.retried)).map(|j| j.job)
    });
    assert!(d.path("b.marker").exists(), "the first run happened");
    // c needs 30 GiB, which do not fit in 20: it waits.
    let mut c = d.spawn_job("c", &["--device", "cpu", "--gpu-memory", "30", "--", "python3", "-c", "print('c ok')"]);
    wait_for("c queued", T, || (d.status().jobs.len() == 3).then_some(()));
    let s = d.status();
    assert_eq!(s.devices[0].queued.len(), 2, "b (alone) and c wait: {:?}", s.devices[0]);
    assert_eq!(s.devices[0].memory.as_ref().map(|m| m.free_bytes), Some(20 * G));
    let table = Command::new(KFORGE).arg("--socket").arg(&d.socket).arg("status").output().unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("memory: 20.0 GiB free of 80.0 GiB"), "{table}");
    assert!(table.contains("60.0 GiB / 10.0 GiB declared"), "a's observed / expected peak: {table}");
    assert!(table.contains("retried"), "{table}");
    std::fs::write(d.path("a.release"), "").unwrap();
    assert!(a.wait().unwrap().success());
    write_memory(&mem, 80, &[]);
    assert!(b.wait().unwrap().success(), "b's exit is its second run's");
    assert!(c.wait().unwrap().success());

    let read = |name: &str| std::fs::read_to_string(d.path(name)).unwrap();
    assert_eq!(read("b.out"), "b second run ok\n");
    let b_err = read("b.err");
    assert!(b_err.contains("CUDA out of memory. Tried"), "the first run's output was streamed: {b_err}");
    assert!(
        b_err.contains(&format!("kforge: job {b_job}: CUDA out of memory while other processes held up to 60.0 GiB")),
        "{b_err}"
    );
    assert_eq!((read("a.out"), read("c.out")), ("a done\n".to_string(), "c ok\n".to_string()));
    let rep = d.report();
    assert_eq!(rep.jobs.len(), 3, "one row per job, nothing lost");
    let (ja, jb, jc) = (&rep.jobs[0], &rep.jobs[1], &rep.jobs[2]);
    assert!(rep.jobs.iter().all(|j| j.exit_code == Some(0)), "{:?}", rep.jobs);
    assert!(jb.reason.as_deref().is_some_and(|r| r.contains("second run, alone")), "{:?}", jb.reason);
    assert!(jb.started_ns < ja.ended_ns, "b's row keeps its first run's start, beside a");
    assert!(jb.ended_ns >= ja.ended_ns, "b's second run started after a ended");
    assert!(jc.started_ns >= jb.ended_ns, "nothing ran beside b's second run");
    let mem: Vec<(u64, u64, bool)> = rep.job_memory.iter().map(|m| (m.job, m.peak_bytes, m.retried)).collect();
    assert_eq!(mem, vec![(ja.id, 60 * G, false), (jb.id, 0, true), (jc.id, 0, false)], "memory per job in the store");
    assert!(rep.job_memory[1].siblings_peak_bytes >= 60 * G);
}

#[test]
fn run_refuses_a_bad_gpu_memory_or_expected_length() {
    let d = TestDaemon::start(&[]);
    for (flag, why) in [
        ("--gpu-memory", "--gpu-memory must be a positive number of GiB"),
        ("--expected-s", "--expected-s must be a positive number of seconds"),
    ] {
        for bad in ["0", "-3", "nan"] {
            let out = d.run_cmd(&[flag, bad, "--", "true"]).output().unwrap();
            assert_eq!(out.status.code(), Some(2), "{flag} {bad}");
            assert!(String::from_utf8_lossy(&out.stderr).contains(why), "{flag} {bad}");
        }
    }
}

/// A label's report that passes one frame's limit (a long measuring job's regions and samples)
/// comes in parts, whole; its region time is one small reply.
#[test]
fn a_report_past_the_frame_limit_comes_in_parts_and_region_time_in_one_reply() {
    let d = TestDaemon::start(&[]);
    const SCRIPT: &str = r#"
import kforge, time
for i in range(3):
    with kforge.region("r%d" % i) as r:
        time.sleep(0.05)
    kforge.report_measurement("m%d" % i, [1.0 + j * 1e-7 for j in range(40_000)], r)
"#;
    let run = |tag: &str, label: &str| {
        let mut j = d.spawn_job(tag, &["--device", "cpu", "--label", label, "--", "python3", "-c", SCRIPT]);
        let err = || std::fs::read_to_string(d.path(&format!("{tag}.err"))).unwrap_or_default();
        assert!(j.wait().unwrap().success(), "{}", err());
    };
    run("a", "big");
    run("b", "big");
    run("c", "other");
    // The label's report passes one frame: it comes in parts, whole.
    let parts = d.client().report_parts(Some("big".into())).unwrap();
    let sizes: Vec<usize> = parts.iter().map(|p| p.to_string().len()).collect();
    assert!(parts.len() >= 2 && sizes.iter().sum::<usize>() > kforge_proto::MAX_FRAME, "{sizes:?}");
    assert!(sizes.iter().all(|&n| n < kforge_proto::MAX_FRAME), "{sizes:?}");
    let big = kforge_store::Report::from_parts(parts).unwrap();
    assert_eq!((big.jobs.len(), big.regions.len(), big.measurements.len()), (2, 6, 6));
    assert!(big.measurements.iter().all(|m| m.samples_ms.len() == 40_000));
    let time = |job: Option<u64>, since_ns: Option<i64>| match d
        .client()
        .request(&Request::RegionTime { label: "big".into(), job, since_ns })
        .unwrap()
    {
        kforge_proto::Reply::RegionTime { jobs, regions, seconds } => (jobs, regions, seconds),
        other => panic!("unexpected reply {other:?}"),
    };
    let (jobs, regions, seconds) = time(None, None);
    assert_eq!((jobs, regions), (2, 6));
    assert!((0.3..30.0).contains(&seconds), "{seconds}");
    let summed: f64 = big.jobs.iter().map(|j| big.region_seconds(j.id)).sum();
    assert!((summed - seconds).abs() < 1e-6, "the store's sum {seconds} against the report's {summed}");
    // One job's, and the jobs queued since the second was: the same job.
    let (one_jobs, one_regions, one_s) = time(Some(2), None);
    assert_eq!((one_jobs, one_regions), (1, 3));
    assert!(one_s > 0.15 - 1e-9 && one_s < seconds, "{one_s} of {seconds}");
    let late = time(None, Some(i64::MAX));
    assert_eq!(late, (0, 0, 0.0));
    let none = d.client().request(&Request::RegionTime { label: "nobody".into(), job: None, since_ns: None }).unwrap();
    assert_eq!(none, kforge_proto::Reply::RegionTime { jobs: 0, regions: 0, seconds: 0.0 });
}
