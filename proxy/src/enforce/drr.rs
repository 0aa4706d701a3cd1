//! Fair queuing of heavy requests: one FIFO per flow (a client), served by
//! deficit round robin on predicted bytes, so one client's storm cannot
//! starve another client's single LIST. Pure and generic over what waits.
//!
//! Each round, the flow at the front of the active list earns `quantum`
//! bytes of credit and is served while its head fits in its credit; then
//! the next flow. A flow whose queue empties leaves the list and forgets
//! its credit. Costs far above the quantum are handled by fast-forwarding
//! whole rounds in which nobody could be served, so serving is O(flows).
//!
//! Bounds: `per_flow_depth` entries per flow and `max_flows` flows; a push
//! past either is refused (the caller answers 429 at once).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// Why a push was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// This flow already has `per_flow_depth` entries waiting.
    FlowFull,
    /// `max_flows` flows are waiting already.
    TooManyFlows,
}

#[derive(Debug)]
struct Flow<T> {
    queue: VecDeque<(f64, T)>,
    deficit: f64,
}

/// The fair queue.
#[derive(Debug)]
pub struct FairQueue<K, T> {
    flows: HashMap<K, Flow<T>>,
    /// Flows with something waiting, in round-robin order.
    active: VecDeque<K>,
    /// The front flow has had its quantum for this visit.
    credited: bool,
    quantum: f64,
    per_flow_depth: usize,
    max_flows: usize,
    len: usize,
    bytes: f64,
}

impl<K: Clone + Eq + Hash, T> FairQueue<K, T> {
    pub fn new(quantum: f64, per_flow_depth: usize, max_flows: usize) -> Self {
        FairQueue {
            flows: HashMap::new(),
            active: VecDeque::new(),
            credited: false,
            quantum: quantum.max(1.0),
            per_flow_depth: per_flow_depth.max(1),
            max_flows: max_flows.max(1),
            len: 0,
            bytes: 0.0,
        }
    }

