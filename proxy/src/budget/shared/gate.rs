//! The shared budget applied locally: a token bucket of etcd-read bytes
//! refilled at the share in force (the grant last read, while valid, else
//! the fallback), which a heavy request that reads etcd passes before the
//! local pool. Nothing here waits on etcd: the renewal loop sets the share
//! ([`EtcdGate::set_share`]), admission only reads it. The bucket's burst
//! is one second of the share, so a shrink costs at most one second of
//! the old share in over-admission.
//!
//! Waiters take turns in arrival order (a one-permit semaphore is the
//! queue; no data lock is held across an await), so small LISTs cannot
//! starve a large one; the fair queues per client are the local pool's.
//! A request that cannot pass within its wait gets a 429, as for the pool.
//! The bytes asked for (passed or not) are the member's demand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::budget::pool::QuotaPool;

/// The bucket's burst, in seconds of the share.
pub const BURST: Duration = Duration::from_secs(1);
/// A waiter looks again at least this often (the share may have grown).
const RECHECK: Duration = Duration::from_millis(250);

/// What a member may spend, as the renewal loop last set it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Share {
    /// The grant read from etcd, bytes/s, and until when it may be spent.
    pub grant: Option<(f64, Instant)>,
    /// Bytes/s without a valid grant.
    pub fallback: f64,
}

impl Share {
    /// The rate in force at `now`, and whether it is a grant.
    pub fn at(&self, now: Instant) -> (f64, bool) {
        match self.grant {
            Some((rate, until)) if now < until => (rate, true),
            _ => (self.fallback, false),
        }
    }
}

/// The bucket and the share, pure: time passed in.
#[derive(Debug, Clone)]
pub struct GateState {
    pool: QuotaPool,
    share: Share,
}

impl GateState {
    /// A full bucket at `share`.
    pub fn new(share: Share, now: Instant) -> GateState {
        let (rate, _) = share.at(now);
        GateState {
            pool: QuotaPool::new(rate, rate * BURST.as_secs_f64(), now),
            share,
        }
    }

    fn refresh(&mut self, now: Instant) -> f64 {
        let (rate, _) = self.share.at(now);
        if rate != self.pool.rate() {
            self.pool.set_limits(rate, rate * BURST.as_secs_f64(), now);
        }
        rate
    }

    pub fn set_share(&mut self, share: Share, now: Instant) {
        self.share = share;
        self.refresh(now);
    }

    pub fn share(&self) -> Share {
        self.share
    }

    /// Debit `bytes` now, or how long until they could be.
    pub fn try_debit(&mut self, bytes: f64, now: Instant) -> Result<(), Duration> {
        self.refresh(now);
        if self.pool.try_debit(bytes, now) {
            Ok(())
        } else {
            Err(self.pool.time_until(bytes, now))
        }
    }

    /// Settle a debit with what was actually read.
    pub fn reconcile(&mut self, debited: f64, actual: f64, now: Instant) {
        self.refresh(now);
        self.pool.reconcile(debited, actual, now);
    }

    /// Bytes available at `now` (negative: debt).
    pub fn level(&mut self, now: Instant) -> f64 {
        self.refresh(now);
        self.pool.level(now)
    }
}

/// The gate admission holds.
#[derive(Debug)]
pub struct EtcdGate {
    state: Mutex<GateState>,
    turn: Semaphore,
    /// Bytes asked for, passed or not (the demand).
    wanted: AtomicU64,
    /// Predicted bytes of the requests let through to the apiserver
    /// (counted when they end: a request the local pool then refused was
    /// refunded, not let through).
    admitted: AtomicU64,
    /// Bytes read, as settled when responses ended.
    read: AtomicU64,
    rejected: AtomicU64,
}

/// Counters and the share in force, for metrics and `/debug/budget`.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GateView {
    pub bytes_per_second: f64,
    pub granted: bool,
    pub level_bytes: f64,
    pub wanted_bytes: u64,
    pub admitted_bytes: u64,
    pub read_bytes: u64,
    pub rejected: u64,
}

