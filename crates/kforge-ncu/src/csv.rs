//! ncu's CSV: finding the table among other lines, splitting records, and reading the raw and
//! details pages into launches.

use crate::{Launch, NcuError, DRAM_BYTES, DURATION, FLOP_COUNTERS, OCCUPANCY, SOL_COMPUTE, SOL_MEMORY};
use std::collections::HashMap;

/// The result table: its header and records, each with its 1-based line number in the text.
pub(crate) struct Table {
    pub header: Vec<String>,
    pub rows: Vec<(usize, Vec<String>)>,
}

/// Split one CSV record: fields separated by commas, optionally quoted, `""` inside quotes for
/// a quote. `None` when a quote is left open.
pub(crate) fn split(line: &str) -> Option<Vec<String>> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let (mut quoted, mut chars) = (false, line.trim_end_matches(['\r', '\n']).chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    if quoted {
        return None;
    }
    fields.push(field);
    Some(fields)
}

/// ncu's own message lines (`==PROF==`, `==WARNING==`, `==ERROR==`) other than progress.
fn is_message(line: &str) -> bool {
    line.starts_with("==") && !line.starts_with("==PROF== Profiling") && !line.starts_with("==PROF== Connected")
}

fn is_header(line: &str) -> bool {
    split(line).is_some_and(|f| f.first().map(String::as_str) == Some("ID") && f.iter().any(|x| x == "Kernel Name"))
}

/// The table starts at the first line whose first field is `ID` and which names `Kernel Name`;
/// ncu's message lines (`==…`) and blank lines inside it are skipped, and so is the header
/// repeated (a table per profiled process).
pub(crate) fn find_table(text: &str) -> Result<Table, NcuError> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.iter().position(|l| is_header(l));
    let Some(start) = start else {
        let messages = lines.iter().filter(|l| is_message(l)).map(|l| l.trim().to_string()).collect();
        return Err(NcuError::NoTable { messages });
    };
    let header = split(lines[start]).unwrap_or_default();
    let mut rows = Vec::new();
    for (i, line) in lines.iter().enumerate().skip(start + 1) {
        if line.starts_with("==") || line.trim().is_empty() || is_header(line) {
            continue;
        }
        let fields = split(line).ok_or_else(|| NcuError::Csv { line: i + 1, reason: "a quote is left open".into() })?;
        if fields.len() != header.len() {
            let reason = format!("{} fields where the header has {}", fields.len(), header.len());
            return Err(NcuError::Csv { line: i + 1, reason });
        }
        rows.push((i + 1, fields));
    }
    Ok(Table { header, rows })
}

fn column(header: &[String], name: &str) -> Result<usize, NcuError> {
    header.iter().position(|h| h == name).ok_or_else(|| NcuError::MissingColumn(name.into()))
}

/// A metric value in its unit, durations in nanoseconds; `None` for `n/a` or an empty field.
/// Thousands separators (`1,234.5`) are dropped.
fn value(line: usize, metric: &str, text: &str, unit: &str) -> Result<Option<f64>, NcuError> {
    let t = text.trim();
    if t.is_empty() || t.eq_ignore_ascii_case("n/a") {
        return Ok(None);
    }
    let bad = || NcuError::BadValue { line, metric: metric.into(), value: text.into(), unit: unit.into() };
    let v: f64 = t.replace(',', "").parse().map_err(|_| bad())?;
    if !v.is_finite() {
        return Err(bad());
    }
    let scale = match metric {
        DURATION => match unit.trim() {
            "" | "ns" | "nsecond" => Some(1.0),
            "us" | "usecond" => Some(1e3),
            "ms" | "msecond" => Some(1e6),
            "s" | "second" => Some(1e9),
            _ => None,
        },
        DRAM_BYTES => prefixed(unit, "byte"),
        _ if FLOP_COUNTERS.iter().any(|(m, _)| *m == metric) => prefixed(unit, "inst"),
        _ => Some(1.0),
    };
    Ok(Some(v * scale.ok_or_else(bad)?))
}

/// The factor of `unit` against `base` (`Mbyte` against `byte`: 1e6; ncu's prefixes are
/// decimal); an empty unit is the base.
fn prefixed(unit: &str, base: &str) -> Option<f64> {
    let unit = unit.trim();
    if unit.is_empty() || unit == base {
        return Some(1.0);
    }
    match unit.strip_suffix(base)? {
        "K" => Some(1e3),
        "M" => Some(1e6),
        "G" => Some(1e9),
        "T" => Some(1e12),
        _ => None,
    }
}

