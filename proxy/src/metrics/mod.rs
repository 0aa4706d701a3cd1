//! Every metric tollgate exports: the families (names `tollgate_*`, bounded
//! labels only: verbs, codes, lanes, pattern classes, configured upstream
//! URLs, resource types), their label sets, and handles that skip the family
//! lookup on the hot path ([`series`]). Registered in a registry passed down
//! from the gateway, never global. Each step records its own metrics: admit
//! (decisions, queue waits, debits, 429s, cache rewrites), forward
//! (upgrades), observe (requests, bytes, durations, errors, reconciliation,
//! prediction accuracy), the scrape (object counts); the gauges of state are
//! refreshed when `/metrics` is encoded ([`Metrics::refresh`]).
//!
//! Beside them, the process's own cost under client_golang's names
//! ([`kubeio::process`]) and `tollgate_build_info`.
//!
//! A labeled counter or histogram whose label values are a small fixed set is
//! exported at zero from the start ([`Metrics::register`]), so `rate()` and
//! `increase()` in alerts see its first event. Families keyed by verb, code,
//! pattern class, decision, upstream URL or resource are created as events
//! come: their sets are open (codes, resources) or their product is large
//! (decisions: mode × lane × verb × consistency × decision × reason).

mod series;

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

pub use series::{PerClass, PerDecision, PerVerb};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbCode {
    pub verb: &'static str,
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabel {
    pub verb: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    pub verb: &'static str,
    pub consistency: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: &'static str,
}

/// Where an upstream exchange stalled: `headers` (none came in time) or
/// `body` (a pause in the body passed its bound).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: &'static str,
}

