//! The coordinator's allocation core: members' demands in, grants out.
//! Pure: time is passed in, nothing here talks to etcd.
//!
//! ## The target
//! The capacity `C = budget − reserve` is divided among the live members
//! ([`target`]): each gets at least the floor `f = min(floor, C/N)`; when
//! the demands fit (`Σ d ≤ C`) each gets its demand plus an equal part of
//! what is left (headroom, so a rise is served before the next grant);
//! when they do not, the rest `C − N·f` is divided in proportion to what
//! each wants above its floor (Doorman's proportional share: a master
//! with 70% of the LIST storm gets 70% of the budget, not a third). The
//! grants always sum to `C`.
//!
//! ## Shrink before grow
//! A member may still be spending a grant the coordinator has replaced: it
//! applies the last grant it read until it reads the next one (at once
//! through its watch, else at its next renewal) and at most
//! [`super::GRANT_TTL`] after its last read. So the coordinator counts,
//! per member, what it may *hold*: the current grant, and every grant it
//! superseded less than `GRANT_TTL` ago that the member has not yet
//! acknowledged replacing (a member writes the sequence number of a grant
//! it applies when that grant is lower than the one it had). A lower grant
//! is given at once; a higher one only from what no member holds.
//! Invariant (property-tested): the sum of what members may hold never
//! exceeds `C`.
//!
//! ## Taking over
//! A new coordinator knows the grants in etcd, not the ones superseded
//! before it: for `GRANT_TTL` after it takes over (the learning period) it
//! only shrinks; after that, nothing it did not grant can still be held.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// One member's report.
#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    /// The member's id (its key under the prefix).
    pub member: String,
    /// Recent etcd-read bytes/s it wanted (admitted or not).
    pub bytes_per_second: f64,
    /// The sequence number of the grant it applies (0: none yet).
    pub applied: u64,
}

/// The coordinator's parameters, bytes/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// The cluster-wide etcd-read budget `B`.
    pub budget: f64,
    /// Kept back from the grants: members without a valid grant (new,
    /// cut off from etcd) spend it as their fallback share.
    pub reserve: f64,
    /// Each live member's least grant (lowered to `C/N` if they do not fit).
    pub floor: f64,
    /// How long a superseded, unacknowledged grant may still be spent.
    pub grant_ttl: Duration,
}

impl Params {
    /// What the grants divide: `budget − reserve`, never negative.
    pub fn capacity(&self) -> f64 {
        (self.budget - self.reserve).max(0.0)
    }
}

/// A grant as written to etcd.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    pub bytes_per_second: f64,
    /// Grows with every grant the coordinators give; members acknowledge it.
    pub seq: u64,
}

/// What the coordinator knows of one member's grants.
#[derive(Debug, Clone, Default)]
struct Held {
    current: Option<Grant>,
    /// Grants replaced but maybe still spent: (replaced at, bytes/s, seq).
    superseded: Vec<(Instant, f64, u64)>,
}

impl Held {
    fn current_rate(&self) -> f64 {
        self.current.map_or(0.0, |g| g.bytes_per_second)
    }

    /// The most the member may spend now.
    fn at(&self, ttl: Duration, now: Instant) -> f64 {
        self.superseded
            .iter()
            .filter(|(at, _, _)| *at + ttl > now)
            .map(|(_, r, _)| *r)
            .fold(self.current_rate(), f64::max)
    }

    /// Forget what the member acknowledged replacing or can no longer spend.
    fn prune(&mut self, applied: u64, ttl: Duration, now: Instant) {
        let acked = self.current.is_some_and(|g| applied >= g.seq);
        self.superseded
            .retain(|(at, _, seq)| !acked && *at + ttl > now && *seq >= applied);
    }
}

/// The coordinator's state between two steps.
#[derive(Debug, Clone)]
pub struct Allocator {
    params: Params,
    held: BTreeMap<String, Held>,
    next_seq: u64,
    /// Until then, only shrink (a new coordinator's learning period).
    learning_until: Instant,
}

/// The even share of `capacity` for `n` members under `floor`.
fn floor_of(capacity: f64, floor: f64, n: usize) -> f64 {
    floor.max(0.0).min(capacity / n.max(1) as f64)
}

/// What each member should have, in `demands`' order (see the module doc).
pub fn target(demands: &[f64], capacity: f64, floor: f64) -> Vec<f64> {
    let n = demands.len();
    if n == 0 {
        return Vec::new();
    }
    let capacity = capacity.max(0.0);
    let f = floor_of(capacity, floor, n);
    let demands: Vec<f64> = demands.iter().map(|d| d.max(0.0)).collect();
    let total: f64 = demands.iter().map(|d| d.max(f)).sum();
    if total <= capacity {
        let spare = (capacity - total) / n as f64;
        return demands.iter().map(|d| d.max(f) + spare).collect();
    }
    let rest = capacity - f * n as f64;
    let above: f64 = demands.iter().map(|d| (d - f).max(0.0)).sum();
    demands
        .iter()
        .map(|d| f + rest * (d - f).max(0.0) / above)
        .collect()
}

