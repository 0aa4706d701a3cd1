//! Theodolite's search strategies over a (load × resource) grid, made stateless: a strategy
//! is a pure function from the results known so far to the next experiment to run, or to
//! "done". Replaying stored results (the resumable search Theodolite's future-work section
//! asks for) is then nothing more than asking again: every experiment already in the results
//! is answered from them, and the first one that is not is the next to run.
//!
//! Two metrics (Henning and Hasselbring, 2022):
//! - **demand**: for each load, the least resource amount that meets the SLOs;
//! - **capacity**: for each resource amount, the highest load that meets them.
//!
//! Strategies (each searches one row or column of the grid; the assumptions are Theodolite's):
//! - `full`: every experiment of the grid;
//! - `linear`: demand tries resources upwards and stops at the first pass; capacity tries
//!   loads upwards and stops at the first failure;
//! - `binary`: bisection over the same row or column, assuming monotonicity there;
//! - with `lower_bound` restriction, the search for a load starts at the demand of the next
//!   lower load (demand never decreases with load); for capacity, the search for a resource
//!   amount starts at the capacity of the next smaller amount (capacity never decreases with
//!   resources).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Which metric a search computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Metric {
    Demand,
    Capacity,
}

/// How each row (demand) or column (capacity) is searched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Strategy {
    Full,
    Linear,
    Binary,
}

/// A search: metric, strategy and whether the lower-bound restriction applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Search {
    pub metric: Metric,
    pub strategy: Strategy,
    #[serde(default)]
    pub lower_bound: bool,
}

/// An experiment: indexes into the load and resource dimensions (both sorted ascending).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Cell {
    pub load: usize,
    pub resource: usize,
}

/// Verdicts known so far, by cell.
pub type Verdicts = BTreeMap<Cell, bool>;

/// What the search needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Run this experiment and record its verdict.
    Run(Cell),
    /// Every experiment the strategy wants is known: the metric, per load (demand: the least
    /// passing resource index) or per resource (capacity: the highest passing load index).
    Done(Vec<Option<usize>>),
}

/// The outcome of searching one row or column.
enum Line {
    Need(usize),
    Found(Option<usize>),
}

impl Search {
    /// The next experiment to run given what is known, or the finished metric.
    pub fn next(&self, loads: usize, resources: usize, known: &Verdicts) -> Step {
        let (outer, inner) = match self.metric {
            Metric::Demand => (loads, resources),
            Metric::Capacity => (resources, loads),
        };
        let cell = |o: usize, i: usize| match self.metric {
            Metric::Demand => Cell {
                load: o,
                resource: i,
            },
            Metric::Capacity => Cell {
                load: i,
                resource: o,
            },
        };
        let mut metric = Vec::with_capacity(outer);
        // The restriction: where the previous row's answer says this one can start.
        let mut start = 0usize;
        let mut nothing_left = false;
        for o in 0..outer {
            if nothing_left {
                metric.push(None);
                continue;
            }
            let lo = if self.lower_bound { start } else { 0 };
            let verdict = |i: usize| known.get(&cell(o, i)).copied();
            let line = match (self.metric, self.strategy) {
                (_, Strategy::Full) => full(lo, inner, self.metric, &verdict),
                (Metric::Demand, Strategy::Linear) => first_pass(lo, inner, &verdict),
                (Metric::Capacity, Strategy::Linear) => last_pass_linear(lo, inner, &verdict),
                (Metric::Demand, Strategy::Binary) => first_pass_binary(lo, inner, &verdict),
                (Metric::Capacity, Strategy::Binary) => last_pass_binary(lo, inner, &verdict),
            };
            match line {
                Line::Need(i) => return Step::Run(cell(o, i)),
                Line::Found(found) => {
                    metric.push(found);
                    match (self.metric, found) {
                        (_, Some(i)) => start = i,
                        // Demand: no resource amount carries this load, so none carries more.
                        (Metric::Demand, None) => nothing_left = self.lower_bound,
                        // Capacity: not even the lowest load passes here; more resources may.
                        (Metric::Capacity, None) => {}
                    }
                }
            }
        }
        Step::Done(metric)
    }
}

/// Every cell from `lo`, then the metric read off the whole line.
fn full(lo: usize, n: usize, metric: Metric, verdict: &dyn Fn(usize) -> Option<bool>) -> Line {
    let mut passes = Vec::with_capacity(n);
    for i in lo..n {
        match verdict(i) {
            None => return Line::Need(i),
            Some(v) => passes.push((i, v)),
        }
    }
    Line::Found(match metric {
        Metric::Demand => passes.iter().find(|(_, v)| *v).map(|(i, _)| *i),
        // The highest load below the first failure: a pass above a failure is noise, not capacity.
        Metric::Capacity => passes
            .iter()
            .take_while(|(_, v)| *v)
            .last()
            .map(|(i, _)| *i),
    })
}

fn first_pass(lo: usize, n: usize, verdict: &dyn Fn(usize) -> Option<bool>) -> Line {
    for i in lo..n {
        match verdict(i) {
            None => return Line::Need(i),
            Some(true) => return Line::Found(Some(i)),
            Some(false) => {}
        }
    }
    Line::Found(None)
}

fn last_pass_linear(lo: usize, n: usize, verdict: &dyn Fn(usize) -> Option<bool>) -> Line {
    let mut best = None;
    for i in lo..n {
        match verdict(i) {
            None => return Line::Need(i),
            Some(true) => best = Some(i),
            Some(false) => break,
        }
    }
    Line::Found(best)
}

/// The least passing index in [lo, n), assuming fail…fail pass…pass.
fn first_pass_binary(lo: usize, n: usize, verdict: &dyn Fn(usize) -> Option<bool>) -> Line {
    let (mut a, mut b) = (lo, n); // answer in [a, b]; b = n means none
    while a < b {
        let m = a + (b - a) / 2;
        match verdict(m) {
            None => return Line::Need(m),
            Some(true) => b = m,
            Some(false) => a = m + 1,
        }
    }
    Line::Found((a < n).then_some(a))
}

/// The highest passing index in [lo, n), assuming pass…pass fail…fail; none if `lo` fails.
fn last_pass_binary(lo: usize, n: usize, verdict: &dyn Fn(usize) -> Option<bool>) -> Line {
    // Find the first failing index f in [lo, n]; the answer is f - 1 when f > lo.
    let (mut a, mut b) = (lo, n);
    while a < b {
        let m = a + (b - a) / 2;
        match verdict(m) {
            None => return Line::Need(m),
            Some(false) => b = m,
            Some(true) => a = m + 1,
        }
    }
    Line::Found((a > lo).then(|| a - 1))
}

/// Runs a search to the end against an oracle, returning the metric and the experiments run
/// in order. `known` starts with replayed results and grows.
pub fn run_to_end(
    search: &Search,
    loads: usize,
    resources: usize,
    known: &mut Verdicts,
    mut oracle: impl FnMut(Cell) -> bool,
) -> (Vec<Option<usize>>, Vec<Cell>) {
    let mut ran = Vec::new();
    loop {
        match search.next(loads, resources, known) {
            Step::Run(cell) => {
                let v = oracle(cell);
                known.insert(cell, v);
                ran.push(cell);
            }
            Step::Done(metric) => return (metric, ran),
        }
    }
}

#[cfg(test)]
#[path = "search_tests.rs"]
mod tests;
