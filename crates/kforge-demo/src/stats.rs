//! Statistics over a run: quantiles, timing inflation, overlapping regions.

use kforge_store::RegionRow;

/// Quantile `q` in [0, 1] of `xs` with linear interpolation between order statistics (as
/// `numpy.quantile`'s default and `torch.quantile`). None for an empty slice.
pub fn quantile(xs: &[f64], q: f64) -> Option<f64> {
    if xs.is_empty() || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let mut v: Vec<f64> = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let pos = q * (v.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    Some(v[lo] + (v[hi] - v[lo]) * (pos - lo as f64))
}

pub fn median(xs: &[f64]) -> Option<f64> {
    quantile(xs, 0.5)
}

/// Timing inflation: measured / isolated − 1.
pub fn inflation(measured: f64, isolated: f64) -> f64 {
    measured / isolated - 1.0
}

/// Pairs of regions on one device whose [granted, released] intervals overlap. Regions still
/// open (no release) count as open to the end of time. Touching endpoints do not overlap.
pub fn overlapping_pairs(regions: &[RegionRow]) -> usize {
    let mut by_dev: std::collections::BTreeMap<&str, Vec<(i64, i64)>> = Default::default();
    for r in regions {
        by_dev.entry(r.device.as_str()).or_default().push((r.granted_ns, r.released_ns.unwrap_or(i64::MAX)));
    }
    let mut n = 0;
    for iv in by_dev.values_mut() {
        iv.sort();
        // Sweep: for each interval count earlier-starting intervals still open at its start.
        let mut open: Vec<i64> = Vec::new(); // end times of active intervals
        for &(s, e) in iv.iter() {
            open.retain(|&end| end > s);
            n += open.len();
            open.push(e);
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(dev: &str, g: i64, r: Option<i64>) -> RegionRow {
        RegionRow {
            id: 0, job: None, device: dev.into(), name: "r".into(), pid: 1, tid: 1, policy: "region".into(), exclusive: true,
            requested_ns: g, granted_ns: g, released_ns: r, wait_ms: 0.0, gate_ms: 0.0, drain_ms: 0.0, drain_timed_out: false,
            freeze_ms: 0.0, frozen_jobs: 0, settle_ms: 0.0, settle_timed_out: false, isolate_ms: 0.0, core: None, lease_ms: 1, revoked: false, tainted: false,
        }
    }

    #[test]
    fn quantiles_interpolate() {
        let xs = [4.0, 1.0, 3.0, 2.0];
        assert_eq!(quantile(&xs, 0.0), Some(1.0));
        assert_eq!(quantile(&xs, 1.0), Some(4.0));
        assert_eq!(quantile(&xs, 0.5), Some(2.5));
        assert!((quantile(&xs, 0.95).unwrap() - 3.85).abs() < 1e-12);
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&xs, 1.5), None);
        assert_eq!(median(&[7.0]), Some(7.0));
    }

    #[test]
    fn inflation_is_relative() {
        assert!((inflation(1.1, 1.0) - 0.1).abs() < 1e-12);
        assert!((inflation(0.9, 1.0) + 0.1).abs() < 1e-12);
    }

    #[test]
    fn overlaps_counted_per_device() {
        let rs = vec![
            region("cpu", 0, Some(10)),
            region("cpu", 10, Some(20)), // touches, no overlap
            region("cpu", 15, Some(30)), // overlaps the second
            region("0", 16, Some(17)),   // other device
            region("cpu", 25, None),     // open: overlaps the third
        ];
        assert_eq!(overlapping_pairs(&rs), 2);
        let nested = vec![region("cpu", 0, Some(100)), region("cpu", 1, Some(2)), region("cpu", 3, Some(4))];
        assert_eq!(overlapping_pairs(&nested), 2);
        assert_eq!(overlapping_pairs(&[]), 0);
    }
}
