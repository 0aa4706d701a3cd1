//! In-flight slots per lane, and fairness inside a limited lane.
//!
//! Each lane has an in-flight limit, read from the running configuration at
//! each admission, so a reload takes effect at once (a lowered limit lets
//! running requests finish). Inside a limited lane requests are served per
//! flow (a client, see [`crate::admit::Flow`]), as the apiserver's flow
//! control gives every flow its own queue inside a priority level:
//!
//! - A flow holds at most its share of the lane's slots
//!   (`lanes.queue.maxFlowShare`), so one flow never holds the whole lane:
//!   sixty anonymous clients behind one address sending slow bodies used to
//!   take every slot and make everyone else wait out `lanes.maxWaitSeconds`
//!   and get a 429; now the rest of the lane stays free for other flows.
//! - A request that finds the lane (or its flow's share) full waits in its
//!   flow's queue. A freed slot is handed straight to the next flow in round
//!   robin that is under its share (the heavy lane's [`FairQueue`], every
//!   cost one), so a newcomer cannot take it first and no flow waits behind
//!   another's backlog.
//! - Bounds: `perFlowDepth` requests waiting per flow and `maxFlows` flows
//!   waiting; past either a request is refused at once (429). Only flows
//!   holding a slot are counted, so that map has at most `limit` entries.
//!
//! One `std` mutex per lane, held for counting and choosing, never across an
//! `.await`; slots are sent to waiters after it is released. A waiter that
//! gives up (its wait ran out, its client left) drops its receiver: a slot
//! already sent to it is then dropped with it and freed like any other, so
//! nothing leaks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

use super::drr::{FairQueue, Refused};
use super::lane::Lane;
use super::settings::Lanes;

/// A slot taken without a flow (tollgate's own requests, a dry run, the
/// exempt lane): counted in the lane, not in any flow's share.
const NO_FLOW: u64 = 0;

/// A lane's limits for one admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLimits {
    /// Slots in the lane; `0` is no limit.
    pub limit: usize,
    /// Slots one flow may hold.
    pub per_flow: usize,
    /// Requests one flow may have waiting.
    pub per_flow_depth: usize,
    /// Flows that may have requests waiting.
    pub max_flows: usize,
}

impl SlotLimits {
    /// `lane`'s limits under `lanes`.
    pub fn of(lane: Lane, lanes: &Lanes) -> SlotLimits {
        let limit = lane.limit(lanes);
        let q = &lanes.queue;
        // Truncated, at least one: a share of a small lane is still a slot.
        // An unlimited lane has no shares either.
        let share = (limit as f64 * q.max_flow_share).floor() as usize;
        let per_flow = if limit == 0 {
            usize::MAX
        } else {
            share.clamp(1, limit)
        };
        SlotLimits {
            limit,
            per_flow,
            per_flow_depth: q.per_flow_depth.max(1),
            max_flows: q.max_flows.max(1),
        }
    }
}

/// The in-flight slots of every lane.
#[derive(Debug)]
pub struct LaneSlots {
    lanes: [Arc<LaneState>; 5],
}

impl Default for LaneSlots {
    fn default() -> Self {
        LaneSlots {
            lanes: Lane::ALL.map(|lane| {
                Arc::new(LaneState {
                    lane,
                    inner: Mutex::default(),
                })
            }),
        }
    }
}

/// One lane's slots.
#[derive(Debug)]
struct LaneState {
    lane: Lane,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    inflight: usize,
    /// The limits of the latest admission, for slots freed later.
    limits: SlotLimits,
    /// Slots held, per flow holding any.
    held: HashMap<u64, usize>,
    waiting: FairQueue<u64, oneshot::Sender<LaneSlot>>,
}

impl Default for Inner {
    fn default() -> Self {
        let limits = SlotLimits {
            limit: 0,
            per_flow: 1,
            per_flow_depth: 1,
            max_flows: 1,
        };
        Inner {
            inflight: 0,
            limits,
            held: HashMap::new(),
            // Every cost one and a quantum of one: plain round robin.
            waiting: FairQueue::new(1.0, limits.per_flow_depth, limits.max_flows),
        }
    }
}

/// A slot handed to a waiter: its flow, and where to send it.
type Grant = (u64, oneshot::Sender<LaneSlot>);

impl Inner {
    fn room(&self) -> bool {
        self.limits.limit == 0 || self.inflight < self.limits.limit
    }

    fn under_share(&self, flow: u64) -> bool {
        flow == NO_FLOW || self.held.get(&flow).copied().unwrap_or(0) < self.limits.per_flow
    }

    fn set_limits(&mut self, limits: SlotLimits) {
        if self.limits != limits {
            self.limits = limits;
            self.waiting
                .set_limits(1.0, limits.per_flow_depth, limits.max_flows);
        }
    }