/// The `phase` values of `tollgate_upstream_stalls_total`.
pub const STALL_PHASES: [&str; 2] = ["headers", "body"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabel {
    pub upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabel {
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

/// One admission decision, by pattern class.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabel {
    pub mode: &'static str,
    pub lane: &'static str,
    pub verb: &'static str,
    pub consistency: &'static str,
    pub decision: &'static str,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaneLabel {
    pub lane: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabel {
    pub cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UnitLabel {
    pub unit: &'static str,
}

/// `client` or `admin`: the two listeners.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    pub listener: &'static str,
}

/// A listener and the result of a reload of its certificate files.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerResultLabel {
    pub listener: &'static str,
    pub result: &'static str,
}

/// What `tollgate_build_info` says: the crate version and the git commit it was built from.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabel {
    pub version: &'static str,
    pub revision: &'static str,
}

/// The git commit tollgate was built from (`build.rs`; `unknown` when built outside git).
pub const REVISION: &str = env!("TOLLGATE_REVISION");

/// The `result` values of reloads (configuration, certificates).
pub const RELOAD_RESULTS: [&str; 2] = ["ok", "error"];

/// The `direction` values of `tollgate_quota_reconciled_bytes_total`.
pub const RECONCILE_DIRECTIONS: [&str; 2] = ["refund", "debt"];

/// The `listener` values.
pub const LISTENERS: [&str; 2] = ["client", "admin"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    pub direction: &'static str,
}

/// The `reason` values of `tollgate_scrape_failures_total`.
pub const SCRAPE_FAILURE_REASONS: [&str; 4] = ["noIdentity", "unauthorized", "forbidden", "error"];

/// The `result` values of `tollgate_upstream_version_reads_total` (counted by [`crate::release`]).
pub const VERSION_READ_RESULTS: [&str; 3] = ["ok", "error", "unparsable"];

/// The outcomes counted in `tollgate_token_reviews_total` (by [`crate::tokenreview`]).
pub const TOKEN_REVIEW_OUTCOMES: [&str; 4] = ["authenticated", "rejected", "error", "limited"];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Every metric tollgate exports.
#[derive(Debug)]
pub struct Metrics {
    pub requests: Family<VerbCode, Counter>,
    pub response_bytes: Family<VerbLabel, Counter>,
    pub duration: HistogramFamily<VerbLabel>,
    pub inflight: Gauge,
    pub errors: Family<SourceLabel, Counter>,
    /// Upstream exchanges given up for a stall, by phase.
    pub upstream_stalls: Family<PhaseLabel, Counter>,
    pub predicted_bytes: Family<ClassLabel, Counter>,
    pub actual_bytes: Family<ClassLabel, Counter>,
    pub prediction_ratio: HistogramFamily<ClassLabel>,
    pub patterns: Gauge,
    pub upstream_healthy: Family<UpstreamLabel, Gauge>,
    pub upstream_outstanding: Family<UpstreamLabel, Gauge>,
    pub upgrades: Counter,
    pub reloads: Family<ResultLabel, Counter>,
    pub resource_objects: Family<ResourceLabel, Gauge>,
    pub decisions: Family<DecisionLabel, Counter>,
    /// Predicted cost (`predictedCostBytes`) of the heavy lane's decisions.
    pub predicted_cost: Family<DecisionLabel, Counter>,
    pub lane_inflight: Family<LaneLabel, Gauge>,
    pub queue_wait: HistogramFamily<LaneLabel>,
    pub queued: Gauge,
    pub quota_available: Gauge,
    pub quota_rate: Gauge,
    pub quota_burst: Gauge,
    pub quota_debited: Counter,
    pub quota_reconciled: Family<DirectionLabel, Counter>,
    pub guard_active: Gauge,
    pub budget_rate: Gauge,
    pub budget_inflight: Gauge,
    pub budget_inflight_used: Gauge,
    pub budget_signal: Gauge<f64, AtomicU64>,
    pub budget_target: Gauge<f64, AtomicU64>,
    pub budget_unlearned: Gauge,
    pub budget_decisions: Family<ReasonLabel, Counter>,
    /// The budget's own probes of the apiserver, by result
    /// ([`crate::signal_probe::RESULTS`]).
    pub signal_probes: Family<ResultLabel, Counter>,
    pub scrape_failures: Family<ReasonLabel, Counter>,
    /// Reads of the upstream's `/version`, by result (ok, error, unparsable).
    pub version_reads: Family<ResultLabel, Counter>,
    /// The upstream's minor release as its `/version` says; 0 while unknown.
    pub upstream_minor: Gauge,
    /// Reads of `kube-system/extension-apiserver-authentication`, by result.
    pub requestheader_reads: Family<ResultLabel, Counter>,
    /// TokenReviews by outcome, and those not made (`limited`).
    pub token_reviews: Family<ResultLabel, Counter>,
    pub guard_triggers: Family<CauseLabel, Counter>,
    pub cluster_size: Family<UnitLabel, Gauge>,
    pub rewrites: Counter,
    pub accept_errors: Family<ListenerLabel, Counter>,
    pub connections_refused: Family<ListenerLabel, Counter>,
    pub open_connections: Family<ListenerLabel, Gauge>,
    /// Tasks alive in tollgate's runtime, set at each scrape: a leak of
    /// connections or watches shows here before it shows in memory.
    pub alive_tasks: Gauge,
    pub certificate_reloads: Family<ListenerResultLabel, Counter>,
    pub build_info: Family<BuildLabel, Gauge>,
    /// Handles into `requests` (code 200), `response_bytes` and `duration` per verb.
    pub per_verb: PerVerb,
    /// Handles into `predicted_bytes`, `actual_bytes` and `prediction_ratio` per class.
    pub per_class: PerClass,
    /// Handles into `decisions` per label set.
    pub per_decision: PerDecision,
}

impl Metrics {
    /// Create the metrics and register them in `registry`.
    pub fn register(registry: &mut Registry) -> Metrics {
        fn latency() -> Histogram {
            Histogram::new(exponential_buckets(0.001, 2.0, 17))
        }
        fn ratio() -> Histogram {
            Histogram::new(exponential_buckets(0.125, 2.0, 8))
        }
        let m = Metrics {
            requests: Family::default(),
            response_bytes: Family::default(),
            duration: Family::new_with_constructor(latency),
            inflight: Gauge::default(),
            errors: Family::default(),
            upstream_stalls: Family::default(),
            predicted_bytes: Family::default(),
            actual_bytes: Family::default(),
            prediction_ratio: Family::new_with_constructor(ratio),
            patterns: Gauge::default(),
            upstream_healthy: Family::default(),
            upstream_outstanding: Family::default(),
            upgrades: Counter::default(),
            reloads: Family::default(),
            resource_objects: Family::default(),
            decisions: Family::default(),
            predicted_cost: Family::default(),
            lane_inflight: Family::default(),
            queue_wait: Family::new_with_constructor(latency),
            queued: Gauge::default(),
            quota_available: Gauge::default(),
            quota_rate: Gauge::default(),
            quota_burst: Gauge::default(),
            quota_debited: Counter::default(),
            quota_reconciled: Family::default(),
            guard_active: Gauge::default(),
            budget_rate: Gauge::default(),
            budget_inflight: Gauge::default(),
            budget_inflight_used: Gauge::default(),
            budget_signal: Gauge::default(),
            budget_target: Gauge::default(),
            budget_unlearned: Gauge::default(),
            budget_decisions: Family::default(),
            signal_probes: Family::default(),
            scrape_failures: Family::default(),
            version_reads: Family::default(),
            upstream_minor: Gauge::default(),
            requestheader_reads: Family::default(),
            token_reviews: Family::default(),
            guard_triggers: Family::default(),
            cluster_size: Family::default(),
            rewrites: Counter::default(),
            accept_errors: Family::default(),
            connections_refused: Family::default(),
            open_connections: Family::default(),
            alive_tasks: Gauge::default(),
            certificate_reloads: Family::default(),
            build_info: Family::default(),
            per_verb: PerVerb::default(),
            per_class: PerClass::default(),
            per_decision: PerDecision::default(),
        };
        // Units go through `register_with_unit`, which appends the unit to the name (so the
        // exported names end in `_seconds`, `_bytes`, `_ratio`, …) and writes OpenMetrics'
        // `# UNIT` line: a scraper can tell bytes from seconds without reading the help.
        m.register_requests(registry);
        m.register_prediction(registry);
        m.register_upstreams(registry);
        m.register_admission(registry);
        m.register_listeners(registry);
        m.register_process(registry);
        m.export_known_label_sets();
        m
    }

    /// Every series of a family whose label values are a small fixed set, at zero: an alert
    /// can tell "never happened" from "not scraped", and `increase()` counts the first event.
    fn export_known_label_sets(&self) {
        for result in VERSION_READ_RESULTS {
            self.version_reads
                .get_or_create(&ResultLabel {
                    result: result.into(),
                })
                .inc_by(0);
        }
        for result in crate::signal_probe::RESULTS {
            self.signal_probes
                .get_or_create(&ResultLabel {
                    result: result.into(),
                })
                .inc_by(0);
        }
        for reason in SCRAPE_FAILURE_REASONS {
            self.scrape_failures
                .get_or_create(&ReasonLabel { reason })
                .inc_by(0);
        }
        for result in TOKEN_REVIEW_OUTCOMES {
            self.token_reviews
                .get_or_create(&ResultLabel {
                    result: result.into(),
                })
                .inc_by(0);
        }
        for result in RELOAD_RESULTS {
            self.requestheader_reads
                .get_or_create(&ResultLabel {
                    result: result.into(),
                })
                .inc_by(0);
            self.reloads
                .get_or_create(&ResultLabel {
                    result: result.into(),
                })
                .inc_by(0);
            for listener in LISTENERS {
                self.certificate_reloads
                    .get_or_create(&ListenerResultLabel { listener, result })
                    .inc_by(0);
            }
        }
        for source in crate::status::ErrorSource::ALL {
            self.errors
                .get_or_create(&SourceLabel {
                    source: source.as_str(),
                })
                .inc_by(0);
        }
        for phase in STALL_PHASES {
            self.upstream_stalls
                .get_or_create(&PhaseLabel { phase })
                .inc_by(0);
        }
        for lane in crate::enforce::lane::Lane::ALL {
            // A histogram at zero: its buckets, count and sum all 0.
            let _ = self.queue_wait.get_or_create(&LaneLabel {
                lane: lane.as_str(),
            });
        }
        for cause in crate::enforce::guard::Cause::ALL {
            self.guard_triggers
                .get_or_create(&CauseLabel {
                    cause: cause.as_str(),
                })
                .inc_by(0);
        }
        for direction in RECONCILE_DIRECTIONS {
            self.quota_reconciled
                .get_or_create(&DirectionLabel { direction })
                .inc_by(0);
        }
    }

    /// The process's own cost (CPU, memory, descriptors, start time) and what was built.
    fn register_process(&self, r: &mut Registry) {
        r.register_collector(Box::new(kubeio::process::ProcessCollector::new()));
        r.register(
            "tollgate_build_info",
            "1, labeled with the version and the git commit (revision) tollgate was built from",
            self.build_info.clone(),
        );
        self.build_info
            .get_or_create(&BuildLabel {
                version: env!("CARGO_PKG_VERSION"),
                revision: REVISION,
            })
            .set(1);
    }

    /// Requests, their bytes and durations, and errors tollgate answered itself.
    fn register_requests(&self, r: &mut Registry) {
        r.register(
            "tollgate_requests",
            "Requests forwarded or answered, by verb and HTTP status code",
            self.requests.clone(),
        );
        r.register_with_unit(
            "tollgate_response",
            "Response body bytes sent to clients (as on the wire), by verb",
            Unit::Bytes,
            self.response_bytes.clone(),
        );
        r.register_with_unit(
            "tollgate_request_duration",
            "Seconds from request to the end of its response, by verb (watches and connects excluded)",
            Unit::Seconds,
            self.duration.clone(),
        );
        r.register(
            "tollgate_inflight_requests",
            "Requests whose response has not ended",
            self.inflight.clone(),
        );
        r.register(
            "tollgate_errors",
            "Requests tollgate answered itself with an error, and responses the upstream cut short (source upstream), by side (downstream, upstream, internal)",
            self.errors.clone(),
        );
        r.register(
            "tollgate_upstream_stalls",
            "Upstream exchanges given up for a stall (upstream.timeouts), by phase: headers (a 504 Status) or body (the stream cut; also counted in tollgate_errors_total{source=\"upstream\"} and as code 504 in tollgate_requests_total)",
            self.upstream_stalls.clone(),
        );
    }

    /// Prediction accuracy and the pattern cache.
    fn register_prediction(&self, r: &mut Registry) {
        let ratio = || Unit::Other("ratio".into());
        r.register_with_unit(
            "tollgate_predicted",
            "Predicted response bytes at admission, by pattern verb and consistency",
            Unit::Bytes,
            self.predicted_bytes.clone(),
        );
        r.register_with_unit(
            "tollgate_actual",
            "Actual response bytes (uncompressed estimate), by pattern verb and consistency",
            Unit::Bytes,
            self.actual_bytes.clone(),
        );
        r.register_with_unit(
            "tollgate_prediction",
            "Actual over predicted response bytes per request (1: exact), by pattern verb and consistency",
            ratio(),
            self.prediction_ratio.clone(),
        );
        r.register(
            "tollgate_patterns",
            "Patterns in the pattern cache (bounded by patterns.capacity)",
            self.patterns.clone(),
        );
    }

    /// The upstreams, upgrades, reloads and what the scrape learned.
    fn register_upstreams(&self, r: &mut Registry) {
        r.register(
            "tollgate_upstream_healthy",
            "1 if the upstream is in rotation, 0 if its health checks fail (one series per configured upstream URL)",
            self.upstream_healthy.clone(),
        );
        r.register(
            "tollgate_upstream_outstanding_requests",
            "Requests outstanding on the upstream (one series per configured upstream URL)",
            self.upstream_outstanding.clone(),
        );
        r.register(
            "tollgate_upgrades",
            "Connection upgrades (exec, attach, port-forward) carried",
            self.upgrades.clone(),
        );
        r.register(
            "tollgate_config_reloads",
            "Configuration reloads, by result (ok, error)",
            self.reloads.clone(),
        );
        r.register(
            "tollgate_resource_objects",
            "Objects per resource as last scraped from the apiserver's metrics (one series per resource type the apiserver reports)",
            self.resource_objects.clone(),
        );
        r.register(
            "tollgate_upstream_version_reads",
            "Reads of the upstream's /version (at start and after it recovers), by result (ok, error, unparsable); without one, consistentStore auto prices consistent LISTs as etcd reads",
            self.version_reads.clone(),
        );
        r.register(
            "tollgate_upstream_minor_version",
            "The upstream's Kubernetes minor release as its /version says (37 for v1.37.2), 0 while unknown: consistentStore auto prices consistent LISTs as watch-cache reads from 31",
            self.upstream_minor.clone(),
        );
    }

    /// The client and admin listeners: accept errors, the connection caps.
    /// Exported at zero from the start, for both listeners.
    fn register_listeners(&self, r: &mut Registry) {
        r.register(
            "tollgate_accept_errors",
            "Failed accepts (e.g. out of file descriptors: EMFILE, ENFILE), each followed by a backoff of 10 ms doubling to 1 s, by listener (client, admin)",
            self.accept_errors.clone(),
        );
        r.register(
            "tollgate_connections_refused",
            "Connections closed as soon as accepted because the listener's cap (maxConnections, admin.maxConnections) was reached, by listener",
            self.connections_refused.clone(),
        );
        r.register(
            "tollgate_open_connections",
            "Connections open, by listener (upgraded exec/attach/port-forward streams not included)",
            self.open_connections.clone(),
        );
        r.register(
            "tollgate_runtime_alive_tasks",
            "Tasks alive in tollgate's async runtime (connections, requests, watches, background loops), at the scrape",
            self.alive_tasks.clone(),
        );
        r.register(
            "tollgate_certificate_reloads",
            "Reloads of a listener's serving certificate, key and client CA after their files changed, by listener (client, admin) and result (ok; error: the running certificate stays)",
            self.certificate_reloads.clone(),
        );
        for listener in LISTENERS {
            let l = ListenerLabel { listener };
            self.accept_errors.get_or_create(&l).inc_by(0);
            self.connections_refused.get_or_create(&l).inc_by(0);
            self.open_connections.get_or_create(&l).set(0);
        }
    }

    /// Admission: decisions, lanes, queues, the quota pool, the relist guard, scaling.
    fn register_admission(&self, r: &mut Registry) {
        let bytes_per_second = || Unit::Other("bytes_per_second".into());
        r.register(
            "tollgate_decisions",
            "Admission decisions (in dryRun: what enforcement would have done), by mode, lane, pattern verb and consistency, decision (admit, queue, reject) and reason",
            self.decisions.clone(),
        );
        r.register_with_unit(
            "tollgate_predicted_cost",
            "Predicted cost of the heavy lane's admission decisions, the bytes each was decided on (predictedCostBytes: response bytes plus quota.etcdReadWeight times the bytes read from etcd), with the labels of tollgate_decisions_total",
            Unit::Bytes,
            self.predicted_cost.clone(),
        );
        r.register(
            "tollgate_lane_inflight_requests",
            "Requests holding an in-flight slot, by lane",
            self.lane_inflight.clone(),
        );
        r.register_with_unit(
            "tollgate_queue_wait",
            "Seconds admitted requests waited for a slot or the quota pool, by lane",
            Unit::Seconds,
            self.queue_wait.clone(),
        );
        r.register(
            "tollgate_quota_queued_requests",
            "Heavy requests waiting in the fair queues",
            self.queued.clone(),
        );
        r.register_with_unit(
            "tollgate_quota_available",
            "Bytes in the quota pool (negative: debt)",
            Unit::Bytes,
            self.quota_available.clone(),
        );
        r.register_with_unit(
            "tollgate_quota_rate",
            "Effective refill rate of the quota pool in bytes per second (scaling and relist guard applied)",
            bytes_per_second(),
            self.quota_rate.clone(),
        );
        r.register_with_unit(
            "tollgate_quota_burst",
            "Effective capacity of the quota pool in bytes (scaling and relist guard applied)",
            Unit::Bytes,
            self.quota_burst.clone(),
        );
        r.register_with_unit(
            "tollgate_quota_debited",
            "Predicted bytes debited from the quota pool at admission",
            Unit::Bytes,
            self.quota_debited.clone(),
        );
        r.register_with_unit(
            "tollgate_quota_reconciled",
            "Bytes settled when responses ended, by direction (refund: cost less than debited; debt: more)",
            Unit::Bytes,
            self.quota_reconciled.clone(),
        );
        register_budget(self, r);
        r.register(
            "tollgate_relist_guard_active",
            "1 while the relist-storm guard ramps heavy admission after an upstream came back",
            self.guard_active.clone(),
        );
        r.register(
            "tollgate_relist_guard_triggers",
            "Warm-ups started by the relist-storm guard, by cause (recovered, restarted)",
            self.guard_triggers.clone(),
        );
        r.register(
            "tollgate_cluster_size",
            "Cluster size for the pool's scaling, by unit (nodes, containers)",
            self.cluster_size.clone(),
        );
        r.register(
            "tollgate_cache_rewrites",
            "Consistent LISTs rewritten to resourceVersion=0 by the relist guard's policy",
            self.rewrites.clone(),
        );
    }
}

/// The budget's gauges (see [`crate::budget`]).
fn register_budget(m: &Metrics, r: &mut Registry) {
    r.register_with_unit(
        "tollgate_budget",
        "Heavy-lane rate the budget sets in bytes per second (adaptive: the controller's; static: as configured and scaled), before the relist guard's ramp",
        Unit::Other("bytes_per_second".into()),
        m.budget_rate.clone(),
    );
    r.register_with_unit(
        "tollgate_budget_inflight",
        "Heavy-lane in-flight budget in predicted bytes (relist guard applied)",
        Unit::Bytes,
        m.budget_inflight.clone(),
    );
    r.register_with_unit(
        "tollgate_budget_inflight_used",
        "Predicted bytes of the heavy requests in flight",
        Unit::Bytes,
        m.budget_inflight_used.clone(),
    );
    r.register_with_unit(
        "tollgate_budget_signal",
        "Short-window p99 latency of the protected lanes (or the workload lane standing in) steering the budget; NaN with too few samples",
        Unit::Seconds,
        m.budget_signal.clone(),
    );
    r.register_with_unit(
        "tollgate_budget_target",
        "The p99 the budget keeps the signal within (adaptive.target)",
        Unit::Seconds,
        m.budget_target.clone(),
    );
    r.register(
        "tollgate_budget_unlearned_patterns",
        "Unlearned heavy-looking patterns with their one request in flight",
        m.budget_unlearned.clone(),
    );
    r.register(
        "tollgate_budget_decisions",
        "The adaptive controller's decisions (one per epoch) by reason: clear, congested, upstreamErrors, band, idle, notOurs, draining, noSignal, ceiling, floor",
        m.budget_decisions.clone(),
    );
    r.register(
        "tollgate_signal_probes",
        "The adaptive budget's own GETs of the apiserver, sent while too few protected or workload requests give it a signal, by result: ok and timeout (both samples of the signal), error (no answer or not 2xx: no sample), busy (skipped: the most allowed were in flight)",
        m.signal_probes.clone(),
    );
    r.register(
        "tollgate_token_reviews",
        "TokenReviews of client tokens by result (authenticated, rejected, error) and those not made for the client address's limits (limited)",
        m.token_reviews.clone(),
    );
    r.register(
        "tollgate_requestheader_reads",
        "Reads of kube-system/extension-apiserver-authentication (the identity header names the apiserver trusts), by result (ok; error: the names known so far stay)",
        m.requestheader_reads.clone(),
    );
    r.register(
        "tollgate_scrape_failures",
        "Failed scrapes of the apiserver's /metrics, by reason (forbidden, unauthorized, noIdentity, error): the priors and the restart detection go without",
        m.scrape_failures.clone(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The families whose label values are a fixed set have every series from the start.
    #[test]
    fn known_label_sets_are_exported_at_zero() {
        let mut registry = Registry::default();
        let _m = Metrics::register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        for series in [
            "tollgate_config_reloads_total{result=\"ok\"} 0",
            "tollgate_config_reloads_total{result=\"error\"} 0",
            "tollgate_errors_total{source=\"downstream\"} 0",
            "tollgate_errors_total{source=\"upstream\"} 0",
            "tollgate_errors_total{source=\"internal\"} 0",
            "tollgate_upstream_stalls_total{phase=\"headers\"} 0",
            "tollgate_upstream_stalls_total{phase=\"body\"} 0",
            "tollgate_queue_wait_seconds_count{lane=\"heavy\"} 0",
            "tollgate_queue_wait_seconds_count{lane=\"system\"} 0",
            "tollgate_relist_guard_triggers_total{cause=\"recovered\"} 0",
            "tollgate_relist_guard_triggers_total{cause=\"restarted\"} 0",
            "tollgate_quota_reconciled_bytes_total{direction=\"debt\"} 0",
            "tollgate_certificate_reloads_total{listener=\"client\",result=\"error\"} 0",
            "tollgate_certificate_reloads_total{listener=\"admin\",result=\"ok\"} 0",
            "tollgate_requestheader_reads_total{result=\"error\"} 0",
            "tollgate_token_reviews_total{result=\"limited\"} 0",
        ] {
            assert!(text.lines().any(|l| l == series), "{series} in\n{text}");
        }
        let build = format!(
            "tollgate_build_info{{version=\"{}\",revision=\"{REVISION}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.lines().any(|l| l == build), "{build} in\n{text}");
        assert!(!REVISION.is_empty());
    }

    /// The README's metrics table lists exactly what `/metrics` exports.
    #[test]
    fn the_readme_lists_every_metric_and_no_other() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        // Families without a sample are not exported: give each one.
        let (verb, lane) = ("list", "heavy");
        m.requests
            .get_or_create(&VerbCode { verb, code: 200 })
            .inc();
        m.response_bytes.get_or_create(&VerbLabel { verb }).inc();
        m.duration.get_or_create(&VerbLabel { verb }).observe(1.0);
        m.errors
            .get_or_create(&SourceLabel { source: "upstream" })
            .inc();
        let class = ClassLabel {
            verb,
            consistency: "cache",
        };
        m.predicted_bytes.get_or_create(&class).inc();
        m.actual_bytes.get_or_create(&class).inc();
        m.prediction_ratio.get_or_create(&class).observe(1.0);
        let upstream = UpstreamLabel {
            upstream: "u".into(),
        };
        m.upstream_healthy.get_or_create(&upstream).set(1);
        m.upstream_outstanding.get_or_create(&upstream).set(1);
        m.reloads
            .get_or_create(&ResultLabel {
                result: "ok".into(),
            })
            .inc();
        m.resource_objects
            .get_or_create(&ResourceLabel {
                resource: "pods".into(),
            })
            .set(1);
        m.decisions
            .get_or_create(&DecisionLabel {
                mode: "enforce",
                lane,
                verb,
                consistency: "cache",
                decision: "admit",
                reason: "pool",
            })
            .inc();
        m.predicted_cost
            .get_or_create(&DecisionLabel {
                mode: "enforce",
                lane,
                verb,
                consistency: "cache",
                decision: "admit",
                reason: "pool",
            })
            .inc();
        m.lane_inflight.get_or_create(&LaneLabel { lane }).set(1);
        m.queue_wait.get_or_create(&LaneLabel { lane }).observe(1.0);
        m.quota_reconciled
            .get_or_create(&DirectionLabel {
                direction: "refund",
            })
            .inc();
        m.guard_triggers
            .get_or_create(&CauseLabel { cause: "restarted" })
            .inc();
        m.cluster_size
            .get_or_create(&UnitLabel { unit: "nodes" })
            .set(1);
        m.scrape_failures
            .get_or_create(&ReasonLabel {
                reason: "forbidden",
            })
            .inc();
        m.budget_decisions
            .get_or_create(&ReasonLabel { reason: "clear" })
            .inc();
        // With the shared etcd-read budget on, its metrics too (one view gives each a sample).
        let shared = crate::budget::shared::metrics::SharedMetrics::register(&mut registry);
        shared.update(&crate::budget::shared::coordination::SharedView::sample());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        let exported: BTreeSet<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| {
                let (name, kind) = l.split_once(' ')?;
                Some(match kind {
                    "counter" => format!("{name}_total"),
                    _ => name.to_string(),
                })
            })
            .collect();
        let readme = include_str!("../../README.md");
        let section = readme
            .split("## Metrics")
            .nth(1)
            .expect("a Metrics section");
        // tollgate's own names, and the process collector's.
        let documented: BTreeSet<String> = section
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter(|l| l.starts_with("tollgate_") || l.starts_with("process_"))
            .filter_map(|l| l.split('`').next())
            .map(str::to_string)
            .collect();
        assert_eq!(exported, documented);
        assert!(documented.contains("process_cpu_seconds_total"));
    }
}
