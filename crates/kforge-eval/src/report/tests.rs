use super::compute::{is_repeat_name, truth_base_name};
use super::*;
use crate::runner::RunManifest;
use crate::workload::{Command, Profile};
use kforge_store::{JobRow, MeasurementRow, RegionRow, Store};
use serde_json::json;

fn cmd(id: &str, group: &str, op: &str) -> Command {
    Command {
        id: id.into(),
        profile: Profile::Cpu,
        operator: op.into(),
        group: group.into(),
        candidate: id.into(),
        spec: json!({"id": id}),
        est_ms: 1.0,
        argv: vec!["python3".into()],
    }
}

fn manifest(
    name: &str,
    kind: &str,
    policy: &str,
    db: &str,
    workload: &str,
    wall_s: f64,
    commands: usize,
) -> RunManifest {
    RunManifest {
        name: name.into(),
        kind: kind.into(),
        policy: policy.into(),
        ablation: "-".into(),
        warm: false,
        concurrency: 4,
        workload: workload.into(),
        db: db.into(),
        label: format!("eval:{name}"),
        device: "cpu".into(),
        daemon_flags: vec![],
        gpu_groups: false,
        started_unix: 1000.0,
        wall_s,
        commands,
        failed: vec![],
    }
}

/// Record one job per (id, median) under `label`, with a region [start, end] seconds.
fn record(s: &Store, label: &str, first_id: u64, rows: &[(&str, f64, f64, f64)]) {
    record_clocked(s, label, first_id, rows, &[]);
}

/// `record`, the k-th region with SM clocks (granted, released) `clocks[k]` when given.
fn record_clocked(
    s: &Store,
    label: &str,
    first_id: u64,
    rows: &[(&str, f64, f64, f64)],
    clocks: &[Option<(u32, u32)>],
) {
    record_on(s, label, first_id, rows, clocks, "cpu");
}

/// `record_clocked`, the jobs on daemon device `device`.
fn record_on(
    s: &Store,
    label: &str,
    first_id: u64,
    rows: &[(&str, f64, f64, f64)],
    clocks: &[Option<(u32, u32)>],
    device: &str,
) {
    record_settled(s, label, first_id, rows, clocks, device, 0.0);
}

/// Rows as `record_on`, each region after a settle step of `settle_ms`.
fn record_settled(
    s: &Store,
    label: &str,
    first_id: u64,
    rows: &[(&str, f64, f64, f64)],
    clocks: &[Option<(u32, u32)>],
    device: &str,
    settle_ms: f64,
) {
    for (k, (name, ms, start, end)) in rows.iter().enumerate() {
        let clock = clocks.get(k).copied().flatten();
        let id = first_id + k as u64;
        s.insert_job(&JobRow {
            id,
            label: Some(label.into()),
            argv: vec![],
            cwd: "/".into(),
            device: device.into(),
            policy: "region".into(),
            queued_ns: 0,
            started_ns: None,
            ended_ns: None,
            pid: None,
            exit_code: Some(0),
            signal: None,
            reason: None,
        })
        .unwrap();
        let ns = |t: f64| ((1000.0 + t) * 1e9) as i64;
        s.insert_region(&RegionRow {
            id,
            job: Some(id),
            device: "cpu".into(),
            name: name.to_string(),
            pid: 1,
            tid: 1,
            policy: "region".into(),
            exclusive: true,
            requested_ns: ns(*start),
            granted_ns: ns(*start),
            released_ns: Some(ns(*end)),
            wait_ms: 1.0,
            steps: kforge_store::StepTimings {
                drain_ms: 2.0,
                freeze_ms: 0.5,
                frozen_jobs: 1,
                settle_ms,
                isolate_ms: 0.1,
                ..Default::default()
            },
            gpu_temp_c_granted: None,
            sm_clock_mhz_granted: clock.map(|c| c.0),
            gpu_temp_c_released: None,
            sm_clock_mhz_released: clock.map(|c| c.1),
            core: Some(0),
            lease_ms: 60000,
            revoked: false,
            tainted: false,
        })
        .unwrap();
        if let Some((_, released)) = clock {
            s.region_released(id, ns(*end), false, false, Some((40, released))).unwrap();
        }
        // Three samples whose median is `ms`.
        s.insert_measurement(&MeasurementRow {
            id,
            job: Some(id),
            region: Some(id),
            name: name.to_string(),
            recorded_ns: 0,
            samples_ms: vec![ms * 0.9, *ms, ms * 1.5],
            valid: true,
        })
        .unwrap();
    }
}