impl Allocator {
    /// A coordinator that takes over at `now`, with the grants it found in
    /// etcd (member, grant); sequence numbers continue after `last_seq`.
    pub fn take_over(
        params: Params,
        found: impl IntoIterator<Item = (String, Grant)>,
        last_seq: u64,
        now: Instant,
    ) -> Allocator {
        let mut held = BTreeMap::new();
        let mut next_seq = last_seq;
        for (member, g) in found {
            next_seq = next_seq.max(g.seq);
            held.insert(
                member,
                Held {
                    current: Some(g),
                    superseded: Vec::new(),
                },
            );
        }
        Allocator {
            params,
            held,
            next_seq: next_seq + 1,
            learning_until: now + params.grant_ttl,
        }
    }

    pub fn params(&self) -> Params {
        self.params
    }

    /// New parameters (a reload): a lower budget shrinks at the next step.
    pub fn set_params(&mut self, params: Params) {
        self.params = params;
    }

    /// Whether the learning period is still running at `now`.
    pub fn learning(&self, now: Instant) -> bool {
        now < self.learning_until
    }

    /// The most all members together may spend now.
    pub fn held_total(&self, now: Instant) -> f64 {
        let ttl = self.params.grant_ttl;
        self.held.values().map(|h| h.at(ttl, now)).sum()
    }

    /// The current grants, by member.
    pub fn grants(&self) -> BTreeMap<String, Grant> {
        self.held
            .iter()
            .filter_map(|(m, h)| h.current.map(|g| (m.clone(), g)))
            .collect()
    }

    /// The last sequence number given.
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// One step with the live members' `demands` at `now`: members gone
    /// are dropped (their lease expired: they stopped spending before it
    /// did, see [`super::member`]), shrinks are given at once, growth from
    /// what nobody holds. Returns whether any grant changed by more than
    /// `hysteresis` bytes/s (or a member came or went): worth a write.
    pub fn step(&mut self, demands: &[Demand], hysteresis: f64, now: Instant) -> bool {
        let ttl = self.params.grant_ttl;
        let before = self.held.len();
        self.held
            .retain(|m, _| demands.iter().any(|d| &d.member == m));
        let mut changed = self.held.len() != before;
        for d in demands {
            let h = self.held.entry(d.member.clone()).or_default();
            h.prune(d.applied, ttl, now);
        }
        let wanted: Vec<f64> = demands.iter().map(|d| d.bytes_per_second).collect();
        let goal = target(&wanted, self.params.capacity(), self.params.floor);
        // What each may spend now: its grant can rise that far for free.
        let holdable: Vec<f64> = demands
            .iter()
            .map(|d| self.held[&d.member].at(ttl, now))
            .collect();
        let mut free = if self.learning(now) {
            0.0
        } else {
            (self.params.capacity() - holdable.iter().sum::<f64>()).max(0.0)
        };
        // Beyond that, growth comes from what nobody holds, to each in
        // proportion to what it lacks. Shrinks are given at once: they free
        // nothing until acknowledged (or `GRANT_TTL` later), but they must
        // be written before the growth they make room for.
        let lacking: Vec<f64> = goal
            .iter()
            .zip(&holdable)
            .map(|(g, h)| (g - h).max(0.0))
            .collect();
        let total_lacking: f64 = lacking.iter().sum();
        let scale = if total_lacking > 0.0 {
            (free / total_lacking).min(1.0)
        } else {
            0.0
        };
        let next: Vec<f64> = demands
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let cur = self.held[&d.member].current_rate();
                if goal[i] <= cur {
                    return goal[i];
                }
                let extra = (lacking[i] * scale).min(free);
                free -= extra;
                goal[i].min(holdable[i] + extra)
            })
            .collect();
        for (d, n) in demands.iter().zip(next) {
            let h = self.held.get_mut(&d.member).expect("inserted above");
            let cur = h.current;
            let differs = match cur {
                None => n > 0.0,
                Some(g) => (g.bytes_per_second - n).abs() > hysteresis,
            };
            if !differs {
                continue;
            }
            changed = true;
            if let Some(g) = cur {
                h.superseded.push((now, g.bytes_per_second, g.seq));
            }
            h.current = Some(Grant {
                bytes_per_second: n,
                seq: self.next_seq,
            });
            self.next_seq += 1;
        }
        changed
    }
}

#[cfg(test)]
#[path = "alloc_tests.rs"]
mod tests;