/// A record's value in a column, read as a metric (`None` where the table has no such column).
type Value<'a> = dyn Fn(usize, &str) -> Result<Option<f64>, NcuError> + 'a;

/// The FLOPs of a launch from the counters its record has: `None` when it has none.
fn flops(counters: &[(usize, f64)], get: &Value) -> Result<Option<f64>, NcuError> {
    let mut total: Option<f64> = None;
    for (i, &(col, weight)) in counters.iter().enumerate() {
        if let Some(v) = get(col, FLOP_COUNTERS[i].0)? {
            total = Some(total.unwrap_or(0.0) + weight * v);
        }
    }
    Ok(total)
}

fn launch_id(line: usize, text: &str) -> Result<u64, NcuError> {
    text.trim().replace(',', "").parse().map_err(|_| NcuError::BadValue {
        line,
        metric: "ID".into(),
        value: text.into(),
        unit: String::new(),
    })
}

/// The raw page: a column per metric; a first record with an empty `ID` holds the units. The two
/// speed-of-light columns are needed; duration, occupancy, block and grid size are read when
/// there.
pub(crate) fn raw(t: &Table) -> Result<Vec<Launch>, NcuError> {
    let (id, kernel) = (column(&t.header, "ID")?, column(&t.header, "Kernel Name")?);
    let (m, c) = (column(&t.header, SOL_MEMORY)?, column(&t.header, SOL_COMPUTE)?);
    let optional = |name: &str| t.header.iter().position(|h| h == name);
    let (d, o) = (optional(DURATION), optional(OCCUPANCY));
    let (block, grid, dram) = (optional("Block Size"), optional("Grid Size"), optional(DRAM_BYTES));
    // Each counter's column, in FLOP_COUNTERS' order (usize::MAX where the table has none).
    let counters: Vec<(usize, f64)> =
        FLOP_COUNTERS.iter().map(|(m, w)| (optional(m).unwrap_or(usize::MAX), *w)).collect();
    let any_counter = counters.iter().any(|(c, _)| *c != usize::MAX);
    let mut rows = t.rows.as_slice();
    let mut units = vec![String::new(); t.header.len()];
    if let Some((_, first)) = rows.first() {
        if first[id].trim().is_empty() {
            units = first.clone();
            rows = &rows[1..];
        }
    }
    rows.iter()
        .map(|(line, f)| {
            let get = |col: usize, metric: &str| value(*line, metric, &f[col], &units[col]);
            let maybe = |col: Option<usize>, metric: &str| col.map_or(Ok(None), |col| get(col, metric));
            let present = |col: usize, metric: &str| if col == usize::MAX { Ok(None) } else { get(col, metric) };
            Ok(Launch {
                id: launch_id(*line, &f[id])?,
                kernel: f[kernel].clone(),
                duration_ns: maybe(d, DURATION)?,
                sol_memory_pct: get(m, SOL_MEMORY)?,
                sol_compute_pct: get(c, SOL_COMPUTE)?,
                occupancy_pct: maybe(o, OCCUPANCY)?,
                dram_bytes: maybe(dram, DRAM_BYTES)?,
                flops: if any_counter { flops(&counters, &present)? } else { None },
                block: block.map(|b| f[b].clone()),
                grid: grid.map(|g| f[g].clone()),
            })
        })
        .collect()
}

/// Which of a launch's values a details-page record is, by its raw metric name or by the label
/// the Speed Of Light and Occupancy sections give it, in percent where a percentage is meant
/// (Memory Workload Analysis has a "Memory Throughput" in bytes per second too).
fn slot(metric: &str, unit: &str, section: Option<&str>) -> Option<&'static str> {
    let flop = FLOP_COUNTERS.iter().map(|(m, _)| *m);
    let raw = [DURATION, SOL_MEMORY, SOL_COMPUTE, OCCUPANCY, DRAM_BYTES].into_iter().chain(flop).find(|m| *m == metric);
    if raw.is_some() {
        return raw;
    }
    let in_section = |want: &str| section.is_none_or(|s| s.contains(want));
    let percent = unit.trim() == "%";
    match metric {
        "Duration" if in_section("Speed Of Light") => Some(DURATION),
        "Memory Throughput" if percent && in_section("Speed Of Light") => Some(SOL_MEMORY),
        "Compute (SM) Throughput" if percent && in_section("Speed Of Light") => Some(SOL_COMPUTE),
        "Achieved Occupancy" if percent && in_section("Occupancy") => Some(OCCUPANCY),
        _ => None,
    }
}

