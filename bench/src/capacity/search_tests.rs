use rand::{Rng, SeedableRng};

use super::*;

/// A monotone SLO oracle: resource amount r carries loads 0..=cap[r] (cap None: no load at
/// all), and cap never decreases with r — what every strategy assumes.
struct Oracle {
    cap: Vec<Option<usize>>,
    loads: usize,
}

impl Oracle {
    fn random(rng: &mut impl Rng, loads: usize, resources: usize) -> Self {
        let mut cap = Vec::with_capacity(resources);
        // -1 stands for "none"; steps up by random amounts, edges included.
        let mut c: i64 = rng.random_range(-1..loads as i64);
        for _ in 0..resources {
            cap.push((c >= 0).then_some(c as usize));
            if rng.random_bool(0.5) {
                c = (c + rng.random_range(0..=loads as i64)).min(loads as i64 - 1);
            }
        }
        Oracle { cap, loads }
    }
    fn pass(&self, cell: Cell) -> bool {
        self.cap[cell.resource].is_some_and(|c| cell.load <= c)
    }
    fn capacity(&self) -> Vec<Option<usize>> {
        self.cap.clone()
    }
    fn demand(&self) -> Vec<Option<usize>> {
        (0..self.loads)
            .map(|l| self.cap.iter().position(|c| c.is_some_and(|c| l <= c)))
            .collect()
    }
}

const STRATEGIES: [Strategy; 3] = [Strategy::Full, Strategy::Linear, Strategy::Binary];

fn searches(metric: Metric) -> impl Iterator<Item = Search> {
    STRATEGIES.into_iter().flat_map(move |strategy| {
        [false, true].into_iter().map(move |lower_bound| Search {
            metric,
            strategy,
            lower_bound,
        })
    })
}

#[test]
fn every_strategy_finds_what_the_full_search_finds_on_monotone_oracles() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for case in 0..3000 {
        let loads = rng.random_range(1..9);
        let resources = rng.random_range(1..9);
        let oracle = Oracle::random(&mut rng, loads, resources);
        for metric in [Metric::Demand, Metric::Capacity] {
            let full = Search {
                metric,
                strategy: Strategy::Full,
                lower_bound: false,
            };
            let (reference, full_ran) =
                run_to_end(&full, loads, resources, &mut Verdicts::new(), |c| {
                    oracle.pass(c)
                });
            assert_eq!(full_ran.len(), loads * resources, "full runs the grid");
            let truth = match metric {
                Metric::Demand => oracle.demand(),
                Metric::Capacity => oracle.capacity(),
            };
            assert_eq!(reference, truth, "case {case}: full search vs the oracle");
            for search in searches(metric) {
                let (found, ran) =
                    run_to_end(&search, loads, resources, &mut Verdicts::new(), |c| {
                        oracle.pass(c)
                    });
                assert_eq!(
                    found, reference,
                    "case {case}: {search:?} on caps {:?}",
                    oracle.cap
                );
                let mut unique = ran.clone();
                unique.sort();
                unique.dedup();
                assert_eq!(unique.len(), ran.len(), "{search:?} repeated an experiment");
                assert!(ran.len() <= loads * resources);
            }
        }
    }
}

#[test]
fn cheaper_strategies_run_fewer_experiments_on_a_large_grid() {
    // 20 loads × 20 resources, capacity rising one load per resource step.
    let oracle = Oracle {
        cap: (0..20).map(Some).collect(),
        loads: 20,
    };
    let count = |search: Search| {
        run_to_end(&search, 20, 20, &mut Verdicts::new(), |c| oracle.pass(c))
            .1
            .len()
    };
    let full = count(Search {
        metric: Metric::Demand,
        strategy: Strategy::Full,
        lower_bound: false,
    });
    let linear = count(Search {
        metric: Metric::Demand,
        strategy: Strategy::Linear,
        lower_bound: false,
    });
    let binary = count(Search {
        metric: Metric::Demand,
        strategy: Strategy::Binary,
        lower_bound: false,
    });
    let linear_lb = count(Search {
        metric: Metric::Demand,
        strategy: Strategy::Linear,
        lower_bound: true,
    });
    assert_eq!(full, 400);
    assert_eq!(
        linear,
        (1..=20).sum::<usize>(),
        "demand of load l is resource l"
    );
    assert!(binary < linear, "binary {binary} vs linear {linear}");
    // The restriction starts each load at the previous demand: two experiments per load, one at load 0.
    assert_eq!(linear_lb, 1 + 2 * 19);
}

#[test]
fn replay_after_an_interruption_repeats_nothing() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for _ in 0..500 {
        let (loads, resources) = (rng.random_range(1..8), rng.random_range(1..8));
        let oracle = Oracle::random(&mut rng, loads, resources);
        for metric in [Metric::Demand, Metric::Capacity] {
            for search in searches(metric) {
                let (whole, whole_ran) =
                    run_to_end(&search, loads, resources, &mut Verdicts::new(), |c| {
                        oracle.pass(c)
                    });
                let cut = rng.random_range(0..=whole_ran.len());
                // The stored results of a run killed after `cut` experiments.
                let mut stored: Verdicts = whole_ran[..cut]
                    .iter()
                    .map(|&c| (c, oracle.pass(c)))
                    .collect();
                let (resumed, resumed_ran) =
                    run_to_end(&search, loads, resources, &mut stored, |c| oracle.pass(c));
                assert_eq!(resumed, whole);
                assert_eq!(resumed_ran, whole_ran[cut..].to_vec(), "{search:?}");
            }
        }
    }
}

#[test]
fn edges_of_the_grid() {
    // Nothing passes anywhere; everything passes everywhere; one cell.
    for (cap, loads, resources) in [
        (vec![None, None, None], 4, 3),
        (vec![Some(3), Some(3), Some(3)], 4, 3),
        (vec![Some(0)], 1, 1),
        (vec![None], 1, 1),
    ] {
        let oracle = Oracle { cap, loads };
        for metric in [Metric::Demand, Metric::Capacity] {
            let truth = match metric {
                Metric::Demand => oracle.demand(),
                Metric::Capacity => oracle.capacity(),
            };
            for search in searches(metric) {
                let (found, _) = run_to_end(&search, loads, resources, &mut Verdicts::new(), |c| {
                    oracle.pass(c)
                });
                assert_eq!(found, truth, "{search:?} on {:?}", oracle.cap);
            }
        }
    }
}