#[test]
fn report_from_a_synthetic_store() {
    let dir = tempfile::tempdir().unwrap();
    let wl = dir.path().join("w.jsonl");
    let cmds = vec![cmd("a", "g1", "mm"), cmd("b", "g1", "mm"), cmd("c", "g1", "mm"), cmd("d", "g2", "sm")];
    crate::workload::write(&wl, &cmds).unwrap();
    let dbp = dir.path().join("e.db");
    let s = Store::open(&dbp).unwrap();
    // Ground truth: a < b < c in group g1 (ranking), d alone; buckets: 0.05, 0.5, 5, 50 ms.
    record(
        &s,
        "eval:truth",
        1,
        &[("a", 0.05, 0.0, 0.1), ("b", 0.5, 0.2, 0.3), ("c", 5.0, 0.4, 0.5), ("d", 50.0, 0.6, 0.7)],
    );
    // Run: a +10%, b +0%, c slower than... keep order a<b<c except swap? b becomes 6.0 > c 5.5: one flip of 3 pairs.
    record(
        &s,
        "eval:region",
        11,
        &[("a", 0.055, 0.0, 1.0), ("b", 6.0, 2.0, 3.0), ("c", 5.5, 2.5, 4.0), ("d", 50.0, 9.0, 10.0)],
    );
    record(
        &s,
        "eval:command",
        21,
        &[("a", 0.05, 0.0, 1.0), ("b", 0.5, 1.0, 2.0), ("c", 5.0, 2.0, 3.0), ("d", 50.0, 3.0, 4.0)],
    );
    drop(s);
    let db = dbp.display().to_string();
    let w = wl.display().to_string();
    let ms = vec![
        manifest("truth", "truth", "command", &db, &w, 10.0, 4),
        manifest("region", "run", "region", &db, &w, 10.0, 4),
        manifest("command", "run", "command", &db, &w, 20.0, 4),
    ];
    let r = compute(&ms).unwrap();
    assert_eq!(r.isolated_commands, 4);
    let region = r.runs.iter().find(|x| x.name == "region").unwrap();
    assert_eq!(region.throughput_per_min, 24.0);
    assert_eq!(region.throughput_ratio_vs_command, Some(2.0));
    let infl: Vec<(usize, f64)> = region.inflation.iter().map(|b| (b.n, b.p50)).collect();
    assert_eq!(infl[0].0, 1);
    assert!((infl[0].1 - 0.1).abs() < 1e-9, "{infl:?}"); // a: 0.055 / 0.05 - 1
    assert!((infl[1].1 - 11.0).abs() < 1e-9); // b: 6.0 / 0.5 - 1
    assert!((infl[2].1 - 0.1).abs() < 1e-9); // c
    assert!(infl[3].1.abs() < 1e-12); // d
    assert_eq!(region.inflation_all.n, 4);
    // Ranking: group g1 has pairs (a,b) (a,c) (b,c); (b,c) flipped. g2 has one candidate: not ranked.
    let mm = region.ranking.iter().find(|o| o.operator == "mm").unwrap();
    assert_eq!((mm.groups, mm.pairs), (1, 3));
    assert!((mm.flip_rate - 1.0 / 3.0).abs() < 1e-12);
    assert!((mm.kendall_tau - 1.0 / 3.0).abs() < 1e-12);
    assert!(region.ranking.iter().all(|o| o.operator != "sm"));
    // Regions [0,1] [2,3] [2.5,4] [9,10]: union 4 s of 10 s; one overlapping pair.
    assert!((region.busy_share - 0.4).abs() < 1e-9, "{}", region.busy_share);
    assert_eq!(region.regions.overlapping_pairs, 1);
    assert_eq!(region.regions.count, 4);
    assert!((region.regions.drain_ms_p50 - 2.0).abs() < 1e-12);
    let command = r.runs.iter().find(|x| x.name == "command").unwrap();
    assert!(command.ranking.iter().all(|o| o.flip_rate == 0.0 && o.kendall_tau == 1.0));
    assert!(table(&r).contains("2.00x"));
    // No ground truth, or one command in two truth parts, are errors.
    assert!(compute(&ms[1..]).unwrap_err().to_string().contains("no ground-truth"));
    let two = vec![ms[0].clone(), ms[0].clone()];
    assert!(compute(&two).unwrap_err().to_string().contains("in two ground-truth parts of one GPU"));
}

