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
            id: 0,
            job: None,
            device: dev.into(),
            name: "r".into(),
            pid: 1,
            tid: 1,
            policy: "region".into(),
            exclusive: true,
            requested_ns: g,
            granted_ns: g,
            released_ns: r,
            wait_ms: 0.0,
            steps: kforge_store::StepTimings::default(),
            gpu_temp_c_granted: None,
            sm_clock_mhz_granted: None,
            gpu_temp_c_released: None,
            sm_clock_mhz_released: None,
            core: None,
            lease_ms: 1,
            revoked: false,
            tainted: false,
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

/// How two rankings order one pair of items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairOrder {
    Concordant,
    Discordant,
    /// Tied in either ranking: ordered by neither.
    Tied,
}

/// How rankings `a` and `b` order items i and j, given `(a_i, a_j)` and `(b_i, b_j)`.
pub fn pair_order(a: (f64, f64), b: (f64, f64)) -> PairOrder {
    if a.0 == a.1 || b.0 == b.1 {
        PairOrder::Tied
    } else if (a.0 - a.1).signum() * (b.0 - b.1).signum() > 0.0 {
        PairOrder::Concordant
    } else {
        PairOrder::Discordant
    }
}

/// Concordant and discordant pairs between two rankings of the same items (ties in either
/// ranking are neither). Returns (concordant, discordant, ties).
pub fn pair_counts(a: &[f64], b: &[f64]) -> (usize, usize, usize) {
    assert_eq!(a.len(), b.len(), "rankings of different lengths");
    let (mut c, mut d, mut t) = (0, 0, 0);
    for i in 0..a.len() {
        for j in i + 1..a.len() {
            match pair_order((a[i], a[j]), (b[i], b[j])) {
                PairOrder::Concordant => c += 1,
                PairOrder::Discordant => d += 1,
                PairOrder::Tied => t += 1,
            }
        }
    }
    (c, d, t)
}

/// Kendall's tau-b of two rankings; None with fewer than two items or no untied pair.
pub fn kendall_tau_b(a: &[f64], b: &[f64]) -> Option<f64> {
    let n = a.len();
    if n < 2 {
        return None;
    }
    let n0 = n * (n - 1) / 2;
    let ties = |x: &[f64]| {
        let mut v: Vec<f64> = x.to_vec();
        v.sort_by(|p, q| p.total_cmp(q));
        let mut t = 0;
        let mut i = 0;
        while i < v.len() {
            let mut j = i;
            while j + 1 < v.len() && v[j + 1] == v[i] {
                j += 1;
            }
            let k = j - i + 1;
            t += k * (k - 1) / 2;
            i = j + 1;
        }
        t
    };
    let (c, d, _) = pair_counts(a, b);
    let denom = (((n0 - ties(a)) * (n0 - ties(b))) as f64).sqrt();
    (denom > 0.0).then(|| (c as f64 - d as f64) / denom)
}

/// Share of untied pairs ordered differently by the two rankings (0 when there is none).
pub fn flip_rate(a: &[f64], b: &[f64]) -> f64 {
    let (c, d, _) = pair_counts(a, b);
    if c + d == 0 {
        0.0
    } else {
        d as f64 / (c + d) as f64
    }
}

/// Total length of the union of intervals.
pub fn union_length(intervals: &[(f64, f64)]) -> f64 {
    let mut v: Vec<(f64, f64)> = intervals.iter().copied().filter(|(s, e)| e > s).collect();
    v.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mut total = 0.0;
    let mut cur: Option<(f64, f64)> = None;
    for (s, e) in v {
        match cur {
            Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                cur = Some((s, e));
            }
            None => cur = Some((s, e)),
        }
    }
    if let Some((cs, ce)) = cur {
        total += ce - cs;
    }
    total
}

#[cfg(test)]
mod rank_tests {
    use super::*;

    #[test]
    fn kendall_and_flips() {
        let iso = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(kendall_tau_b(&iso, &[10.0, 20.0, 30.0, 40.0]), Some(1.0));
        assert_eq!(kendall_tau_b(&iso, &[4.0, 3.0, 2.0, 1.0]), Some(-1.0));
        // One adjacent swap out of 6 pairs: tau = (5 - 1) / 6.
        let t = kendall_tau_b(&iso, &[1.0, 3.0, 2.0, 4.0]).unwrap();
        assert!((t - 4.0 / 6.0).abs() < 1e-12);
        assert!((flip_rate(&iso, &[1.0, 3.0, 2.0, 4.0]) - 1.0 / 6.0).abs() < 1e-12);
        assert_eq!(flip_rate(&iso, &iso), 0.0);
        // tau-b with a tie: scipy.stats.kendalltau([1,2,3],[1,1,2]) = 0.8164965809
        let t = kendall_tau_b(&[1.0, 2.0, 3.0], &[1.0, 1.0, 2.0]).unwrap();
        assert!((t - 0.816_496_580_9).abs() < 1e-9, "{t}");
        assert_eq!(kendall_tau_b(&[1.0], &[1.0]), None);
        assert_eq!(kendall_tau_b(&[1.0, 1.0], &[2.0, 3.0]), None);
        assert_eq!(pair_counts(&[1.0, 2.0, 2.0], &[3.0, 1.0, 2.0]), (0, 2, 1));
    }

    #[test]
    fn union_of_intervals() {
        assert_eq!(union_length(&[(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)]), 3.0);
        assert_eq!(union_length(&[(0.0, 10.0), (1.0, 2.0)]), 10.0);
        assert_eq!(union_length(&[]), 0.0);
        assert_eq!(union_length(&[(2.0, 1.0)]), 0.0);
    }
}
