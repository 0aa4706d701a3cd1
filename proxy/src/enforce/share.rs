//! Fair shares of a light lane's in-flight slots among flows: the pure core
//! of [`super::slots`] (no clock, no channels: generic over what waits).
//!
//! The model. A lane has `L` slots. The flows *present* are those holding
//! a slot or waiting for one; with `n` of them (the asking flow counted),
//! a flow may hold at most
//!
//! ```text
//! share(n) = max(1, min(⌊maxFlowShare·L⌋, ⌊L / (n + 1)⌋))
//! ```
//!
//! — an equal part of the lane for each flow present *and one more*, so a
//! flow that arrives finds a slot free at once instead of waiting for one
//! to be released; `maxFlowShare` (½ by default) caps a flow that is alone.
//! A flow already holding a slot takes another only if `share(n)` slots
//! stay free after it (a flow holding none may take any free slot): with
//! every flow at its share that is always so (`L − n·share(n) ≥ share(n)`),
//! so it costs nothing then, but flows that came early and hold more than
//! today's share cannot squeeze the lane shut on later ones. A request of
//! a flow that may take a slot takes a free one at once; else it waits in
//! its flow's FIFO. A freed slot goes to the next waiting flow, in
//! round robin (deficit round robin with every request costing one), that
//! is under its share: a flow over it is passed over and keeps its place.
//! So waiting flows are served one request per turn, and N flows cannot
//! take a lane from the rest: as their slots turn over they are held to
//! `share(n)` each, which leaves `L − N·share(n) ≥ share(n)` slots to others.
//!
//! What it cannot do: take back slots already held. A flow that came when
//! the lane was quiet holds up to `share(1)` until its requests end
//! (ordinary requests are bounded by `timeouts.requestSeconds`; long-running
//! ones release their slot when their response starts). Flows that hold
//! every slot they get leave, arriving one after the other, about a share
//! of the flows present free (ten in a lane of 40 leave one slot, two in a
//! lane of 12 leave four), less a slot for each flow arriving when a share
//! is all that is left: with more such flows than that the lane fills until
//! their requests end. Shares compare
//! only requests, not their cost or duration, as the apiserver's own flow
//! control counts seats.
//!
//! Bounds: `per_flow_depth` requests waiting per flow, `max_flows` flows
//! waiting; past either a request is refused at once. The flows remembered
//! are those present plus those still in the round-robin order, which is
//! compacted once it has twice `max_flows` entries, so memory is bounded by
//! the slots held and the queues' bounds.

use std::collections::{HashMap, VecDeque};

use super::drr::Refused;

/// Something waiting for a slot, that may have gone (its client left, its
/// wait ran out) before one comes.
pub trait Waiting {
    fn gone(&self) -> bool;
}

/// The limits of one lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareLimits {
    /// Slots in the lane; `0` is no limit.
    pub limit: usize,
    /// Slots one flow may hold when alone (`⌊maxFlowShare·L⌋`, at least one).
    pub max_share: usize,
    /// Requests one flow may have waiting.
    pub per_flow_depth: usize,
    /// Flows that may have requests waiting.
    pub max_flows: usize,
}

impl ShareLimits {
    /// What one flow may hold with `present` flows present (itself counted).
    pub fn share(&self, present: usize) -> usize {
        if self.limit == 0 {
            return usize::MAX;
        }
        (self.limit / (present + 1)).min(self.max_share).max(1)
    }
}

#[derive(Debug)]
struct FlowState<W> {
    held: usize,
    queue: VecDeque<W>,
    /// In the round-robin order (at most once).
    in_turn: bool,
}

impl<W> FlowState<W> {
    fn present(&self) -> bool {
        self.held > 0 || !self.queue.is_empty()
    }
}

/// The slots of one lane and the flows sharing them. Flow `0` is no flow:
/// its slots count in the lane, in no share (tollgate's own requests, a dry
/// run, the exempt lane).
#[derive(Debug)]
pub struct FairSlots<W> {
    limits: ShareLimits,
    inflight: usize,
    flows: HashMap<u64, FlowState<W>>,
    /// Flows holding or waiting.
    present: usize,
    /// Flows with a request waiting.
    waiting_flows: usize,
    /// Flows with requests waiting, in round-robin order; an entry whose
    /// queue emptied since is dropped when reached (or compacted).
    turn: VecDeque<u64>,
}

/// The flow of slots counted in no share.
pub const NO_FLOW: u64 = 0;

