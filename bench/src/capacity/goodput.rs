//! Goodput: the LISTs a run served, not the LISTs it was offered (issue 16).
//!
//! Straight to the apiserver, an experiment within its SLOs served about what it was offered,
//! so Theodolite's capacity (the highest offered load within the SLOs) measures the control
//! plane. Through tollgate it does not: tollgate answers the excess with 429s, which cost the
//! control plane nothing, so a load whose LISTs nearly all got 429 passes and the "capacity"
//! grows with the grid. With tollgate in front the capacity search therefore maximises the
//! goodput — LISTs answered 2xx per minute — over the experiments within the SLOs, and reports
//! the offered load it was reached at beside it.
//!
//! The search itself still bisects pass/fail along the load (the SLOs stay monotone there);
//! only the point read off a column changes. Through tollgate, goodput rises with the offered
//! load until the budget is used, so the highest passing load the search finds is where the
//! goodput is too — but not always (longer waits, timeouts), hence the maximum over every
//! passing experiment the search ran at or below it.

use serde::{Deserialize, Serialize};

use super::execution::Execution;
use super::slo::{ok_per_minute, OperationSummary, Summary};

/// What a capacity search maximises.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Objective {
    /// The offered load (Theodolite's capacity): the default of files written before goodput.
    #[default]
    OfferedLoad,
    /// LISTs served per minute.
    Goodput,
}

impl Objective {
    /// Goodput when tollgate is in front (it can refuse load), the offered load otherwise.
    pub fn of(exec: &Execution) -> Objective {
        if exec.sut.tollgate.is_some() {
            Objective::Goodput
        } else {
            Objective::OfferedLoad
        }
    }
}

/// What one run served.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Served {
    /// LISTs answered 2xx per minute of the run's schedule.
    #[serde(rename = "listsServedPerMinute")]
    pub lists_per_minute: f64,
    /// Body bytes of the LIST answers (loadgen's `bytes` of its LIST operations; the few
    /// hundred bytes of each 429 Status body are in it too).
    #[serde(rename = "servedBytes")]
    pub bytes: u64,
}

impl Served {
    /// From loadgen's summary: its operations whose verb is a LIST (`LIST`, `LIST(rv=0)`,
    /// `LIST(exact)`), or named `list` where loadgen wrote no verb.
    pub fn of(summary: &Summary) -> Served {
        let lists: Vec<&OperationSummary> = summary
            .operations
            .iter()
            .filter(|o| {
                if o.verb.is_empty() {
                    o.name == "list"
                } else {
                    o.verb.starts_with("LIST")
                }
            })
            .collect();
        Served {
            lists_per_minute: ok_per_minute(&lists, summary.duration_s),
            bytes: lists.iter().map(|o| o.bytes).sum(),
        }
    }

    /// What every repetition served at least (a capacity must hold every time, as a
    /// verdict does): the repetition with the least goodput.
    pub fn least(reps: impl IntoIterator<Item = Served>) -> Option<Served> {
        reps.into_iter()
            .min_by(|a, b| a.lists_per_minute.total_cmp(&b.lists_per_minute))
    }
}

/// The load index a capacity column reports: with [`Objective::OfferedLoad`] the search's
/// capacity itself; with [`Objective::Goodput`] the passing experiment at or below it with the
/// most LISTs served (the lower load on a tie: the same goodput for less offered), or the
/// capacity when no experiment there recorded what it served (results written before goodput).
/// `cell(i)` is load index `i`'s verdict and what it served, if it ran.
pub fn chosen(
    objective: Objective,
    capacity: Option<usize>,
    cell: impl Fn(usize) -> Option<(bool, Option<Served>)>,
) -> Option<usize> {
    let top = capacity?;
    if objective == Objective::OfferedLoad {
        return Some(top);
    }
    let mut best: Option<(usize, f64)> = None;
    for i in 0..=top {
        if let Some((true, Some(s))) = cell(i) {
            if best.is_none_or(|(_, g)| s.lists_per_minute > g) {
                best = Some((i, s.lists_per_minute));
            }
        }
    }
    Some(best.map_or(top, |(i, _)| i))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(name: &str, verb: &str, codes: &[(&str, u64)], bytes: u64) -> OperationSummary {
        let mut o = OperationSummary {
            name: name.into(),
            verb: verb.into(),
            bytes,
            ..Default::default()
        };
        for (c, n) in codes {
            o.status_codes.insert((*c).into(), *n);
        }
        o
    }

    #[test]
    fn served_counts_2xx_lists_only() {
        let s = Summary {
            duration_s: 30.0,
            interrupted: false,
            operations: vec![
                op("list", "LIST", &[("200", 10), ("429", 90)], 5_000),
                op("watch-list", "LIST(rv=0)", &[("200", 2)], 100),
                op("patch", "PATCH", &[("200", 3000)], 9_999_999),
            ],
        };
        let got = Served::of(&s);
        assert_eq!(got.lists_per_minute, 24.0);
        assert_eq!(got.bytes, 5_100);
        // Older summaries without verbs: the operation named `list`.
        let s = Summary {
            operations: vec![op("list", "", &[("200", 6)], 7), op("get", "", &[], 1)],
            ..s
        };
        assert_eq!(Served::of(&s).lists_per_minute, 12.0);
        assert_eq!(Served::of(&s).bytes, 7);
    }

    fn served(g: f64) -> Option<Served> {
        Some(Served {
            lists_per_minute: g,
            bytes: g as u64,
        })
    }

    #[test]
    fn goodput_picks_the_passing_cell_with_the_most_served() {
        // Loads 0..4: all pass up to 3 (the capacity), goodput peaks at 1, 4 is past a failure.
        let cells = [
            Some((true, served(10.0))),
            Some((true, served(30.0))),
            None,
            Some((true, served(20.0))),
            Some((true, served(99.0))),
        ];
        let cell = |i: usize| cells.get(i).copied().flatten();
        assert_eq!(chosen(Objective::Goodput, Some(3), cell), Some(1));
        assert_eq!(chosen(Objective::OfferedLoad, Some(3), cell), Some(3));
        assert_eq!(chosen(Objective::Goodput, None, cell), None);
        // A failing cell never wins, however much it served; ties go to the lower load.
        let cells = [
            Some((true, served(30.0))),
            Some((false, served(50.0))),
            Some((true, served(30.0))),
        ];
        let cell = |i: usize| cells.get(i).copied().flatten();
        assert_eq!(chosen(Objective::Goodput, Some(2), cell), Some(0));
        // Records without goodput: the capacity itself.
        let cell = |_: usize| Some((true, None));
        assert_eq!(chosen(Objective::Goodput, Some(2), cell), Some(2));
    }

    #[test]
    fn the_least_repetition_counts() {
        let reps = [served(30.0), served(12.0), served(40.0)];
        assert_eq!(
            Served::least(reps.into_iter().flatten()).map(|s| s.lists_per_minute),
            Some(12.0)
        );
        assert_eq!(Served::least([]), None);
    }
}
