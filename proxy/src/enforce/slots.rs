//! In-flight slots per lane, and fair shares of them inside a limited lane.
//!
//! Each lane has an in-flight limit, read from the running configuration at
//! each admission, so a reload takes effect at once (a lowered limit lets
//! running requests finish). Inside a limited lane requests are served per
//! flow (a client, see [`crate::admit::Flow`]), as the apiserver's flow
//! control gives every flow its own queue inside a priority level; the
//! model is [`super::share`]'s: a flow may hold an equal part of the lane
//! for each flow present and one more (capped by `lanes.queue.maxFlowShare`),
//! waits in its own FIFO past it, and freed slots go round robin to the
//! waiting flows under their share. Two flows of slow uploads used to hold
//! half the lane each (a fixed cap per flow), and every other client waited
//! out `lanes.maxWaitSeconds` for a 429.
//!
//! Bounds: `perFlowDepth` requests waiting per flow and `maxFlows` flows
//! waiting; past either a request is refused at once (429).
//!
//! One `std` mutex per lane, held for counting and choosing, never across an
//! `.await`; slots are sent to waiters after it is released. A waiter that
//! gives up (its wait ran out, its client left) drops its receiver: a slot
//! already sent to it is then dropped with it and freed like any other, so
//! nothing leaks.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

use super::drr::Refused;
use super::lane::Lane;
use super::share::{FairSlots, ShareLimits, Waiting, NO_FLOW};
use crate::config::settings::enforce::Lanes;

/// A lane's limits for one admission.
pub type SlotLimits = ShareLimits;

impl ShareLimits {
    /// `lane`'s limits under `lanes`.
    pub fn of(lane: Lane, lanes: &Lanes) -> ShareLimits {
        let limit = lane.limit(lanes);
        let q = &lanes.queue;
        // Truncated, at least one: a share of a small lane is still a slot.
        let share = (limit as f64 * q.max_flow_share).floor() as usize;
        ShareLimits {
            limit,
            max_share: share.clamp(1, limit.max(1)),
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
                    inner: Mutex::new(FairSlots::new(ShareLimits {
                        limit: 0,
                        max_share: 1,
                        per_flow_depth: 1,
                        max_flows: 1,
                    })),
                })
            }),
        }
    }
}

/// One lane's slots.
#[derive(Debug)]
struct LaneState {
    lane: Lane,
    inner: Mutex<FairSlots<oneshot::Sender<LaneSlot>>>,
}

impl Waiting for oneshot::Sender<LaneSlot> {
    fn gone(&self) -> bool {
        self.is_closed()
    }
}

/// A slot handed to a waiter: its flow, and where to send it.
type Grant = (u64, oneshot::Sender<LaneSlot>);

/// Grants made under the lock, sent after it (a `Vec` allocates only
/// when a slot is granted to a waiter, never on the path without waiting).
type Grants = Vec<Grant>;

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
    fn lock(&self) -> MutexGuard<'_, FairSlots<oneshot::Sender<LaneSlot>>> {
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
            inner.release(flow);
            grants(&mut inner)
        };
        self.send_all(grants);
    }

    /// Send the granted slots (with the lock released). A waiter that has
    /// gone hands its slot on to the next: a loop, not recursion through
    /// `Drop`.
    fn send_all(self: &Arc<Self>, mut pending: Grants) {
        while !pending.is_empty() {
            let mut gone = Vec::new();
            for (flow, tx) in pending {
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
                inner.release(flow);
            }
            pending = grants(&mut inner);
        }
    }
}

/// What `slots` frees to the waiting flows now.
fn grants(slots: &mut FairSlots<oneshot::Sender<LaneSlot>>) -> Grants {
    let mut out = Grants::new();
    slots.grants(|flow, tx| out.push((flow, tx)));
    out
}

impl LaneSlots {
    fn state(&self, lane: Lane) -> &Arc<LaneState> {
        &self.lanes[lane.index()]
    }

    /// Slots held in `lane` now.
    pub fn inflight(&self, lane: Lane) -> usize {
        self.state(lane).lock().inflight()
    }