#[test]
fn resolved_ranking_flips_and_a_repeat_truth() {
    let dir = tempfile::tempdir().unwrap();
    let wl = dir.path().join("w.jsonl");
    let cmds =
        [cmd("a", "g1", "mm"), cmd("b", "g1", "mm"), cmd("c", "g1", "mm"), cmd("d", "g2", "ew"), cmd("e", "g2", "ew")];
    crate::workload::write(&wl, &cmds).unwrap();
    let dbp = dir.path().join("e.db");
    let s = Store::open(&dbp).unwrap();
    // Cold truth in two parts: a 1.00 < b 1.01 < c 1.50 (g1), d 2.00 < e 2.10 (g2).
    record(&s, "eval:truth-0", 1, &[("a", 1.0, 0.0, 0.1), ("b", 1.01, 0.2, 0.3), ("c", 1.5, 0.4, 0.5)]);
    record(&s, "eval:truth-3", 4, &[("d", 2.0, 0.0, 0.1), ("e", 2.1, 0.2, 0.3)]);
    // Warm truth (a repeat): flips a/b (1 % apart), keeps the rest.
    record(
        &s,
        "eval:truth-warm",
        11,
        &[
            ("a", 1.02, 0.0, 0.1),
            ("b", 1.0, 0.2, 0.3),
            ("c", 1.5, 0.4, 0.5),
            ("d", 2.0, 0.6, 0.7),
            ("e", 2.1, 0.8, 0.9),
        ],
    );
    // The run flips a/b (1 % apart) and d/e (5 % apart); a/c, b/c kept.
    record(
        &s,
        "eval:region",
        21,
        &[
            ("a", 1.01, 0.0, 1.0),
            ("b", 1.0, 1.0, 2.0),
            ("c", 1.6, 2.0, 3.0),
            ("d", 2.2, 3.0, 4.0),
            ("e", 2.1, 4.0, 5.0),
        ],
    );
    drop(s);
    let (db, w) = (dbp.display().to_string(), wl.display().to_string());
    let warm = |mut m: RunManifest| {
        m.warm = true;
        m
    };
    let ms = vec![
        manifest("truth-0", "truth", "region", &db, &w, 10.0, 3),
        warm(manifest("truth-warm", "truth", "region", &db, &w, 5.0, 5)),
        manifest("truth-3", "truth", "region", &db, &w, 10.0, 2),
        manifest("region", "run", "region", &db, &w, 10.0, 5),
        manifest("command", "run", "command", &db, &w, 20.0, 5),
    ];
    let r = compute_with(&ms, &ReportOptions { min_gap: 0.02 }).unwrap();
    // The cold parts are the reference (5 commands); the warm truth is a repeat row.
    assert_eq!(r.isolated_commands, 5);
    assert_eq!(r.resolved_min_gap, 0.02);
    let names: Vec<&str> = r.runs.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["truth-warm", "region", "command"]);
    let repeat = &r.runs[0];
    assert!(repeat.repeat_of_truth && repeat.throughput_ratio_vs_command.is_none());
    // Repeat: 4 pairs (a,b) (a,c) (b,c) (d,e), one flip at a 1 % gap: resolved pairs keep order.
    assert_eq!(repeat.ranking_all, Some(PairRanking { pairs: 4, flips: 1, kendall_tau: 0.5 }));
    assert_eq!(repeat.ranking_resolved, Some(PairRanking { pairs: 3, flips: 0, kendall_tau: 1.0 }));
    let run = &r.runs[1];
    assert!(!run.repeat_of_truth && run.throughput_ratio_vs_command == Some(2.0));
    assert_eq!(run.ranking_all, Some(PairRanking { pairs: 4, flips: 2, kendall_tau: 0.0 }));
    assert_eq!(run.ranking_resolved, Some(PairRanking { pairs: 3, flips: 1, kendall_tau: 1.0 / 3.0 }));
    // Flips, largest truth gap first, with both gaps.
    let f: Vec<(&str, &str, &str)> =
        run.flips.iter().map(|f| (f.operator.as_str(), f.faster.as_str(), f.slower.as_str())).collect();
    assert_eq!(f, [("ew", "d", "e"), ("mm", "a", "b")]);
    assert!(
        (run.flips[0].truth_gap - 0.05).abs() < 1e-9 && (run.flips[0].measured_gap - (2.1 / 2.2 - 1.0)).abs() < 1e-9
    );
    let t = table(&r);
    assert!(t.contains("truth-warm+") && t.contains("0.000/0.333") && t.contains(">= 2.0 %"), "{t}");
    // A gap of 0 counts every pair; a negative or NaN one is refused.
    let r0 = compute_with(&ms, &ReportOptions { min_gap: 0.0 }).unwrap();
    assert_eq!(r0.runs[1].ranking_resolved, r0.runs[1].ranking_all);
    for bad in [-0.01, f64::NAN] {
        assert!(compute_with(&ms, &ReportOptions { min_gap: bad }).unwrap_err().to_string().contains("minimum gap"));
    }
    // A warm truth in parts is one repeat row; a cold truth named truth-repeat is another.
    let s = Store::open(&dbp).unwrap();
    record(&s, "eval:truth-warm-0", 31, &[("a", 1.0, 0.0, 0.1), ("b", 1.01, 0.2, 0.3)]);
    record(&s, "eval:truth-warm-2", 33, &[("c", 1.5, 0.0, 0.1)]);
    record(&s, "eval:truth-repeat", 41, &[("a", 1.0, 0.0, 0.1), ("c", 1.5, 0.2, 0.3)]);
    drop(s);
    let parts = vec![
        ms[0].clone(),
        ms[2].clone(),
        warm(manifest("truth-warm-0", "truth", "region", &db, &w, 5.0, 2)),
        warm(manifest("truth-warm-2", "truth", "region", &db, &w, 5.0, 1)),
        manifest("truth-repeat", "truth", "region", &db, &w, 5.0, 2),
    ];
    let rp = compute(&parts).unwrap();
    let rows: Vec<(&str, usize, bool)> =
        rp.runs.iter().map(|x| (x.name.as_str(), x.inflation_all.n, x.repeat_of_truth)).collect();
    assert_eq!(rows, [("truth-warm", 3, true), ("truth-repeat", 2, true)]);
    // A repeat (or a run) that measures a command twice is refused, not silently overwritten.
    let dup = vec![ms[0].clone(), ms[2].clone(), ms[1].clone(), parts[2].clone()];
    let e = compute(&dup).unwrap_err().to_string();
    assert!(e.contains("truth-warm measured command a twice"), "{e}");
    // Only warm truths: they are the reference, no repeat row.
    let only_warm = vec![ms[1].clone(), ms[3].clone()];
    let rw = compute(&only_warm).unwrap();
    assert_eq!(rw.runs.len(), 1);
    assert!(!rw.runs[0].repeat_of_truth);
    assert_eq!(truth_base_name("truth-warm-50"), "truth-warm");
    assert_eq!(truth_base_name("truth-warm"), "truth-warm");
    assert_eq!(truth_base_name("-5"), "-5");
    assert_eq!(truth_base_name("truth-gpu1-50"), "truth");
    assert_eq!(truth_base_name("truth-gpu1"), "truth");
    assert_eq!(truth_base_name("truth-gpux"), "truth-gpux");
    assert!(is_repeat_name("truth-repeat-gpu1-0") && !is_repeat_name("truth-warm"));
}