impl<W: Waiting> FairSlots<W> {
    pub fn new(limits: ShareLimits) -> Self {
        FairSlots {
            limits,
            inflight: 0,
            flows: HashMap::new(),
            present: 0,
            waiting_flows: 0,
            turn: VecDeque::new(),
        }
    }

    /// New limits (a reload); what is held and waiting stays. Call
    /// [`FairSlots::grants`] after: a raised limit serves those waiting.
    pub fn set_limits(&mut self, limits: ShareLimits) {
        self.limits = limits;
    }

    pub fn limits(&self) -> ShareLimits {
        self.limits
    }

    pub fn inflight(&self) -> usize {
        self.inflight
    }

    /// Slots `flow` holds.
    pub fn held(&self, flow: u64) -> usize {
        self.flows.get(&flow).map_or(0, |f| f.held)
    }

    /// Requests `flow` has waiting (gone ones included until purged).
    pub fn depth(&self, flow: u64) -> usize {
        self.flows.get(&flow).map_or(0, |f| f.queue.len())
    }

    /// Flows holding or waiting.
    pub fn present(&self) -> usize {
        self.present
    }

    /// Flows remembered (present, or still in the round-robin order).
    pub fn remembered(&self) -> usize {
        self.flows.len()
    }

    fn room(&self) -> bool {
        self.limits.limit == 0 || self.inflight < self.limits.limit
    }

    /// May `flow` take one more slot (room aside): under its share, and,
    /// if it holds any, leaving a share free for the next flow.
    pub fn may_take(&self, flow: u64) -> bool {
        if self.limits.limit == 0 {
            return true;
        }
        let (held, share) = (self.held(flow), self.share_of(flow));
        let free_after = self.limits.limit.saturating_sub(self.inflight + 1);
        held < share && (held == 0 || free_after >= share)
    }

    /// What `flow` may hold now.
    pub fn share_of(&self, flow: u64) -> usize {
        let counted = self.flows.get(&flow).is_some_and(FlowState::present);
        self.limits.share(self.present + usize::from(!counted))
    }

    /// Change `flow`'s state by `f`, keeping the counts of flows present and
    /// waiting, and forgetting it once it holds nothing, waits for nothing
    /// and is not in the round-robin order.
    fn with_flow<R>(&mut self, flow: u64, f: impl FnOnce(&mut FlowState<W>) -> R) -> R {
        let state = self.flows.entry(flow).or_insert_with(|| FlowState {
            held: 0,
            queue: VecDeque::new(),
            in_turn: false,
        });
        let (was_present, was_waiting) = (state.present(), !state.queue.is_empty());
        let r = f(state);
        let (present, waiting) = (state.present(), !state.queue.is_empty());
        let forget = !present && !state.in_turn;
        self.present = self.present + usize::from(present) - usize::from(was_present);
        self.waiting_flows = self.waiting_flows + usize::from(waiting) - usize::from(was_waiting);
        if forget {
            self.flows.remove(&flow);
        }
        r
    }

    /// Count a slot for `flow`.
    fn count(&mut self, flow: u64) {
        self.inflight += 1;
        if flow != NO_FLOW {
            self.with_flow(flow, |f| f.held += 1);
        }
    }

    /// Take a slot for `flow` at once if one is free and the flow is under
    /// its share with nothing of its own waiting (its requests stay in
    /// order).
    pub fn try_now(&mut self, flow: u64) -> bool {
        if !self.room() {
            return false;
        }
        if flow != NO_FLOW && (self.depth(flow) > 0 || !self.may_take(flow)) {
            return false;
        }
        self.count(flow);
        true
    }

    /// Take a slot for flow `NO_FLOW` if the lane has room under `limit`
    /// (`0`: none), whatever the shares; or past any limit if `force`.
    pub fn take_unshared(&mut self, limit: usize, force: bool) -> bool {
        if !force && limit != 0 && self.inflight >= limit {
            return false;
        }
        self.count(NO_FLOW);
        true
    }