    /// Slots `flow` holds in `lane` now.
    pub fn held(&self, lane: Lane, flow: u64) -> usize {
        self.state(lane).lock().held(flow.max(NO_FLOW + 1))
    }

    /// Take a slot if one is free under `limit` (0: no limit), counted in no
    /// flow (tollgate's own requests, a dry run).
    pub fn try_take(&self, lane: Lane, limit: usize) -> Option<LaneSlot> {
        let state = self.state(lane);
        let taken = state.lock().take_unshared(limit, false);
        taken.then(|| state.slot(NO_FLOW))
    }

    /// Take a slot even past the limit (exempt, dry run: count, never wait).
    pub fn force_take(&self, lane: Lane) -> LaneSlot {
        let state = self.state(lane);
        state.lock().take_unshared(0, true);
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
        let (rx, pending) = {
            let mut inner = state.lock();
            if inner.limits() != limits {
                inner.set_limits(limits);
            }
            // A raised limit first serves those already waiting.
            let pending = grants(&mut inner);
            if inner.try_now(flow) {
                drop(inner);
                state.send_all(pending);
                return SlotOutcome::Now(state.slot(flow));
            }
            let (tx, rx) = oneshot::channel();
            if let Err((refused, _)) = inner.enqueue(flow, tx) {
                drop(inner);
                state.send_all(pending);
                return SlotOutcome::Refused(refused);
            }
            (rx, pending)
        };
        state.send_all(pending);
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
/// queue's bounds (nor its flow as present, once none is left).
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
        // Its flow may have left with it: the others' shares grow.
        let pending = {
            let mut inner = self.state.lock();
            inner.purge(self.flow);
            grants(&mut inner)
        };
        self.state.send_all(pending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(limit: usize, max_share: usize) -> SlotLimits {
        SlotLimits {
            limit,
            max_share,
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
    async fn a_flow_holds_at_most_its_share_of_the_flows_present() {
        let slots = Arc::new(LaneSlots::default());
        let l = limits(4, 2);
        // Alone, flow 1 may hold half the lane.
        let (a1, _a2) = (
            now(slots.take(Lane::Workload, 1, l, SECOND).await),
            now(slots.take(Lane::Workload, 1, l, SECOND).await),
        );
        let a3 = waiter(&slots, Lane::Workload, 1, l).await;
        // Two slots free, but not for flow 1: flow 2 takes one at once.
        let b = now(slots.take(Lane::Workload, 2, l, SECOND).await);
        assert_eq!(slots.inflight(Lane::Workload), 3);
        assert_eq!(slots.held(Lane::Workload, 2), 1);
        // With two flows present a share is ⌊4/3⌋ = 1: flow 1 holds it.
        drop(a1);
        settle().await;
        assert!(!a3.is_finished(), "flow 1 at its share");
        // Flow 2 gone: flow 1 alone again, its waiter served.
        drop(b);
        let a3 = a3.await.expect("joins");
        assert!(matches!(a3, SlotOutcome::Waited(_)));
        assert_eq!(slots.inflight(Lane::Workload), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn queues_are_bounded_and_refuse_at_once() {
        let slots = Arc::new(LaneSlots::default());
        let l = SlotLimits {
            limit: 1,
            max_share: 1,
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
        assert_eq!(SlotLimits::of(Lane::Workload, &lanes).max_share, 25);
        assert_eq!(SlotLimits::of(Lane::Workload, &lanes).share(1), 25);
        assert_eq!(SlotLimits::of(Lane::Workload, &lanes).share(4), 10);
        lanes.max_inflight.workload = 1;
        assert_eq!(SlotLimits::of(Lane::Workload, &lanes).share(1), 1);
        lanes.max_inflight.workload = 0;
        assert_eq!(SlotLimits::of(Lane::Workload, &lanes).share(1), usize::MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unlimited_lane_never_makes_a_flow_wait() {
        let slots = LaneSlots::default();
        let lanes = Lanes {
            max_inflight: crate::config::settings::enforce::LaneLimits {
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
