//! `/metrics` with kube-apiserver's own names for what the simulator models,
//! so anything that scrapes a real apiserver (tollgate, loadgen, Prometheus
//! rules) reads the simulator the same way.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub scope: String,
    pub component: String,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DurationLabels {
    pub verb: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub scope: String,
    pub component: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub request_kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StorageListLabels {
    pub resource: String,
    pub storage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LongRunningLabels {
    pub verb: String,
    pub resource: String,
    pub scope: String,
    pub component: String,
}

/// The simulator's metric families.
pub struct SimMetrics {
    pub requests: Family<RequestLabels, Counter>,
    pub duration: Family<DurationLabels, Histogram>,
    pub inflight: Family<KindLabels, Gauge<i64, AtomicI64>>,
    pub storage_objects: Family<ResourceLabels, Gauge<i64, AtomicI64>>,
    /// LIST requests served from storage (etcd), not the watch cache.
    pub storage_lists: Family<ResourceLabels, Counter>,
    pub list_fetched: Family<StorageListLabels, Counter>,
    pub list_returned: Family<StorageListLabels, Counter>,
    pub list_evaluated: Family<StorageListLabels, Counter>,
    pub longrunning: Family<LongRunningLabels, Gauge<i64, AtomicI64>>,
    /// `process_start_time_seconds` as f64 bits: a modeled restart moves it.
    pub process_start: Arc<AtomicU64>,
}

/// kube-apiserver's request duration buckets.
const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];

impl SimMetrics {
    pub fn register(registry: &mut Registry) -> SimMetrics {
        let m = SimMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(|| {
                Histogram::new(DURATION_BUCKETS.iter().copied())
            }),
            inflight: Family::default(),
            storage_objects: Family::default(),
            storage_lists: Family::default(),
            list_fetched: Family::default(),
            list_returned: Family::default(),
            list_evaluated: Family::default(),
            longrunning: Family::default(),
            process_start: Arc::new(AtomicU64::new(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or_default()
                    .to_bits(),
            )),
        };
        // kube-apiserver's watch cache starts with one LIST of each cached resource from etcd,
        // so every resource has an `apiserver_storage_list_total` series from the start; a
        // client comparing its growth (tollgate learning which store serves consistent LISTs)
        // sees 0 new etcd LISTs rather than no series at all.
        for def in crate::sim::resources::RESOURCES {
            m.storage_lists
                .get_or_create(&ResourceLabels {
                    resource: def.name.to_string(),
                })
                .inc();
        }
        registry.register(
            "apiserver_request",
            "Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.",
            m.requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "Response latency distribution in seconds for each verb, group, version, resource, subresource, scope and component.",
            m.duration.clone(),
        );
        registry.register(
            "apiserver_current_inflight_requests",
            "Maximal number of currently used inflight request limit of this apiserver per request kind in last second.",
            m.inflight.clone(),
        );
        registry.register(
            "apiserver_storage_objects",
            "Number of stored objects at the time of last check split by kind.",
            m.storage_objects.clone(),
        );
        registry.register(
            "apiserver_storage_list",
            "Number of LIST requests served from storage",
            m.storage_lists.clone(),
        );
        registry.register(
            "apiserver_storage_list_fetched_objects",
            "Number of objects read from storage in the course of serving a LIST request",
            m.list_fetched.clone(),
        );
        registry.register(
            "apiserver_storage_list_returned_objects",
            "Number of objects returned for a LIST request from storage",
            m.list_returned.clone(),
        );
        registry.register(
            "apiserver_storage_list_evaluated_objects",
            "Number of objects tested in the course of serving a LIST request from storage",
            m.list_evaluated.clone(),
        );
        registry.register(
            "apiserver_longrunning_requests",
            "Gauge of all active long-running apiserver requests broken out by verb, group, version, resource, scope and component.",
            m.longrunning.clone(),
        );
        registry.register_collector(Box::new(ProcessCollector {
            start_time: m.process_start.clone(),
        }));
        for kind in ["readOnly", "mutating"] {
            m.inflight
                .get_or_create(&KindLabels {
                    request_kind: kind.into(),
                })
                .set(0);
        }
        m
    }
}

/// `process_*` metrics read from /proc at scrape time, as client_golang's process collector does.
#[derive(Debug)]
struct ProcessCollector {
    /// f64 bits, shared with the cost model (a modeled restart moves it).
    start_time: Arc<AtomicU64>,
}

/// CPU seconds (user + system) and resident bytes of this process.
pub fn process_usage() -> (f64, f64) {
    let ticks = 100.0; // USER_HZ on Linux
    let page = 4096.0;
    let cpu = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command name (which may hold spaces) start after ')'.
            let rest = s.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
            let utime: f64 = rest.get(11)?.parse().ok()?;
            let stime: f64 = rest.get(12)?.parse().ok()?;
            Some((utime + stime) / ticks)
        })
        .unwrap_or_default();
    let rss = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map(|p| p * page)
        .unwrap_or_default();
    (cpu, rss)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (cpu, rss) = process_usage();
        let c = ConstCounter::new(cpu);
        c.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            MetricType::Counter,
        )?)?;
        let g = ConstGauge::new(rss);
        g.encode(encoder.encode_descriptor(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            None,
            MetricType::Gauge,
        )?)?;
        let s = ConstGauge::new(f64::from_bits(self.start_time.load(Ordering::Relaxed)));
        s.encode(encoder.encode_descriptor(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            None,
            MetricType::Gauge,
        )?)?;
        Ok(())
    }
}
