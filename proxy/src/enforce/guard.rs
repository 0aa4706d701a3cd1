//! The relist-storm guard. When an apiserver comes back — after being
//! unreachable (health checks or connections failed, then succeeded) or
//! restarted (its `process_start_time_seconds` changed) — every informer
//! relists at once. For a warm-up window the guard scales heavy admission
//! down and ramps it back linearly: the pool's rate and burst, and the heavy
//! lane's in-flight limit, are multiplied by
//! `start + (1 − start)·elapsed/window`. Pure: time is passed in.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::settings::enforce::RelistGuard as Settings;

/// Why the guard started a warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// An upstream passed a health check (or took a connection) again.
    Recovered,
    /// An upstream's process start time changed: it restarted.
    Restarted,
}

impl Cause {
    pub const ALL: [Cause; 2] = [Cause::Recovered, Cause::Restarted];

    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Recovered => "recovered",
            Cause::Restarted => "restarted",
        }
    }
}

/// The guard's state.
#[derive(Debug, Default, Clone)]
pub struct RelistGuard {
    warmup_since: Option<Instant>,
    start_time: Option<f64>,
    recoveries: u64,
}

impl RelistGuard {
    /// Start (or restart) a warm-up at `now`.
    pub fn trigger(&mut self, now: Instant) {
        self.warmup_since = Some(now);
    }

    /// The upstream's `process_start_time_seconds` as last scraped; a
    /// change from a known value starts a warm-up (returns the cause).
    pub fn observe_start_time(&mut self, value: f64, now: Instant) -> Option<Cause> {
        let previous = self.start_time.replace(value);
        match previous {
            Some(p) if (p - value).abs() > 0.5 => {
                self.trigger(now);
                Some(Cause::Restarted)
            }
            _ => None,
        }
    }

    /// The upstream pool's count of recoveries (unhealthy → healthy); an
    /// increase starts a warm-up.
    pub fn observe_recoveries(&mut self, count: u64, now: Instant) -> Option<Cause> {
        let previous = std::mem::replace(&mut self.recoveries, count);
        (count > previous).then(|| {
            self.trigger(now);
            Cause::Recovered
        })
    }

    /// The admission factor at `now`: 1 outside a warm-up.
    pub fn factor(&self, settings: &Settings, now: Instant) -> f64 {
        if !settings.enabled {
            return 1.0;
        }
        let Some(since) = self.warmup_since else {
            return 1.0;
        };
        let window = Duration::from_secs_f64(settings.warmup_seconds);
        let elapsed = now.saturating_duration_since(since);
        if elapsed >= window {
            return 1.0;
        }
        let start = settings.start_fraction.clamp(0.0, 1.0);
        start + (1.0 - start) * elapsed.as_secs_f64() / window.as_secs_f64()
    }

    /// In a warm-up at `now`.
    pub fn active(&self, settings: &Settings, now: Instant) -> bool {
        self.factor(settings, now) < 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            enabled: true,
            warmup_seconds: 60.0,
            start_fraction: 0.1,
            rewrite_to_cache: Vec::new(),
        }
    }

    #[test]
    fn a_restart_ramps_admission_over_the_window() {
        let s = settings();
        let t0 = Instant::now();
        let mut g = RelistGuard::default();
        assert_eq!(g.observe_start_time(1000.0, t0), None, "first sight");
        assert_eq!(g.observe_start_time(1000.0, t0), None);
        assert_eq!(g.factor(&s, t0), 1.0);
        let t1 = t0 + Duration::from_secs(100);
        assert_eq!(g.observe_start_time(2000.0, t1), Some(Cause::Restarted));
        assert!((g.factor(&s, t1) - 0.1).abs() < 1e-9);
        assert!((g.factor(&s, t1 + Duration::from_secs(30)) - 0.55).abs() < 1e-9);
        assert!(g.active(&s, t1 + Duration::from_secs(59)));
        assert_eq!(g.factor(&s, t1 + Duration::from_secs(60)), 1.0);
        assert!(!g.active(&s, t1 + Duration::from_secs(61)));
    }

    #[test]
    fn recoveries_trigger_and_disabled_never_does() {
        let t0 = Instant::now();
        let mut g = RelistGuard::default();
        assert_eq!(g.observe_recoveries(0, t0), None);
        assert_eq!(g.observe_recoveries(1, t0), Some(Cause::Recovered));
        assert_eq!(g.observe_recoveries(1, t0), None);
        assert!(g.active(&settings(), t0));
        let off = Settings {
            enabled: false,
            ..settings()
        };
        assert_eq!(g.factor(&off, t0), 1.0);
    }
}
