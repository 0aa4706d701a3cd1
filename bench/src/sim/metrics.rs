//! `/metrics` with kube-apiserver's own names for what the simulator models,
//! so anything that scrapes a real apiserver (tollgate, loadgen, Prometheus
//! rules) reads the simulator the same way.

use kubeio::process::ProcessCollector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Arc;

use crate::sim::kube_version::KubeVersion;
use crate::sim::resources::ResourceDef;

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
    /// `apiserver_storage_list_total`: on 1.20, the LISTs served from etcd by `resource`;
    /// on 1.37, every LIST by store ([`SimMetrics::storage_list_labels`]).
    pub storage_lists: Family<Vec<(String, String)>, Counter>,
    kube_version: KubeVersion,
    pub list_fetched: Family<StorageListLabels, Counter>,
    pub list_returned: Family<StorageListLabels, Counter>,
    pub list_evaluated: Family<StorageListLabels, Counter>,
    pub longrunning: Family<LongRunningLabels, Gauge<i64, AtomicI64>>,
    /// `process_start_time_seconds` as f64 bits: a modeled restart moves it.
    pub process_start: Arc<AtomicU64>,
}

impl SimMetrics {
    /// The labels of `apiserver_storage_list_total` for a LIST of `def` from etcd or the
    /// cache, as the release the sim answers as writes them (1.20: `resource` only, and it
    /// counts only etcd's).
    pub fn storage_list_labels(&self, def: &ResourceDef, from_etcd: bool) -> Vec<(String, String)> {
        if self.kube_version.counts_cache_lists() {
            let storage = if from_etcd { "etcd" } else { "watchcache" };
            vec![
                ("group".into(), def.group.into()),
                ("resource".into(), def.name.into()),
                ("storage".into(), storage.into()),
                ("index".into(), String::new()),
            ]
        } else {
            vec![("resource".into(), def.name.into())]
        }
    }

    /// Counts one LIST in `apiserver_storage_list_total`, if the release counts it.
    pub fn count_storage_list(&self, def: &ResourceDef, from_etcd: bool) {
        if from_etcd || self.kube_version.counts_cache_lists() {
            self.storage_lists
                .get_or_create(&self.storage_list_labels(def, from_etcd))
                .inc();
        }
    }
}

/// kube-apiserver's request duration buckets.
const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];

impl SimMetrics {
    pub fn register(registry: &mut Registry, kube_version: KubeVersion) -> SimMetrics {
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
            kube_version,
            process_start: Arc::new(AtomicU64::new(kubeio::process::start_time().to_bits())),
        };
        // kube-apiserver's watch cache starts with one LIST of each cached resource from etcd,
        // so every resource has an `apiserver_storage_list_total` series from the start; a
        // client comparing its growth (tollgate learning which store serves consistent LISTs)
        // sees 0 new etcd LISTs rather than no series at all.
        for def in crate::sim::resources::builtins()
            .iter()
            .filter(|d| d.supports_verb("list"))
            .filter(|d| {
                crate::sim::resources::lookup_in(kube_version, d.group, d.version, d.name).is_some()
            })
        {
            m.storage_lists
                .get_or_create(&m.storage_list_labels(def, true))
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
        registry.register_collector(Box::new(ProcessCollector::with_start_time(
            m.process_start.clone(),
        )));
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
