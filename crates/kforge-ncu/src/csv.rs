//! ncu's CSV: finding the table among other lines, splitting records, and reading the raw and
//! details pages into launches.

use crate::{Launch, NcuError, DURATION, OCCUPANCY, SOL_COMPUTE, SOL_MEMORY};

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

/// The table starts at the first line whose first field is `ID` and which names `Kernel Name`;
/// it runs to the first line that is not a record of as many fields (ncu may print messages
/// after it, e.g. `==PROF== Disconnected`).
pub(crate) fn find_table(text: &str) -> Result<Table, NcuError> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.iter().position(|l| {
        split(l).is_some_and(|f| f.first().map(String::as_str) == Some("ID") && f.iter().any(|x| x == "Kernel Name"))
    });
    let Some(start) = start else {
        let messages = lines.iter().filter(|l| is_message(l)).map(|l| l.trim().to_string()).collect();
        return Err(NcuError::NoTable { messages });
    };
    let header = split(lines[start]).unwrap_or_default();
    let mut rows = Vec::new();
    for (i, line) in lines.iter().enumerate().skip(start + 1) {
        if line.starts_with("==") {
            break;
        }
        if line.trim().is_empty() {
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
    if metric != DURATION {
        return Ok(Some(v));
    }
    let scale = match unit.trim() {
        "" | "ns" | "nsecond" | "nsecond (ns)" => 1.0,
        "us" | "usecond" => 1e3,
        "ms" | "msecond" => 1e6,
        "s" | "second" => 1e9,
        _ => return Err(bad()),
    };
    Ok(Some(v * scale))
}

fn launch_id(line: usize, text: &str) -> Result<u64, NcuError> {
    text.trim().parse().map_err(|_| NcuError::BadValue {
        line,
        metric: "ID".into(),
        value: text.into(),
        unit: String::new(),
    })
}

/// The raw page: a column per metric; a first record with an empty `ID` holds the units.
pub(crate) fn raw(t: &Table) -> Result<Vec<Launch>, NcuError> {
    let (id, kernel) = (column(&t.header, "ID")?, column(&t.header, "Kernel Name")?);
    let cols = [DURATION, SOL_MEMORY, SOL_COMPUTE, OCCUPANCY].map(|m| column(&t.header, m));
    let [d, m, c, o] = cols;
    let (d, m, c, o) = (d?, m?, c?, o?);
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
            Ok(Launch {
                id: launch_id(*line, &f[id])?,
                kernel: f[kernel].clone(),
                duration_ns: get(d, DURATION)?,
                sol_memory_pct: get(m, SOL_MEMORY)?,
                sol_compute_pct: get(c, SOL_COMPUTE)?,
                occupancy_pct: get(o, OCCUPANCY)?,
            })
        })
        .collect()
}

/// The details page: a record per launch and metric; launches in order of first appearance.
pub(crate) fn details(t: &Table) -> Result<Vec<Launch>, NcuError> {
    let (id, kernel) = (column(&t.header, "ID")?, column(&t.header, "Kernel Name")?);
    let (name, unit, val) =
        (column(&t.header, "Metric Name")?, column(&t.header, "Metric Unit")?, column(&t.header, "Metric Value")?);
    let mut out: Vec<Launch> = Vec::new();
    for (line, f) in &t.rows {
        let launch = launch_id(*line, &f[id])?;
        let at = match out.iter().position(|l| l.id == launch) {
            Some(at) => at,
            None => {
                out.push(Launch {
                    id: launch,
                    kernel: f[kernel].clone(),
                    duration_ns: None,
                    sol_memory_pct: None,
                    sol_compute_pct: None,
                    occupancy_pct: None,
                });
                out.len() - 1
            }
        };
        let metric = f[name].as_str();
        let slot = match metric {
            DURATION | "Duration" => &mut out[at].duration_ns,
            SOL_MEMORY | "Memory Throughput" => &mut out[at].sol_memory_pct,
            SOL_COMPUTE | "Compute (SM) Throughput" => &mut out[at].sol_compute_pct,
            OCCUPANCY | "Achieved Occupancy" => &mut out[at].occupancy_pct,
            _ => continue,
        };
        let as_metric = if metric == "Duration" { DURATION } else { metric };
        *slot = value(*line, as_metric, &f[val], &f[unit])?;
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
    }
}
