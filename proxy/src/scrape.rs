//! Scraping the apiserver's object counts into the resource priors:
//! `apiserver_storage_objects{resource="pods"}` on current releases,
//! `etcd_object_counts{resource="pods"}` on older ones (1.20). A resource
//! label `deployments.apps` becomes the pattern resource `apps/deployments`.
//! One healthy upstream is scraped (the counts are cluster-wide), with
//! tollgate's own identity, every `upstream.metricsScrape.intervalSeconds`.
//!
//! The same scrape teaches which store serves consistent LISTs: the growth
//! of `apiserver_storage_list_total{resource}` (LISTs served from etcd)
//! against the consistent LISTs tollgate forwarded in the same interval
//! (see [`crate::predict::PatternCache::learn_store`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio_util::sync::CancellationToken;

use crate::admit::Admission;
use crate::config;
use crate::enforce::Lane;
use crate::forward::UpstreamPool;
use crate::metrics::{ReasonLabel, ResourceLabel};
use crate::predict::PatternStore;

/// What the scrape reads from and feeds: narrow handles, not the gateway.
pub struct Scraper {
    pub config: Arc<config::Current>,
    pub pool: Arc<UpstreamPool>,
    pub patterns: Arc<PatternStore>,
    /// The pool scales by the node count.
    pub admission: Arc<Admission>,
    /// `tollgate_resource_objects`.
    pub objects: Family<ResourceLabel, Gauge>,
    /// `tollgate_scrape_failures_total`.
    pub failures: Family<ReasonLabel, Counter>,
}

/// Why a scrape failed, as a bounded label: without the scrape, unseen
/// patterns are priced at `defaultListBytes` (the unlearned-pattern gate
/// still runs them one at a time) and apiserver restarts go unseen.
pub fn failure_reason(error: &str, has_identity: bool) -> &'static str {
    match error {
        "status 401" | "status 403" if !has_identity => "noIdentity",
        "status 401" => "unauthorized",
        "status 403" => "forbidden",
        _ => "error",
    }
}

/// Most bytes read from one `/metrics` response.
const MAX_METRICS_BYTES: usize = 64 << 20;

const COUNT_METRICS: [&str; 2] = ["apiserver_storage_objects", "etcd_object_counts"];
const STORAGE_LIST_METRICS: [&str; 1] = ["apiserver_storage_list_total"];

/// `(pattern resource, objects)` from Prometheus text.
pub fn parse_object_counts(text: &str) -> Vec<(String, f64)> {
    parse_by_resource(text, &COUNT_METRICS)
}

/// `(pattern resource, LISTs served from etcd so far)` from Prometheus text, one per resource.
/// Current releases count the watch cache's LISTs in the same metric, told apart by the label
/// `storage` (`etcd` or `watchcache`), and split series by `index`: only `storage="etcd"` (or
/// no such label) counts, summed over the rest; a resource with only watch-cache series has
/// had 0 LISTs from etcd (the etcd series appears with the first). Taking whichever series came
/// last made a v1.37 apiserver's cache-served LISTs look like etcd reads.
pub fn parse_storage_lists(text: &str) -> Vec<(String, f64)> {
    let mut sums: Vec<(String, f64)> = Vec::new();
    let series = kubeio::promtext::samples(text)
        .filter(|s| STORAGE_LIST_METRICS.contains(&s.name) && s.value >= 0.0);
    for s in series {
        let Some(label) = s.label("resource") else {
            continue;
        };
        let from_etcd = s.label("storage").is_none_or(|store| store == "etcd");
        let value = if from_etcd { s.value } else { 0.0 };
        let resource = pattern_resource(&label);
        match sums.iter_mut().find(|(r, _)| *r == resource) {
            Some((_, sum)) => *sum += value,
            None => sums.push((resource, value)),
        }
    }
    sums
}

/// The upstream's `process_start_time_seconds`: a change means it restarted.
pub fn parse_start_time(text: &str) -> Option<f64> {
    kubeio::promtext::first(text, "process_start_time_seconds")
}

