//! The parts of ClusterLoader2's `TestMetrics` that can be measured from
//! outside the cluster, from the `/metrics` texts `resource_usage` sampled:
//! `EtcdMetrics` from an etcd (its four histograms as CL2 converts them, and
//! the largest database size seen), `SchedulingMetrics` from a kube-scheduler
//! (the latency histograms' growth between start and gather, quantiles as
//! Prometheus computes them). Each is skipped, said, when no such URL was
//! sampled; the parts that cannot be seen from outside are listed as skipped
//! ([`TEST_METRICS_SKIPPED`]).

use std::collections::BTreeMap;

use kubeio::promtext::samples;
use serde_json::{json, Value};

use super::resource_usage::Sampled;

/// TestMetrics' parts loadgen cannot measure from outside, with why.
pub const TEST_METRICS_SKIPPED: &[(&str, &str)] = &[
    (
        "MetricsForE2E",
        "needs every component's and kubelet's /metrics",
    ),
    (
        "CPUProfile, MemoryProfile, BlockProfile (etcd, etcd-events, kube-apiserver, kube-scheduler, kube-controller-manager)",
        "pprof over SSH to the control plane",
    ),
    ("SystemPodMetrics", "reads kube-system's pods' restarts"),
    ("ClusterOOMsTracker", "reads the nodes' OOM events"),
];

/// The etcd histograms CL2's EtcdMetrics keeps, by its JSON names.
const ETCD_HISTOGRAMS: [(&str, &str); 4] = [
    (
        "etcd_disk_backend_commit_duration_seconds_bucket",
        "backendCommitDuration",
    ),
    (
        "etcd_debugging_snap_save_total_duration_seconds_bucket",
        "snapshotSaveTotalDuration",
    ),
    (
        "etcd_network_peer_round_trip_time_seconds_bucket",
        "peerRoundTripTime",
    ),
    (
        "etcd_disk_wal_fsync_duration_seconds_bucket",
        "walFsyncDuration",
    ),
];

/// The scheduler's histograms CL2's SchedulingMetrics reads.
const SCHED_E2E: &str = "scheduler_pod_scheduling_sli_duration_seconds_bucket";
const SCHED_ALGORITHM: &str = "scheduler_scheduling_algorithm_duration_seconds_bucket";
const SCHED_EXTENSION: &str = "scheduler_framework_extension_point_duration_seconds_bucket";
const SCHED_PREEMPTION: &str =
    "scheduler_scheduling_algorithm_preemption_evaluation_seconds_bucket";

/// CL2's extension points, in its order.
const EXTENSION_POINTS: [&str; 11] = [
    "PreFilter",
    "Filter",
    "PostFilter",
    "PreScore",
    "Score",
    "PreBind",
    "Bind",
    "PostBind",
    "Reserve",
    "Unreserve",
    "Permit",
];

/// CL2's `ConvertSampleToHistogram`: every series of `metric` (those with
/// `extension_point` = `point`, if given) summed per upper bound.
fn summed_buckets(text: &str, metric: &str, point: Option<&str>) -> Vec<(f64, f64)> {
    let mut by_le: Vec<(f64, f64)> = Vec::new();
    for s in samples(text).filter(|s| s.name == metric) {
        if point.is_some_and(|p| s.label("extension_point").as_deref() != Some(p)) {
            continue;
        }
        let Some(le) = s.label("le").and_then(|v| parse_le(&v)) else {
            continue;
        };
        match by_le.iter_mut().find(|(b, _)| *b == le) {
            Some((_, n)) => *n += s.value,
            None => by_le.push((le, s.value)),
        }
    }
    by_le.sort_by(|a, b| a.0.total_cmp(&b.0));
    by_le
}

fn parse_le(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        _ => v.parse().ok(),
    }
}

/// Prometheus's `bucketQuantile` (what CL2's `Histogram.Quantile` runs):
/// linear within the bucket the rank falls in; `None` (CL2 leaves the
/// quantile 0) without observations or without a `+Inf` bucket.
fn bucket_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let last = buckets.last()?;
    if !last.0.is_infinite() || buckets.len() < 2 {
        return None;
    }
    // Cumulative counts never fall (a scrape between resets could say so).
    let mut b: Vec<(f64, f64)> = Vec::with_capacity(buckets.len());
    let mut max = 0f64;
    for &(le, n) in buckets {
        max = max.max(n);
        b.push((le, max));
    }
    let observations = b[b.len() - 1].1;
    if observations <= 0.0 {
        return None;
    }
    let mut rank = q * observations;
    let i = b
        .iter()
        .position(|(_, n)| *n >= rank)
        .unwrap_or(b.len() - 1);
    if i == b.len() - 1 {
        return Some(b[b.len() - 2].0);
    }
    if i == 0 && b[0].0 <= 0.0 {
        return Some(b[0].0);
    }
    let (mut start, end, mut count) = (0.0, b[i].0, b[i].1);
    if i > 0 {
        start = b[i - 1].0;
        count -= b[i - 1].1;
        rank -= b[i - 1].1;
    }
    Some(start + (end - start) * (rank / count))
}

