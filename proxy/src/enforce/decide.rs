//! Admission: the decision for one request, and the dispatcher that
//! serves the heavy lane's fair queues from the quota pool.
//!
//! Light lanes (system, workload, self) take an in-flight slot, waiting up
//! to `lanes.maxWaitSeconds`; `exempt` is never limited. Heavy requests
//! pass the per-client rate limit, then take their predicted cost from the
//! pool and a heavy in-flight slot at once if nobody waits, else wait in
//! their flow's queue (bounded depth, `quota.maxWaitSeconds`) for the
//! dispatcher. What a request holds ([`Hold`]) moves into its response
//! body's end callback, where the debit is reconciled with what the
//! response actually cost; dropping it unsettled refunds it, so nothing
//! leaks.
//!
//! The state sits behind one `std` mutex, held only for arithmetic, never
//! across an `.await`. In `dryRun` the same decisions are made and
//! counted, but nothing waits and nothing is refused: would-be-admitted
//! and would-be-queued requests are debited (so the pool shows what
//! enforcement would have let through), would-be-rejected ones are not.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::drr::{FairQueue, Refused};
use super::guard::{Cause, RelistGuard};
use super::lane::{Lane, LaneSlot, LaneSlots, SlotOutcome};
use super::pool::QuotaPool;
use super::ratelimit::ClientRates;
use super::retry::{self, LogLimiter};
use super::scaling;
use super::settings::ScalingMode;
use crate::config::Config;
use crate::predict::Prediction;

/// What happened to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Admit,
    /// Admitted after waiting.
    Queue,
    Reject,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Admit => "admit",
            Decision::Queue => "queue",
            Decision::Reject => "reject",
        }
    }
}

/// Why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The exempt lane: never limited.
    Exempt,
    /// A light lane's in-flight slot.
    Slot,
    /// The pool had the bytes.
    Pool,
    /// Costs more than the burst: admitted with a full pool, into debt.
    Debt,
    /// A light lane stayed full for its whole wait.
    Inflight,
    /// The pool did not have the bytes within `maxWait`.
    MaxWait,
    /// The client's queue was full.
    QueueFull,
    /// Too many clients were waiting.
    TooManyFlows,
    /// The client's heavy-request rate was over its limit.
    RateLimit,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Exempt => "exempt",
            Reason::Slot => "slot",
            Reason::Pool => "pool",
            Reason::Debt => "debt",
            Reason::Inflight => "inflight",
            Reason::MaxWait => "maxWait",
            Reason::QueueFull => "queueFull",
            Reason::TooManyFlows => "tooManyFlows",
            Reason::RateLimit => "rateLimit",
        }
    }

    /// Words for the 429 message.
    pub fn explain(self) -> &'static str {
        match self {
            Reason::Inflight => "too many requests in flight in this lane",
            Reason::MaxWait => "the byte quota had no room for this request within the wait limit",
            Reason::QueueFull => "too many of this client's heavy requests are already waiting",
            Reason::TooManyFlows => "too many clients are waiting for the byte quota",
            Reason::RateLimit => "this client sends heavy requests faster than its rate limit",
            _ => "admitted",
        }
    }
}

/// What an admitted request holds until its response ends.
#[derive(Debug, Default)]
pub enum Hold {
    #[default]
    Nothing,
    Slot(LaneSlot),
    Heavy(HeavyTicket),
}

impl Hold {
    /// The response ended: settle a heavy debit with the actual cost.
    pub fn settle(self, actual: f64) {
        if let Hold::Heavy(t) = self {
            t.settle(actual);
        }
    }

    /// Bytes debited from the pool (heavy only).
    pub fn debited(&self) -> f64 {
        match self {
            Hold::Heavy(t) => t.debited,
            _ => 0.0,
        }
    }
}

/// The outcome of admission.
#[derive(Debug)]
pub struct Verdict {
    pub decision: Decision,
    pub reason: Reason,
    pub hold: Hold,
    /// For a rejection: seconds for `Retry-After`.
    pub retry_after: u64,
    /// Time spent waiting.
    pub waited: Duration,
}

impl Verdict {
    fn admit(reason: Reason, hold: Hold) -> Verdict {
        Verdict {
            decision: Decision::Admit,
            reason,
            hold,
            retry_after: 0,
            waited: Duration::ZERO,
        }
    }
}

/// A heavy request's debit and in-flight slot. Settle it with the actual
/// cost; dropped unsettled, it refunds the debit.
#[derive(Debug)]
pub struct HeavyTicket {
    admission: Arc<Admission>,
    debited: f64,
    settled: bool,
}