impl EtcdGate {
    /// A gate spending `fallback` until the first grant is read.
    pub fn new(fallback: f64) -> EtcdGate {
        let share = Share {
            grant: None,
            fallback,
        };
        EtcdGate {
            state: Mutex::new(GateState::new(share, Instant::now())),
            turn: Semaphore::new(1),
            wanted: AtomicU64::new(0),
            admitted: AtomicU64::new(0),
            read: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        // A panic while holding the lock leaves numbers, not invariants.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_share(&self, share: Share) {
        self.lock().set_share(share, Instant::now());
    }

    pub fn share(&self) -> Share {
        self.lock().share()
    }

    /// Bytes asked for so far (the renewal loop turns it into a rate).
    pub fn wanted(&self) -> u64 {
        self.wanted.load(Ordering::Relaxed)
    }

    /// Pass `bytes` of etcd reads, waiting in turn until `deadline`;
    /// `None` if they could not pass by then.
    pub async fn pass(self: &Arc<Self>, bytes: f64, deadline: Instant) -> Option<EtcdTicket> {
        self.wanted.fetch_add(bytes as u64, Ordering::Relaxed);
        let refused = || {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            None
        };
        let Ok(Ok(_permit)) = tokio::time::timeout_at(deadline, self.turn.acquire()).await else {
            return refused();
        };
        loop {
            let now = Instant::now();
            let wait = match self.lock().try_debit(bytes, now) {
                Ok(()) => {
                    return Some(EtcdTicket {
                        gate: self.clone(),
                        debited: bytes,
                        settled: false,
                    });
                }
                Err(wait) => wait,
            };
            if now + wait > deadline && now + RECHECK > deadline {
                return refused();
            }
            tokio::time::sleep_until((now + wait.min(RECHECK)).min(deadline)).await;
        }
    }

    pub fn view(&self) -> GateView {
        let now = Instant::now();
        let mut s = self.lock();
        let (rate, granted) = s.share().at(now);
        GateView {
            bytes_per_second: rate,
            granted,
            level_bytes: s.level(now),
            wanted_bytes: self.wanted.load(Ordering::Relaxed),
            admitted_bytes: self.admitted.load(Ordering::Relaxed),
            read_bytes: self.read.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
        }
    }
}

/// Etcd-read bytes a request passed with. Settle it with what was read;
/// dropped unsettled (the request never reached the apiserver), it
/// refunds them.
#[derive(Debug)]
pub struct EtcdTicket {
    gate: Arc<EtcdGate>,
    debited: f64,
    settled: bool,
}

impl EtcdTicket {
    pub fn debited(&self) -> f64 {
        self.debited
    }

    /// The response ended having read `actual` bytes from etcd.
    pub fn settle(mut self, actual: f64) {
        self.settled = true;
        let gate = &self.gate;
        gate.admitted
            .fetch_add(self.debited as u64, Ordering::Relaxed);
        gate.read.fetch_add(actual as u64, Ordering::Relaxed);
        self.gate
            .lock()
            .reconcile(self.debited, actual, Instant::now());
    }
}

impl Drop for EtcdTicket {
    fn drop(&mut self) {
        if !self.settled {
            self.gate
                .lock()
                .reconcile(self.debited, 0.0, Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: f64 = 1_000_000.0;

    #[test]
    fn the_share_in_force_is_the_grant_until_it_expires_then_the_fallback() {
        let t0 = Instant::now();
        let s = Share {
            grant: Some((40.0 * MB, t0 + Duration::from_secs(3))),
            fallback: 2.0 * MB,
        };
        assert_eq!(s.at(t0), (40.0 * MB, true));
        assert_eq!(s.at(t0 + Duration::from_secs(3)), (2.0 * MB, false));
        let mut g = GateState::new(s, t0);
        // A full second of the grant, then the refill.
        assert_eq!(g.try_debit(40.0 * MB, t0), Ok(()));
        assert_eq!(g.try_debit(20.0 * MB, t0), Err(Duration::from_millis(500)));
        // Expired: the fallback's rate and burst.
        let t1 = t0 + Duration::from_secs(5);
        assert_eq!(g.level(t1), 2.0 * MB);
        assert_eq!(g.try_debit(2.0 * MB, t1), Ok(()));
        assert!(g.try_debit(1.0 * MB, t1).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn requests_pass_at_the_share_and_are_refused_past_their_wait() {
        let gate = Arc::new(EtcdGate::new(10.0 * MB));
        let deadline = Instant::now() + Duration::from_secs(2);
        let first = gate.pass(10.0 * MB, deadline).await.expect("the burst");
        assert_eq!(gate.view().admitted_bytes, 0, "counted when it ends");
        let start = Instant::now();
        let second = gate
            .pass(10.0 * MB, deadline)
            .await
            .expect("one second later");
        assert!(start.elapsed() >= Duration::from_millis(990));
        first.settle(10.0 * MB);
        // Dropped unsettled: refunded.
        drop(second);
        let third = gate.pass(10.0 * MB, deadline).await;
        assert!(third.is_some(), "the refund let it pass");
        assert!(gate
            .pass(30.0 * MB, Instant::now() + Duration::from_millis(500))
            .await
            .is_none());
        let v = gate.view();
        // The refunded one is not counted; the third is still in flight.
        assert_eq!((v.wanted_bytes, v.admitted_bytes), (60_000_000, 10_000_000));
        assert_eq!((v.read_bytes, v.rejected), (10_000_000, 1));
        // A grant raises the rate at once.
        gate.set_share(Share {
            grant: Some((100.0 * MB, Instant::now() + Duration::from_secs(3))),
            fallback: 10.0 * MB,
        });
        assert_eq!(gate.view().bytes_per_second, 100.0 * MB);
        assert!(gate.view().granted);
    }
}