    /// Queue `w` in `flow`'s FIFO; refused (with `w` back) past a bound.
    /// Gone waiters are purged first when the flow's queue is full.
    pub fn enqueue(&mut self, flow: u64, w: W) -> Result<(), (Refused, W)> {
        let depth = self.limits.per_flow_depth.max(1);
        if self.depth(flow) >= depth {
            self.purge(flow);
            if self.depth(flow) >= depth {
                return Err((Refused::FlowFull, w));
            }
        }
        if self.depth(flow) == 0 && self.waiting_flows >= self.limits.max_flows.max(1) {
            return Err((Refused::TooManyFlows, w));
        }
        let joined = self.with_flow(flow, |f| {
            f.queue.push_back(w);
            !std::mem::replace(&mut f.in_turn, true)
        });
        if joined {
            self.turn.push_back(flow);
            if self.turn.len() > 2 * self.limits.max_flows.max(1) {
                self.compact();
            }
        }
        Ok(())
    }

    /// Drop from the round-robin order the flows with nothing waiting
    /// (each such entry was at most one; at least half go).
    fn compact(&mut self) {
        let turn = std::mem::take(&mut self.turn);
        for flow in turn {
            if self.depth(flow) > 0 {
                self.turn.push_back(flow);
            } else {
                self.with_flow(flow, |f| f.in_turn = false);
            }
        }
    }

    /// Remove `flow`'s waiters that have gone; returns how many.
    pub fn purge(&mut self, flow: u64) -> usize {
        if !self.flows.contains_key(&flow) {
            return 0;
        }
        self.with_flow(flow, |f| {
            let before = f.queue.len();
            f.queue.retain(|w| !w.gone());
            before - f.queue.len()
        })
    }

    /// Free a slot of `flow`. Call [`FairSlots::grants`] after.
    pub fn release(&mut self, flow: u64) {
        self.inflight = self.inflight.saturating_sub(1);
        if flow != NO_FLOW && self.flows.contains_key(&flow) {
            self.with_flow(flow, |f| f.held = f.held.saturating_sub(1));
        }
    }

