//! What a member knows between renewals, pure with time passed in: its
//! demand (the etcd-read bytes/s its heavy requests asked for, smoothed),
//! the grant it last read and acknowledged, the share in force, and
//! whether its registration is worth rewriting.
//!
//! A member acknowledges a grant (writes its sequence number as `applied`)
//! only when it is lower than the one it read before, or its first: until
//! then the coordinator counts the old, higher grant as still spent (see
//! [`super::alloc`]), and the acknowledgement is what lets it give the
//! difference to another member at once. A higher grant needs none: the
//! coordinator already counts the higher of the two.
//!
//! A grant is spent for at most [`GRANT_TTL`] after it was last read, and
//! never past the member's lease as the member knows it (the time it sent
//! its last successful keep-alive plus the TTL etcd answered): by the time
//! etcd expires the lease and the coordinator frees the share, the member
//! has stopped spending it. Without a valid grant it spends the fallback.

use tokio::time::Instant;

use super::alloc::Grant;
use super::gate::Share;
use super::{DEMAND_CHANGE, GRANT_TTL};

/// The demand's smoothing time constant, seconds: a LIST every second
/// reads as a rate, and a storm that moved from one master to another is
/// seen to have moved (the two demands cross) within 0.7 s of a renewal's
/// measurement; the shares follow within milliseconds of the demand's
/// write (see the constants in [`super`]).
const DEMAND_TAU: f64 = 1.0;
/// A demand change under this fraction of the budget is never written.
const DEMAND_FLOOR: f64 = 0.01;

/// What a member writes under its lease.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Report {
    pub demand: f64,
    pub applied: u64,
}

/// The member's state.
#[derive(Debug, Clone, Default)]
pub struct MemberState {
    demand: f64,
    last_wanted: Option<(u64, Instant)>,
    written: Option<Report>,
    /// The sequence number to report as applied.
    applied: u64,
    /// The grant last read: rate, seq, when.
    grant: Option<(Grant, Instant)>,
    lease_until: Option<Instant>,
    members: usize,
}

impl MemberState {
    /// The gate's count of bytes asked for is `total` at `now`.
    pub fn observe_wanted(&mut self, total: u64, now: Instant) {
        if let Some((before, at)) = self.last_wanted {
            let dt = now.saturating_duration_since(at).as_secs_f64();
            if dt > 0.0 {
                let rate = total.saturating_sub(before) as f64 / dt;
                let k = 1.0 - (-dt / DEMAND_TAU).exp();
                self.demand += k * (rate - self.demand);
            }
        }
        self.last_wanted = Some((total, now));
    }

    pub fn demand(&self) -> f64 {
        self.demand
    }

    /// Read at `now`: this member's grant (if any), how many members are
    /// live, and until when the lease is known alive.
    pub fn read(
        &mut self,
        mine: Option<Grant>,
        members: usize,
        lease_until: Instant,
        now: Instant,
    ) {
        if let Some(g) = mine {
            let shrink = self
                .grant()
                .is_none_or(|before| g.bytes_per_second < before.bytes_per_second);
            if shrink {
                self.applied = g.seq;
            }
        }
        self.grant = mine.map(|g| (g, now));
        self.members = members.max(1);
        self.lease_until = Some(lease_until);
    }

    /// The lease was lost (etcd out of reach, or it expired).
    pub fn lost_lease(&mut self) {
        self.lease_until = None;
        self.written = None;
    }

    /// Members seen at the last read (at least 1).
    pub fn members(&self) -> usize {
        self.members.max(1)
    }

    /// The grant last read, if any.
    pub fn grant(&self) -> Option<Grant> {
        self.grant.map(|(g, _)| g)
    }

    /// The share to apply, `fallback` bytes/s without a valid grant.
    pub fn share(&self, fallback: f64) -> Share {
        let grant = match (self.grant, self.lease_until) {
            (Some((g, read)), Some(lease)) => {
                Some((g.bytes_per_second, (read + GRANT_TTL).min(lease)))
            }
            // A grant is never spent without a lease: etcd cannot free it.
            _ => None,
        };
        Share { grant, fallback }
    }