/// Growth of two per-resource counters between scrapes.
#[derive(Debug, Default)]
pub struct StoreEvidence {
    prev: HashMap<String, (f64, u64)>,
}

impl StoreEvidence {
    /// `(resource, etcd LISTs, consistent LISTs)` since the last call, for
    /// resources seen both times. A counter that went down (an apiserver
    /// restart) counts from zero.
    pub fn update(
        &mut self,
        storage_lists: &[(String, f64)],
        consistent: &HashMap<String, u64>,
    ) -> Vec<(String, f64, u64)> {
        let mut out = Vec::new();
        for (resource, total) in storage_lists {
            let ours = consistent.get(resource).copied().unwrap_or(0);
            if let Some((prev_total, prev_ours)) =
                self.prev.insert(resource.clone(), (*total, ours))
            {
                let d_total = if *total >= prev_total {
                    total - prev_total
                } else {
                    *total
                };
                out.push((resource.clone(), d_total, ours.saturating_sub(prev_ours)));
            }
        }
        out
    }
}

fn parse_by_resource(text: &str, metrics: &[&str]) -> Vec<(String, f64)> {
    kubeio::promtext::by_label(text, metrics, "resource")
        .into_iter()
        // Negative counts mean "unknown" on some releases.
        .filter(|(_, value)| *value >= 0.0)
        .map(|(resource, value)| (pattern_resource(&resource), value))
        .collect()
}

/// `deployments.apps` → `apps/deployments`; `pods` → `pods`.
fn pattern_resource(label: &str) -> String {
    match label.split_once('.') {
        Some((resource, group)) => format!("{group}/{resource}"),
        None => label.to_string(),
    }
}

