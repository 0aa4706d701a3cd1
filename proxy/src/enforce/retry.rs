//! `Retry-After` for rejections, and the rate limit on rejection logs.
//!
//! The retry time is the pool's refill time for the request's cost,
//! stretched by a random fraction (up to `jitter`) so that clients
//! rejected together do not come back together, rounded up to whole
//! seconds and clamped to `[minSeconds, maxSeconds]`. The randomness is a
//! hash of the client and a counter: different clients get different
//! stretches without a random-number dependency.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::settings::enforce::RetryAfter;

/// A uniform number in [0, 1) from `seed` (splitmix64).
pub fn unit(seed: u64) -> f64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// A seed for one rejection of `client`.
pub fn seed(client: &str, counter: u64) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    client.hash(&mut h);
    counter.hash(&mut h);
    h.finish()
}

/// Whole seconds to wait, from the refill time `base`.
pub fn retry_after(base: Duration, seed: u64, settings: &RetryAfter) -> u64 {
    let stretched = base.as_secs_f64() * (1.0 + settings.jitter * unit(seed));
    // The jitter also spreads clients whose base is under a second.
    let spread = settings.jitter * unit(seed.rotate_left(17));
    let secs = (stretched + spread).ceil();
    let secs = if secs.is_finite() {
        secs as u64
    } else {
        u64::MAX
    };
    secs.clamp(
        settings.min_seconds,
        settings.max_seconds.max(settings.min_seconds),
    )
}

/// At most `per_second` log lines a second; the rest are counted and the
/// count reported with the next line that is let through.
#[derive(Debug)]
pub struct LogLimiter {
    /// Milliseconds since `epoch` of the current one-second window.
    window_ms: AtomicU64,
    in_window: AtomicU64,
    suppressed: AtomicU64,
    epoch: Instant,
}

impl LogLimiter {
    pub fn new(now: Instant) -> Self {
        LogLimiter {
            window_ms: AtomicU64::new(0),
            in_window: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            epoch: now,
        }
    }

    /// `Some(suppressed since the last line)` if a line may be logged now.
    pub fn allow(&self, per_second: f64, now: Instant) -> Option<u64> {
        let ms = now.saturating_duration_since(self.epoch).as_millis() as u64;
        let window = self.window_ms.load(Ordering::Relaxed);
        if ms >= window + 1000
            && self
                .window_ms
                .compare_exchange(window, ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.in_window.store(0, Ordering::Relaxed);
        }
        let n = self.in_window.fetch_add(1, Ordering::Relaxed);
        if (n as f64) < per_second {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_the_refill_time_rounded_up_with_jitter() {
        let s = RetryAfter {
            min_seconds: 1,
            max_seconds: 60,
            jitter: 0.0,
        };
        assert_eq!(retry_after(Duration::from_millis(2100), 7, &s), 3);
        assert_eq!(retry_after(Duration::ZERO, 7, &s), 1, "at least min");
        assert_eq!(retry_after(Duration::from_secs(1000), 7, &s), 60);
        let s = RetryAfter { jitter: 0.5, ..s };
        let spread: std::collections::BTreeSet<u64> = (0..100)
            .map(|i| retry_after(Duration::from_secs(10), seed("client", i), &s))
            .collect();
        assert!(spread.iter().all(|&v| (10..=16).contains(&v)), "{spread:?}");
        assert!(spread.len() >= 4, "clients spread out: {spread:?}");
    }

    #[test]
    fn unit_is_in_range() {
        for i in 0..1000 {
            let u = unit(i);
            assert!((0.0..1.0).contains(&u));
        }
    }

    #[test]
    fn log_limiter_lets_n_a_second_through() {
        let t0 = Instant::now();
        let l = LogLimiter::new(t0);
        assert_eq!(l.allow(2.0, t0), Some(0));
        assert_eq!(l.allow(2.0, t0), Some(0));
        assert_eq!(l.allow(2.0, t0), None);
        assert_eq!(l.allow(2.0, t0), None);
        assert_eq!(l.allow(2.0, t0 + Duration::from_millis(1500)), Some(2));
    }
}