#[test]
fn full_clock_inflation_leaves_out_regions_that_ended_throttled() {
    let dir = tempfile::tempdir().unwrap();
    let wl = dir.path().join("w.jsonl");
    let cmds =
        [cmd("a", "g1", "mm"), cmd("b", "g1", "mm"), cmd("c", "g2", "mm"), cmd("d", "g2", "mm"), cmd("e", "g3", "mm")];
    crate::workload::write(&wl, &cmds).unwrap();
    let dbp = dir.path().join("e.db");
    let s = Store::open(&dbp).unwrap();
    // The truth, under the region policy, recorded clocks: e's region ended power-capped.
    record_clocked(
        &s,
        "eval:truth",
        1,
        &[
            ("a", 0.05, 0.0, 0.1),
            ("b", 0.5, 0.2, 0.3),
            ("c", 5.0, 0.4, 0.5),
            ("d", 50.0, 0.6, 0.7),
            ("e", 5.0, 0.8, 0.9),
        ],
        &[Some((1980, 1980)), Some((1980, 1980)), None, None, Some((1980, 1400))],
    );
    // The run: a +10 % at full clock, b +40 % ending at 1500 MHz, c +1 % at 1975 of 1980 MHz,
    // d without a clock reading (counted in neither).
    record_clocked(
        &s,
        "eval:region",
        11,
        &[
            ("a", 0.055, 0.0, 1.0),
            ("b", 0.7, 1.0, 2.0),
            ("c", 5.05, 2.0, 3.0),
            ("d", 50.0, 3.0, 4.0),
            ("e", 5.0, 4.0, 5.0),
        ],
        &[Some((1980, 1980)), Some((1980, 1500)), Some((1965, 1975)), None, Some((1980, 1980))],
    );
    drop(s);
    let (db, w) = (dbp.display().to_string(), wl.display().to_string());
    let ms = vec![
        manifest("truth", "truth", "command", &db, &w, 10.0, 4),
        manifest("region", "run", "region", &db, &w, 10.0, 4),
    ];
    let r = compute(&ms).unwrap();
    let run = &r.runs[0];
    // b ended throttled in the run, e in the truth.
    assert_eq!((run.top_sm_clock_mhz, run.throttled_commands), (Some(1980), 2));
    let n: Vec<usize> = run.full_clock.iter().map(|b| b.n).collect();
    assert_eq!(n, vec![1, 0, 1, 0]);
    assert!((run.full_clock[0].p95 - 0.1).abs() < 1e-9 && (run.full_clock[2].p95 - 0.01).abs() < 1e-9);
    // The overall inflation still holds every command, b's +40 % included.
    assert_eq!(run.inflation_all.n, 5);
    assert!((run.inflation[1].p50 - 0.4).abs() < 1e-9);
    let t = table(&r);
    assert!(t.contains("regions that ended at full clock") && t.contains("1980"), "{t}");
    let html = crate::html::render(&r);
    assert!(html.contains("Regions that ended at full clock") && html.contains("Furthest from the ground truth"));
    // Outliers: largest |inflation| first, with their regions' evidence (e: +0 % last).
    let ids: Vec<&str> = run.outliers.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(ids[..2], ["b", "a"]);
    assert_eq!(ids.len(), 5);
    let b = &run.outliers[0];
    assert_eq!((b.samples, b.truth_samples, b.sm_clock_mhz_released, b.core), (3, 3, Some(1500), Some(0)));
    assert!((b.inflation - 0.4).abs() < 1e-9 && b.freeze_ms == Some(0.5));
    let e = run.outliers.iter().find(|o| o.id == "e").unwrap();
    assert_eq!(e.truth_sm_clock_mhz_released, Some(1400));
}

