//! A learned pattern as `/debug/patterns` shows it. The copy is taken under
//! the pattern store's lock ([`PatternCache::entries`]: each pattern's
//! statistics, store and predicted cost); decaying, formatting and sorting up
//! to `patterns.capacity` of them happen after it is released.

use tokio::time::Instant;

use super::charge::charge;
use super::{PatternCache, PatternStats, Prediction, Store, StoreReason};
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
    /// Why that store (`learned`, `configured`, `versionPrior`, `unknownVersion`).
    pub store_reason: Option<StoreReason>,
    pub count: u64,
    pub rate: f64,
    pub bytes_avg: f64,
    pub bytes_p95: f64,
    /// What admission charges a request of this pattern, in bytes:
    /// `predictedResponseBytes + quota.etcdReadWeight × predictedEtcdReadBytes`.
    /// The same number as the rejection log's `predicted_cost_bytes`, the
    /// 429's `predicted cost` and `tollgate_predicted_cost_bytes_total`.
    pub predicted_cost_bytes: f64,
    /// The predicted response (uncompressed).
    pub predicted_response_bytes: f64,
    /// The predicted bytes the apiserver reads from etcd to serve it (0 from the watch cache).
    pub predicted_etcd_read_bytes: f64,
    pub latency_p99_ms: f64,
    /// Rejected in enforce.
    pub rejected: u64,
    /// Would have been rejected, in dryRun.
    pub would_reject: u64,
    pub top_clients: Vec<String>,
    /// The clients rejected most for this pattern.
    pub rejected_clients: Vec<String>,
}

/// One pattern as copied out of the cache.
#[derive(Debug, Clone)]
pub struct Entry {
    key: PatternKey,
    stats: PatternStats,
    store: Option<(Store, StoreReason)>,
    predicted: Prediction,
}

impl PatternCache {
    /// Every pattern, copied (cheap clones, no formatting), for [`views`].
    pub fn entries(&self, now: Instant) -> Vec<Entry> {
        self.patterns
            .iter()
            .map(|(key, s)| Entry {
                key: key.clone(),
                stats: s.clone(),
                store: key.is_list_like().then(|| self.store_and_reason(key)),
                predicted: self.predict(key, now),
            })
            .collect()
    }

    /// Learned patterns, heaviest first; costs charged with `etcd_read_weight`.
    pub fn snapshot(&self, now: Instant, etcd_read_weight: f64) -> Vec<PatternView> {
        views(
            self.entries(now),
            self.settings.half_life_seconds,
            etcd_read_weight,
            now,
        )
    }
}

/// The entries decayed to `now` and formatted, heaviest first.
pub fn views(
    entries: Vec<Entry>,
    half_life: f64,
    etcd_read_weight: f64,
    now: Instant,
) -> Vec<PatternView> {
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
                store: e.store.map(|s| s.0),
                store_reason: e.store.map(|s| s.1),
                count: s.count,
                rate: s.rate(half_life),
                bytes_avg: s.bytes_mean().unwrap_or(0.0),
                bytes_p95: s.bytes_p95(),
                predicted_cost_bytes: charge(&e.predicted, etcd_read_weight),
                predicted_response_bytes: e.predicted.response_bytes,
                predicted_etcd_read_bytes: e.predicted.read_bytes,
                latency_p99_ms: s.latency_p99_ms(),
                rejected: s.rejected,
                would_reject: s.would_reject,
                top_clients: s.top_clients(),
                rejected_clients: s.top_rejected_clients(),
            }
        })
        .collect();
    views.sort_by(|a, b| b.predicted_cost_bytes.total_cmp(&a.predicted_cost_bytes));
    views
}
