//! Interleaved pairs: a scenario measured against its same-run baseline several times, the two
//! sides alternating which goes first, and the pair with the median fraction reported.
//!
//! Why: on the shared two-core machines the benchmark runs on, the cores' speed wanders by
//! about a tenth within seconds (a fixed CPU-bound loop timed eight times in a row took 0.74 to
//! 0.93 s of user time), and a side measured in a slow moment against one measured in a fast
//! moment moved a single pair's fraction by twenty points (docs/performance.md, "Fractions
//! from interleaved pairs"). The median of several pairs is the code's figure, not the moment's;
//! every pair's fraction stays in the note, so the spread is in the record too.

use std::cmp::Ordering;

use anyhow::Result;

use crate::report::Report;

/// One side of a pair: its rate, what the note says about it (its CPU split, its sizes), and
/// any further rows its scenario reports for it (herald's side only: its RSS, say).
#[derive(Debug, Clone, Default)]
pub(crate) struct Side {
    /// The rate the scenario compares (tasks/s).
    pub(crate) rate: f64,
    /// A clause for the note.
    pub(crate) note: String,
    /// Further rows: metric, value, target in words, whether it was met.
    pub(crate) rows: Vec<(String, f64, String, Option<bool>)>,
}

/// One measurement of herald and of its baseline, taken back to back.
#[derive(Debug, Clone)]
pub(crate) struct Pair {
    pub(crate) herald: Side,
    pub(crate) baseline: Side,
}

impl Pair {
    /// herald's rate over the baseline's (0 when the baseline measured nothing).
    pub(crate) fn fraction(&self) -> f64 {
        if self.baseline.rate > 0.0 {
            self.herald.rate / self.baseline.rate
        } else {
            0.0
        }
    }
}

/// Whether pair `i` (from 0) runs its baseline first: every other pair does, so a machine that
/// slows down or speeds up through the run favours neither side.
pub(crate) fn baseline_first(i: usize) -> bool {
    i.is_multiple_of(2)
}

/// Measures `count` pairs (at least one), alternating the order of the two sides.
pub(crate) async fn measure(
    count: usize,
    mut herald: impl AsyncFnMut() -> Result<Side>,
    mut baseline: impl AsyncFnMut() -> Result<Side>,
) -> Result<Vec<Pair>> {
    let mut pairs = Vec::with_capacity(count.max(1));
    for i in 0..count.max(1) {
        let (herald, baseline) = if baseline_first(i) {
            let b = baseline().await?;
            (herald().await?, b)
        } else {
            let h = herald().await?;
            (h, baseline().await?)
        };
        pairs.push(Pair { herald, baseline });
    }
    Ok(pairs)
}

/// The pair with the median fraction: the middle one of an odd count, the lower of the two
/// middle ones of an even count (so an even count never rounds a verdict up).
pub(crate) fn median(pairs: &[Pair]) -> Option<&Pair> {
    let mut sorted: Vec<&Pair> = pairs.iter().collect();
    sorted.sort_by(|a, b| {
        a.fraction()
            .partial_cmp(&b.fraction())
            .unwrap_or(Ordering::Equal)
    });
    sorted.get(sorted.len().saturating_sub(1) / 2).copied()
}

/// Adds the median pair's row (`metric`, passing at `target` of its baseline) and its herald
/// side's further rows, and a note naming every pair; `what` is the note's opening (`S1: 50000
/// tasks`). Returns the median pair's herald rate (0 without pairs).
pub(crate) fn add(
    report: &mut Report,
    scenario: &str,
    metric: &str,
    target: f64,
    what: &str,
    pairs: &[Pair],
) -> f64 {
    let Some(mid) = median(pairs) else {
        return 0.0;
    };
    report.add_vs(scenario, metric, mid.herald.rate, mid.baseline.rate, target);
    for (metric, value, target, pass) in &mid.herald.rows {
        report.add(scenario, metric, *value, target, *pass);
    }
    if pairs.len() > 1 {
        let fractions: Vec<f64> = pairs.iter().map(Pair::fraction).collect();
        let lowest = fractions.iter().copied().fold(f64::INFINITY, f64::min);
        let highest = fractions.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        report.add(
            scenario,
            &format!("fraction, lowest of {} pairs (%)", pairs.len()),
            lowest * 100.0,
            "",
            None,
        );
        report.add(
            scenario,
            &format!("fraction, highest of {} pairs (%)", pairs.len()),
            highest * 100.0,
            "",
            None,
        );
    }
    let each: Vec<String> = pairs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!(
                "pair {} ({} first): {:.0} against {:.0}, {:.0} %",
                i + 1,
                if baseline_first(i) {
                    "baseline"
                } else {
                    "herald"
                },
                p.herald.rate,
                p.baseline.rate,
                p.fraction() * 100.0
            )
        })
        .collect();
    report.note(format!(
        "{what}; the median pair: herald {}; baseline {}; {}",
        mid.herald.note,
        mid.baseline.note,
        each.join("; ")
    ));
    mid.herald.rate
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(herald: f64, baseline: f64) -> Pair {
        let side = |rate| Side {
            rate,
            ..Side::default()
        };
        Pair {
            herald: side(herald),
            baseline: side(baseline),
        }
    }

    #[test]
    fn the_median_pair_is_the_middle_fraction_whatever_the_order_measured() {
        let pairs = [pair(90.0, 100.0), pair(60.0, 100.0), pair(75.0, 100.0)];
        let mid = median(&pairs).map(Pair::fraction);
        assert_eq!(mid, Some(0.75));
    }

    #[test]
    fn an_even_count_takes_the_lower_middle_pair() {
        let pairs = [
            pair(90.0, 100.0),
            pair(60.0, 100.0),
            pair(85.0, 100.0),
            pair(75.0, 100.0),
        ];
        assert_eq!(median(&pairs).map(Pair::fraction), Some(0.75));
        assert!(median(&[]).is_none());
    }

    #[test]
    fn the_order_alternates_from_the_baseline() {
        let order: Vec<bool> = (0..4).map(baseline_first).collect();
        assert_eq!(order, [true, false, true, false]);
    }

    #[tokio::test]
    async fn pairs_run_in_alternating_order() {
        let log = std::cell::RefCell::new(Vec::new());
        let pairs = measure(
            3,
            async || {
                log.borrow_mut().push("herald");
                Ok(Side {
                    rate: 8.0,
                    ..Side::default()
                })
            },
            async || {
                log.borrow_mut().push("baseline");
                Ok(Side {
                    rate: 10.0,
                    ..Side::default()
                })
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            log.into_inner(),
            ["baseline", "herald", "herald", "baseline", "baseline", "herald"]
        );
        assert!(pairs.iter().all(|p| (p.fraction() - 0.8).abs() < 1e-9));
    }

    #[test]
    fn the_report_shows_the_median_pair_and_the_spread() {
        let mut report = Report::new(&crate::Options::quick());
        let pairs = [pair(90.0, 100.0), pair(60.0, 100.0), pair(75.0, 100.0)];
        let rate = add(&mut report, "S1 drain", "tasks/s", 0.8, "S1", &pairs);
        assert_eq!(rate, 75.0);
        let main = report
            .rows
            .iter()
            .find(|r| r.metric == "tasks/s")
            .map(|r| (r.value, r.baseline, r.pass));
        assert_eq!(main, Some((75.0, Some(100.0), Some(false))));
        let spread: Vec<f64> = report
            .rows
            .iter()
            .filter(|r| r.metric.starts_with("fraction, "))
            .map(|r| r.value)
            .collect();
        assert_eq!(spread, [60.0, 90.0]);
    }
}
