//! The light requests' latencies on their way to the signal: a bounded
//! queue that a response's start pushes to without taking a lock (one per
//! light request was admission's busiest lock), drained into the budget
//! under admission's lock before anything there changes
//! ([`LatencyDrain::drain_into`]). So each sample is still judged, quiet or
//! not, against the heavy lane's state it ended in, as when it was recorded
//! at once.
//!
//! At most [`CAPACITY`] samples wait: the controller step drains the queue
//! every `quota.adaptive.intervalSeconds` (so do heavy requests, `/metrics`
//! and `/debug/budget`), and the signal keeps no more than that many
//! anyway. Past it a sample is dropped and counted
//! (`droppedSamples` in `/debug/budget`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::heavy::ByteBudget;
use super::signal::{Source, MAX_SAMPLES};

/// Samples that may wait between two drains.
pub const CAPACITY: usize = MAX_SAMPLES;

/// One light request's latency to its response headers.
#[derive(Debug, Clone, Copy)]
struct Sample {
    source: Source,
    started: Instant,
    latency: Duration,
}

/// The requests' side: push a sample, never wait.
#[derive(Debug)]
pub struct LatencyQueue {
    tx: SyncSender<Sample>,
    dropped: Arc<AtomicU64>,
}

/// The budget's side, held under admission's lock.
#[derive(Debug)]
pub struct LatencyDrain {
    rx: Receiver<Sample>,
    dropped: Arc<AtomicU64>,
}

/// A queue of `capacity` samples.
pub fn latency_queue(capacity: usize) -> (LatencyQueue, LatencyDrain) {
    let (tx, rx) = mpsc::sync_channel(capacity);
    let dropped = Arc::new(AtomicU64::new(0));
    (
        LatencyQueue {
            tx,
            dropped: dropped.clone(),
        },
        LatencyDrain { rx, dropped },
    )
}

impl LatencyQueue {
    /// A light request that started at `started` got its response headers
    /// at `now`.
    pub fn record(&self, source: Source, started: Instant, now: Instant) {
        let latency = now.saturating_duration_since(started);
        let sample = Sample {
            source,
            started,
            latency,
        };
        if let Err(TrySendError::Full(_)) = self.tx.try_send(sample) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl LatencyDrain {
    /// Hand every waiting sample to `budget`'s signals, oldest first.
    pub fn drain_into(&self, budget: &mut ByteBudget) {
        for s in self.rx.try_iter() {
            let ended = s.started + s.latency;
            budget.record(s.source, s.latency, s.started, ended);
        }
    }

    /// Samples dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::heavy::Ceilings;
    use crate::config::settings::budget::{Adaptive, QuotaMode};

    fn budget(now: Instant) -> ByteBudget {
        let ceilings = Ceilings {
            rate: Some(1e6),
            burst: Some(1e6),
            inflight: Some(1e6),
        };
        ByteBudget::new(QuotaMode::Adaptive, Adaptive::default(), ceilings, now)
    }

    #[test]
    fn samples_reach_their_signal_and_the_overflow_is_counted() {
        let t0 = Instant::now();
        let (queue, drain) = latency_queue(100);
        let mut b = budget(t0);
        let mut now = t0;
        for i in 0..120u64 {
            now += Duration::from_millis(30);
            let source = if i < 60 {
                Source::Workload
            } else {
                Source::Protected
            };
            let latency = Duration::from_millis(if i < 60 { 80 } else { 7 });
            queue.record(source, now - latency, now);
        }
        assert_eq!(drain.dropped(), 20, "100 waited, 20 did not fit");
        drain.drain_into(&mut b);
        let v = b.view(now);
        let (w, p) = (v.workload_signal, v.signal);
        assert_eq!((w.quiet_samples, w.p99_seconds), (60, Some(0.08)));
        assert_eq!((p.quiet_samples, p.p99_seconds), (40, Some(0.007)));
        // Drained: the queue takes samples again.
        queue.record(Source::Protected, now, now + Duration::from_millis(50));
        assert_eq!(drain.dropped(), 20);
    }

    #[test]
    fn a_sample_is_judged_by_the_heavy_lane_it_ended_in() {
        let t0 = Instant::now();
        let (queue, drain) = latency_queue(CAPACITY);
        let mut b = budget(t0);
        // Ended while no heavy request ran: quiet, though drained after
        // one started (admission drains before the heavy lane changes).
        let ended = t0 + Duration::from_secs(1);
        queue.record(Source::Protected, ended - Duration::from_millis(10), ended);
        drain.drain_into(&mut b);
        assert!(b.acquire(1.0, false, ended + Duration::from_millis(1)));
        queue.record(Source::Protected, ended, ended + Duration::from_millis(20));
        drain.drain_into(&mut b);
        assert_eq!(
            b.view(ended + Duration::from_millis(20))
                .signal
                .quiet_samples,
            1
        );
    }
}
