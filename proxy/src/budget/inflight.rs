//! Bytes in flight: the heavy lane's second bound, beside the bytes/s pool.
//! Pure: no clock, no I/O.
//!
//! The pool rations bytes per second; the apiserver pays for what it must
//! hold and encode at once (its memory and its garbage collector). A dozen
//! 33 MB LISTs admitted in the same second hurt the heartbeats far more than
//! the same dozen spread over a minute, though the pool sees the same bytes.
//! So a heavy request also takes its predicted bytes from an in-flight
//! budget, and gives them back when its response ends.
//!
//! - A request fits if its predicted bytes fit in what is left of the budget.
//! - A request larger than the whole budget could never fit: it runs only
//!   alone (nothing else heavy in flight), so it is slowed, never starved.
//! - Lowering the budget lets running requests finish; nothing new starts
//!   until the bytes in flight fall under the new budget.
//!
//! Invariant (property-tested): right after every acquisition, the bytes in
//! flight are at most the budget, or the request just admitted is alone.

/// The in-flight budget of the heavy lane.
#[derive(Debug, Clone)]
pub struct InflightBudget {
    budget: f64,
    used: f64,
    count: usize,
    /// Most bytes in flight since [`InflightBudget::take_window`].
    peak: f64,
    /// The largest request that found no room since
    /// [`InflightBudget::take_window`] (0: none).
    blocked: f64,
}

/// What the controller learns from one window of admissions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InflightWindow {
    /// Most bytes in flight during the window.
    pub peak: f64,
    /// The largest request that had to wait for room (0: none).
    pub blocked: f64,
}

impl InflightBudget {
    pub fn new(budget: f64) -> InflightBudget {
        InflightBudget {
            budget: budget.max(0.0),
            used: 0.0,
            count: 0,
            peak: 0.0,
            blocked: 0.0,
        }
    }

    pub fn budget(&self) -> f64 {
        self.budget
    }

    /// Predicted bytes of the requests in flight.
    pub fn used(&self) -> f64 {
        self.used
    }

    /// Requests in flight.
    pub fn count(&self) -> usize {
        self.count
    }

    /// A new budget (the controller, a reload, the relist guard).
    pub fn set_budget(&mut self, budget: f64) {
        self.budget = budget.max(0.0);
    }

    /// Would `bytes` be admitted now? Does not count as blocked.
    pub fn fits(&self, bytes: f64) -> bool {
        self.count == 0 || self.used + bytes <= self.budget
    }

    /// Take `bytes` if they fit; a refusal is noted for the controller
    /// (the budget was what held a request back).
    pub fn try_acquire(&mut self, bytes: f64) -> bool {
        if !self.fits(bytes) {
            self.blocked = self.blocked.max(bytes);
            return false;
        }
        self.force_acquire(bytes);
        true
    }

    /// Take `bytes` whatever the budget (dry run: counted, never refused).
    pub fn force_acquire(&mut self, bytes: f64) {
        self.used += bytes.max(0.0);
        self.count += 1;
        self.peak = self.peak.max(self.used);
    }

    /// A request that acquired `bytes` ended (or gave up its place).
    pub fn release(&mut self, bytes: f64) {
        self.count = self.count.saturating_sub(1);
        self.used = if self.count == 0 {
            // Float sums drift; an empty lane is exactly empty.
            0.0
        } else {
            (self.used - bytes.max(0.0)).max(0.0)
        };
    }

    /// The window since the last call: peak bytes and whether anyone was
    /// held back. The next window starts from what is in flight now.
    pub fn take_window(&mut self) -> InflightWindow {
        let w = InflightWindow {
            peak: self.peak,
            blocked: self.blocked,
        };
        self.peak = self.used;
        self.blocked = 0.0;
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MB: f64 = 1_000_000.0;

    #[test]
    fn bytes_in_flight_stay_within_the_budget() {
        let mut b = InflightBudget::new(100.0 * MB);
        assert!(b.try_acquire(40.0 * MB));
        assert!(b.try_acquire(60.0 * MB), "exactly full");
        assert!(!b.try_acquire(1.0), "no room");
        assert_eq!((b.used(), b.count()), (100.0 * MB, 2));
        b.release(40.0 * MB);
        assert!(b.fits(40.0 * MB) && !b.fits(41.0 * MB));
        assert_eq!(
            b.take_window(),
            InflightWindow {
                peak: 100.0 * MB,
                blocked: 1.0
            }
        );
        assert_eq!(
            b.take_window(),
            InflightWindow {
                peak: 60.0 * MB,
                blocked: 0.0
            },
            "a new window starts from what is in flight"
        );
    }

    #[test]
    fn an_oversized_request_runs_alone() {
        let mut b = InflightBudget::new(10.0 * MB);
        assert!(b.try_acquire(1.0 * MB));
        assert!(!b.try_acquire(33.0 * MB), "waits for the lane to empty");
        b.release(1.0 * MB);
        assert!(b.try_acquire(33.0 * MB), "alone");
        assert!(!b.try_acquire(1.0), "and nothing joins it");
        b.release(33.0 * MB);
        assert_eq!((b.used(), b.count()), (0.0, 0));
    }

    #[test]
    fn a_lowered_budget_lets_running_requests_finish() {
        let mut b = InflightBudget::new(100.0 * MB);
        for _ in 0..4 {
            assert!(b.try_acquire(20.0 * MB));
        }
        b.set_budget(30.0 * MB);
        assert!(!b.try_acquire(1.0 * MB));
        b.release(20.0 * MB);
        b.release(20.0 * MB);
        assert!(!b.try_acquire(1.0 * MB), "40 MB still in flight");
        b.release(20.0 * MB);
        assert!(b.try_acquire(10.0 * MB));
        assert_eq!(b.used(), 30.0 * MB);
    }

    proptest! {
        /// Whatever arrives, leaves and however the budget moves, every
        /// acquisition leaves the bytes in flight within the budget unless
        /// the request is alone; an empty lane always admits.
        #[test]
        fn in_flight_bytes_never_pass_the_budget_but_for_one_alone(
            ops in proptest::collection::vec((0u8..4, 0.0f64..200.0), 1..400),
        ) {
            let mut b = InflightBudget::new(50.0);
            let mut running: Vec<f64> = Vec::new();
            for (op, x) in ops {
                match op {
                    0 | 1 => {
                        let empty = running.is_empty();
                        if b.try_acquire(x) {
                            running.push(x);
                            prop_assert!(b.used() <= b.budget() + 1e-9 || running.len() == 1,
                                "{} in flight > budget {}", b.used(), b.budget());
                        } else {
                            prop_assert!(!empty, "an empty lane refused {x}");
                        }
                    }
                    2 => {
                        if !running.is_empty() {
                            let i = (x as usize) % running.len();
                            b.release(running.swap_remove(i));
                        }
                    }
                    _ => b.set_budget(x),
                }
                let sum: f64 = running.iter().sum();
                prop_assert!((b.used() - sum).abs() < 1e-6);
                prop_assert_eq!(b.count(), running.len());
            }
        }
    }
}