    /// Free slots given to waiting flows under their share, one request per
    /// flow per turn; each grant is counted here and handed to `out`.
    /// Waiters that have gone are dropped on the way.
    pub fn grants(&mut self, mut out: impl FnMut(u64, W)) {
        // Flows passed over in a row (at their share): a whole turn of
        // them and nobody can be served.
        let mut passed = 0;
        while self.room() && self.waiting_flows > 0 && passed < self.turn.len() {
            let Some(flow) = self.turn.pop_front() else {
                break;
            };
            if self.depth(flow) == 0 {
                self.with_flow(flow, |f| f.in_turn = false);
                continue;
            }
            if !self.may_take(flow) {
                self.turn.push_back(flow);
                passed += 1;
                continue;
            }
            let (w, more) = self.with_flow(flow, |f| {
                let w = f.queue.pop_front();
                let more = !f.queue.is_empty();
                f.in_turn = more;
                (w, more)
            });
            let Some(w) = w else { continue };
            if w.gone() {
                // Its turn stays: the next of its requests, if any, first.
                if more {
                    self.turn.push_front(flow);
                }
                continue;
            }
            if more {
                self.turn.push_back(flow);
            }
            self.count(flow);
            passed = 0;
            out(flow, w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A waiter in the tests: an id and whether it has gone.
    #[derive(Debug, Clone)]
    struct W(u32, Rc<Cell<bool>>);

    impl Waiting for W {
        fn gone(&self) -> bool {
            self.1.get()
        }
    }

    fn w(id: u32) -> W {
        W(id, Rc::new(Cell::new(false)))
    }

    fn limits(limit: usize, max_share: usize) -> ShareLimits {
        ShareLimits {
            limit,
            max_share,
            per_flow_depth: 100,
            max_flows: 100,
        }
    }

    fn grants(s: &mut FairSlots<W>) -> Vec<(u64, u32)> {
        let mut out = Vec::new();
        s.grants(|f, w| out.push((f, w.0)));
        out
    }

    #[test]
    fn the_share_leaves_room_for_one_more_flow() {
        let l = limits(12, 6);
        assert_eq!(l.share(1), 6, "alone: maxFlowShare");
        assert_eq!(l.share(2), 4);
        assert_eq!(l.share(3), 3);
        assert_eq!(l.share(11), 1);
        assert_eq!(l.share(50), 1, "at least one");
        assert_eq!(limits(0, 1).share(5), usize::MAX, "no limit");
    }

    /// Two flows that hold what they get and never give it back, one after
    /// the other: the lane keeps slots for others, served at once (with a
    /// cap of half the lane per flow, the two took it all).
    #[test]
    fn two_greedy_flows_leave_slots_free() {
        let mut s: FairSlots<W> = FairSlots::new(limits(12, 6));
        for flow in [1, 2] {
            for i in 0..30 {
                if !s.try_now(flow) {
                    s.enqueue(flow, w(i)).expect("room to wait");
                }
            }
        }
        // The second leaves its share of ⌊12/3⌋ = 4 free.
        assert_eq!((s.held(1), s.held(2)), (6, 2));
        for flow in 3..=6 {
            assert!(s.try_now(flow), "flow {flow} at once");
        }
        assert_eq!(s.inflight(), 12);
    }

    /// Ten flows that hold what they get, one after the other: an
    /// eleventh still finds a slot at once.
    #[test]
    fn ten_greedy_flows_one_after_the_other_leave_a_slot() {
        let mut s: FairSlots<W> = FairSlots::new(limits(40, 20));
        for flow in 1..=10 {
            for i in 0..30 {
                if !s.try_now(flow) {
                    s.enqueue(flow, w(i)).expect("room to wait");
                }
            }
        }
        assert_eq!(s.held(1), 20);
        assert!(s.try_now(11), "{} held", s.inflight());
    }

    /// Ten flows flooding together (round after round of requests) hold
    /// their share each; an eleventh gets a slot at once.
    #[test]
    fn ten_flows_flooding_together_leave_slots_free() {
        let mut s: FairSlots<W> = FairSlots::new(limits(40, 20));
        for i in 0..30 {
            for flow in 1..=10 {
                if !s.try_now(flow) {
                    s.enqueue(flow, w(i)).expect("room to wait");
                }
            }
        }
        assert!((1..=10).all(|f| s.held(f) <= 4), "{:?}", s.flows.keys());
        assert!(s.try_now(11));
    }

    /// A freed slot goes to a flow that waits under its share before one
    /// at its share, and waiting flows take turns.
    #[test]
    fn freed_slots_go_round_robin_to_flows_under_their_share() {
        let mut s: FairSlots<W> = FairSlots::new(limits(4, 4));
        for _ in 0..2 {
            assert!(s.try_now(1));
        }
        // Flow 1 at its share (⌊4/2⌋ = 2); flow 2 takes the rest.
        assert!(!s.try_now(1));
        s.enqueue(1, w(10)).expect("waits");
        assert!(s.try_now(2));
        assert!(!s.try_now(2), "flow 2 at its share ⌊4/3⌋ = 1");
        s.enqueue(2, w(20)).expect("waits");
        s.enqueue(2, w(21)).expect("waits");
        s.enqueue(3, w(30)).expect("waits");
        assert_eq!(grants(&mut s), [(3, 30)], "the flow holding nothing");
        s.release(1);
        assert_eq!(grants(&mut s), [], "nobody under its share of 1");
        s.release(2);
        assert_eq!(grants(&mut s), [(2, 20)]);
        s.release(1);
        s.release(3);
        assert_eq!(grants(&mut s), [(1, 10)], "a turn each");
        s.release(2);
        assert_eq!(grants(&mut s), [(2, 21)]);
    }

    #[test]
    fn bounds_refuse_and_gone_waiters_are_purged() {
        let mut s: FairSlots<W> = FairSlots::new(ShareLimits {
            limit: 1,
            max_share: 1,
            per_flow_depth: 1,
            max_flows: 1,
        });
        assert!(s.try_now(1));
        let first = w(1);
        s.enqueue(2, first.clone()).expect("waits");
        assert!(matches!(s.enqueue(2, w(2)), Err((Refused::FlowFull, _))));
        assert!(matches!(
            s.enqueue(3, w(3)),
            Err((Refused::TooManyFlows, _))
        ));
        first.1.set(true);
        s.enqueue(2, w(4)).expect("the gone one purged");
        s.release(1);
        assert_eq!(grants(&mut s), [(2, 4)]);
        assert_eq!(s.remembered(), 1, "only flow 2, holding");
    }

    #[test]
    fn the_round_robin_order_stays_bounded() {
        let mut s: FairSlots<W> = FairSlots::new(ShareLimits {
            limit: 1,
            max_share: 1,
            per_flow_depth: 4,
            max_flows: 8,
        });
        assert!(s.try_now(1));
        // Thousands of flows wait and leave while the lane stays full.
        for flow in 2..5000u64 {
            let waiter = w(0);
            s.enqueue(flow, waiter.clone()).expect("waits");
            waiter.1.set(true);
            s.purge(flow);
        }
        assert!(s.turn.len() <= 16, "{}", s.turn.len());
        assert!(s.remembered() <= 17, "{}", s.remembered());
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A request of flow `.0`.
        Ask(u64),
        /// The `.0`-th held slot (mod how many) ends.
        End(usize),
        /// The oldest waiter of flow `.0` leaves.
        Leave(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (1u64..=6).prop_map(Op::Ask),
            2 => any::<usize>().prop_map(Op::End),
            1 => (1u64..=6).prop_map(Op::Leave),
        ]
    }

    proptest! {
        /// Whatever flows ask, end and leave: the lane is never over its
        /// limit; no grant (at once or from a queue) takes a flow past
        /// its share of the flows present at that moment, nor a flow
        /// holding a slot into the last share of the lane; a free slot is
        /// never left while a flow that may take it waits; each flow is
        /// served in its own order; the counts add up.
        #[test]
        fn no_flow_gets_more_than_its_share_while_others_wait(
            limit in 1usize..16,
            share_pct in 10usize..=100,
            ops in proptest::collection::vec(op(), 1..300),
        ) {
            let max_share = (limit * share_pct / 100).max(1);
            let l = ShareLimits { limit, max_share, per_flow_depth: 8, max_flows: 4 };
            let mut s: FairSlots<W> = FairSlots::new(l);
            let mut held: Vec<u64> = Vec::new();
            let mut waiting: HashMap<u64, VecDeque<W>> = HashMap::new();
            let mut next_id = 0u32;
            let mut last_served: HashMap<u64, u32> = HashMap::new();
            for op in ops {
                let mut granted = Vec::new();
                match op {
                    Op::Ask(flow) => {
                        let share = s.share_of(flow);
                        let before = held.iter().filter(|&&f| f == flow).count();
                        if s.try_now(flow) {
                            prop_assert!(s.held(flow) <= share, "at once past the share");
                            prop_assert!(before == 0 || limit - held.len() > share,
                                "flow {} holding {} took one of the last {} slots at once", flow, before, share);
                            held.push(flow);
                        } else {
                            next_id += 1;
                            let waiter = w(next_id);
                            if s.enqueue(flow, waiter.clone()).is_ok() {
                                waiting.entry(flow).or_default().push_back(waiter);
                            }
                        }
                    }
                    Op::End(i) if !held.is_empty() => {
                        let flow = held.swap_remove(i % held.len());
                        s.release(flow);
                    }
                    Op::End(_) => {}
                    Op::Leave(flow) => {
                        if let Some(waiter) = waiting.get_mut(&flow).and_then(|q| q.pop_front()) {
                            waiter.1.set(true);
                            s.purge(flow);
                        }
                    }
                }
                // Each grant checked in order, against the state it was made in.
                s.grants(|flow, waiter| granted.push((flow, waiter)));
                for (flow, waiter) in granted {
                    let present = (1..=6u64)
                        .filter(|f| held.contains(f) || waiting.get(f).is_some_and(|q| !q.is_empty()))
                        .count();
                    let before = held.iter().filter(|&&f| f == flow).count();
                    let share = l.share(present);
                    prop_assert!(before < share,
                        "flow {} granted its slot {} of a share of {}", flow, before + 1, share);
                    let free_after = limit - held.len() - 1;
                    prop_assert!(before == 0 || free_after >= share,
                        "flow {} holding {} took one of the last {} slots", flow, before, share);
                    let q = waiting.get_mut(&flow).expect("a waiter of this flow");
                    let front = q.pop_front().expect("one waits");
                    prop_assert_eq!(front.0, waiter.0, "served in its own order");
                    if let Some(prev) = last_served.insert(flow, waiter.0) {
                        prop_assert!(prev < waiter.0);
                    }
                    held.push(flow);
                }
                prop_assert!(s.inflight() <= limit);
                prop_assert_eq!(s.inflight(), held.len());
                for flow in 1..=6u64 {
                    let n = held.iter().filter(|&&f| f == flow).count();
                    prop_assert_eq!(s.held(flow), n);
                    let waits = waiting.get(&flow).is_some_and(|q| !q.is_empty());
                    if s.inflight() < limit && waits {
                        let (h, share) = (s.held(flow), s.share_of(flow));
                        let free_after = limit - s.inflight() - 1;
                        prop_assert!(h >= share || (h > 0 && free_after < share),
                            "slot free while flow {} waits and may take it", flow);
                    }
                }
            }
        }
    }
}
