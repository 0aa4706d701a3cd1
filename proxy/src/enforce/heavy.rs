//! The heavy lane's state, pure with time passed in: heavy requests take
//! their predicted cost from the quota pool and an in-flight slot at once if
//! nobody waits, else wait in their flow's queue (deficit round robin) for
//! the dispatcher, which serves the entry it chose first (nobody overtakes
//! it). The pool's rate and burst follow the cluster size and the relist
//! guard's ramp. Everything admission accounts for heavy requests is here,
//! in one place, behind admission's one lock.

use std::time::Duration;

use tokio::time::Instant;

use super::drr::FairQueue;
use super::guard::RelistGuard;
use super::lane::Lane;
use super::pool::QuotaPool;
use super::scaling;
use super::settings::{AdmissionSettings, ScalingMode};

/// The heavy lane: the quota pool, the fair queues with the entry chosen
/// next, the in-flight count, the relist guard and the cluster size the pool
/// scales by. `W` is what a waiter holds to be told it was admitted.
#[derive(Debug)]
pub struct HeavyLane<W> {
    pub pool: QuotaPool,
    pub queue: FairQueue<String, W>,
    /// The entry deficit round robin chose, waiting for the pool: nobody
    /// overtakes it (that is what bounds another flow's wait).
    pub staged: Option<(String, f64, W)>,
    pub inflight: usize,
    pub guard: RelistGuard,
    pub nodes: Option<f64>,
    pub containers: Option<f64>,
}

impl<W> HeavyLane<W> {
    /// Empty queues and a full pool of `s.quota`'s base size.
    pub fn new(s: AdmissionSettings<'_>, now: Instant) -> HeavyLane<W> {
        let q = s.quota;
        HeavyLane {
            pool: QuotaPool::new(q.bytes_per_second, q.burst_bytes, now),
            queue: FairQueue::new(
                q.queue.quantum_bytes,
                q.queue.per_flow_depth,
                q.queue.max_flows,
            ),
            staged: None,
            inflight: 0,
            guard: RelistGuard::default(),
            nodes: None,
            containers: None,
        }
    }

    /// Bring rate, burst and the guard up to date at `now`.
    pub fn refresh(&mut self, s: AdmissionSettings<'_>, now: Instant) {
        let quota = s.quota;
        let size = match quota.scaling.mode {
            ScalingMode::Fixed => None,
            ScalingMode::NodeProportional => self.nodes,
            ScalingMode::ContainerProportional => self.containers,
        };
        let (rate, burst) = scaling::scaled(quota, size);
        let f = self.guard.factor(s.relist_guard, now);
        self.pool.set_limits(rate * f, burst * f, now);
        let q = &quota.queue;
        self.queue
            .set_limits(q.quantum_bytes, q.per_flow_depth, q.max_flows);
    }

    pub fn slot_free(&self, s: AdmissionSettings<'_>, now: Instant) -> bool {
        let limit = Lane::Heavy.limit(s.lanes);
        if limit == 0 {
            return true;
        }
        let f = self.guard.factor(s.relist_guard, now);
        let scaled = ((limit as f64) * f).floor().max(1.0) as usize;
        self.inflight < scaled
    }

    /// Serve what can be served now; `(waiters with their costs, how long
    /// until the staged entry could go)`. A waiter that is `gone` is skipped.
    pub fn dispatch(
        &mut self,
        s: AdmissionSettings<'_>,
        now: Instant,
        gone: impl Fn(&W) -> bool,
    ) -> (Vec<(W, f64)>, Duration) {
        let mut out = Vec::new();
        loop {
            if self.staged.is_none() {
                self.staged = self.queue.pop();
            }
            let Some((_, cost, waiter)) = &self.staged else {
                return (out, Duration::from_secs(1));
            };
            let cost = *cost;
            if gone(waiter) {
                self.staged = None;
                continue;
            }
            if !self.slot_free(s, now) {
                // A release wakes the dispatcher.
                return (out, Duration::from_secs(1));
            }
            if !self.pool.try_debit(cost, now) {
                return (out, self.pool.time_until(cost, now));
            }
            self.inflight += 1;
            if let Some((_, cost, waiter)) = self.staged.take() {
                out.push((waiter, cost));
            }
        }
    }

    /// Seconds until `cost` (behind what is queued) could be admitted.
    pub fn refill_time(&mut self, cost: f64, now: Instant) -> Duration {
        let level = self.pool.level(now);
        let ahead = self.queue.bytes() + self.staged.as_ref().map_or(0.0, |s| s.1);
        let need = cost.min(self.pool.burst()) + ahead - level;
        Duration::from_secs_f64((need.max(0.0) / self.pool.rate()).min(1e6))
    }
}