    /// What to write now, if anything: the first registration, a lower
    /// grant to acknowledge, or a demand that moved by more than
    /// [`DEMAND_CHANGE`] and 1% of `budget`.
    pub fn report(&self, budget: f64) -> Option<Report> {
        let now = Report {
            demand: self.demand,
            applied: self.applied,
        };
        let Some(w) = self.written else {
            return Some(now);
        };
        let moved = (now.demand - w.demand).abs();
        if now.applied != w.applied
            || (moved > DEMAND_CHANGE * w.demand.max(now.demand) && moved > DEMAND_FLOOR * budget)
        {
            return Some(now);
        }
        None
    }

    /// `r` was written.
    pub fn wrote(&mut self, r: Report) {
        self.written = Some(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MB: f64 = 1_000_000.0;

    #[test]
    fn demand_follows_the_bytes_asked_for() {
        let t0 = Instant::now();
        let mut m = MemberState::default();
        m.observe_wanted(0, t0);
        let mut total = 0;
        for s in 1..=10 {
            total += 20_000_000;
            m.observe_wanted(total, t0 + Duration::from_secs(s));
        }
        assert!((m.demand() - 20.0 * MB).abs() < 2.0 * MB, "{}", m.demand());
        for s in 11..=20 {
            m.observe_wanted(total, t0 + Duration::from_secs(s));
        }
        assert!(m.demand() < 0.2 * MB, "{}", m.demand());
    }

    #[test]
    fn a_grant_is_spent_for_three_seconds_and_never_past_the_lease() {
        let t0 = Instant::now();
        let mut m = MemberState::default();
        assert_eq!(m.share(1.0).grant, None, "nothing read yet");
        let g = Grant {
            bytes_per_second: 40.0 * MB,
            seq: 3,
        };
        m.read(Some(g), 3, t0 + Duration::from_secs(10), t0);
        assert_eq!(m.share(1.0).grant, Some((40.0 * MB, t0 + GRANT_TTL)));
        m.read(Some(g), 3, t0 + Duration::from_secs(1), t0);
        assert_eq!(
            m.share(1.0).grant,
            Some((40.0 * MB, t0 + Duration::from_secs(1)))
        );
        m.lost_lease();
        assert_eq!(m.share(1.0).grant, None);
        assert_eq!(m.share(1.0).at(t0), (1.0, false));
    }

    #[test]
    fn writes_only_what_changed_enough() {
        let t0 = Instant::now();
        let budget = 100.0 * MB;
        let mut m = MemberState::default();
        let first = m.report(budget).expect("registers first");
        m.wrote(first);
        assert_eq!(m.report(budget), None);
        m.read(
            Some(Grant {
                bytes_per_second: 5.0 * MB,
                seq: 9,
            }),
            1,
            t0 + Duration::from_secs(10),
            t0,
        );
        let ack = m.report(budget).expect("acknowledges a new grant");
        assert_eq!(ack.applied, 9);
        m.wrote(ack);
        m.observe_wanted(0, t0);
        m.observe_wanted(500_000, t0 + Duration::from_secs(1));
        assert_eq!(m.report(budget), None, "under 1% of the budget");
        m.observe_wanted(60_000_000, t0 + Duration::from_secs(2));
        assert!(m.report(budget).is_some());
    }

    #[test]
    fn acknowledges_a_lower_grant_and_not_a_higher_one() {
        let t0 = Instant::now();
        let lease = t0 + Duration::from_secs(10);
        let grant = |mb: f64, seq| {
            Some(Grant {
                bytes_per_second: mb * MB,
                seq,
            })
        };
        let mut m = MemberState::default();
        m.read(grant(5.0, 3), 2, lease, t0);
        let first = m.report(100.0 * MB).expect("the first grant");
        assert_eq!(first.applied, 3);
        m.wrote(first);
        m.read(grant(8.0, 4), 2, lease, t0);
        assert_eq!(m.report(100.0 * MB), None, "a higher grant needs no write");
        m.read(grant(8.0, 4), 2, lease, t0 + Duration::from_secs(1));
        assert_eq!(m.report(100.0 * MB), None);
        // Lower than the 8 it spent (though above the 5 it acknowledged).
        m.read(grant(6.0, 5), 2, lease, t0 + Duration::from_secs(2));
        assert_eq!(m.report(100.0 * MB).map(|r| r.applied), Some(5));
        assert_eq!(
            m.share(1.0).at(t0 + Duration::from_secs(2)),
            (6.0 * MB, true)
        );
    }
}