/// CL2's `LatencyMetric`: Go durations, in nanoseconds.
fn latency_metric(first: &str, last: &str, metric: &str, point: Option<&str>) -> Value {
    let before = summed_buckets(first, metric, point);
    // CL2's HistogramSub: the gather's buckets less the start's.
    let delta: Vec<(f64, f64)> = summed_buckets(last, metric, point)
        .into_iter()
        .map(|(le, n)| {
            let was = before.iter().find(|(b, _)| *b == le).map_or(0.0, |x| x.1);
            (le, n - was)
        })
        .collect();
    let ns = |q: f64| bucket_quantile(q, &delta).map_or(0, |s| (s * 1e9) as i64);
    json!({"Perc50": ns(0.5), "Perc90": ns(0.9), "Perc99": ns(0.99)})
}

/// CL2's `SchedulingMetrics` file from the first kube-scheduler among
/// `sampled`; `None` when none was sampled twice.
pub fn scheduling_metrics(sampled: &[Sampled]) -> Option<Value> {
    let s = sampled.iter().find(|s| s.scheduler_last.is_some())?;
    let first = s.scheduler_first.as_deref()?;
    let last = s.scheduler_last.as_deref()?;
    let mut points: Vec<&str> = EXTENSION_POINTS.to_vec();
    // Go's encoding/json writes a map's keys sorted.
    points.sort_unstable();
    let mut ext = serde_json::Map::new();
    for p in points {
        ext.insert(
            p.into(),
            latency_metric(first, last, SCHED_EXTENSION, Some(p)),
        );
    }
    Some(json!({
        "frameworkExtensionPointDuration": ext,
        "preemptionEvaluationLatency": latency_metric(first, last, SCHED_PREEMPTION, None),
        "e2eSchedulingLatency": latency_metric(first, last, SCHED_E2E, None),
        "schedulingLatency": latency_metric(first, last, SCHED_ALGORITHM, None),
    }))
}

/// CL2's `EtcdMetrics` file from the etcd sources among `sampled`; `None`
/// when no scraped URL was etcd's.
pub fn etcd_metrics(sampled: &[Sampled]) -> Option<Value> {
    let etcd: Vec<&Sampled> = sampled.iter().filter(|s| s.etcd_last.is_some()).collect();
    if etcd.is_empty() {
        return None;
    }
    let mut out = serde_json::Map::new();
    for (_, key) in ETCD_HISTOGRAMS {
        out.insert(key.into(), Value::Array(Vec::new()));
    }
    let mut max_db = 0f64;
    for s in etcd {
        max_db = max_db.max(s.etcd_max_db_size);
        let text = s.etcd_last.as_deref().unwrap_or_default();
        for (metric, key) in ETCD_HISTOGRAMS {
            let vec = histogram_vec(text, metric);
            if let Some(Value::Array(a)) = out.get_mut(key) {
                a.extend(vec);
            }
        }
    }
    out.insert("maxDatabaseSize".into(), json!(max_db));
    Some(Value::Object(out))
}

