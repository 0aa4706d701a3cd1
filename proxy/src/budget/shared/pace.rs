//! When the renewal loop acts, pure with time passed in. It wakes for a
//! renewal every [`RENEW`] (keep the lease alive, measure the demand, read,
//! coordinate), and between renewals whenever another member wrote under
//! the prefix (the watch): it reads at once, so a new allocation is applied
//! and a shrink acknowledged within milliseconds of being written, and the
//! coordinator sees a moved demand or an acknowledgement as it lands.
//!
//! The coordinator steps at any wake, but after a step that wrote the
//! allocation, not again for [`STEP_GAP`]: the acknowledgements a shrink
//! calls for arrive within milliseconds of each other, and one step after
//! them grants the growth they made room for in one write, instead of one
//! write per acknowledgement. That bounds the coordinator's writes to
//! `1 / STEP_GAP` per second in the worst case.

use std::time::Duration;

use tokio::time::Instant;

use super::RENEW;

/// Least time between two steps of the coordinator that wrote.
pub const STEP_GAP: Duration = Duration::from_millis(250);

/// The loop's schedule.
#[derive(Debug, Clone)]
pub struct Pace {
    next_renewal: Instant,
    step_after: Instant,
    /// A step was held back: wake for it at `step_after`.
    deferred: bool,
}

impl Pace {
    /// A renewal due at once.
    pub fn new(now: Instant) -> Pace {
        Pace {
            next_renewal: now,
            step_after: now,
            deferred: false,
        }
    }

    /// The loop woke at `now`: whether it is for a renewal (then the next
    /// one is due [`RENEW`] after this one was, or half of it after `now`
    /// if the loop fell behind, as when etcd does not answer). A step held
    /// back is forgotten: this wake steps, or holds it back again.
    pub fn woke(&mut self, now: Instant) -> bool {
        self.deferred = false;
        if now < self.next_renewal {
            return false;
        }
        self.next_renewal = (self.next_renewal + RENEW).max(now + RENEW / 2);
        true
    }

    /// Whether the coordinator may step at `now`; if not, the loop wakes
    /// for it when it may.
    pub fn may_step(&mut self, now: Instant) -> bool {
        let may = now >= self.step_after;
        self.deferred = !may;
        may
    }

    /// The coordinator stepped at `now`, and wrote or not.
    pub fn stepped(&mut self, wrote: bool, now: Instant) {
        if wrote {
            self.step_after = now + STEP_GAP;
        }
    }

    /// The latest the loop wakes, if nothing changes before.
    pub fn wake(&self) -> Instant {
        if self.deferred {
            self.next_renewal.min(self.step_after)
        } else {
            self.next_renewal
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_every_second_and_steps_held_back_after_a_write() {
        let t0 = Instant::now();
        let mut p = Pace::new(t0);
        assert!(p.woke(t0));
        assert!(
            !p.woke(t0 + Duration::from_millis(10)),
            "a change, not a renewal"
        );
        assert_eq!(p.wake(), t0 + RENEW);
        // Work took 30 ms: the period stays one second.
        assert!(p.woke(t0 + RENEW + Duration::from_millis(30)));
        assert_eq!(p.wake(), t0 + 2 * RENEW);
        // Fell far behind: the next renewal half a period on, not at once.
        let late = t0 + 5 * RENEW;
        assert!(p.woke(late));
        assert_eq!(p.wake(), late + RENEW / 2);

        let t1 = late + Duration::from_millis(100);
        assert!(p.may_step(t1));
        p.stepped(true, t1);
        let t2 = t1 + Duration::from_millis(5);
        assert!(!p.may_step(t2), "an acknowledgement 5 ms after the write");
        assert_eq!(p.wake(), t1 + STEP_GAP);
        assert!(!p.woke(t1 + STEP_GAP));
        assert!(p.may_step(t1 + STEP_GAP));
        p.stepped(false, t1 + STEP_GAP);
        assert!(p.may_step(t1 + STEP_GAP + Duration::from_millis(1)));
        assert_eq!(p.wake(), late + RENEW / 2);
        // Held back, then no longer the coordinator: the next wake forgets it.
        p.stepped(true, t1 + STEP_GAP);
        assert!(!p.may_step(t1 + STEP_GAP));
        assert!(!p.woke(t1 + STEP_GAP + Duration::from_millis(2)));
        assert_eq!(
            p.wake(),
            late + RENEW / 2,
            "no wake for a step nobody takes"
        );
    }
}