impl HeavyTicket {
    pub fn settle(mut self, actual: f64) {
        self.settled = true;
        self.admission.release(self.debited, actual);
    }
}

impl Drop for HeavyTicket {
    fn drop(&mut self) {
        if !self.settled {
            self.admission.release(self.debited, 0.0);
        }
    }
}

struct Waiter {
    tx: oneshot::Sender<HeavyTicket>,
}

/// The heavy lane's shared state.
struct Heavy {
    pool: QuotaPool,
    queue: FairQueue<String, Waiter>,
    /// The entry deficit round robin chose, waiting for the pool: nobody
    /// overtakes it (that is what bounds another flow's wait).
    staged: Option<(String, f64, Waiter)>,
    inflight: usize,
    guard: RelistGuard,
    nodes: Option<f64>,
    containers: Option<f64>,
}

/// A snapshot for metrics.
#[derive(Debug, Clone, Copy)]
pub struct PoolView {
    pub level: f64,
    pub rate: f64,
    pub burst: f64,
    pub queued: usize,
    pub heavy_inflight: usize,
    pub guard_active: bool,
}

/// Admission control, shared by all requests.
pub struct Admission {
    heavy: Mutex<Heavy>,
    wake: Notify,
    slots: Arc<LaneSlots>,
    rates: ClientRates,
    log: LogLimiter,
    seq: AtomicU64,
    /// Guard triggers, by cause (exported).
    pub on_guard: Box<dyn Fn(Cause) + Send + Sync>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission").finish_non_exhaustive()
    }
}

/// The bytes a prediction charges: sent plus weighted etcd reads.
pub fn charge(p: &Prediction, etcd_read_weight: f64) -> f64 {
    p.response_bytes + etcd_read_weight * p.read_bytes
}

/// The actual charge once the response ended: the bytes sent (uncompressed
/// estimate) plus the etcd reads they imply (an unfiltered etcd read reads
/// what it sends; a filtered one reads what was predicted). A response cut
/// short is never refunded below its debit: the apiserver did the work.
pub fn actual_charge(
    p: &Prediction,
    filtered: bool,
    sent: f64,
    complete: bool,
    etcd_read_weight: f64,
    debited: f64,
) -> f64 {
    let read = if p.read_bytes <= 0.0 {
        0.0
    } else if filtered {
        p.read_bytes
    } else {
        sent
    };
    let actual = sent + etcd_read_weight * read;
    if complete {
        actual
    } else {
        actual.max(debited)
    }
}

impl Heavy {
    /// Bring rate, burst and the guard up to date at `now`.
    fn refresh(&mut self, config: &Config, now: Instant) {
        let quota = &config.quota;
        let size = match quota.scaling.mode {
            ScalingMode::Fixed => None,
            ScalingMode::NodeProportional => self.nodes,
            ScalingMode::ContainerProportional => self.containers,
        };
        let (rate, burst) = scaling::scaled(quota, size);
        let f = self.guard.factor(&config.relist_guard, now);
        self.pool.set_limits(rate * f, burst * f, now);
        let q = &quota.queue;
        self.queue
            .set_limits(q.quantum_bytes, q.per_flow_depth, q.max_flows);
    }

    fn slot_free(&self, config: &Config, now: Instant) -> bool {
        let limit = Lane::Heavy.limit(&config.lanes);
        if limit == 0 {
            return true;
        }
        let f = self.guard.factor(&config.relist_guard, now);
        let scaled = ((limit as f64) * f).floor().max(1.0) as usize;
        self.inflight < scaled
    }

