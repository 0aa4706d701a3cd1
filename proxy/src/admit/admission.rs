//! Admission: the state every request's admit step shares (lane slots, the
//! heavy lane, per-client rates), the decision for one request, and the
//! dispatcher that serves the heavy lane's fair queues from the quota pool.
//! It reads only its own settings ([`AdmissionSettings`]: `lanes`, `quota`,
//! `relistGuard`), those of the request's configuration.
//!
//! Light lanes (system, workload, self) take an in-flight slot, waiting up
//! to `lanes.maxWaitSeconds` in their flow's queue, each flow held to its
//! share of the lane ([`crate::enforce::slots`]); `exempt` is never limited. Heavy requests
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

use std::collections::hash_map::RandomState;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::futures::Notified;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::budget::heavy::BudgetView;
use crate::budget::latencies::{latency_queue, LatencyQueue, CAPACITY};
use crate::budget::shared::gate::{EtcdGate, EtcdTicket};
use crate::budget::signal::Source;
use crate::budget::unlearned::Start;
use crate::config::settings::enforce::AdmissionSettings;
use crate::enforce::decision::{Decision, Reason};
use crate::enforce::drr::Refused;
use crate::enforce::guard::Cause;
use crate::enforce::heavy::HeavyAdmission;
use crate::enforce::lane::Lane;
use crate::enforce::ratelimit::ClientRates;
use crate::enforce::retry::{self, LogLimiter};
use crate::enforce::slots::{LaneSlot, LaneSlots, SlotLimits, SlotOutcome};
use crate::pattern::PatternKey;

use super::flow::Flow;
use super::pages::{Lineage, Pages};

/// What an admitted request holds until its response ends.
#[derive(Debug, Default)]
pub enum Hold {
    #[default]
    Nothing,
    Slot(LaneSlot),
    /// Boxed: every request's context holds a `Hold` across its awaits,
    /// and only heavy ones need the ticket's hundred bytes.
    Heavy(Box<HeavyTicket>),
}

impl Hold {
    /// The response ended: settle a heavy debit with the actual cost;
    /// `complete` if the response was sent whole.
    pub fn settle(self, actual: f64, complete: bool) {
        if let Hold::Heavy(t) = self {
            (*t).settle(actual, complete);
        }
    }

    /// An unlearned pattern's turn rides with the heavy ticket, so it ends
    /// with the response; any other hold (a rejection) ends it now.
    pub fn attach(&mut self, turn: Option<UnlearnedTurn>) {
        if let Hold::Heavy(t) = self {
            t.turn = turn;
        }
    }

    /// The etcd reads passed through the shared budget ride with the heavy
    /// ticket too; any other hold drops them, which refunds them.
    pub fn attach_etcd(&mut self, etcd: Option<EtcdTicket>) {
        if let Hold::Heavy(t) = self {
            t.etcd = etcd;
        }
    }

    /// The shared budget's etcd reads, to settle with what was read.
    pub fn take_etcd(&mut self) -> Option<EtcdTicket> {
        match self {
            Hold::Heavy(t) => t.etcd.take(),
            _ => None,
        }
    }