/// CL2's `ConvertSampleToBucket` over every series of `metric`: one
/// `{"labels", "buckets"}` per label set (`le` aside, `__name__` kept as
/// CL2's model keeps it), buckets keyed by `le` as written.
fn histogram_vec(text: &str, metric: &str) -> Vec<Value> {
    let mut hists: Vec<(BTreeMap<String, String>, BTreeMap<String, i64>)> = Vec::new();
    for s in samples(text).filter(|s| s.name == metric) {
        let mut labels: BTreeMap<String, String> = s
            .labels()
            .filter(|(k, _)| *k != "le")
            .map(|(k, v)| (k.to_string(), v.into_owned()))
            .collect();
        labels.insert("__name__".into(), metric.into());
        let le = s.label("le").map(|v| v.into_owned()).unwrap_or_default();
        let at = match hists.iter().position(|(l, _)| *l == labels) {
            Some(i) => i,
            None => {
                hists.push((labels, BTreeMap::new()));
                hists.len() - 1
            }
        };
        *hists[at].1.entry(le).or_default() += s.value as i64;
    }
    hists
        .into_iter()
        .map(|(labels, buckets)| json!({"labels": labels, "buckets": buckets}))
        .collect()
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;

    fn sampled(url: &str, component: &'static str) -> Sampled {
        Sampled {
            url: url.into(),
            component: Some(component),
            ..Sampled::default()
        }
    }

    #[test]
    fn etcd_metrics_in_cl2s_shape() {
        let text = "etcd_server_has_leader 1\n\
etcd_mvcc_db_total_size_in_bytes 4096\n\
etcd_disk_wal_fsync_duration_seconds_bucket{le=\"0.001\"} 5\n\
etcd_disk_wal_fsync_duration_seconds_bucket{le=\"+Inf\"} 7\n\
etcd_disk_backend_commit_duration_seconds_bucket{le=\"0.01\"} 2\n";
        let mut s = Sampled {
            url: "http://127.0.0.1:2379".into(),
            ..Sampled::default()
        };
        let mut last = None;
        s.add(Instant::now(), text.to_string(), &mut last);
        assert_eq!(s.component, Some("etcd"));
        let m = etcd_metrics(&[s]).expect("etcd seen");
        assert_eq!(m["maxDatabaseSize"], 4096.0);
        let wal = &m["walFsyncDuration"][0];
        assert_eq!(wal["buckets"]["0.001"], 5);
        assert_eq!(wal["buckets"]["+Inf"], 7);
        assert_eq!(
            wal["labels"]["__name__"],
            "etcd_disk_wal_fsync_duration_seconds_bucket"
        );
        assert_eq!(m["backendCommitDuration"][0]["buckets"]["0.01"], 2);
        assert_eq!(m["peerRoundTripTime"], json!([]));
        assert_eq!(m["snapshotSaveTotalDuration"], json!([]));
        assert!(etcd_metrics(&[sampled("http://a", "tollgate")]).is_none());
    }

    #[test]
    fn bucket_quantiles_are_prometheus_s() {
        let b = [(0.1, 10.0), (0.2, 20.0), (f64::INFINITY, 20.0)];
        assert_eq!(bucket_quantile(0.5, &b), Some(0.1));
        assert!((bucket_quantile(0.75, &b).expect("q") - 0.15).abs() < 1e-12);
        // In the +Inf bucket: the highest finite bound.
        let c = [(0.1, 1.0), (f64::INFINITY, 10.0)];
        assert_eq!(bucket_quantile(0.9, &c), Some(0.1));
        assert_eq!(
            bucket_quantile(0.5, &[(0.1, 0.0), (f64::INFINITY, 0.0)]),
            None
        );
        assert_eq!(bucket_quantile(0.5, &[(0.1, 3.0)]), None, "no +Inf bucket");
    }

    /// SchedulingMetrics: what the scheduler's histograms gained between start and
    /// gather, series summed (every `result`, one extension point at a time), in Go
    /// nanoseconds; absent without a kube-scheduler.
    #[test]
    fn scheduling_metrics_from_the_histograms_growth() {
        let text = |e2e_fast: u32, e2e_all: u32, filter: u32| {
            format!(
                "scheduler_schedule_attempts_total{{result=\"scheduled\"}} 1\n\
scheduler_pod_scheduling_sli_duration_seconds_bucket{{attempts=\"1\",le=\"0.01\"}} {e2e_fast}\n\
scheduler_pod_scheduling_sli_duration_seconds_bucket{{attempts=\"1\",le=\"0.02\"}} {e2e_all}\n\
scheduler_pod_scheduling_sli_duration_seconds_bucket{{attempts=\"1\",le=\"+Inf\"}} {e2e_all}\n\
scheduler_framework_extension_point_duration_seconds_bucket{{extension_point=\"Filter\",profile=\"default\",status=\"Success\",le=\"0.001\"}} {filter}\n\
scheduler_framework_extension_point_duration_seconds_bucket{{extension_point=\"Filter\",profile=\"default\",status=\"Success\",le=\"+Inf\"}} {filter}\n\
scheduler_framework_extension_point_duration_seconds_bucket{{extension_point=\"Bind\",profile=\"default\",status=\"Success\",le=\"0.5\"}} 9\n\
scheduler_framework_extension_point_duration_seconds_bucket{{extension_point=\"Bind\",profile=\"default\",status=\"Success\",le=\"+Inf\"}} 9\n"
            )
        };
        let mut s = Sampled {
            url: "https://127.0.0.1:10259/metrics".into(),
            ..Sampled::default()
        };
        let mut last = None;
        // Before the start, 100 pods were scheduled fast; between start and gather,
        // 10 more, all in the slower bucket.
        s.add(Instant::now(), text(100, 100, 4), &mut last);
        s.add(Instant::now(), text(100, 110, 6), &mut last);
        assert_eq!(s.component, Some("kube-scheduler"));
        let m = scheduling_metrics(&[s]).expect("a scheduler was sampled");
        let e2e = &m["e2eSchedulingLatency"];
        assert_eq!(e2e["Perc50"], 15_000_000, "{m:#}");
        assert_eq!(e2e["Perc99"], 19_900_000, "{m:#}");
        assert_eq!(
            m["frameworkExtensionPointDuration"]["Filter"]["Perc50"],
            500_000
        );
        // Bind did not grow: no observation between start and gather.
        assert_eq!(m["frameworkExtensionPointDuration"]["Bind"]["Perc99"], 0);
        assert_eq!(m["schedulingLatency"]["Perc50"], 0);
        assert_eq!(
            m["frameworkExtensionPointDuration"]
                .as_object()
                .map(|o| o.len()),
            Some(11)
        );
        assert!(scheduling_metrics(&[sampled("http://a", "etcd")]).is_none());
    }
}
