//! The beam's second round over the dispatch space: the Inductor knobs that helped alone in the
//! first measurement, combined (`MODE+K1+K2…`), measured again in one interleaved measurement
//! beside the first round's best variants, against the same baseline — so a combination wins
//! only by beating them in the same rounds, never by a ratio from another command. The search
//! stops after the first round when fewer than two knobs helped (nothing to combine), and after
//! the second when no combination beat the first round's best.

use crate::{Agent, DispatchMeasurement};

/// The second round's variants: the modes and the knob variants (`K1+K2` for a combination, `K`
/// for a single knob carried over) for `python3 -m kforge.optimize.dispatch --modes --knobs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeamRound {
    pub modes: Vec<String>,
    pub knobs: Vec<String>,
}

/// The most knobs combined (all their subsets of two or more are measured: 11 for 4).
pub const MAX_WIDTH: usize = 4;

/// The second round for the first round's measurement `m` with beam width `width` (2 to
/// [`MAX_WIDTH`]): the `width` knobs with the largest speedups above 1.0, every subset of two or
/// more of them, beside the first round's best variants (its winner, the knobs carried). `Err`
/// says why the search stops after the first round.
pub fn second_round(m: &DispatchMeasurement, width: usize) -> Result<BeamRound, String> {
    let prefix = format!("{}+", m.baseline);
    let mut helped: Vec<(&str, f64)> = m
        .modes
        .iter()
        .filter(|(v, t)| Agent::of_variant(v) == Agent::Inductor && t.speedup > 1.0)
        .filter_map(|(v, t)| v.strip_prefix(&prefix).filter(|k| !k.contains('+')).map(|k| (k, t.speedup)))
        .collect();
    helped.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    helped.truncate(width.clamp(2, MAX_WIDTH));
    if helped.len() < 2 {
        return Err(format!(
            "beam: stopped after round 1: {} knob(s) measured faster than {} alone, two are needed to combine",
            helped.len(),
            m.baseline
        ));
    }
    let singles: Vec<&str> = helped.iter().map(|(k, _)| *k).collect();
    let mut knobs: Vec<String> = combinations(&singles);
    knobs.extend(singles.iter().map(|k| k.to_string()));
    let winner_mode = (!m.fallback && Agent::of_variant(&m.winner) == Agent::Dispatch && m.winner != m.baseline)
        .then(|| m.winner.clone());
    Ok(BeamRound { modes: winner_mode.into_iter().collect(), knobs })
}

/// Every subset of two or more of `items`, larger first, each joined by `+` in `items`' order.
fn combinations(items: &[&str]) -> Vec<String> {
    let n = items.len();
    let mut subsets: Vec<Vec<&str>> = (1u32..(1 << n))
        .filter(|mask| mask.count_ones() >= 2)
        .map(|mask| (0..n).filter(|i| mask & (1 << i) != 0).map(|i| items[i]).collect())
        .collect();
    subsets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    subsets.into_iter().map(|s| s.join("+")).collect()
}

/// Whether the second round improved on the first: its winner is a combination.
pub fn improved(second: &DispatchMeasurement) -> bool {
    !second.fallback && second.winner.matches('+').count() >= 2
}

