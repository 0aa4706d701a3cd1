//! A learned pattern as `/debug/patterns` shows it. The copy is taken under
//! the pattern store's lock ([`PatternCache::entries`]: each pattern's
//! statistics, store and predicted cost); decaying, formatting and sorting up
//! to `patterns.capacity` of them happen after it is released.

use tokio::time::Instant;

use super::{PatternCache, PatternStats, Store};
use crate::pattern::PatternKey;

/// A learned pattern as `/debug/patterns` shows it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PatternView {
    pub pattern: String,
    pub verb: String,
    pub resource: String,
    pub scope: String,
    pub consistency: Option<String>,
    /// For LISTs: the store assumed to serve it (`watchCache`, `etcd`).
    pub store: Option<Store>,
    pub count: u64,
    pub rate: f64,
    pub bytes_avg: f64,
    pub bytes_p95: f64,
    pub predicted_cost: f64,
    pub latency_p99_ms: f64,
    /// Rejected (in dryRun: would have been).
    pub rejected: u64,
    pub top_clients: Vec<String>,
    /// The clients rejected most for this pattern.
    pub rejected_clients: Vec<String>,
}

/// One pattern as copied out of the cache.
#[derive(Debug, Clone)]
pub struct Entry {
    key: PatternKey,
    stats: PatternStats,
    store: Option<Store>,
    predicted_cost: f64,
}

impl PatternCache {
    /// Every pattern, copied (cheap clones, no formatting), for [`views`].
    pub fn entries(&self, now: Instant) -> Vec<Entry> {
        self.patterns
            .iter()
            .map(|(key, s)| Entry {
                key: key.clone(),
                stats: s.clone(),
                store: key.is_list_like().then(|| self.store(key)),
                predicted_cost: self.predict(key, now).cost(),
            })
            .collect()
    }

    /// Learned patterns, heaviest first.
    pub fn snapshot(&self, now: Instant) -> Vec<PatternView> {
        views(self.entries(now), self.settings.half_life_seconds, now)
    }
}

/// The entries decayed to `now` and formatted, heaviest first.
pub fn views(entries: Vec<Entry>, half_life: f64, now: Instant) -> Vec<PatternView> {
    let mut views: Vec<PatternView> = entries
        .into_iter()
        .map(|e| {
            let (key, mut s) = (e.key, e.stats);
            s.decay_to(now, half_life);
            PatternView {
                pattern: key.to_string(),
                verb: key.verb.as_str().to_string(),
                resource: key.resource.clone(),
                scope: key.scope.as_str().to_string(),
                consistency: key.consistency.map(|c| c.as_str().to_string()),
                store: e.store,
                count: s.count,
                rate: s.rate(half_life),
                bytes_avg: s.bytes_mean().unwrap_or(0.0),
                bytes_p95: s.bytes_p95(),
                predicted_cost: e.predicted_cost,
                latency_p99_ms: s.latency_p99_ms(),
                rejected: s.rejected,
                top_clients: s.top_clients(),
                rejected_clients: s.top_rejected_clients(),
            }
        })
        .collect();
    views.sort_by(|a, b| b.predicted_cost.total_cmp(&a.predicted_cost));
    views
}