    fn count(&mut self, flow: u64) {
        self.inflight += 1;
        if flow != NO_FLOW {
            *self.held.entry(flow).or_default() += 1;
        }
    }

    fn uncount(&mut self, flow: u64) {
        self.inflight = self.inflight.saturating_sub(1);
        if let Some(n) = self.held.get_mut(&flow) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&flow);
            }
        }
    }

    /// Free slots to waiting flows under their share, in round robin;
    /// counted here, sent by the caller once the lock is released.
    fn grants(&mut self) -> Vec<Grant> {
        let mut out = Vec::new();
        while self.room() && !self.waiting.is_empty() {
            let (held, per_flow) = (&self.held, self.limits.per_flow);
            let eligible = |f: &u64| held.get(f).copied().unwrap_or(0) < per_flow;
            let Some((flow, _, tx)) = self.waiting.pop_where(eligible) else {
                break;
            };
            if tx.is_closed() {
                continue;
            }
            self.count(flow);
            out.push((flow, tx));
        }
        out
    }
}

/// One request's place in a lane; freed on drop (to the next waiter, if any).
#[derive(Debug)]
pub struct LaneSlot {
    /// `None` once handed back unused (its waiter had gone).
    state: Option<Arc<LaneState>>,
    flow: u64,
}

impl Drop for LaneSlot {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            state.release(self.flow);
        }
    }
}

impl LaneSlot {
    pub fn lane(&self) -> Lane {
        self.state.as_ref().map_or(Lane::default(), |s| s.lane)
    }
}

/// How taking a slot went.
#[derive(Debug)]
pub enum SlotOutcome {
    /// At once.
    Now(LaneSlot),
    /// After waiting.
    Waited(LaneSlot),
    /// No slot came for the whole wait.
    Full,
    /// The flow's queue, or the number of waiting flows, was at its bound.
    Refused(Refused),
}

impl LaneState {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Counts, not invariants that a panic could break halfway.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot(self: &Arc<Self>, flow: u64) -> LaneSlot {
        LaneSlot {
            state: Some(self.clone()),
            flow,
        }
    }

    /// Free a slot of `flow`, and send what that frees to the next waiter.
    fn release(self: &Arc<Self>, flow: u64) {
        let grants = {
            let mut inner = self.lock();
            inner.uncount(flow);
            inner.grants()
        };
        self.send_all(grants);
    }

    /// Send the granted slots (with the lock released). A waiter that has
    /// gone hands its slot on to the next: a loop, not recursion through
    /// `Drop`.
    fn send_all(self: &Arc<Self>, mut grants: Vec<Grant>) {
        while !grants.is_empty() {
            let mut gone = Vec::new();
            for (flow, tx) in grants {
                if let Err(mut slot) = tx.send(self.slot(flow)) {
                    // Disarmed: freed below, not by its `Drop`.
                    slot.state = None;
                    gone.push(flow);
                }
            }
            if gone.is_empty() {
                return;
            }
            let mut inner = self.lock();
            for flow in gone {
                inner.uncount(flow);
            }
            grants = inner.grants();
        }
    }
}

impl LaneSlots {
    fn state(&self, lane: Lane) -> &Arc<LaneState> {
        &self.lanes[lane.index()]
    }

    /// Slots held in `lane` now.
    pub fn inflight(&self, lane: Lane) -> usize {
        self.state(lane).lock().inflight
    }

    /// Take a slot if one is free under `limit` (0: no limit), counted in no
    /// flow (tollgate's own requests, a dry run).
    pub fn try_take(&self, lane: Lane, limit: usize) -> Option<LaneSlot> {
        let state = self.state(lane);
        let mut inner = state.lock();
        if limit != 0 && inner.inflight >= limit {
            return None;
        }
        inner.count(NO_FLOW);
        drop(inner);
        Some(state.slot(NO_FLOW))
    }

    /// Take a slot even past the limit (exempt, dry run: count, never wait).
    pub fn force_take(&self, lane: Lane) -> LaneSlot {
        let state = self.state(lane);
        state.lock().count(NO_FLOW);
        state.slot(NO_FLOW)
    }