/// Why the beam stopped after its second round, which times the first round's winner again beside
/// the combinations and decides: where that winner did not hold up, the line says so (level-3
/// 010 on the H100: `max-autotune-no-cudagraphs` 1.048x in round 1, 0.978x in round 2).
pub fn stopped(first: &DispatchMeasurement, second: &DispatchMeasurement) -> String {
    let again = second.modes.get(&first.winner).filter(|_| first.winner != second.winner);
    match again {
        Some(t) => format!(
            "beam: round 2 found no combination beyond the first round's best, and timed round 1's winner {} \
             again at {:.3}x{}: the decision is {}",
            first.winner,
            t.speedup,
            if t.beyond_noise { "" } else { ", within noise" },
            second.winner
        ),
        None => format!("beam: round 2 found no combination beyond the first round's best ({})", second.winner),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ModeTiming;

    fn measured(winner: &str, speedups: &[(&str, f64)]) -> DispatchMeasurement {
        DispatchMeasurement {
            baseline: "max-autotune".into(),
            winner: winner.into(),
            fallback: winner == "max-autotune",
            noise_floor: Some(1.01),
            modes: speedups
                .iter()
                .map(|(v, s)| (v.to_string(), ModeTiming { speedup: *s, ci95: [*s, *s], beyond_noise: *s > 1.01 }))
                .collect(),
            prepared: Default::default(),
            rewrite: None,
            graphs: None,
            baseline_profile: None,
            duplicates: Default::default(),
            not_prepared: Vec::new(),
            rounds_cut: None,
            input_bytes: None,
        }
    }

    #[test]
    fn a_second_round_that_timed_round_1s_winner_again_says_how_it_held_up() {
        let first = measured("max-autotune-no-cudagraphs", &[("max-autotune-no-cudagraphs", 1.048)]);
        let second = measured("max-autotune", &[("max-autotune-no-cudagraphs", 0.978), ("max-autotune+a+b", 1.003)]);
        let why = stopped(&first, &second);
        assert!(
            why.contains("timed round 1's winner max-autotune-no-cudagraphs again at 0.978x, within noise: the decision is max-autotune"),
            "{why}"
        );
        let held = measured("max-autotune-no-cudagraphs", &[("max-autotune-no-cudagraphs", 1.05)]);
        assert_eq!(
            stopped(&first, &held),
            "beam: round 2 found no combination beyond the first round's best (max-autotune-no-cudagraphs)"
        );
    }

    #[test]
    fn the_knobs_that_helped_are_combined_beside_the_first_rounds_best() {
        let m = measured(
            "eager",
            &[
                ("eager", 1.2),
                ("max-autotune+freezing", 1.05),
                ("max-autotune+coordinate-descent", 1.10),
                ("max-autotune+no-epilogue-fusion", 0.97),
                ("max-autotune+aggressive-fusion", 1.002),
            ],
        );
        let r = second_round(&m, 2).unwrap();
        assert_eq!(r.modes, ["eager"], "the first round's winner, re-measured in the same rounds");
        assert_eq!(r.knobs, ["coordinate-descent+freezing", "coordinate-descent", "freezing"]);
        let wide = second_round(&m, 3).unwrap();
        assert_eq!(
            wide.knobs,
            [
                "coordinate-descent+freezing+aggressive-fusion",
                "coordinate-descent+freezing",
                "coordinate-descent+aggressive-fusion",
                "freezing+aggressive-fusion",
                "coordinate-descent",
                "freezing",
                "aggressive-fusion"
            ]
        );
        assert_eq!(second_round(&m, 99).unwrap().knobs.len(), 7, "the width is capped by the knobs that helped");
    }

    #[test]
    fn fewer_than_two_knobs_that_helped_stop_the_search_with_the_reason() {
        let m = measured(
            "max-autotune+freezing",
            &[("max-autotune+freezing", 1.3), ("max-autotune+coordinate-descent", 0.99)],
        );
        let why = second_round(&m, 4).unwrap_err();
        assert!(why.contains("1 knob(s) measured faster than max-autotune alone"), "{why}");
        let none = measured("max-autotune", &[("eager", 0.5)]);
        assert!(second_round(&none, 2).unwrap_err().contains("0 knob(s)"));
    }

    #[test]
    fn only_a_combination_winning_the_second_round_improves_on_the_first() {
        assert!(improved(&measured("max-autotune+freezing+coordinate-descent", &[])));
        assert!(!improved(&measured("max-autotune+freezing", &[])));
        assert!(!improved(&measured("max-autotune", &[])));
        assert_eq!(combinations(&["a", "b", "c", "d"]).len(), 11);
    }
}
