//! The heavy lane's state, pure with time passed in: heavy requests take
//! their predicted cost from the quota pool and an in-flight slot at once if
//! nobody waits, else wait in their flow's queue (deficit round robin) for
//! the dispatcher, which serves the entry it chose first (nobody overtakes
//! it). A heavy request also takes its predicted cost from the in-flight
//! budget ([`crate::budget`]); an unlearned heavy-looking pattern has at
//! most one request in flight. The pool's rate and burst and the in-flight
//! budget are static or adaptive (`quota.mode`), bounded by the cluster
//! size's scaling and ramped by the relist guard. Everything admission accounts for heavy requests is here,
//! in one place, behind admission's one lock.

use std::time::Duration;

use tokio::time::Instant;

use super::drr::FairQueue;
use super::guard::RelistGuard;
use super::lane::Lane;
use super::pool::QuotaPool;
use super::scaling;
use super::settings::{AdmissionSettings, ScalingMode};
use crate::budget::heavy::HeavyBudget;
use crate::budget::latencies::LatencyDrain;
use crate::budget::unlearned::SingleFlight;
use crate::pattern::PatternKey;

/// Unlearned heavy-looking patterns tracked with a request in flight.
const UNLEARNED_CAPACITY: usize = 1024;

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
    /// The in-flight budget, the latency signal and the controller.
    pub budget: HeavyBudget,
    /// Unlearned heavy-looking patterns with their one request in flight.
    pub unlearned: SingleFlight<PatternKey>,
    /// The light requests' latencies, queued for the budget's signal.
    pub latencies: LatencyDrain,
}

impl<W> HeavyLane<W> {
    /// Empty queues and a full pool of `s.quota`'s base size; latencies
    /// come from `latencies`' queue.
    pub fn new(s: AdmissionSettings<'_>, latencies: LatencyDrain, now: Instant) -> HeavyLane<W> {
        let q = s.quota;
        HeavyLane {
            pool: QuotaPool::new(q.bytes_per_second(), q.burst_bytes(), now),
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
            budget: HeavyBudget::new(q.mode, q.adaptive.clone(), scaling::ceilings(q, None), now),
            unlearned: SingleFlight::new(UNLEARNED_CAPACITY),
            latencies,
        }
    }

    /// Hand the latencies queued since the last call to the signal. Called
    /// before anything here changes, so each is judged against the heavy
    /// lane's state it ended in.
    pub fn take_latencies(&mut self) {
        self.latencies.drain_into(&mut self.budget);
    }

    /// Bring rate, burst and the guard up to date at `now`.
    pub fn refresh(&mut self, s: AdmissionSettings<'_>, now: Instant) {
        let quota = s.quota;
        let size = match quota.scaling.mode {
            ScalingMode::Fixed => None,
            ScalingMode::NodeProportional => self.nodes,
            ScalingMode::ContainerProportional => self.containers,
        };
        let ceilings = scaling::ceilings(quota, size);
        self.budget
            .set_settings(quota.mode, &quota.adaptive, ceilings);
        let limits = self.budget.limits();
        let f = self.guard.factor(s.relist_guard, now);
        self.pool.set_limits(limits.rate * f, limits.burst * f, now);
        self.budget.apply_guard(f);
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
            if !self.budget.fits(cost) {
                self.budget.note_waited(cost);
                return (out, Duration::from_secs(1));
            }
            if !self.pool.try_debit(cost, now) {
                self.budget.note_waited(cost);
                return (out, self.pool.time_until(cost, now));
            }
            self.budget.acquire(cost, false, now);
            self.inflight += 1;
            if let Some((_, cost, waiter)) = self.staged.take() {
                out.push((waiter, cost));
            }
        }
    }

    /// Admit `cost` at once if nobody waits and the slot, the in-flight
    /// budget and the pool all have room.
    pub fn admit_now(&mut self, cost: f64, s: AdmissionSettings<'_>, now: Instant) -> bool {
        let nobody_waits = self.staged.is_none() && self.queue.is_empty();
        if nobody_waits
            && self.slot_free(s, now)
            && self.budget.fits(cost)
            && self.pool.try_debit(cost, now)
        {
            self.budget.acquire(cost, false, now);
            self.inflight += 1;
            return true;
        }
        false
    }

    /// A heavy request admitted at `admitted_at` with `debited` bytes
    /// ended, costing `actual`; `complete` if its response was sent whole.
    pub fn release(
        &mut self,
        debited: f64,
        actual: f64,
        admitted_at: Instant,
        complete: bool,
        now: Instant,
    ) {
        self.pool.reconcile(debited, actual, now);
        self.inflight = self.inflight.saturating_sub(1);
        self.budget.release(debited, admitted_at, complete, now);
    }

    /// Seconds until `cost` (behind what is queued) could be admitted.
    pub fn refill_time(&mut self, cost: f64, now: Instant) -> Duration {
        let level = self.pool.level(now);
        let ahead = self.queue.bytes() + self.staged.as_ref().map_or(0.0, |s| s.1);
        let need = cost.min(self.pool.burst()) + ahead - level;
        Duration::from_secs_f64((need.max(0.0) / self.pool.rate()).min(1e6))
    }
}