    /// Take a slot for `flow` (any number; 0, reserved, counts as 1),
    /// waiting up to `wait` in the flow's queue for one to be handed over.
    pub async fn take(
        &self,
        lane: Lane,
        flow: u64,
        limits: SlotLimits,
        wait: Duration,
    ) -> SlotOutcome {
        let flow = flow.max(NO_FLOW + 1);
        let state = self.state(lane);
        let (rx, grants) = {
            let mut inner = state.lock();
            inner.set_limits(limits);
            // A raised limit first serves those already waiting.
            let grants = inner.grants();
            if inner.room() && inner.under_share(flow) && inner.waiting.depth(&flow) == 0 {
                inner.count(flow);
                drop(inner);
                state.send_all(grants);
                return SlotOutcome::Now(state.slot(flow));
            }
            let (tx, rx) = oneshot::channel();
            let mut pushed = inner.waiting.push(flow, 1.0, tx);
            if let Err((Refused::FlowFull, tx)) = pushed {
                // Waiters that gave up still count until purged.
                inner.waiting.purge(&flow, |w| w.is_closed());
                pushed = inner.waiting.push(flow, 1.0, tx);
            }
            if let Err((refused, _)) = pushed {
                drop(inner);
                state.send_all(grants);
                return SlotOutcome::Refused(refused);
            }
            (rx, grants)
        };
        state.send_all(grants);
        let mut waiter = Waiter { state, flow, rx };
        match tokio::time::timeout(wait, &mut waiter.rx).await {
            Ok(Ok(slot)) => SlotOutcome::Waited(slot),
            // Its place was dropped unserved: only a purge of closed places
            // does that, so not seen; a full lane all the same.
            Ok(Err(_)) => SlotOutcome::Full,
            Err(_) => {
                waiter.rx.close();
                // Handed over just as the wait ran out: take it.
                match waiter.rx.try_recv() {
                    Ok(slot) => SlotOutcome::Waited(slot),
                    Err(_) => SlotOutcome::Full,
                }
            }
        }
    }
}