#[test]
fn serial_time_sums_held_regions_and_settle_steps_per_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let wl = dir.path().join("w.jsonl");
    crate::workload::write(&wl, &[cmd("a", "g1", "mm"), cmd("b", "g1", "mm")]).unwrap();
    let dbp = dir.path().join("e.db");
    let s = Store::open(&dbp).unwrap();
    record(&s, "eval:truth", 1, &[("a", 1.0, 0.0, 0.5), ("b", 2.0, 1.0, 1.5)]);
    // Regions of 1.0 and 2.0 s, each after 250 ms of settle; a run of 10 s.
    record_settled(&s, "eval:region", 11, &[("a", 1.0, 0.0, 1.0), ("b", 2.0, 2.0, 4.0)], &[], "cpu", 250.0);
    record(&s, "eval:command", 21, &[("a", 1.0, 0.0, 1.0), ("b", 2.0, 1.0, 2.0)]);
    drop(s);
    let (db, w) = (dbp.display().to_string(), wl.display().to_string());
    let ms = vec![
        manifest("truth", "truth", "region", &db, &w, 1.0, 2),
        manifest("region", "run", "region", &db, &w, 10.0, 2),
        manifest("command", "run", "command", &db, &w, 10.0, 2),
    ];
    let r = compute(&ms).unwrap();
    let region = r.runs.iter().find(|x| x.name == "region").unwrap();
    assert!(
        (region.regions.held_s - 3.0).abs() < 1e-9 && (region.regions.settle_s - 0.5).abs() < 1e-9,
        "{:?}",
        region.regions
    );
    let t = table(&r);
    let row =
        t.lines().skip_while(|l| !l.starts_with("serial time per GPU")).find(|l| l.starts_with("region ")).unwrap();
    assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["region", "10.0", "3.0", "0.5", "35%"]);
    // Whole-command exclusivity has no serial-time row: its regions are not what is exclusive.
    assert!(!t.lines().skip_while(|l| !l.starts_with("serial time per GPU")).any(|l| l.starts_with("command ")), "{t}");
}

