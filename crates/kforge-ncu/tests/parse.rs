//! ncu's CSV pages as written to a log file (hand-made in ncu's layout: the raw page kforge asks
//! for, the details page a user may have saved; and one real page from the H200) and the outputs of
//! a failed or empty profile.

use kforge_ncu::*;

fn data(name: &str) -> String {
    std::fs::read_to_string(format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn the_raw_page_gives_a_launch_per_row_in_base_units() {
    let launches = parse(&data("raw.csv")).unwrap();
    assert_eq!(launches.len(), 3);
    assert_eq!(launches[0].kernel, "triton_poi_fused_add_mul_0");
    assert_eq!(launches[0].duration_ns, Some(1_843_200.0));
    assert_eq!(launches[0].sol_memory_pct, Some(91.52));
    assert_eq!(launches[1].occupancy_pct, None, "n/a is no value");
    assert_eq!(launches[2].id, 2);
    let rows = kernels(&launches);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].launches, 2);
    assert!((rows[0].sol_memory_pct.unwrap() - 90.51).abs() < 1e-9);
    assert_eq!(rows[0].time_ns, 3_686_400.0);
    assert!(rows[1].name.starts_with("sm90_xmma_gemm"));
    assert_eq!(rows[0].dram_bytes, Some(805_306_368.0), "thousands separators, summed over launches");
    assert_eq!(rows[0].flops, Some(33_554_432.0), "an n/a counter adds nothing");
    assert_eq!(rows[1].flops, Some(2_147_483_648.0), "an FMA counts two operations");
    assert!((rows[1].flops_per_s().unwrap() - 419.43e9).abs() < 1e7);
    assert_eq!(rows[1].sol_compute_pct, Some(86.75));
}

#[test]
fn the_details_page_gives_the_same_launches_by_section_names() {
    let launches = parse(&data("details.csv")).unwrap();
    assert_eq!(launches.len(), 2);
    let fill = &launches[0];
    assert!(fill.kernel.starts_with("void at::native::vectorized_elementwise_kernel<4"), "{}", fill.kernel);
    assert_eq!(fill.duration_ns, Some(12_500.0), "usecond converted");
    assert_eq!(
        (fill.sol_memory_pct, fill.sol_compute_pct, fill.occupancy_pct),
        (Some(71.3), Some(8.2), None),
        "Memory Workload Analysis' Memory Throughput is bytes per second, not the percentage"
    );
    let red = &launches[1];
    assert_eq!((red.sol_memory_pct, red.sol_compute_pct, red.occupancy_pct), (Some(22.0), Some(31.0), Some(45.0)));
    assert_eq!(red.duration_ns, None);
    assert_eq!(base_name(&fill.kernel), "at::native::vectorized_elementwise_kernel");
    assert_eq!((fill.block.as_deref(), fill.grid.as_deref()), (Some("(128, 1, 1)"), Some("(4096, 1, 1)")));
}

#[test]
fn a_table_per_process_and_optional_columns_are_read() {
    let raw = data("raw.csv");
    let header = raw.lines().find(|l| l.starts_with("\"ID\"")).unwrap();
    let mut twice: Vec<&str> = raw.lines().collect();
    let last_row = twice.iter().rposition(|l| l.starts_with("\"2\"")).unwrap();
    let again = ["==PROF== Connected to process 4243 (/usr/bin/python3.12)", header, twice[last_row]];
    let row3 = twice[last_row].replacen("\"2\"", "\"1,003\"", 1);
    twice.splice(last_row + 1..last_row + 1, again.iter().copied().chain([row3.as_str()]));
    let launches = parse(&twice.join("\n")).unwrap();
    assert_eq!(launches.len(), 5, "the second header is skipped, not read as a launch");
    assert_eq!(launches[4].id, 1003, "an ID with a thousands separator");
    // Without the occupancy and duration columns (a user's --metrics of the two SOL ones).
    let cols = [SOL_MEMORY, SOL_COMPUTE];
    let short = format!(
        "\"ID\",\"Kernel Name\",\"{}\",\"{}\"\n\"\",\"\",\"%\",\"%\"\n\"0\",\"k\",\"50\",\"20\"\n",
        cols[0], cols[1]
    );
    let l = parse(&short).unwrap();
    assert_eq!((l[0].sol_memory_pct, l[0].duration_ns, l[0].block.clone()), (Some(50.0), None, None));
}

#[test]
fn no_table_carries_ncus_messages() {
    let e = parse(&data("no-counters.txt")).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("LibraryNotLoaded"), "{text}");
    assert!(!text.contains("Connected"), "progress lines are left out: {text}");
    let e = parse(&data("no-kernels.txt")).unwrap_err();
    assert!(e.to_string().contains("No kernels were profiled"), "{e}");
    assert_eq!(parse(""), Err(NcuError::NoTable { messages: vec![] }));
}

#[test]
fn broken_tables_name_the_line_and_the_problem() {
    let raw = data("raw.csv");
    let header = raw.lines().find(|l| l.starts_with("\"ID\"")).unwrap();
    let short = format!("{header}\n\"0\",\"1\"\n");
    assert!(matches!(parse(&short), Err(NcuError::Csv { line: 2, .. })), "{:?}", parse(&short));
    let open = format!("{header}\n\"0,\"1\"\n");
    assert!(matches!(parse(&open), Err(NcuError::Csv { line: 2, .. })));
    let missing = header.replace(SOL_COMPUTE, "something_else");
    let e = parse(&missing).unwrap_err();
    assert_eq!(e, NcuError::MissingColumn(SOL_COMPUTE.into()));
    assert!(e.to_string().contains(&METRICS.join(",")), "{e}");
    let bad = raw.replace("\"91.52\"", "\"lots\"");
    match parse(&bad).unwrap_err() {
        NcuError::BadValue { line, metric, value, .. } => {
            assert_eq!((line, metric.as_str(), value.as_str()), (7, SOL_MEMORY, "lots"));
        }
        e => panic!("{e:?}"),
    }
}

/// A page ncu 2025.3.1 wrote on the H200 for `kforge profile` of `016_silu_bf16` (kept as it
/// came back): the `==PROF==` lines of three connected processes, the NVTX range columns before
/// the kernel's name, 327 columns in all and a units row.
#[test]
fn a_real_h200_page_with_nvtx_columns_gives_its_one_kernel() {
    let launches = parse(&data("h200-silu.csv")).unwrap();
    assert_eq!(launches.len(), 1);
    let silu = &launches[0];
    assert_eq!(silu.kernel, "triton_poi_fused_silu_0");
    assert_eq!(silu.duration_ns, Some(128_640.0), "thousands separators in nanoseconds");
    assert_eq!(silu.sol_memory_pct.map(|p| p.round()), Some(83.0));
    assert!(silu.dram_bytes.unwrap() > 5.0e8, "{:?}", silu.dram_bytes);
    assert_eq!(silu.flops, Some(1_946_157_056.0));
    let rows = kernels(&launches);
    assert_eq!((rows.len(), rows[0].launches), (1, 1));
}