/// A request waiting in its flow's queue. However it leaves (served, its
/// wait run out, or dropped with its client's request), its place is
/// closed, a slot sent to it meanwhile is freed to the next waiter, and the
/// closed places of its flow are purged, so they do not count against the
/// queue's bounds.
struct Waiter<'a> {
    state: &'a Arc<LaneState>,
    flow: u64,
    rx: oneshot::Receiver<LaneSlot>,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.rx.close();
        // Dropped here, before the lock below: its release takes it too.
        drop(self.rx.try_recv());
        self.state
            .lock()
            .waiting
            .purge(&self.flow, |w| w.is_closed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(limit: usize, per_flow: usize) -> SlotLimits {
        SlotLimits {
            limit,
            per_flow,
            per_flow_depth: 10,
            max_flows: 10,
        }
    }

    const SECOND: Duration = Duration::from_secs(1);

    /// `flow` waits in `lane` (for up to 5 s) in a task of its own; returns
    /// once it is parked in its queue.
    async fn waiter(
        slots: &Arc<LaneSlots>,
        lane: Lane,
        flow: u64,
        l: SlotLimits,
    ) -> tokio::task::JoinHandle<SlotOutcome> {
        let s = slots.clone();
        let task = tokio::spawn(async move { s.take(lane, flow, l, 5 * SECOND).await });
        settle().await;
        task
    }

    /// Let every spawned task run until it waits (one thread, paused clock).
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    fn now(o: SlotOutcome) -> LaneSlot {
        match o {
            SlotOutcome::Now(s) => s,
            other => panic!("expected a slot at once, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn slots_wait_for_a_release_then_give_up() {
        let slots = Arc::new(LaneSlots::default());
        let a = slots.try_take(Lane::System, 1).expect("free");
        assert!(slots.try_take(Lane::System, 1).is_none());
        assert!(slots.try_take(Lane::System, 0).is_some(), "0 is unlimited");
        let s2 = slots.clone();
        let waiter =
            tokio::spawn(async move { s2.take(Lane::System, 7, limits(1, 1), 5 * SECOND).await });
        // The clock is paused: this sleep ends only once every task is idle, i.e. the waiter
        // is parked in `take`, and then advances virtual time by 1 s (< its 5 s wait).
        tokio::time::sleep(SECOND).await;
        drop(a);
        assert!(matches!(
            waiter.await.expect("joins"),
            SlotOutcome::Waited(_)
        ));
        let _held = slots.try_take(Lane::Heavy, 1).expect("free");
        assert!(matches!(
            slots.take(Lane::Heavy, 7, limits(1, 1), SECOND).await,
            SlotOutcome::Full
        ));
        assert_eq!(slots.inflight(Lane::Heavy), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn one_flow_holds_at_most_its_share_and_another_gets_a_slot_at_once() {
        let slots = Arc::new(LaneSlots::default());
        let l = limits(4, 2);
        let (a1, _a2) = (
            now(slots.take(Lane::Workload, 1, l, SECOND).await),
            now(slots.take(Lane::Workload, 1, l, SECOND).await),
        );
        let a3 = waiter(&slots, Lane::Workload, 1, l).await;
        // Two slots free, but not for flow 1: flow 2 takes one at once.
        let _b = now(slots.take(Lane::Workload, 2, l, SECOND).await);
        assert_eq!(slots.inflight(Lane::Workload), 3);
        drop(a1);
        let a3 = a3.await.expect("joins");
        assert!(matches!(a3, SlotOutcome::Waited(_)));
        assert_eq!(slots.inflight(Lane::Workload), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn freed_slots_go_round_robin_to_the_waiting_flows() {
        let slots = Arc::new(LaneSlots::default());
        let l = limits(2, 2);
        let mut held = vec![
            now(slots.take(Lane::System, 1, l, SECOND).await),
            now(slots.take(Lane::System, 1, l, SECOND).await),
        ];
        let mut a = Vec::new();
        for _ in 0..3 {
            a.push(waiter(&slots, Lane::System, 1, l).await);
        }
        let b = waiter(&slots, Lane::System, 2, l).await;
        // Flow 1's backlog came first; flow 2 is served after one of it.
        held.remove(0);
        held.remove(0);
        let served = |t: &tokio::task::JoinHandle<SlotOutcome>| t.is_finished();
        settle().await;
        assert!(served(&a[0]) && served(&b), "a1 then b1");
        assert!(!served(&a[1]) && !served(&a[2]));
        let (a1, b1) = (a.remove(0), b);
        drop(a1.await.expect("joins"));
        settle().await;
        assert!(served(&a[0]) && !served(&a[1]), "then a2");
        drop(b1.await.expect("joins"));
        for t in a {
            assert!(matches!(t.await.expect("joins"), SlotOutcome::Waited(_)));
        }
        assert_eq!(slots.inflight(Lane::System), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn queues_are_bounded_and_refuse_at_once() {
        let slots = Arc::new(LaneSlots::default());
        let l = SlotLimits {
            limit: 1,
            per_flow: 1,
            per_flow_depth: 1,
            max_flows: 1,
        };
        let _held = now(slots.take(Lane::Workload, 1, l, SECOND).await);
        let _w = waiter(&slots, Lane::Workload, 1, l).await;
        assert!(matches!(
            slots.take(Lane::Workload, 1, l, SECOND).await,
            SlotOutcome::Refused(Refused::FlowFull)
        ));
        assert!(matches!(
            slots.take(Lane::Workload, 2, l, SECOND).await,
            SlotOutcome::Refused(Refused::TooManyFlows)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_leaves_loses_its_place_and_no_slot() {
        let slots = Arc::new(LaneSlots::default());
        let l = SlotLimits {
            per_flow_depth: 1,
            ..limits(1, 1)
        };
        let held = now(slots.take(Lane::Workload, 1, l, SECOND).await);
        // Cancelled (its client went away) while waiting.
        let gone = waiter(&slots, Lane::Workload, 2, l).await;
        gone.abort();
        assert!(gone.await.is_err());
        // Timed out: its place is purged, so the flow may queue again.
        assert!(matches!(
            slots.take(Lane::Workload, 3, l, SECOND).await,
            SlotOutcome::Full
        ));
        let again = waiter(&slots, Lane::Workload, 3, l).await;
        drop(held);
        assert!(matches!(
            again.await.expect("joins"),
            SlotOutcome::Waited(_)
        ));
        assert_eq!(slots.inflight(Lane::Workload), 0);
        let _s = now(slots.take(Lane::Workload, 4, l, SECOND).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_raised_limit_serves_those_waiting() {
        let slots = Arc::new(LaneSlots::default());
        let _held = now(slots.take(Lane::Workload, 1, limits(1, 1), SECOND).await);
        let w = waiter(&slots, Lane::Workload, 2, limits(1, 1)).await;
        let _s = now(slots.take(Lane::Workload, 3, limits(3, 1), SECOND).await);
        let w = w.await.expect("joins");
        assert!(matches!(w, SlotOutcome::Waited(_)));
        assert_eq!(slots.inflight(Lane::Workload), 3);
    }

    #[test]
    fn a_share_is_at_least_one_slot_and_at_most_the_lane() {
        let mut lanes = Lanes::default();
        lanes.max_inflight.workload = 50;
        assert_eq!(SlotLimits::of(Lane::Workload, &lanes).per_flow, 25);
        lanes.max_inflight.workload = 1;
        assert_eq!(SlotLimits::of(Lane::Workload, &lanes).per_flow, 1);
        lanes.max_inflight.workload = 0;
        assert_eq!(SlotLimits::of(Lane::Workload, &lanes).per_flow, usize::MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unlimited_lane_never_makes_a_flow_wait() {
        let slots = LaneSlots::default();
        let lanes = Lanes {
            max_inflight: crate::enforce::settings::LaneLimits {
                workload: 0,
                ..Default::default()
            },
            ..Lanes::default()
        };
        let l = SlotLimits::of(Lane::Workload, &lanes);
        let mut held = Vec::new();
        for _ in 0..100 {
            held.push(now(slots.take(Lane::Workload, 1, l, SECOND).await));
        }
        assert_eq!(slots.inflight(Lane::Workload), 100);
    }
}