#[test]
fn a_run_over_every_gpu_is_compared_with_each_gpus_truth() {
    let dir = tempfile::tempdir().unwrap();
    let wl = dir.path().join("w.jsonl");
    let cmds = [cmd("a", "g1", "mm"), cmd("b", "g1", "mm"), cmd("c", "g1", "mm")];
    crate::workload::write(&wl, &cmds).unwrap();
    let dbp = dir.path().join("e.db");
    let s = Store::open(&dbp).unwrap();
    // Truth of every command on both GPUs (GPU 1 is 10 % slower).
    let rows = |f: f64| [("a", 1.0 * f, 0.0, 0.1), ("b", 2.0 * f, 0.2, 0.3), ("c", 3.0 * f, 0.4, 0.5)];
    record_on(&s, "eval:truth", 1, &rows(1.0), &[], "0");
    record_on(&s, "eval:truth-gpu1", 4, &rows(1.1), &[], "1");
    // The scaling run: a and c on GPU 1 (+0 % against GPU 1's truth), b on GPU 0 (+5 %).
    record_on(&s, "eval:both", 11, &[("a", 1.1, 0.0, 1.0), ("c", 3.3, 0.0, 1.0)], &[], "1");
    record_on(&s, "eval:both", 13, &[("b", 2.1, 0.0, 1.0)], &[], "0");
    drop(s);
    let (db, w) = (dbp.display().to_string(), wl.display().to_string());
    let on = |mut m: RunManifest, dev: &str| {
        m.device = dev.into();
        m
    };
    let ms = vec![
        on(manifest("truth", "truth", "region", &db, &w, 1.0, 3), "0 (H200, GPU-a)"),
        on(manifest("truth-gpu1", "truth", "region", &db, &w, 1.0, 3), "1 (H200, GPU-b)"),
        on(manifest("both", "run", "region", &db, &w, 1.0, 3), "all: 0 (H200, GPU-a); 1 (H200, GPU-b)"),
    ];
    let r = compute(&ms).unwrap();
    assert_eq!(r.isolated_commands, 3);
    let run = &r.runs[0];
    assert_eq!((run.cross_device_commands, run.compared_across_devices, run.inflation_all.n), (0, false, 3));
    assert_eq!((run.gpus, run.throughput_ratio_vs_command), (2, None));
    // Against whole-command exclusivity on one GPU at the same commands per minute: half as
    // many per GPU — the ratio is per GPU, not the two GPUs' sum over one.
    {
        let s = Store::open(&dbp).unwrap();
        record_on(
            &s,
            "eval:command",
            31,
            &[("a", 1.0, 0.0, 1.0), ("b", 2.0, 1.0, 2.0), ("c", 3.0, 2.0, 3.0)],
            &[],
            "0",
        );
        let mut with_cmd = ms.clone();
        assert_eq!(with_cmd[2].name, "both");
        with_cmd.push(on(manifest("command", "run", "command", &db, &w, 1.0, 3), "0 (H200, GPU-a)"));
        let r = compute(&with_cmd).unwrap();
        let (both, command) = (&r.runs[0], &r.runs[1]);
        assert_eq!((both.gpus, command.gpus), (2, 1));
        let per_gpu: Vec<(&str, usize)> = both.commands_per_gpu.iter().map(|(d, n)| (d.as_str(), *n)).collect();
        assert_eq!(per_gpu, [("0 (H200, GPU-a)", 1), ("1 (H200, GPU-b)", 2)]);
        assert!(command.commands_per_gpu.is_empty());
        assert!(table(&r).contains("both: commands measured per GPU: GPU 0 1, GPU 1 2"), "{}", table(&r));
        assert_eq!((both.throughput_ratio_vs_command, command.throughput_ratio_vs_command), (Some(0.5), Some(1.0)));
        assert!(table(&r).contains("VS_CMD/GPU"));
        assert!(!both.gpu_groups && !table(&r).contains("GPUS g:"));
        // With GPU groups: marked in the table, and parts that differ in it are not merged.
        with_cmd[2].gpu_groups = true;
        let r = compute(&with_cmd).unwrap();
        assert!(r.runs[0].gpu_groups);
        let t = table(&r);
        assert!(t.lines().any(|l| l.starts_with("both ") && l.split_whitespace().nth(4) == Some("2g")), "{t}");
        assert!(t.contains("GPUS g: each candidate group ran on one GPU"));
        let mut part = with_cmd[2].clone();
        part.name = "both@9".into();
        part.gpu_groups = false;
        with_cmd[2].name = "both@0".into();
        with_cmd.push(part);
        let e = compute(&with_cmd).unwrap_err().to_string();
        assert!(e.contains("share the name both but not policy, ablation, warm, daemon flags and GPU groups"), "{e}");
    }
    let mut x = run.inflation_all.values.clone();
    x.sort_by(f64::total_cmp);
    assert!(x[0].abs() < 1e-9 && x[1].abs() < 1e-9 && (x[2] - 0.05).abs() < 1e-9, "{x:?}");
    // Only the pair measured on one GPU is ranked: (a, c) on GPU 1; b's pairs span GPUs.
    assert_eq!(run.ranking_all.map(|t| t.pairs), Some(1));
    // A job on a GPU the manifest does not list keeps the manifest's device: no same-GPU truth.
    let s = Store::open(&dbp).unwrap();
    record_on(&s, "eval:both", 14, &[("d", 1.0, 0.0, 1.0)], &[], "7");
    record_on(&s, "eval:truth", 15, &[("d", 1.0, 0.6, 0.7)], &[], "0");
    // A run on a third GPU: compared across GPUs, with the reference's first GPU's truth.
    record_on(&s, "eval:elsewhere", 21, &[("a", 1.2, 0.0, 1.0), ("b", 2.4, 0.0, 1.0)], &[], "2");
    drop(s);
    let mut cmds4 = cmds.to_vec();
    cmds4.push(cmd("d", "g2", "mm"));
    crate::workload::write(&wl, &cmds4).unwrap();
    let mut ms2 = ms.clone();
    ms2.push(on(manifest("elsewhere", "run", "region", &db, &w, 1.0, 2), "2 (H200, GPU-c)"));
    let r = compute(&ms2).unwrap();
    assert_eq!(r.device, "0 (H200, GPU-a); 1 (H200, GPU-b)");
    let both = &r.runs[0];
    assert_eq!((both.inflation_all.n, both.cross_device_commands), (3, 1), "d: measured on an unlisted GPU, left out");
    let elsewhere = &r.runs[1];
    assert!(elsewhere.compared_across_devices);
    let mut x = elsewhere.inflation_all.values.clone();
    x.sort_by(f64::total_cmp);
    assert!((x[0] - 0.2).abs() < 1e-9 && (x[1] - 0.2).abs() < 1e-9, "GPU 0's truth (1.0, 2.0), not GPU 1's: {x:?}");
    // The same GPU's truth twice is refused.
    let twice = vec![ms[0].clone(), ms[0].clone(), ms[2].clone()];
    assert!(compute(&twice)
        .unwrap_err()
        .to_string()
        .contains("in two ground-truth parts of one GPU (truth and truth, GPU 0 (H200, GPU-a))"));
}