    /// New bounds and quantum (a reload); what waits stays.
    pub fn set_limits(&mut self, quantum: f64, per_flow_depth: usize, max_flows: usize) {
        self.quantum = quantum.max(1.0);
        self.per_flow_depth = per_flow_depth.max(1);
        self.max_flows = max_flows.max(1);
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Predicted bytes waiting.
    pub fn bytes(&self) -> f64 {
        self.bytes.max(0.0)
    }

    pub fn flows(&self) -> usize {
        self.flows.len()
    }

    /// Entries waiting in `flow`.
    pub fn depth(&self, flow: &K) -> usize {
        self.flows.get(flow).map_or(0, |f| f.queue.len())
    }

    /// Queue `item` of predicted `cost` bytes in `flow`; refused (with the
    /// item back) past a bound.
    pub fn push(&mut self, flow: K, cost: f64, item: T) -> Result<(), (Refused, T)> {
        let cost = cost.max(0.0);
        let room_for_flows = self.flows.len() < self.max_flows;
        match self.flows.get_mut(&flow) {
            Some(f) if f.queue.len() >= self.per_flow_depth => Err((Refused::FlowFull, item)),
            Some(f) => {
                f.queue.push_back((cost, item));
                self.len += 1;
                self.bytes += cost;
                Ok(())
            }
            None if !room_for_flows => Err((Refused::TooManyFlows, item)),
            None => {
                let mut queue = VecDeque::new();
                queue.push_back((cost, item));
                self.flows.insert(
                    flow.clone(),
                    Flow {
                        queue,
                        deficit: 0.0,
                    },
                );
                self.active.push_back(flow);
                self.len += 1;
                self.bytes += cost;
                Ok(())
            }
        }
    }

    /// Remove the entries of `flow` for which `gone` holds (waiters that
    /// left); returns how many.
    pub fn purge(&mut self, flow: &K, mut gone: impl FnMut(&T) -> bool) -> usize {
        let Some(f) = self.flows.get_mut(flow) else {
            return 0;
        };
        let before = f.queue.len();
        let mut removed_bytes = 0.0;
        f.queue.retain(|(cost, item)| {
            let g = gone(item);
            if g {
                removed_bytes += cost;
            }
            !g
        });
        let removed = before - f.queue.len();
        self.len -= removed;
        self.bytes -= removed_bytes;
        if f.queue.is_empty() {
            self.remove_flow(flow);
        }
        removed
    }

    /// Give back `cost` of credit to `flow`: an entry it was charged for
    /// at its pop was never served (its waiter left while it waited for
    /// the budget). A flow no longer queued has forgotten its credit
    /// anyway, so nothing changes for it.
    pub fn refund(&mut self, flow: &K, cost: f64) {
        if let Some(f) = self.flows.get_mut(flow) {
            f.deficit += cost.max(0.0);
        }
    }

    fn remove_flow(&mut self, flow: &K) {
        self.flows.remove(flow);
        if self.active.front() == Some(flow) {
            self.credited = false;
        }
        self.active.retain(|k| k != flow);
    }

    /// The next entry deficit round robin serves: its flow, cost and item.
    pub fn pop(&mut self) -> Option<(K, f64, T)> {
        self.pop_where(|_| true)
    }

    /// As [`FairQueue::pop`], passing over the flows `eligible` refuses
    /// (they keep their entries and credit, and take their turn once
    /// eligible): the light lanes pass over flows holding their share.
    pub fn pop_where(&mut self, eligible: impl Fn(&K) -> bool) -> Option<(K, f64, T)> {
        if self.len == 0 {
            return None;
        }
        // A front flow already credited this visit that cannot serve its
        // head has had its turn: the others come first in the next round.
        if self.credited {
            let stuck = self
                .active
                .front()
                .and_then(|k| self.flows.get(k))
                .and_then(|f| f.queue.front().map(|h| h.0 > f.deficit))
                .unwrap_or(false);
            if stuck {
                self.active.rotate_left(1);
                self.credited = false;
            }
        }
        self.fast_forward(&eligible);
        // At most two passes over the flows: after fast-forwarding, some
        // eligible flow is served within one round.
        for _ in 0..=(2 * self.active.len() + 1) {
            let key = self.active.front()?.clone();
            if !eligible(&key) {
                self.active.rotate_left(1);
                self.credited = false;
                continue;
            }
            let quantum = self.quantum;
            let credited = &mut self.credited;
            let flow = self.flows.get_mut(&key)?;
            if !*credited {
                flow.deficit += quantum;
                *credited = true;
            }
            let head_cost = flow.queue.front().map_or(0.0, |h| h.0);
            if head_cost <= flow.deficit {
                let (cost, item) = flow.queue.pop_front()?;
                flow.deficit -= cost;
                self.len -= 1;
                self.bytes -= cost;
                if flow.queue.is_empty() {
                    self.remove_flow(&key);
                }
                return Some((key, cost, item));
            }
            // Not enough credit: the next flow's turn.
            self.active.rotate_left(1);
            self.credited = false;
        }
        None
    }

    /// Add the credit of the rounds in which no eligible flow could be
    /// served, so a cost of many quanta takes one pass, not cost/quantum of
    /// them.
    fn fast_forward(&mut self, eligible: &impl Fn(&K) -> bool) {
        let quantum = self.quantum;
        let mut fewest = f64::INFINITY;
        for (i, key) in self.active.iter().enumerate() {
            let Some(f) = self.flows.get(key).filter(|_| eligible(key)) else {
                continue;
            };
            let head = f.queue.front().map_or(0.0, |h| h.0);
            // The front flow, already credited this visit, gets its next
            // quantum only in the next round.
            let credit = if i == 0 && self.credited {
                f.deficit
            } else {
                f.deficit + quantum
            };
            let rounds = ((head - credit) / quantum).ceil().max(0.0);
            fewest = fewest.min(rounds);
        }
        if fewest.is_finite() && fewest >= 1.0 {
            for (key, f) in self.flows.iter_mut() {
                if eligible(key) {
                    f.deficit += fewest * quantum;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bounds_refuse_and_purge_frees() {
        let mut q: FairQueue<&str, u32> = FairQueue::new(10.0, 2, 2);
        assert!(q.push("a", 1.0, 1).is_ok());
        assert!(q.push("a", 1.0, 2).is_ok());
        assert_eq!(q.push("a", 1.0, 3), Err((Refused::FlowFull, 3)));
        assert!(q.push("b", 1.0, 4).is_ok());
        assert_eq!(q.push("c", 1.0, 5), Err((Refused::TooManyFlows, 5)));
        assert_eq!(q.purge(&"a", |&i| i == 1), 1);
        assert_eq!((q.len(), q.depth(&"a")), (2, 1));
        assert_eq!(q.purge(&"b", |_| true), 1);
        assert!(q.push("c", 1.0, 5).is_ok());
        assert_eq!(q.bytes(), 2.0);
    }

    #[test]
    fn costs_far_above_the_quantum_are_served_in_order_of_credit() {
        let mut q: FairQueue<&str, u32> = FairQueue::new(1.0, 10, 10);
        q.push("big", 1_000_000.0, 1).expect("room");
        q.push("small", 10.0, 2).expect("room");
        assert_eq!(q.pop().map(|e| e.2), Some(2));
        assert_eq!(q.pop().map(|e| e.2), Some(1));
        assert!(q.pop().is_none());
    }

    #[test]
    fn flows_passed_over_keep_their_place() {
        let mut q: FairQueue<&str, u32> = FairQueue::new(1.0, 10, 10);
        for i in 0..3 {
            q.push("a", 1.0, i).expect("room");
            q.push("b", 1.0, 10 + i).expect("room");
        }
        let order: Vec<u32> =
            std::iter::from_fn(|| q.pop_where(|f| *f != "a").map(|e| e.2)).collect();
        assert_eq!(order, [10, 11, 12]);
        assert_eq!((q.len(), q.depth(&"a")), (3, 3));
        assert!(q.pop_where(|_| false).is_none());
        assert_eq!(q.pop().map(|e| e.2), Some(0));
    }

    proptest! {
        /// Two flows with equal demand (each always has requests waiting,
        /// any sizes from the same distribution) get equal bytes within 10%.
        #[test]
        fn equal_demand_gets_equal_bytes(
            seed in any::<u64>(),
            quantum in 1.0f64..100.0,
        ) {
            let mut rng = seed | 1;
            let mut cost = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                1.0 + (rng % 100) as f64
            };
            let mut q: FairQueue<u8, ()> = FairQueue::new(quantum, 4, 4);
            for _ in 0..4 {
                q.push(0, cost(), ()).expect("room");
                q.push(1, cost(), ()).expect("room");
            }
            let mut served = [0.0f64; 2];
            for _ in 0..4000 {
                let (flow, c, ()) = q.pop().expect("demand never ends");
                served[flow as usize] += c;
                q.push(flow, cost(), ()).expect("room");
            }
            let ratio = served[0] / served[1];
            prop_assert!((0.9..=1.1).contains(&ratio), "{served:?}");
        }

        /// While one flow floods, another flow's single request is served
        /// after at most one quantum of the flood's bytes (plus the flood
        /// request already being served when it arrived).
        #[test]
        fn a_flood_delays_another_flow_by_at_most_one_quantum(
            flood_cost in 1.0f64..50.0,
            single_cost in 1.0f64..50.0,
            warmup in 0usize..50,
            quantum in 50.0f64..200.0,
        ) {
            let mut q: FairQueue<u8, ()> = FairQueue::new(quantum, 1000, 4);
            for _ in 0..500 {
                q.push(0, flood_cost, ()).expect("room");
            }
            for _ in 0..warmup {
                q.pop().expect("flood");
            }
            q.push(1, single_cost, ()).expect("room");
            let mut flood_bytes = 0.0;
            loop {
                let (flow, c, ()) = q.pop().expect("something waits");
                if flow == 1 {
                    break;
                }
                flood_bytes += c;
            }
            prop_assert!(flood_bytes <= quantum + flood_cost,
                "{flood_bytes} flood bytes went first (quantum {quantum})");
        }
    }
}
