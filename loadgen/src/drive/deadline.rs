//! Per-request timeouts kept by the driver instead of a tokio timer per
//! request: each attempt takes a slot with its deadline and leaves its waker
//! there while it waits; the driver, which wakes anyway for its ticks, looks
//! at the earliest deadline and wakes the attempts that are past theirs, which
//! then end with a timeout. Every operation has one `--timeout`, so deadlines
//! come in issue order and the earliest is nearly always the oldest attempt:
//! the slots are scanned only when it is due, about once per timeout.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::{Poll, Waker};
use std::time::Instant;

#[derive(Debug)]
enum State {
    Free,
    Waiting,
    Expired,
}

#[derive(Debug)]
struct Slot {
    state: State,
    deadline: Instant,
    waker: Option<Waker>,
}

/// The deadlines of one driver's attempts. At most one slot per request in
/// flight, so its size is bounded by `--max-in-flight`.
#[derive(Debug, Default)]
pub(crate) struct Deadlines {
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// No waiting slot's deadline is earlier (it may be later: slots freed
    /// since are not looked at until it is due).
    earliest: Option<Instant>,
    active: usize,
}

impl Deadlines {
    fn insert(&mut self, deadline: Instant) -> usize {
        self.earliest = Some(self.earliest.map_or(deadline, |e| e.min(deadline)));
        self.active += 1;
        let slot = Slot {
            state: State::Waiting,
            deadline,
            waker: None,
        };
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                self.slots.len() - 1
            }
        }
    }

    fn remove(&mut self, i: usize) {
        if let Some(s) = self.slots.get_mut(i) {
            s.state = State::Free;
            s.waker = None;
            self.free.push(i);
            self.active -= 1;
        }
    }

    /// When the driver must look again: the earliest deadline, if any attempt waits.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.earliest.filter(|_| self.active > 0)
    }

    /// Expires (and wakes) every waiting attempt whose deadline is not after `now`.
    pub(crate) fn expire(&mut self, now: Instant) {
        match self.earliest {
            Some(e) if e <= now => {}
            _ => return,
        }
        let mut earliest: Option<Instant> = None;
        for s in &mut self.slots {
            if !matches!(s.state, State::Waiting) {
                continue;
            }
            if s.deadline <= now {
                s.state = State::Expired;
                if let Some(w) = s.waker.take() {
                    // Only schedules the attempt; nothing runs inside this borrow.
                    w.wake();
                }
            } else {
                earliest = Some(earliest.map_or(s.deadline, |e| e.min(s.deadline)));
            }
        }
        self.earliest = earliest;
    }
}

/// Removes its slot however the attempt ends (finished, expired, or dropped).
struct SlotGuard<'a> {
    table: &'a RefCell<Deadlines>,
    slot: usize,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.table.borrow_mut().remove(self.slot);
    }
}

/// Runs `fut` until it ends (`Some`) or `table`'s driver finds `deadline`
/// passed (`None`; `fut` is dropped, and with it its connection).
pub(crate) async fn with_deadline<F: Future>(
    table: &RefCell<Deadlines>,
    deadline: Instant,
    fut: F,
) -> Option<F::Output> {
    let guard = SlotGuard {
        slot: table.borrow_mut().insert(deadline),
        table,
    };
    let mut fut = pin!(fut);
    poll_fn(|cx| {
        if matches!(guard.table.borrow().slots[guard.slot].state, State::Expired) {
            return Poll::Ready(None);
        }
        match fut.as_mut().poll(cx) {
            Poll::Ready(v) => Poll::Ready(Some(v)),
            Poll::Pending => {
                let mut t = guard.table.borrow_mut();
                let slot = &mut t.slots[guard.slot];
                if !slot.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    slot.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn expires_only_what_is_due_and_reuses_slots() {
        let t0 = Instant::now();
        let mut d = Deadlines::default();
        let a = d.insert(t0 + Duration::from_secs(1));
        let b = d.insert(t0 + Duration::from_secs(2));
        assert_eq!(d.next_due(), Some(t0 + Duration::from_secs(1)));
        d.remove(a);
        // Lazy: the freed slot's deadline is still the one to look at.
        assert_eq!(d.next_due(), Some(t0 + Duration::from_secs(1)));
        d.expire(t0 + Duration::from_secs(1));
        assert!(matches!(d.slots[b].state, State::Waiting));
        assert_eq!(d.next_due(), Some(t0 + Duration::from_secs(2)));
        d.expire(t0 + Duration::from_secs(2));
        assert!(matches!(d.slots[b].state, State::Expired));
        d.remove(b);
        assert_eq!(d.next_due(), None);
        assert_eq!(d.insert(t0), b);
        assert_eq!(d.slots.len(), 2);
    }

    #[tokio::test]
    async fn an_expired_attempt_ends_with_none() {
        let table = RefCell::new(Deadlines::default());
        let t0 = Instant::now();
        let never = std::future::pending::<()>();
        let mut attempt = pin!(with_deadline(&table, t0, never));
        assert!(futures_util::poll!(attempt.as_mut()).is_pending());
        table.borrow_mut().expire(t0);
        assert_eq!(attempt.await, None);
        assert_eq!(table.borrow().next_due(), None);
        let done = with_deadline(&table, t0 + Duration::from_secs(9), async { 7 }).await;
        assert_eq!(done, Some(7));
    }
}