#[test]
fn inflation_uses_ground_truth_from_the_same_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let wl = dir.path().join("w.jsonl");
    let cmds = vec![cmd("a", "g1", "mm"), cmd("b", "g1", "mm"), cmd("c", "g2", "mm")];
    crate::workload::write(&wl, &cmds).unwrap();
    // A byte-identical copy of the workload elsewhere (a state directory from another call).
    let other = tempfile::tempdir().unwrap();
    let wl2 = other.path().join("w.jsonl");
    std::fs::copy(&wl, &wl2).unwrap();
    let dbp = dir.path().join("e.db");
    let s = Store::open(&dbp).unwrap();
    record(&s, "eval:t0", 1, &[("a", 1.0, 0.0, 0.1)]); // part 0 on GPU A
    record(&s, "eval:t1", 2, &[("b", 2.0, 0.0, 0.1), ("c", 3.0, 0.2, 0.3)]); // part 1 on GPU B
    record(&s, "eval:run", 11, &[("a", 1.5, 0.0, 1.0), ("b", 2.2, 1.0, 2.0), ("c", 3.3, 2.0, 3.0)]); // on GPU B
    record(&s, "eval:sub", 21, &[("a", 1.2, 0.0, 1.0)]); // on GPU B, only command a
    drop(s);
    let db = dbp.display().to_string();
    let on = |mut m: RunManifest, dev: &str| {
        m.device = dev.into();
        m
    };
    let ms = vec![
        on(manifest("t0", "truth", "command", &db, &wl.display().to_string(), 1.0, 1), "A"),
        on(manifest("t1", "truth", "command", &db, &wl2.display().to_string(), 1.0, 2), "B"),
        on(manifest("run", "run", "region", &db, &wl.display().to_string(), 1.0, 3), "B"),
        on(manifest("sub", "run", "region", &db, &wl.display().to_string(), 1.0, 1), "B"),
    ];
    let r = compute(&ms).unwrap();
    let run = r.runs.iter().find(|x| x.name == "run").unwrap();
    // a (truth on A) is left out: +10% for b and c only.
    assert_eq!(run.inflation_all.n, 2);
    assert!((run.inflation_all.p50 - 0.1).abs() < 1e-9, "{:?}", run.inflation_all);
    assert_eq!((run.cross_device_commands, run.compared_across_devices), (1, false));
    // A run with no same-GPU truth at all is compared across GPUs, and marked.
    let sub = r.runs.iter().find(|x| x.name == "sub").unwrap();
    assert_eq!((sub.inflation_all.n, sub.compared_across_devices), (1, true));
    assert!((sub.inflation_all.p50 - 0.2).abs() < 1e-9);
    assert!(table(&r).contains("sub*"));
    // A workload that differs is still refused.
    std::fs::write(&wl2, "{}\n").unwrap();
    assert!(compute(&ms).unwrap_err().to_string().contains("different workloads"));
}