impl Scraper {
    /// Scrape until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let settings = self.config.get().upstream.metrics_scrape.clone();
        if !settings.enabled {
            return;
        }
        let interval = Duration::from_secs_f64(settings.interval_seconds);
        let mut evidence = StoreEvidence::default();
        // Logged as a warning when it starts or changes, then counted.
        let mut last_failure: Option<&'static str> = None;
        loop {
            let pool = &self.pool;
            // tollgate's own requests go in the `self` lane; a full lane skips a round.
            let limit = Lane::SelfLane.limit(&self.config.get().lanes);
            let slot = self.admission.slots().try_take(Lane::SelfLane, limit);
            let healthy = pool.upstreams().iter().find(|u| u.is_healthy());
            if let (Some(u), Some(_slot)) = (healthy, slot) {
                match pool
                    .own_get(u, &settings.path, MAX_METRICS_BYTES, interval)
                    .await
                {
                    Ok(body) => {
                        let text = String::from_utf8_lossy(&body);
                        let resources = self.learn(&text, &mut evidence);
                        last_failure = None;
                        tracing::debug!(upstream = %u.url, resources, "scraped object counts");
                    }
                    Err(e) => {
                        let up = &self.config.get().upstream;
                        let has_identity = up.client_cert_file.is_some() || up.kubeconfig.is_some();
                        let reason = failure_reason(&e, has_identity);
                        self.failures.get_or_create(&ReasonLabel { reason }).inc();
                        if last_failure != Some(reason) {
                            tracing::warn!(upstream = %u.url, error = %e, reason,
                                "cannot scrape the apiserver's metrics: unseen LISTs are priced at defaultListBytes (one at a time until learned), restarts go unseen; give tollgate an identity allowed to get /metrics");
                        } else {
                            tracing::debug!(upstream = %u.url, error = %e, "metrics scrape failed");
                        }
                        last_failure = Some(reason);
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }

    /// Object counts into the priors, the node count into the pool's
    /// scaling, the stores of consistent LISTs, the upstream's start time
    /// into the relist guard. Returns how many resources were counted.
    fn learn(&self, text: &str, evidence: &mut StoreEvidence) -> usize {
        let counts = parse_object_counts(text);
        self.patterns.set_object_counts(&counts);
        if let Some((_, nodes)) = counts.iter().find(|(r, _)| r == "nodes") {
            self.admission.set_cluster_size("nodes", *nodes);
        }
        for (resource, n) in &counts {
            self.objects
                .get_or_create(&ResourceLabel {
                    resource: resource.clone(),
                })
                .set(*n as i64);
        }
        let deltas = evidence.update(
            &parse_storage_lists(text),
            &self.patterns.consistent_lists(),
        );
        self.patterns.learn_stores(&deltas);
        if let Some(t) = parse_start_time(text) {
            self.admission
                .observe_upstream(self.pool.recoveries(), Some(t));
        }
        counts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_reasons() {
        assert_eq!(failure_reason("status 403", false), "noIdentity");
        assert_eq!(failure_reason("status 403", true), "forbidden");
        assert_eq!(failure_reason("status 401", true), "unauthorized");
        assert_eq!(failure_reason("timed out", false), "error");
    }

    #[test]
    fn store_evidence_is_the_growth_between_scrapes() {
        let mut e = StoreEvidence::default();
        let ours = |n: u64| HashMap::from([("pods".to_string(), n)]);
        let text = |n: u64| format!("apiserver_storage_list_total{{resource=\"pods\"}} {n}\n");
        assert!(
            e.update(&parse_storage_lists(&text(100)), &ours(3))
                .is_empty(),
            "a baseline first"
        );
        assert_eq!(
            e.update(&parse_storage_lists(&text(101)), &ours(13)),
            vec![("pods".to_string(), 1.0, 10)]
        );
        assert_eq!(
            e.update(&parse_storage_lists(&text(4)), &ours(13)),
            vec![("pods".to_string(), 4.0, 0)],
            "restart"
        );
    }

    #[test]
    fn storage_lists_count_etcd_series_only() {
        // v1.37.2's series: the watch cache's LISTs counted beside etcd's, split by index.
        let text = "apiserver_storage_list_total{group=\"\",index=\"\",resource=\"pods\",storage=\"watchcache\"} 64\n\
apiserver_storage_list_total{group=\"\",index=\"\",resource=\"pods\",storage=\"etcd\"} 2\n\
apiserver_storage_list_total{group=\"\",index=\"f:spec.nodeName\",resource=\"pods\",storage=\"etcd\"} 3\n\
apiserver_storage_list_total{group=\"apps\",index=\"\",resource=\"deployments.apps\",storage=\"watchcache\"} 9\n\
apiserver_storage_list_total{resource=\"nodes\"} 7\n";
        assert_eq!(
            parse_storage_lists(text),
            vec![
                ("pods".to_string(), 5.0),
                ("apps/deployments".to_string(), 0.0),
                ("nodes".to_string(), 7.0)
            ]
        );
    }

    #[test]
    fn the_start_time_is_read() {
        let text = "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.7e+09\nprocess_start_time_seconds_x 3\n";
        assert_eq!(parse_start_time(text), Some(1.7e9));
        assert_eq!(
            parse_start_time("process_start_time_seconds{a=\"b\"} 12\n"),
            Some(12.0)
        );
        assert_eq!(parse_start_time("other 1\n"), None);
    }

    #[test]
    fn counts_from_current_and_old_releases() {
        let text = "# HELP apiserver_storage_objects x\n# TYPE apiserver_storage_objects gauge\n\
apiserver_storage_objects{resource=\"pods\"} 15000\n\
apiserver_storage_objects{resource=\"deployments.apps\"} 3.2e+03\n\
apiserver_storage_objects{resource=\"events\"} -1\n\
etcd_object_counts{resource=\"nodes\"} 5000\n\
apiserver_storage_objects_total{resource=\"x\"} 1\n\
apiserver_request_total{verb=\"GET\"} 7\n";
        assert_eq!(
            parse_object_counts(text),
            vec![
                ("pods".to_string(), 15000.0),
                ("apps/deployments".to_string(), 3200.0),
                ("nodes".to_string(), 5000.0),
            ]
        );
    }
}
