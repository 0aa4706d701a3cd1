//! How late a worker runs what is ready: the part of a light request's latency that tollgate's
//! own timing of it cannot see.
//!
//! The budget's signal times a light request from its handler to the apiserver's response
//! headers ([`crate::admit::on_response_start`]). Its client waits longer: for the worker to read
//! and parse the request after its bytes arrived, and for it to write the response after the
//! headers came back. At rest both are microseconds. With the machine's cores busy (the
//! apiserver encoding LISTs, tollgate relaying them through TLS on both sides, the clients
//! reading them) each is a wait for the thread to be scheduled and for the tasks queued ahead of
//! it on the worker to yield. The kernel's receive time of a request is not in reach, so the
//! worker measures the wait where it can: a task on each worker sleeps to a fixed schedule and
//! notes how late it woke ([`INTERVAL`]). A timer and a readable socket are both found by the same
//! poll of the worker's driver and queued behind the same tasks on the same thread, so the
//! timer's lateness is what a request arriving then waits before its handler runs, and again
//! before its response is written.
//!
//! Each light request's sample is then its measured latency plus the worker's lateness twice
//! (in and out): [`added`]. On kube-apiserver 1.37.2, where a storm of 10,000-pod LISTs sent
//! directly kept the heartbeats within 50 ms, tollgate's signal read 17–38 ms while the clients
//! saw 40–185 ms (bench/RESULTS.md, "kube-apiserver v1.37.2"): the controller admitted LISTs
//! whose relaying was the congestion.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::{sleep_until, Instant};

/// How often each worker's ticker wakes: 200 times a second (a wake costs a microsecond or two),
/// often enough that a request's wait falls in a span the ticker saw.
pub const INTERVAL: Duration = Duration::from_millis(5);

/// The recent lateness is the largest of the last `SPAN` ticks (20 ms): one late tick is the
/// wait a request queued at that moment had; the neighbours cover a request that arrived
/// between two ticks.
const SPAN: usize = 4;

/// tokio's timers fire on a millisecond wheel: a sleep wakes up to a millisecond after its
/// deadline on an idle worker. That much is the timer's, not a wait.
const TIMER_RESOLUTION: Duration = Duration::from_millis(1);

/// Each worker's recent lateness in microseconds, for `/debug/budget` (read on another
/// thread): by worker index, the first [`SHOWN`].
const SHOWN: usize = 64;
static SEEN: [AtomicU32; SHOWN] = [const { AtomicU32::new(0) }; SHOWN];

thread_local! {
    /// This worker's last [`SPAN`] latenesses, in microseconds (a ring, oldest overwritten).
    static RECENT: Cell<([u32; SPAN], usize)> = const { Cell::new(([0; SPAN], 0)) };
}

/// The lateness this worker's ticker saw recently (zero on a thread without a ticker).
pub fn recent() -> Duration {
    let (ring, _) = RECENT.with(Cell::get);
    Duration::from_micros(u64::from(ring.iter().copied().max().unwrap_or(0)))
}

/// The largest recent lateness of any worker (of the first [`SHOWN`]).
pub fn workers_recent() -> Duration {
    let max = SEEN.iter().map(|s| s.load(Ordering::Relaxed)).max();
    Duration::from_micros(u64::from(max.unwrap_or(0)))
}

/// What a light request waited on this worker beyond its measured latency: the recent lateness,
/// once before its handler and once after its response headers.
pub fn added() -> Duration {
    recent() * 2
}

pub(crate) fn note(late: Duration) {
    let micros = u32::try_from(late.as_micros()).unwrap_or(u32::MAX);
    RECENT.with(|r| {
        let (mut ring, next) = r.get();
        ring[next % SPAN] = micros;
        r.set((ring, (next + 1) % SPAN));
    });
}

/// The ticker: run on each worker's runtime for as long as it lives (dropped with it).
pub async fn tick() {
    let mut due = Instant::now();
    loop {
        due += INTERVAL;
        sleep_until(due).await;
        let now = Instant::now();
        note(
            now.saturating_duration_since(due)
                .saturating_sub(TIMER_RESOLUTION),
        );
        let micros = u32::try_from(recent().as_micros()).unwrap_or(u32::MAX);
        SEEN[crate::workers::current() % SHOWN].store(micros, Ordering::Relaxed);
        // After a stall longer than the interval, the schedule starts again from now rather
        // than firing once per missed tick (each would read the same stall again).
        if now > due + INTERVAL {
            due = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recent_lateness_is_the_largest_of_the_last_ticks_and_then_forgotten() {
        assert_eq!(recent(), Duration::ZERO, "no ticker, no lateness");
        note(Duration::from_millis(7));
        note(Duration::from_millis(2));
        assert_eq!(recent(), Duration::from_millis(7));
        assert_eq!(added(), Duration::from_millis(14), "in and out");
        for _ in 0..SPAN - 1 {
            note(Duration::ZERO);
        }
        assert_eq!(
            recent(),
            Duration::from_millis(2),
            "the 7 is older than the span"
        );
        note(Duration::ZERO);
        assert_eq!(recent(), Duration::ZERO, "and now the 2");
    }

    #[test]
    fn a_worker_kept_busy_reads_as_late() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            tokio::spawn(tick());
            // Idle: the ticker wakes on time (within the timer's millisecond).
            let deadline = Instant::now() + Duration::from_millis(100);
            while Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(recent() < Duration::from_millis(3), "idle: {:?}", recent());
            // A task that holds the thread for 30 ms without yielding delays the ticker by
            // about that much.
            std::thread::sleep(Duration::from_millis(30));
            tokio::task::yield_now().await;
            let deadline = Instant::now() + Duration::from_secs(5);
            while recent() < Duration::from_millis(20) && Instant::now() < deadline {
                tokio::task::yield_now().await;
            }
            assert!(
                recent() >= Duration::from_millis(20),
                "busy: {:?}",
                recent()
            );
        });
    }
}
