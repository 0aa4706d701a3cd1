//! Per-client heavy-request rate limits beside the byte pool: many small
//! but frequent LISTs are a storm too. governor's keyed GCRA limiter does
//! the counting; it cannot be reconfigured, so a reload with new numbers
//! starts a fresh one (clients lose at most one burst of history).
//!
//! Bounded: idle keys (whose state says they are back to a full burst) are
//! dropped by `retain_recent` once `maxClients` is passed, and if every key
//! is busy the limiter starts over rather than grow without bound.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

use crate::config::settings::enforce::PerClient;

type Limiter = DefaultKeyedRateLimiter<String>;

/// The limiters of the running configuration.
#[derive(Default)]
pub struct ClientRates {
    current: Mutex<Option<(PerClient, Arc<Limiter>)>>,
}

impl std::fmt::Debug for ClientRates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientRates")
            .field("clients", &self.len())
            .finish()
    }
}

fn quota(settings: &PerClient) -> Option<Quota> {
    if !(settings.requests_per_second.is_finite() && settings.requests_per_second > 0.0) {
        return None;
    }
    let period = Duration::from_secs_f64(1.0 / settings.requests_per_second);
    let burst = NonZeroU32::new(settings.burst.max(1))?;
    Some(Quota::with_period(period)?.allow_burst(burst))
}

impl ClientRates {
    fn limiter(&self, settings: &PerClient) -> Option<Arc<Limiter>> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        match &*current {
            Some((s, l)) if s == settings => return Some(l.clone()),
            _ => {}
        }
        let limiter = Arc::new(Limiter::keyed(quota(settings)?));
        *current = Some((settings.clone(), limiter.clone()));
        Some(limiter)
    }

    /// Count a heavy request of `client`: `Err(wait)` if it is over its rate.
    pub fn check(&self, settings: &PerClient, client: &str) -> Result<(), Duration> {
        let Some(limiter) = self.limiter(settings) else {
            return Ok(());
        };
        if limiter.len() >= settings.max_clients {
            limiter.retain_recent();
            limiter.shrink_to_fit();
            if limiter.len() >= settings.max_clients {
                tracing::warn!(
                    clients = limiter.len(),
                    "per-client rate limiter full of busy clients: starting over"
                );
                let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
                *current = None;
                drop(current);
                return self.check_fresh(settings, client);
            }
        }
        let key = client.to_string();
        limiter
            .check_key(&key)
            .map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))
    }

    fn check_fresh(&self, settings: &PerClient, client: &str) -> Result<(), Duration> {
        let Some(limiter) = self.limiter(settings) else {
            return Ok(());
        };
        limiter
            .check_key(&client.to_string())
            .map_err(|n| n.wait_time_from(DefaultClock::default().now()))
    }

    /// Clients with state kept.
    pub fn len(&self) -> usize {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current.as_ref().map_or(0, |(_, l)| l.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_held_to_its_rate_and_others_are_not() {
        let rates = ClientRates::default();
        let s = PerClient {
            requests_per_second: 1.0,
            burst: 2,
            max_clients: 100,
        };
        assert!(rates.check(&s, "a").is_ok());
        assert!(rates.check(&s, "a").is_ok());
        let wait = rates.check(&s, "a").expect_err("over the burst");
        assert!(wait <= Duration::from_secs(1), "{wait:?}");
        assert!(rates.check(&s, "b").is_ok());
        let off = PerClient {
            requests_per_second: 0.0,
            ..s.clone()
        };
        for _ in 0..10 {
            assert!(rates.check(&off, "a").is_ok());
        }
    }

    #[test]
    fn keyed_state_stays_bounded() {
        let rates = ClientRates::default();
        let s = PerClient {
            requests_per_second: 0.001,
            burst: 1,
            max_clients: 50,
        };
        for i in 0..500 {
            let _ = rates.check(&s, &format!("client-{i}"));
            assert!(rates.len() <= 50, "{} keys", rates.len());
        }
    }
}