/// The details page: a record per launch and metric; launches in order of first appearance.
pub(crate) fn details(t: &Table) -> Result<Vec<Launch>, NcuError> {
    let (id, kernel) = (column(&t.header, "ID")?, column(&t.header, "Kernel Name")?);
    let (name, unit, val) =
        (column(&t.header, "Metric Name")?, column(&t.header, "Metric Unit")?, column(&t.header, "Metric Value")?);
    let optional = |name: &str| t.header.iter().position(|h| h == name);
    let (section, block, grid) = (optional("Section Name"), optional("Block Size"), optional("Grid Size"));
    let mut out: Vec<Launch> = Vec::new();
    let mut at_of: HashMap<u64, usize> = HashMap::new();
    for (line, f) in &t.rows {
        let launch = launch_id(*line, &f[id])?;
        let at = *at_of.entry(launch).or_insert_with(|| {
            out.push(Launch {
                id: launch,
                kernel: f[kernel].clone(),
                duration_ns: None,
                sol_memory_pct: None,
                sol_compute_pct: None,
                occupancy_pct: None,
                dram_bytes: None,
                flops: None,
                block: block.map(|b| f[b].clone()),
                grid: grid.map(|g| f[g].clone()),
            });
            out.len() - 1
        });
        let Some(metric) = slot(&f[name], &f[unit], section.map(|s| f[s].as_str())) else { continue };
        let v = value(*line, metric, &f[val], &f[unit])?;
        let l = &mut out[at];
        match metric {
            DURATION => l.duration_ns = v,
            SOL_MEMORY => l.sol_memory_pct = v,
            SOL_COMPUTE => l.sol_compute_pct = v,
            OCCUPANCY => l.occupancy_pct = v,
            DRAM_BYTES => l.dram_bytes = v,
            counter => {
                let weight = FLOP_COUNTERS.iter().find(|(m, _)| *m == counter).map_or(1.0, |(_, w)| *w);
                if let Some(v) = v {
                    l.flops = Some(l.flops.unwrap_or(0.0) + weight * v);
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_split_with_quotes_and_escapes() {
        assert_eq!(split(r#""a","b,c","d""e",,f"#).unwrap(), ["a", "b,c", "d\"e", "", "f"]);
        assert_eq!(split("x\r\n").unwrap(), ["x"]);
        assert!(split(r#""open"#).is_none());
    }

    #[test]
    fn values_take_units_and_separators() {
        assert_eq!(value(1, DURATION, "1,234.5", "nsecond").unwrap(), Some(1234.5));
        assert_eq!(value(1, DURATION, "2.5", "usecond").unwrap(), Some(2500.0));
        assert_eq!(value(1, DURATION, "3", "msecond").unwrap(), Some(3e6));
        assert_eq!(value(1, SOL_MEMORY, "n/a", "%").unwrap(), None);
        assert_eq!(value(1, SOL_MEMORY, "", "%").unwrap(), None);
        assert!(matches!(value(7, SOL_MEMORY, "lots", "%"), Err(NcuError::BadValue { line: 7, .. })));
        assert!(matches!(value(7, DURATION, "1", "cycle"), Err(NcuError::BadValue { .. })));
        assert!(matches!(value(7, SOL_MEMORY, "inf", "%"), Err(NcuError::BadValue { .. })));
        assert_eq!(value(1, DRAM_BYTES, "2.5", "Mbyte").unwrap(), Some(2.5e6));
        assert_eq!(value(1, DRAM_BYTES, "7", "byte").unwrap(), Some(7.0));
        assert!(matches!(value(1, DRAM_BYTES, "7", "byte/s"), Err(NcuError::BadValue { .. })));
        assert_eq!(value(1, FLOP_COUNTERS[2].0, "3", "Kinst").unwrap(), Some(3e3));
    }
}