#[test]
fn slices_merge_into_one_run_with_per_slice_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let wl = dir.path().join("w.jsonl");
    crate::workload::write(&wl, &[cmd("a", "g1", "mm"), cmd("b", "g1", "mm"), cmd("c", "g2", "mm")]).unwrap();
    let dbp = dir.path().join("e.db");
    let s = Store::open(&dbp).unwrap();
    record(&s, "eval:t0", 1, &[("a", 1.0, 0.0, 0.1)]);
    record(&s, "eval:t1", 2, &[("b", 2.0, 0.0, 0.1), ("c", 3.0, 0.2, 0.3)]);
    record(&s, "eval:region@0", 11, &[("a", 1.1, 0.0, 1.0)]);
    record(&s, "eval:region@1", 21, &[("b", 2.2, 0.0, 1.0), ("c", 3.3, 1.0, 2.0)]);
    drop(s);
    let (db, w) = (dbp.display().to_string(), wl.display().to_string());
    let on = |mut m: RunManifest, dev: &str| {
        m.device = dev.into();
        m
    };
    let mut ms = vec![
        on(manifest("t0", "truth", "command", &db, &w, 1.0, 1), "A"),
        on(manifest("t1", "truth", "command", &db, &w, 1.0, 2), "B"),
        on(manifest("region@0", "run", "region", &db, &w, 10.0, 1), "A"),
        on(manifest("region@1", "run", "region", &db, &w, 20.0, 2), "B"),
    ];
    let r = compute(&ms).unwrap();
    assert_eq!(r.runs.len(), 1);
    let run = &r.runs[0];
    assert_eq!((run.name.as_str(), run.commands, run.wall_s), ("region", 3, 30.0));
    assert!((run.throughput_per_min - 6.0).abs() < 1e-9);
    // Every command compared with truth from its own slice's GPU: +10 % each.
    assert_eq!((run.inflation_all.n, run.cross_device_commands, run.compared_across_devices), (3, 0, false));
    assert!((run.inflation_all.p95 - 0.1).abs() < 1e-9);
    assert_eq!(run.regions.count, 3);
    // The second slice's regions come after the first slice's wall time on the timeline.
    assert!(run.timeline.iter().any(|t| t.start_s >= 10.0));
    // Parts of one name must agree on the policy.
    ms[3].policy = "none".into();
    assert!(compute(&ms).unwrap_err().to_string().contains("share the name region"));
}
