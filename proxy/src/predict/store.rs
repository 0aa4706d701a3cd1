//! The pattern cache as the gateway shares it: one mutex, held for a lookup
//! or an update, never across an `.await`. The handle the steps (predict,
//! admit, observe), the scraper and `/debug/patterns` get.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tokio::time::Instant;

use super::{view, PatternCache, PatternView, Patterns, Release};

/// The shared pattern cache.
#[derive(Debug)]
pub struct PatternStore {
    cache: Mutex<PatternCache>,
}

impl PatternStore {
    pub fn new(settings: Patterns) -> PatternStore {
        PatternStore {
            cache: Mutex::new(PatternCache::new(settings)),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, PatternCache> {
        // A panic while holding the lock leaves statistics, not invariants: keep going.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Learned patterns, heaviest first, costs charged with
    /// `etcd_read_weight` (`quota.etcdReadWeight`); the lock is held only
    /// for the copy.
    pub fn snapshot(&self, etcd_read_weight: f64) -> Vec<PatternView> {
        let now = Instant::now();
        let cache = self.lock();
        let half_life = cache.settings.half_life_seconds;
        let entries = cache.entries(now);
        drop(cache);
        view::views(entries, half_life, etcd_read_weight, now)
    }

    /// Object counts scraped from the apiserver (see [`crate::scrape`]).
    pub fn set_object_counts(&self, counts: &[(String, f64)]) {
        let mut cache = self.lock();
        for (resource, n) in counts {
            cache.set_object_count(resource, *n);
        }
    }

    /// The upstream's release (`None`: unknown), the prior of `consistentStore: auto`.
    pub fn set_release(&self, release: Option<Release>) {
        self.lock().set_release(release);
    }

    pub fn release(&self) -> Option<Release> {
        self.lock().release()
    }

    /// Consistent LISTs forwarded so far, per resource.
    pub fn consistent_lists(&self) -> HashMap<String, u64> {
        self.lock().consistent_lists().clone()
    }

    /// Learn which store serves consistent LISTs from `(resource, etcd
    /// LISTs, consistent LISTs)` over one scrape interval.
    pub fn learn_stores(&self, deltas: &[(String, f64, u64)]) {
        let mut cache = self.lock();
        for (resource, etcd, ours) in deltas {
            if let Some(store) = cache.learn_store(resource, *etcd, *ours) {
                tracing::debug!(%resource, ?store, "learned the store of consistent LISTs");
            }
        }
    }
}
