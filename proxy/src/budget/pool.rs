//! The byte-cost quota pool: a token bucket of bytes that may go into debt.
//! Pure: time is passed in.
//!
//! - Heavy requests are debited their predicted cost when admitted.
//! - It refills at `rate` bytes/s up to `burst`.
//! - When a response ends, the debit is reconciled with the actual cost:
//!   a refund if it cost less, more debt if it cost more; so prediction
//!   errors do not accumulate and the long-run admitted bytes follow `rate`.
//! - A request costing more than the burst could never fit: it is admitted
//!   when the pool is full and leaves it in debt (large LISTs stay
//!   possible, just rare).
//!
//! Invariant (property-tested): over any interval of length `T`, debits
//! total at most `rate·T + max(burst, largest cost)`.

use std::time::Duration;

use tokio::time::Instant;

/// The pool.
#[derive(Debug, Clone)]
pub struct QuotaPool {
    rate: f64,
    burst: f64,
    /// Bytes available now; negative is debt.
    level: f64,
    last: Instant,
}

impl QuotaPool {
    /// A full pool.
    pub fn new(rate: f64, burst: f64, now: Instant) -> QuotaPool {
        QuotaPool {
            rate: rate.max(f64::MIN_POSITIVE),
            burst: burst.max(0.0),
            level: burst.max(0.0),
            last: now,
        }
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    pub fn burst(&self) -> f64 {
        self.burst
    }

    /// Bytes available at `now` (negative: debt).
    pub fn level(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.level
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        if dt > 0.0 {
            self.level = (self.level + dt * self.rate).min(self.burst);
        }
        self.last = self.last.max(now);
    }

    /// New rate and burst (a reload, cluster scaling, the relist guard):
    /// time so far refills at the old rate; the level is kept (capped at the
    /// new burst), so a reload neither forgives debt nor hands out a burst
    /// beyond what the old rate earned since the last refresh.
    pub fn set_limits(&mut self, rate: f64, burst: f64, now: Instant) {
        // Refilled up to the new burst, not the old: a burst that grows a
        // little at every refresh (the relist guard's ramp) must not leave a
        // full pool forever just short of full, where a request larger than
        // the burst would never be admitted.
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.level += dt * self.rate;
        self.last = self.last.max(now);
        self.rate = rate.max(f64::MIN_POSITIVE);
        self.burst = burst.max(0.0);
        self.level = self.level.min(self.burst);
    }

    /// Lower the level to at most `cap` (the relist guard's start: the
    /// stored burst must not be handed out at once).
    pub fn cap_level(&mut self, cap: f64, now: Instant) {
        self.refill(now);
        self.level = self.level.min(cap);
    }

    /// Can `cost` be admitted now? It fits, or it can never fit and the
    /// pool is full.
    pub fn can_admit(&mut self, cost: f64, now: Instant) -> bool {
        self.refill(now);
        self.fits(cost)
    }

    fn fits(&self, cost: f64) -> bool {
        cost <= self.level || (cost > self.burst && self.level >= self.burst)
    }

    /// Debit `cost` if it can be admitted now.
    pub fn try_debit(&mut self, cost: f64, now: Instant) -> bool {
        if self.can_admit(cost, now) {
            self.level -= cost;
            true
        } else {
            false
        }
    }

    /// Debit `cost` whatever the level (dry run: a request that would have
    /// waited in its queue is still served later, from the same pool).
    pub fn force_debit(&mut self, cost: f64, now: Instant) {
        self.refill(now);
        self.level -= cost;
    }

    /// Settle a debit of `debited` whose actual cost was `actual`: the
    /// difference is refunded (up to the burst) or added as debt.
    pub fn reconcile(&mut self, debited: f64, actual: f64, now: Instant) {
        self.refill(now);
        self.level = (self.level + debited - actual).min(self.burst);
    }

    /// Return a debit that was never used (the client went away while queued).
    pub fn refund(&mut self, debited: f64, now: Instant) {
        self.reconcile(debited, 0.0, now);
    }

    /// How long until `cost` can be admitted, if nothing else is debited:
    /// the refill time for that cost (for an oversized one, until full).
    pub fn time_until(&mut self, cost: f64, now: Instant) -> Duration {
        self.refill(now);
        if self.fits(cost) {
            return Duration::ZERO;
        }
        let need = cost.min(self.burst) - self.level;
        Duration::from_secs_f64((need / self.rate).clamp(0.0, 1e9))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MB: f64 = 1_000_000.0;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn debits_refills_and_reconciles() {
        let t0 = Instant::now();
        let mut p = QuotaPool::new(10.0 * MB, 20.0 * MB, t0);
        assert!(p.try_debit(15.0 * MB, t0));
        assert!(!p.try_debit(10.0 * MB, t0), "5 MB left");
        assert_eq!(p.time_until(10.0 * MB, t0), secs(0.5));
        assert!(p.try_debit(10.0 * MB, t0 + secs(0.5)));
        assert_eq!(p.level(t0 + secs(0.5)), 0.0);
        // It cost 4 MB, not 10: 6 MB back.
        p.reconcile(10.0 * MB, 4.0 * MB, t0 + secs(0.5));
        assert_eq!(p.level(t0 + secs(0.5)), 6.0 * MB);
        // It cost 9 MB more than predicted: debt.
        p.reconcile(1.0 * MB, 10.0 * MB, t0 + secs(0.5));
        assert_eq!(p.level(t0 + secs(0.5)), -3.0 * MB);
        // Refill stops at the burst, refunds too.
        assert_eq!(p.level(t0 + secs(100.0)), 20.0 * MB);
        p.refund(5.0 * MB, t0 + secs(100.0));
        assert_eq!(p.level(t0 + secs(100.0)), 20.0 * MB);
    }

    #[test]
    fn oversized_requests_wait_for_a_full_pool_then_go_into_debt() {
        let t0 = Instant::now();
        let mut p = QuotaPool::new(10.0 * MB, 20.0 * MB, t0);
        assert!(p.try_debit(1.0 * MB, t0));
        assert!(!p.can_admit(50.0 * MB, t0));
        assert_eq!(p.time_until(50.0 * MB, t0), secs(0.1), "until full");
        assert!(p.try_debit(50.0 * MB, t0 + secs(0.1)));
        assert_eq!(p.level(t0 + secs(0.1)), -30.0 * MB);
        assert_eq!(p.time_until(1.0 * MB, t0 + secs(0.1)), secs(3.1));
    }

    #[test]
    fn new_limits_keep_the_level_and_debt() {
        let t0 = Instant::now();
        let mut p = QuotaPool::new(10.0 * MB, 20.0 * MB, t0);
        p.force_debit(30.0 * MB, t0);
        p.set_limits(1.0 * MB, 5.0 * MB, t0 + secs(1.0));
        assert_eq!(p.level(t0 + secs(1.0)), 0.0, "refilled at the old rate");
        assert_eq!(p.level(t0 + secs(11.0)), 5.0 * MB, "new rate, new burst");
        p.cap_level(1.0 * MB, t0 + secs(11.0));
        assert_eq!(p.level(t0 + secs(11.0)), 1.0 * MB);
    }

    #[test]
    fn a_burst_growing_at_every_refresh_still_admits_an_oversized_request() {
        let t0 = Instant::now();
        let mut p = QuotaPool::new(1.0 * MB, 1.0 * MB, t0);
        let mut now = t0;
        for i in 1..=5 {
            now += Duration::from_millis(1);
            p.set_limits(1.0 * MB, 1.0 * MB * (1.0 + i as f64 * 1e-6), now);
        }
        assert!(
            p.try_debit(3.0 * MB, now),
            "full: the oversized request goes"
        );
    }

    proptest! {
        /// Whatever arrives when, debits over the run never exceed
        /// rate·T + max(burst, largest cost).
        #[test]
        fn never_admits_more_than_rate_times_time_plus_burst(
            rate in 1.0e3f64..1.0e8,
            burst_factor in 0.01f64..10.0,
            steps in proptest::collection::vec((0u64..2_000, 0.0f64..3.0), 1..300),
        ) {
            let burst = rate * burst_factor;
            let t0 = Instant::now();
            let mut p = QuotaPool::new(rate, burst, t0);
            let mut now = t0;
            let mut admitted = 0.0;
            let mut largest = 0.0f64;
            for (ms, cost_factor) in steps {
                now += Duration::from_millis(ms);
                let cost = burst * cost_factor;
                if p.try_debit(cost, now) {
                    admitted += cost;
                    largest = largest.max(cost);
                }
                let elapsed = now.duration_since(t0).as_secs_f64();
                let bound = rate * elapsed + burst.max(largest);
                prop_assert!(admitted <= bound * (1.0 + 1e-9) + 1e-6,
                    "admitted {admitted} > {bound}");
            }
        }

        /// Saturated demand with any mix of prediction errors (predictions
        /// from a fifth to five times the actual cost, requests taking up
        /// to a second): with reconciliation, the actual bytes served
        /// over a long run stay within 5% of the rate.
        #[test]
        fn reconciliation_keeps_long_run_bytes_at_the_rate(
            seed in any::<u64>(),
            over_predict in 0.2f64..5.0,
            spread in 0.0f64..1.0,
        ) {
            let rate = 10.0 * MB;
            let burst = 40.0 * MB;
            let t0 = Instant::now();
            let mut p = QuotaPool::new(rate, burst, t0);
            let mut rng = seed | 1;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                (rng >> 11) as f64 / (1u64 << 53) as f64
            };
            // (finishes at, debited, actual)
            let mut running: Vec<(Instant, f64, f64)> = Vec::new();
            let mut served = 0.0;
            let step = Duration::from_millis(10);
            let run = Duration::from_secs(600);
            let mut now = t0;
            // The next request, always waiting (saturated demand).
            let mut want = (1.0 * MB, 1.0 * MB);
            while now < t0 + run {
                now += step;
                running.retain(|&(end, debited, actual)| {
                    if end <= now {
                        p.reconcile(debited, actual, now);
                        served += actual;
                        false
                    } else {
                        true
                    }
                });
                while p.try_debit(want.0, now) {
                    let duration = Duration::from_secs_f64(next());
                    running.push((now + duration, want.0, want.1));
                    let actual = MB * (0.1 + 4.0 * next());
                    let error = over_predict * (1.0 + spread * (next() - 0.5));
                    want = (actual * error, actual);
                }
            }
            let expected = rate * run.as_secs_f64();
            let ratio = served / expected;
            prop_assert!((0.95..=1.05).contains(&ratio), "served {ratio:.3} of the rate");
        }
    }
}
