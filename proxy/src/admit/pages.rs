//! Lists in progress: a client that was admitted a page of a LIST (`limit`)
//! gets the pages after it (`continue`) admitted at once, so it is never
//! stranded in the middle of a list. kubectl got its first page, then a 429
//! with `Retry-After: 53` on the second and hung silently for 53 s; what the
//! apiserver had done for the first page was wasted, and the retry started
//! the list over (the continue token may expire meanwhile).
//!
//! A list is known by its lineage: the flow (client) and the resource and
//! scope it reads. A page admitted the ordinary way starts (or refreshes) a
//! lineage with an allowance: the cost of reading the resource's whole state
//! once, at least [`MIN_PAGES`] of its own pages. Each continue page of the
//! lineage within [`PAGE_GAP`] of the last one takes its cost from the
//! allowance and is admitted; once the allowance is spent (a client that
//! sends continue tokens forever), or the gap passed, its pages wait their
//! turn like any other request. So what continuations add to the
//! apiserver's load is bounded by one whole read per list in progress, and
//! the number of lineages by [`CAPACITY`].
//!
//! Pure: time passed in, no I/O; one bounded map.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// How long after its last page a list's next page keeps the priority:
/// kubectl asks for the next page as soon as one is read.
pub const PAGE_GAP: Duration = Duration::from_secs(30);

/// Lists in progress remembered at most; past it the stalest is forgotten.
pub const CAPACITY: usize = 4096;

/// An allowance is at least this many pages of the admitting page's cost.
pub const MIN_PAGES: f64 = 4.0;

/// A list's lineage: flow name, resource and scope (`cluster`, `namespace`).
pub type Lineage = (String, String, &'static str);

#[derive(Debug, Clone, Copy)]
struct InProgress {
    last: Instant,
    /// Bytes of cost its continue pages may still be admitted for at once.
    allowance: f64,
}

/// Lists in progress, by lineage.
#[derive(Debug, Default)]
pub struct Pages {
    lists: HashMap<Lineage, InProgress>,
}

impl Pages {
    /// A page of `lineage` costing `page_cost` was admitted the ordinary way
    /// at `now`; reading the resource's whole state costs `whole_cost`.
    pub fn admitted(&mut self, lineage: Lineage, page_cost: f64, whole_cost: f64, now: Instant) {
        let allowance = whole_cost.max(MIN_PAGES * page_cost).max(0.0);
        if !self.lists.contains_key(&lineage) && self.lists.len() >= CAPACITY {
            self.forget_stale(now);
        }
        let e = self.lists.entry(lineage).or_insert(InProgress {
            last: now,
            allowance,
        });
        e.last = now;
        e.allowance = e.allowance.max(allowance);
    }

    /// May a continue page of `lineage` costing `cost` go at once? If so its
    /// cost is taken from the list's allowance.
    pub fn take(&mut self, lineage: &Lineage, cost: f64, now: Instant) -> bool {
        let Some(e) = self.lists.get_mut(lineage) else {
            return false;
        };
        if now.saturating_duration_since(e.last) > PAGE_GAP {
            self.lists.remove(lineage);
            return false;
        }
        if e.allowance < cost {
            return false;
        }
        e.allowance -= cost;
        e.last = now;
        true
    }

    pub fn len(&self) -> usize {
        self.lists.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lists.is_empty()
    }

    /// Drop lists past their gap; if none was, the stalest one.
    fn forget_stale(&mut self, now: Instant) {
        let before = self.lists.len();
        self.lists
            .retain(|_, e| now.saturating_duration_since(e.last) <= PAGE_GAP);
        if self.lists.len() < before {
            return;
        }
        let stalest = self
            .lists
            .iter()
            .min_by_key(|(_, e)| e.last)
            .map(|(k, _)| k.clone());
        if let Some(k) = stalest {
            self.lists.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lineage(flow: &str) -> Lineage {
        (flow.to_string(), "pods".to_string(), "cluster")
    }

    #[test]
    fn continue_pages_of_an_admitted_list_go_until_the_whole_is_read() {
        let t0 = Instant::now();
        let mut p = Pages::default();
        assert!(!p.take(&lineage("a"), 1.0, t0), "no list in progress");
        // A 3 MB first page of a 12 MB resource.
        p.admitted(lineage("a"), 3e6, 12e6, t0);
        assert!(!p.take(&lineage("b"), 3e6, t0), "another client's list");
        let mut now = t0;
        for _ in 0..4 {
            now += Duration::from_secs(1);
            assert!(p.take(&lineage("a"), 3e6, now));
        }
        assert!(!p.take(&lineage("a"), 3e6, now), "the whole was read");
    }

    #[test]
    fn a_list_left_longer_than_the_gap_is_forgotten() {
        let t0 = Instant::now();
        let mut p = Pages::default();
        p.admitted(lineage("a"), 1e6, 10e6, t0);
        assert!(p.take(&lineage("a"), 1e6, t0 + PAGE_GAP));
        let late = t0 + PAGE_GAP * 2 + Duration::from_millis(1);
        assert!(!p.take(&lineage("a"), 1e6, late));
        assert!(p.is_empty());
    }

    #[test]
    fn small_resources_still_allow_a_few_pages() {
        let t0 = Instant::now();
        let mut p = Pages::default();
        p.admitted(lineage("a"), 1e6, 0.0, t0);
        let taken = (0..10).filter(|_| p.take(&lineage("a"), 1e6, t0)).count();
        assert_eq!(taken, MIN_PAGES as usize);
    }

    proptest! {
        /// Never more lists than the bound, and a continue page never goes
        /// past what its list was allowed.
        #[test]
        fn bounded_and_never_over_the_allowance(
            ops in prop::collection::vec((0u16..6000, 0u64..100, 1.0f64..5e6, any::<bool>()), 1..400)
        ) {
            let t0 = Instant::now();
            let mut p = Pages::default();
            let mut allowed: HashMap<String, f64> = HashMap::new();
            let mut taken: HashMap<String, f64> = HashMap::new();
            for (flow, secs, cost, start) in ops {
                let now = t0 + Duration::from_secs(secs);
                let flow = flow.to_string();
                if start {
                    p.admitted(lineage(&flow), cost, 4.0 * cost, now);
                    *allowed.entry(flow).or_default() += 4.0 * cost;
                } else if p.take(&lineage(&flow), cost, now) {
                    *taken.entry(flow).or_default() += cost;
                }
                prop_assert!(p.len() <= CAPACITY);
            }
            for (flow, t) in taken {
                prop_assert!(t <= allowed.get(&flow).copied().unwrap_or(0.0) + 1e-6);
            }
        }
    }
}