    /// Serve what can be served now; `(senders with their costs, how long
    /// until the staged entry could go)`.
    fn dispatch(&mut self, config: &Config, now: Instant) -> (Vec<(Waiter, f64)>, Duration) {
        let mut out = Vec::new();
        loop {
            if self.staged.is_none() {
                self.staged = self.queue.pop();
            }
            let Some((_, cost, waiter)) = &self.staged else {
                return (out, Duration::from_secs(1));
            };
            let cost = *cost;
            if waiter.tx.is_closed() {
                self.staged = None;
                continue;
            }
            if !self.slot_free(config, now) {
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
    fn refill_time(&mut self, cost: f64, now: Instant) -> Duration {
        let level = self.pool.level(now);
        let ahead = self.queue.bytes() + self.staged.as_ref().map_or(0.0, |s| s.1);
        let need = cost.min(self.pool.burst()) + ahead - level;
        Duration::from_secs_f64((need.max(0.0) / self.pool.rate()).min(1e6))
    }
}

impl Admission {
    pub fn new(
        config: &Config,
        slots: Arc<LaneSlots>,
        on_guard: Box<dyn Fn(Cause) + Send + Sync>,
    ) -> Admission {
        let now = Instant::now();
        let q = &config.quota;
        Admission {
            heavy: Mutex::new(Heavy {
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
            }),
            wake: Notify::new(),
            slots,
            rates: ClientRates::default(),
            log: LogLimiter::new(now),
            seq: AtomicU64::new(0),
            on_guard,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Heavy> {
        // A panic while holding the lock leaves numbers, not invariants.
        self.heavy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A heavy ticket was settled or dropped.
    fn release(&self, debited: f64, actual: f64) {
        let now = Instant::now();
        let mut h = self.lock();
        h.pool.reconcile(debited, actual, now);
        h.inflight = h.inflight.saturating_sub(1);
        drop(h);
        self.wake.notify_one();
    }

    /// May a rejection be logged now? `Some(suppressed)` if so.
    pub fn log_allowed(&self, config: &Config) -> Option<u64> {
        self.log.allow(config.quota.log_per_second, Instant::now())
    }

    /// The upstream pool's recovery count and, if scraped, the upstream's
    /// process start time: either may start a warm-up.
    pub fn observe_upstream(&self, recoveries: u64, start_time: Option<f64>) {
        let now = Instant::now();
        let mut h = self.lock();
        let mut causes = Vec::new();
        causes.extend(h.guard.observe_recoveries(recoveries, now));
        if let Some(t) = start_time {
            causes.extend(h.guard.observe_start_time(t, now));
        }
        drop(h);
        for cause in causes {
            tracing::warn!(
                cause = cause.as_str(),
                "upstream back: relist guard warming up"
            );
            (self.on_guard)(cause);
        }
    }

    /// The cluster size for scaling (`nodes` or `containers`).
    pub fn set_cluster_size(&self, unit: &str, n: f64) {
        let mut h = self.lock();
        match unit {
            "nodes" => h.nodes = Some(n),
            "containers" => h.containers = Some(n),
            _ => {}
        }
    }

    /// Whether the relist guard is warming up (for the cache rewrite).
    pub fn warming_up(&self, config: &Config) -> bool {
        self.lock()
            .guard
            .active(&config.relist_guard, Instant::now())
    }

    pub fn view(&self, config: &Config) -> PoolView {
        let now = Instant::now();
        let mut h = self.lock();
        h.refresh(config, now);
        PoolView {
            level: h.pool.level(now),
            rate: h.pool.rate(),
            burst: h.pool.burst(),
            queued: h.queue.len() + usize::from(h.staged.is_some()),
            heavy_inflight: h.inflight,
            guard_active: h.guard.active(&config.relist_guard, now),
        }
    }

    fn retry(&self, base: Duration, flow: &str, config: &Config) -> u64 {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        retry::retry_after(base, retry::seed(flow, n), &config.quota.retry_after)
    }

    fn reject(&self, reason: Reason, base: Duration, flow: &str, config: &Config) -> Verdict {
        Verdict {
            decision: Decision::Reject,
            reason,
            hold: Hold::Nothing,
            retry_after: self.retry(base, flow, config),
            waited: Duration::ZERO,
        }
    }

    /// A light lane: a slot, waiting up to `lanes.maxWaitSeconds`; in dry
    /// run, counted but never waited for. `flow` is only asked for on a
    /// rejection (its Retry-After jitter): no per-request string otherwise.
    pub async fn admit_light(
        &self,
        lane: Lane,
        flow: impl FnOnce() -> String,
        config: &Config,
        dry: bool,
    ) -> Verdict {
        if lane == Lane::Exempt {
            return Verdict::admit(Reason::Exempt, Hold::Slot(self.slots.force_take(lane)));
        }
        let limit = lane.limit(&config.lanes);
        if dry {
            return match self.slots.try_take(lane, limit) {
                Some(s) => Verdict::admit(Reason::Slot, Hold::Slot(s)),
                None => Verdict {
                    decision: Decision::Queue,
                    ..Verdict::admit(Reason::Slot, Hold::Slot(self.slots.force_take(lane)))
                },
            };
        }
        let started = Instant::now();
        let wait = Duration::from_secs_f64(config.lanes.max_wait_seconds);
        match self.slots.take(lane, limit, wait).await {
            SlotOutcome::Now(s) => Verdict::admit(Reason::Slot, Hold::Slot(s)),
            SlotOutcome::Waited(s) => Verdict {
                decision: Decision::Queue,
                waited: started.elapsed(),
                ..Verdict::admit(Reason::Slot, Hold::Slot(s))
            },
            SlotOutcome::Full => {
                self.reject(Reason::Inflight, Duration::from_secs(1), &flow(), config)
            }
        }
    }

    /// A heavy request of `flow` costing `cost` bytes.
    pub async fn admit_heavy(
        self: &Arc<Self>,
        flow: &str,
        cost: f64,
        config: &Config,
        dry: bool,
    ) -> Verdict {
        if let Err(wait) = self.rates.check(&config.quota.per_client, flow) {
            return self.reject(Reason::RateLimit, wait, flow, config);
        }
        let now = Instant::now();
        let max_wait = Duration::from_secs_f64(config.quota.max_wait_seconds);
        let ticket = |admission: &Arc<Admission>| HeavyTicket {
            admission: admission.clone(),
            debited: cost,
            settled: false,
        };
        let rx = {
            let mut h = self.lock();
            h.refresh(config, now);
            let oversize = cost > h.pool.burst();
            let nobody_waits = h.staged.is_none() && h.queue.is_empty();
            if nobody_waits && h.slot_free(config, now) && h.pool.try_debit(cost, now) {
                h.inflight += 1;
                drop(h);
                let reason = if oversize { Reason::Debt } else { Reason::Pool };
                return Verdict::admit(reason, Hold::Heavy(ticket(self)));
            }
            if dry {
                // Would it have been served within maxWait? Estimate from
                // the refill time; debit it if so (it would have been served).
                let wait = h.pool.time_until(cost, now);
                if wait <= max_wait {
                    h.pool.force_debit(cost, now);
                    h.inflight += 1;
                    drop(h);
                    return Verdict {
                        decision: Decision::Queue,
                        ..Verdict::admit(Reason::Pool, Hold::Heavy(ticket(self)))
                    };
                }
                let base = h.refill_time(cost, now);
                drop(h);
                return self.reject(Reason::MaxWait, base, flow, config);
            }
            let (tx, rx) = oneshot::channel();
            let mut pushed = h.queue.push(flow.to_string(), cost, Waiter { tx });
            if let Err((Refused::FlowFull, waiter)) = pushed {
                // Waiters that gave up still count until purged.
                h.queue.purge(&flow.to_string(), |w| w.tx.is_closed());
                pushed = h.queue.push(flow.to_string(), cost, waiter);
            }
            if let Err((refused, _)) = pushed {
                let base = h.refill_time(cost, now);
                drop(h);
                let reason = match refused {
                    Refused::FlowFull => Reason::QueueFull,
                    Refused::TooManyFlows => Reason::TooManyFlows,
                };
                return self.reject(reason, base, flow, config);
            }
            rx
        };
        self.wake.notify_one();
        match tokio::time::timeout(max_wait, rx).await {
            Ok(Ok(t)) => Verdict {
                decision: Decision::Queue,
                waited: now.elapsed(),
                ..Verdict::admit(Reason::Pool, Hold::Heavy(t))
            },
            // Timed out (the waiter leaves; the dispatcher skips it), or the
            // dispatcher went away (shutdown).
            _ => {
                let base = self.lock().refill_time(cost, Instant::now());
                let mut v = self.reject(Reason::MaxWait, base, flow, config);
                v.waited = now.elapsed();
                v
            }
        }
    }

    /// Serve the heavy queues from the pool until `stop`. `config` gives
    /// the running configuration each round, `recoveries` the upstream
    /// pool's count of recoveries (for the relist guard).
    pub async fn dispatch_loop(
        self: Arc<Self>,
        config: impl Fn() -> Arc<Config> + Send,
        recoveries: impl Fn() -> u64 + Send,
        stop: CancellationToken,
    ) {
        loop {
            let cfg = config();
            self.observe_upstream(recoveries(), None);
            let now = Instant::now();
            let (ready, wait) = {
                let mut h = self.lock();
                h.refresh(&cfg, now);
                h.dispatch(&cfg, now)
            };
            for (waiter, cost) in ready {
                let t = HeavyTicket {
                    admission: self.clone(),
                    debited: cost,
                    settled: false,
                };
                // A waiter gone just now: the ticket comes back and its
                // drop refunds the debit (the lock is not held here).
                let _ = waiter.tx.send(t);
            }
            // Refill is continuous: wake when the staged entry could fit,
            // at least every second (the guard's ramp, a reload).
            let wait = wait.clamp(Duration::from_millis(1), Duration::from_secs(1));
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