    /// A heavy request's debit and in-flight place.
    pub fn is_heavy(&self) -> bool {
        matches!(self, Hold::Heavy(_))
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

/// A heavy request's debit, in-flight slot and in-flight bytes (and, for
/// an unlearned pattern, its turn). Settle it with the actual cost; dropped
/// unsettled, it refunds the debit.
#[derive(Debug)]
pub struct HeavyTicket {
    admission: Arc<Admission>,
    debited: f64,
    admitted_at: Instant,
    settled: bool,
    turn: Option<UnlearnedTurn>,
    etcd: Option<EtcdTicket>,
}

impl HeavyTicket {
    fn new(admission: &Arc<Admission>, debited: f64) -> HeavyTicket {
        HeavyTicket {
            admission: admission.clone(),
            debited,
            admitted_at: Instant::now(),
            settled: false,
            turn: None,
            etcd: None,
        }
    }

    pub fn settle(mut self, actual: f64, complete: bool) {
        self.settled = true;
        // Not settled with what was read (a watch's start): kept as passed.
        if let Some(etcd) = self.etcd.take() {
            let debited = etcd.debited();
            etcd.settle(debited);
        }
        self.admission
            .release(self.debited, actual, self.admitted_at, complete);
    }
}

impl Drop for HeavyTicket {
    fn drop(&mut self) {
        if !self.settled {
            self.admission
                .release(self.debited, 0.0, self.admitted_at, false);
        }
    }
}

/// The one request in flight of an unlearned heavy-looking pattern; the
/// next may start when it is dropped (with the response's end).
#[derive(Debug)]
pub struct UnlearnedTurn {
    admission: Arc<Admission>,
    key: PatternKey,
}

impl Drop for UnlearnedTurn {
    fn drop(&mut self) {
        self.admission.lock().unlearned.finish(&self.key);
        self.admission.unlearned_freed.notify_waiters();
    }
}

struct Waiter {
    tx: oneshot::Sender<HeavyTicket>,
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
    /// The cluster size, by unit, as last set.
    pub nodes: Option<f64>,
    pub containers: Option<f64>,
}

/// The heavy lane at a rejection: the pool's level, rate and burst, the
/// queue, the in-flight budget.
#[derive(Debug, Clone, Copy)]
pub struct HeavyState {
    pub level: f64,
    pub rate: f64,
    pub burst: f64,
    pub queued: usize,
    /// Predicted bytes waiting in the heavy queues.
    pub queued_bytes: f64,
    pub inflight: usize,
    pub inflight_bytes: f64,
    pub inflight_used_bytes: f64,
    /// `static` or `adaptive`.
    pub mode: &'static str,
}

impl HeavyState {
    /// Seconds the pool takes to refill from empty: how soon the budget
    /// turns over.
    pub fn turnover_seconds(&self) -> f64 {
        if self.rate > 0.0 {
            self.burst / self.rate
        } else {
            f64::INFINITY
        }
    }
}

/// Admission control, shared by all requests.
pub struct Admission {
    /// The shared etcd-read budget's gate, when `quota.global` is on.
    shared: std::sync::OnceLock<Arc<EtcdGate>>,
    heavy: Mutex<HeavyAdmission<Waiter>>,
    wake: Notify,
    /// An unlearned pattern's request ended: its waiters look again.
    unlearned_freed: Notify,
    slots: Arc<LaneSlots>,
    /// The key of the light lanes' flow hashes, random per process.
    flow_keys: RandomState,
    /// Light requests' latencies, taken in at the next lock.
    latencies: LatencyQueue,
    rates: ClientRates,
    /// Lists in progress, whose continue pages go at once.
    pages: Mutex<Pages>,
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

impl Admission {
    pub fn new(
        settings: AdmissionSettings<'_>,
        on_guard: Box<dyn Fn(Cause) + Send + Sync>,
    ) -> Admission {
        let now = Instant::now();
        let (latencies, drain) = latency_queue(CAPACITY);
        Admission {
            shared: std::sync::OnceLock::new(),
            heavy: Mutex::new(HeavyAdmission::new(settings, drain, now)),
            latencies,
            wake: Notify::new(),
            unlearned_freed: Notify::new(),
            slots: Arc::new(LaneSlots::default()),
            flow_keys: RandomState::new(),
            rates: ClientRates::default(),
            pages: Mutex::new(Pages::default()),
            log: LogLimiter::new(now),
            seq: AtomicU64::new(0),
            on_guard,
        }
    }

    /// The heavy lane, with the latencies queued since the last lock
    /// taken in before anything can change it.
    fn lock(&self) -> MutexGuard<'_, HeavyAdmission<Waiter>> {
        // A panic while holding the lock leaves numbers, not invariants.
        let mut h = self.heavy.lock().unwrap_or_else(|e| e.into_inner());
        h.take_latencies();
        h
    }

    /// Pass heavy requests' etcd reads through `gate` from now on (set
    /// once, at start).
    pub fn set_shared_gate(&self, gate: Arc<EtcdGate>) {
        let _ = self.shared.set(gate);
    }

    /// The shared budget's gate, if on.
    pub fn shared_gate(&self) -> Option<&Arc<EtcdGate>> {
        self.shared.get()
    }

    /// The in-flight slots of the light lanes (and tollgate's own `self` lane).
    pub fn slots(&self) -> &Arc<LaneSlots> {
        &self.slots
    }

    /// A heavy ticket was settled or dropped.
    fn release(&self, debited: f64, actual: f64, admitted_at: Instant, complete: bool) {
        let now = Instant::now();
        self.lock()
            .release(debited, actual, admitted_at, complete, now);
        self.wake.notify_one();
    }

    /// Take the turn of the unlearned pattern `key` if none of its requests
    /// is in flight.
    pub fn try_start_unlearned(self: &Arc<Self>, key: &PatternKey) -> Option<UnlearnedTurn> {
        let started = self.lock().unlearned.try_start(key) == Start::Started;
        started.then(|| UnlearnedTurn {
            admission: self.clone(),
            key: key.clone(),
        })
    }

    /// Resolves when an unlearned pattern's request ends (create it, then
    /// look, then await: an end in between is not missed).
    pub fn unlearned_freed(&self) -> Notified<'_> {
        self.unlearned_freed.notified()
    }

    /// A request of a protected lane (`System`, `Exempt`) or a light
    /// `Workload` one that started at `started` got its response headers
    /// now. Queued, not locked for: the signal takes it in at the next lock.
    pub fn record_latency(&self, lane: Lane, started: Instant) {
        let source = match lane {
            Lane::System | Lane::Exempt => Source::Protected,
            Lane::Workload => Source::Workload,
            Lane::Heavy | Lane::SelfLane => return,
        };
        // What its client waited for this worker, in and out, is latency the handler's clock
        // does not see (crate::wake_lag).
        let ended = Instant::now() + crate::wake_lag::added();
        self.latencies.record(source, started, ended);
    }

    /// One of tollgate's own probes, sent at `started`, was answered (or
    /// gave up) at `ended`.
    pub fn record_probe(&self, started: Instant, ended: Instant) {
        self.latencies.record(Source::Probe, started, ended);
    }

    /// Would a probe help the signal now
    /// ([`crate::budget::heavy::ByteBudget::wants_probe`]).
    pub fn wants_probe(&self) -> bool {
        self.lock().budget.wants_probe(Instant::now())
    }

    /// The apiserver answered 429 or 5xx: the controller counts it.
    pub fn note_upstream_error(&self) {
        self.lock().budget.note_upstream_error();
    }

    /// The budget as `/debug/budget` shows it.
    pub fn budget_view(&self, s: AdmissionSettings<'_>) -> BudgetView {
        let now = Instant::now();
        let mut h = self.lock();
        h.refresh(s, now);
        let mut v = h.budget.view(now);
        v.unlearned_inflight = h.unlearned.len();
        v.dropped_samples = h.latencies.dropped();
        v.worker_lag_seconds = crate::wake_lag::workers_recent().as_secs_f64();
        v
    }

    /// Step the budget's controller every `quota.adaptive.intervalSeconds`
    /// and apply its limits to the pool and the in-flight budget, until
    /// `stop`.
    pub async fn budget_loop<C: Send>(
        self: Arc<Self>,
        current: impl Fn() -> C + Send,
        settings: fn(&C) -> AdmissionSettings<'_>,
        stop: CancellationToken,
    ) {
        loop {
            let cfg = current();
            let s = settings(&cfg);
            let interval = Duration::from_secs_f64(s.quota.adaptive.interval_seconds);
            let now = Instant::now();
            {
                let mut h = self.lock();
                h.refresh(s, now);
                h.budget.step(now);
                h.refresh(s, now);
            }
            // A grown budget may let the staged entry go.
            self.wake.notify_one();
            drop(cfg);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }

    /// May a rejection be logged now? `Some(suppressed)` if so.
    pub fn log_allowed(&self, s: AdmissionSettings<'_>) -> Option<u64> {
        self.log.allow(s.quota.log_per_second, Instant::now())
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
    pub fn warming_up(&self, s: AdmissionSettings<'_>) -> bool {
        self.lock().guard.active(s.relist_guard, Instant::now())
    }

    pub fn view(&self, s: AdmissionSettings<'_>) -> PoolView {
        let now = Instant::now();
        let mut h = self.lock();
        h.refresh(s, now);
        PoolView {
            level: h.pool.level(now),
            rate: h.pool.rate(),
            burst: h.pool.burst(),
            queued: h.queue.len() + usize::from(h.staged.is_some()),
            heavy_inflight: h.inflight,
            guard_active: h.guard.active(s.relist_guard, now),
            nodes: h.nodes,
            containers: h.containers,
        }
    }

    fn retry(&self, base: Duration, flow: &str, s: AdmissionSettings<'_>) -> u64 {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        retry::retry_after(base, retry::seed(flow, n), &s.quota.retry_after)
    }

    fn reject(
        &self,
        reason: Reason,
        base: Duration,
        flow: &str,
        s: AdmissionSettings<'_>,
    ) -> Verdict {
        Verdict {
            decision: Decision::Reject,
            reason,
            hold: Hold::Nothing,
            retry_after: self.retry(base, flow, s),
            waited: Duration::ZERO,
        }
    }

    /// A heavy request whose unlearned pattern stayed busy for its whole
    /// wait.
    pub fn reject_unlearned(&self, flow: &str, s: AdmissionSettings<'_>) -> Verdict {
        let wait = Duration::from_secs_f64(s.quota.max_wait_seconds);
        self.reject(Reason::Unlearned, wait, flow, s)
    }

    /// A heavy request whose etcd reads found no room in the shared budget
    /// within its wait.
    pub fn reject_shared(&self, flow: &str, s: AdmissionSettings<'_>) -> Verdict {
        let wait = Duration::from_secs_f64(s.quota.max_wait_seconds);
        self.reject(Reason::SharedBudget, wait, flow, s)
    }

    /// A light lane: a slot, waiting up to `lanes.maxWaitSeconds` in
    /// `flow`'s queue; in dry run, counted but never waited for (nor held
    /// to a share). The flow's name is only made on a rejection (its
    /// Retry-After jitter): no per-request string otherwise.
    pub async fn admit_light(
        &self,
        lane: Lane,
        flow: &Flow<'_>,
        s: AdmissionSettings<'_>,
        dry: bool,
    ) -> Verdict {
        if lane == Lane::Exempt {
            return Verdict::admit(Reason::Exempt, Hold::Slot(self.slots.force_take(lane)));
        }
        let limits = SlotLimits::of(lane, s.lanes);
        if dry {
            return match self.slots.try_take(lane, limits.limit) {
                Some(s) => Verdict::admit(Reason::Slot, Hold::Slot(s)),
                None => Verdict {
                    decision: Decision::Queue,
                    ..Verdict::admit(Reason::Slot, Hold::Slot(self.slots.force_take(lane)))
                },
            };
        }
        let started = Instant::now();
        let wait = Duration::from_secs_f64(s.lanes.max_wait_seconds);
        let id = flow.id(&self.flow_keys);
        let second = Duration::from_secs(1);
        match self.slots.take(lane, id, limits, wait).await {
            SlotOutcome::Now(s) => Verdict::admit(Reason::Slot, Hold::Slot(s)),
            SlotOutcome::Waited(s) => Verdict {
                decision: Decision::Queue,
                waited: started.elapsed(),
                ..Verdict::admit(Reason::Slot, Hold::Slot(s))
            },
            SlotOutcome::Full => self.reject(Reason::Inflight, second, &flow.name(), s),
            SlotOutcome::Refused(Refused::FlowFull) => {
                self.reject(Reason::QueueFull, second, &flow.name(), s)
            }
            SlotOutcome::Refused(Refused::TooManyFlows) => {
                self.reject(Reason::TooManyFlows, second, &flow.name(), s)
            }
        }
    }

    /// A page of the list `lineage` costing `page_cost` was admitted the
    /// ordinary way; the resource's whole state costs `whole_cost`: its
    /// continue pages go at once for a while ([`super::pages`]).
    pub fn page_admitted(&self, lineage: Lineage, page_cost: f64, whole_cost: f64) {
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        pages.admitted(lineage, page_cost, whole_cost, Instant::now());
    }

    /// A continue page of `lineage` costing `cost`: admitted at once if its
    /// list is in progress (its cost debited from the pool, which may go
    /// into debt, and held in the in-flight budget, which it may overfill),
    /// `None` to be admitted the ordinary way. Not held to the per-client
    /// rate, the queues or the heavy lane's in-flight limit: the list was
    /// admitted as a whole.
    pub fn admit_continuation(
        self: &Arc<Self>,
        lineage: &Lineage,
        cost: f64,
        s: AdmissionSettings<'_>,
    ) -> Option<Verdict> {
        let now = Instant::now();
        {
            let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
            if !pages.take(lineage, cost, now) {
                return None;
            }
        }
        let mut h = self.lock();
        h.refresh(s, now);
        h.pool.force_debit(cost, now);
        h.budget.acquire(cost, true, now);
        h.inflight += 1;
        drop(h);
        Some(Verdict::admit(
            Reason::Continuation,
            Hold::Heavy(Box::new(HeavyTicket::new(self, cost))),
        ))
    }

    /// What bounds the heavy lane now, for a rejection's log line and
    /// message: the pool, the in-flight budget, the queue.
    pub fn heavy_state(&self, s: AdmissionSettings<'_>) -> HeavyState {
        let now = Instant::now();
        let mut h = self.lock();
        h.refresh(s, now);
        let b = h.budget.view(now);
        HeavyState {
            level: h.pool.level(now),
            rate: h.pool.rate(),
            burst: h.pool.burst(),
            queued: h.queue.len() + usize::from(h.staged.is_some()),
            queued_bytes: h.queue.bytes() + h.staged.as_ref().map_or(0.0, |e| e.1),
            inflight: h.inflight,
            inflight_bytes: b.inflight_bytes,
            inflight_used_bytes: b.inflight_used_bytes,
            mode: b.mode,
        }
    }

    /// A heavy request of `flow` costing `cost` bytes.
    pub async fn admit_heavy(
        self: &Arc<Self>,
        flow: &str,
        cost: f64,
        s: AdmissionSettings<'_>,
        dry: bool,
    ) -> Verdict {
        if let Err(wait) = self.rates.check(&s.quota.per_client, flow) {
            return self.reject(Reason::RateLimit, wait, flow, s);
        }
        let now = Instant::now();
        let max_wait = Duration::from_secs_f64(s.quota.max_wait_seconds);
        let ticket = |admission: &Arc<Admission>| Box::new(HeavyTicket::new(admission, cost));
        let rx = {
            let mut h = self.lock();
            h.refresh(s, now);
            let oversize = cost > h.pool.burst();
            if h.admit_now(cost, s, now) {
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
                    h.budget.acquire(cost, true, now);
                    h.inflight += 1;
                    drop(h);
                    return Verdict {
                        decision: Decision::Queue,
                        ..Verdict::admit(Reason::Pool, Hold::Heavy(ticket(self)))
                    };
                }
                let base = h.refill_time(cost, now);
                drop(h);
                return self.reject(Reason::MaxWait, base, flow, s);
            }
            h.budget.note_waited(cost);
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
                return self.reject(reason, base, flow, s);
            }
            rx
        };
        self.wake.notify_one();
        match tokio::time::timeout(max_wait, rx).await {
            Ok(Ok(t)) => Verdict {
                decision: Decision::Queue,
                waited: now.elapsed(),
                ..Verdict::admit(Reason::Pool, Hold::Heavy(Box::new(t)))
            },
            // Timed out (the waiter leaves; the dispatcher skips it), or the
            // dispatcher went away (shutdown).
            _ => {
                let base = self.lock().refill_time(cost, Instant::now());
                let mut v = self.reject(Reason::MaxWait, base, flow, s);
                v.waited = now.elapsed();
                v
            }
        }
    }

    /// Serve the heavy queues from the pool until `stop`. `current` gives
    /// the running configuration each round and `settings` admission's part
    /// of it, `recoveries` the upstream pool's count of recoveries (for the
    /// relist guard).
    pub async fn dispatch_loop<C: Send>(
        self: Arc<Self>,
        current: impl Fn() -> C + Send,
        settings: fn(&C) -> AdmissionSettings<'_>,
        recoveries: impl Fn() -> u64 + Send,
        stop: CancellationToken,
    ) {
        loop {
            let cfg = current();
            let s = settings(&cfg);
            self.observe_upstream(recoveries(), None);
            let now = Instant::now();
            let (ready, wait) = {
                let mut h = self.lock();
                h.refresh(s, now);
                h.dispatch(s, now, |w| w.tx.is_closed())
            };
            for (waiter, cost) in ready {
                let t = HeavyTicket::new(&self, cost);
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
#[path = "admission_tests.rs"]
mod tests;
