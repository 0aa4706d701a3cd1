//! Metrics and the admin listener: `/metrics` (Prometheus text, names
//! `tollgate_*`, bounded labels only: verbs, codes, pattern classes,
//! configured upstream URLs), `/healthz`, `/readyz` (an upstream is healthy
//! and tollgate is not draining), `/debug/patterns` (learned patterns as a
//! JSON array, heaviest first).

use std::convert::Infallible;
use std::sync::OnceLock;

use apimodel::{ConsistencyClass, Verb};

use http::header::CONTENT_TYPE;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::handle::Gateway;
use crate::pattern::PatternVerb;
use crate::status::full;
use crate::Body;

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    pub direction: &'static str,
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
    pub lane_inflight: Family<LaneLabel, Gauge>,
    pub queue_wait: HistogramFamily<LaneLabel>,
    pub queued: Gauge,
    pub quota_available: Gauge,
    pub quota_rate: Gauge,
    pub quota_burst: Gauge,
    pub quota_debited: Counter,
    pub quota_reconciled: Family<DirectionLabel, Counter>,
    pub guard_active: Gauge,
    pub guard_triggers: Family<CauseLabel, Counter>,
    pub cluster_size: Family<UnitLabel, Gauge>,
    pub rewrites: Counter,
    /// Handles into `requests` (code 200), `response_bytes` and `duration` per verb.
    pub per_verb: PerVerb,
    /// Handles into `predicted_bytes`, `actual_bytes` and `prediction_ratio` per class.
    pub per_class: PerClass,
}

/// The series of `tollgate_requests` (200), `tollgate_response_bytes` and
/// `tollgate_request_duration_seconds` one verb's responses touch, each looked up in its
/// family once, on first use. Each family lookup takes its lock and hashes the label set;
/// three per request were a tenth of what tollgate adds to minproxy's work per request
/// (issue 3). A handle is the family's own series (a clone shares it), and each is created
/// only when first counted, so the exported text is the same as without them.
#[derive(Debug, Default)]
pub struct PerVerb {
    slots: [VerbSeries; PerVerb::SLOTS],
}

/// One verb's series; see [`PerVerb`].
#[derive(Debug, Default)]
struct VerbSeries {
    ok: OnceLock<Counter>,
    response_bytes: OnceLock<Counter>,
    duration: OnceLock<Histogram>,
}

impl PerVerb {
    /// More than `apimodel::Verb` has variants; a verb past it is looked up each time.
    const SLOTS: usize = 16;

    fn slot(&self, verb: Verb) -> Option<&VerbSeries> {
        self.slots.get(verb as usize)
    }

    /// `tollgate_requests{verb, code}` + 1.
    pub fn request(&self, m: &Metrics, verb: Verb, code: u16) {
        let v = verb.as_str();
        match self.slot(verb) {
            Some(s) if code == 200 => {
                s.ok.get_or_init(|| {
                    m.requests
                        .get_or_create(&VerbCode { verb: v, code })
                        .clone()
                })
                .inc()
            }
            _ => m.requests.get_or_create(&VerbCode { verb: v, code }).inc(),
        };
    }

    /// `tollgate_response_bytes{verb}` + `bytes`.
    pub fn response_bytes(&self, m: &Metrics, verb: Verb, bytes: u64) {
        let v = verb.as_str();
        match self.slot(verb) {
            Some(s) => s
                .response_bytes
                .get_or_init(|| {
                    m.response_bytes
                        .get_or_create(&VerbLabel { verb: v })
                        .clone()
                })
                .inc_by(bytes),
            None => m
                .response_bytes
                .get_or_create(&VerbLabel { verb: v })
                .inc_by(bytes),
        };
    }

    /// One observation of `tollgate_request_duration_seconds{verb}`.
    pub fn duration(&self, m: &Metrics, verb: Verb, seconds: f64) {
        let v = verb.as_str();
        match self.slot(verb) {
            Some(s) => s
                .duration
                .get_or_init(|| m.duration.get_or_create(&VerbLabel { verb: v }).clone())
                .observe(seconds),
            None => m
                .duration
                .get_or_create(&VerbLabel { verb: v })
                .observe(seconds),
        }
    }
}

/// The same for the three families of prediction accuracy, by pattern class (verb and
/// consistency): one slot per class, each series created when first counted.
#[derive(Debug)]
pub struct PerClass {
    slots: [ClassSeries; PerClass::SLOTS],
}

impl Default for PerClass {
    fn default() -> Self {
        PerClass {
            slots: std::array::from_fn(|_| ClassSeries::default()),
        }
    }
}

#[derive(Debug, Default)]
struct ClassSeries {
    predicted: OnceLock<Counter>,
    actual: OnceLock<Counter>,
    ratio: OnceLock<Histogram>,
}

impl PerClass {
    /// Verbs (`PerVerb::SLOTS`, the last one for a watch-list) × consistency (none and
    /// three classes).
    const VERBS: usize = PerVerb::SLOTS;
    const SLOTS: usize = PerClass::VERBS * 4;

    fn slot(
        &self,
        verb: PatternVerb,
        consistency: Option<ConsistencyClass>,
    ) -> Option<&ClassSeries> {
        let v = match verb {
            PatternVerb::Api(v) if (v as usize) < PerClass::VERBS - 1 => v as usize,
            PatternVerb::Api(_) => return None,
            PatternVerb::WatchList => PerClass::VERBS - 1,
        };
        let c = match consistency {
            None => 0,
            Some(ConsistencyClass::Cache) => 1,
            Some(ConsistencyClass::Consistent) => 2,
            Some(ConsistencyClass::Exact) => 3,
        };
        self.slots.get(v * 4 + c)
    }

    /// A complete, uncompressed success: predicted and actual bytes, and their ratio
    /// when something was predicted.
    pub fn observe(
        &self,
        m: &Metrics,
        verb: PatternVerb,
        consistency: Option<ConsistencyClass>,
        predicted: f64,
        actual: u64,
    ) {
        let class = || ClassLabel {
            verb: verb.as_str(),
            consistency: consistency.map_or("none", |c| c.as_str()),
        };
        let ratio = (predicted > 0.0).then(|| actual as f64 / predicted);
        let Some(s) = self.slot(verb, consistency) else {
            let class = class();
            m.predicted_bytes
                .get_or_create(&class)
                .inc_by(predicted as u64);
            m.actual_bytes.get_or_create(&class).inc_by(actual);
            if let Some(r) = ratio {
                m.prediction_ratio.get_or_create(&class).observe(r);
            }
            return;
        };
        s.predicted
            .get_or_init(|| m.predicted_bytes.get_or_create(&class()).clone())
            .inc_by(predicted as u64);
        s.actual
            .get_or_init(|| m.actual_bytes.get_or_create(&class()).clone())
            .inc_by(actual);
        if let Some(r) = ratio {
            s.ratio
                .get_or_init(|| m.prediction_ratio.get_or_create(&class()).clone())
                .observe(r);
        }
    }
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
            lane_inflight: Family::default(),
            queue_wait: Family::new_with_constructor(latency),
            queued: Gauge::default(),
            quota_available: Gauge::default(),
            quota_rate: Gauge::default(),
            quota_burst: Gauge::default(),
            quota_debited: Counter::default(),
            quota_reconciled: Family::default(),
            guard_active: Gauge::default(),
            guard_triggers: Family::default(),
            cluster_size: Family::default(),
            rewrites: Counter::default(),
            per_verb: PerVerb::default(),
            per_class: PerClass::default(),
        };
        let r = registry;
        // Units go through `register_with_unit`, which appends the unit to the name (so the
        // exported names end in `_seconds`, `_bytes`, `_ratio`, …) and writes OpenMetrics'
        // `# UNIT` line: a scraper can tell bytes from seconds without reading the help.
        let bytes_per_second = || Unit::Other("bytes_per_second".into());
        let ratio = || Unit::Other("ratio".into());
        r.register(
            "tollgate_requests",
            "Requests forwarded or answered, by verb and HTTP status code",
            m.requests.clone(),
        );
        r.register_with_unit(
            "tollgate_response",
            "Response body bytes sent to clients (as on the wire), by verb",
            Unit::Bytes,
            m.response_bytes.clone(),
        );
        r.register_with_unit(
            "tollgate_request_duration",
            "Seconds from request to the end of its response, by verb (watches and connects excluded)",
            Unit::Seconds,
            m.duration.clone(),
        );
        r.register(
            "tollgate_inflight_requests",
            "Requests whose response has not ended",
            m.inflight.clone(),
        );
        r.register(
            "tollgate_errors",
            "Requests tollgate answered itself with an error, by side (downstream, upstream, internal)",
            m.errors.clone(),
        );
        r.register_with_unit(
            "tollgate_predicted",
            "Predicted response bytes at admission, by pattern verb and consistency",
            Unit::Bytes,
            m.predicted_bytes.clone(),
        );
        r.register_with_unit(
            "tollgate_actual",
            "Actual response bytes (uncompressed estimate), by pattern verb and consistency",
            Unit::Bytes,
            m.actual_bytes.clone(),
        );
        r.register_with_unit(
            "tollgate_prediction",
            "Actual over predicted response bytes per request (1: exact), by pattern verb and consistency",
            ratio(),
            m.prediction_ratio.clone(),
        );
        r.register(
            "tollgate_patterns",
            "Patterns in the pattern cache (bounded by patterns.capacity)",
            m.patterns.clone(),
        );
        r.register(
            "tollgate_upstream_healthy",
            "1 if the upstream is in rotation, 0 if its health checks fail (one series per configured upstream URL)",
            m.upstream_healthy.clone(),
        );
        r.register(
            "tollgate_upstream_outstanding_requests",
            "Requests outstanding on the upstream (one series per configured upstream URL)",
            m.upstream_outstanding.clone(),
        );
        r.register(
            "tollgate_upgrades",
            "Connection upgrades (exec, attach, port-forward) carried",
            m.upgrades.clone(),
        );
        r.register(
            "tollgate_config_reloads",
            "Configuration reloads, by result (ok, error)",
            m.reloads.clone(),
        );
        r.register(
            "tollgate_resource_objects",
            "Objects per resource as last scraped from the apiserver's metrics (one series per resource type the apiserver reports)",
            m.resource_objects.clone(),
        );
        r.register(
            "tollgate_decisions",
            "Admission decisions (in dryRun: what enforcement would have done), by mode, lane, pattern verb and consistency, decision (admit, queue, reject) and reason",
            m.decisions.clone(),
        );
        r.register(
            "tollgate_lane_inflight_requests",
            "Requests holding an in-flight slot, by lane",
            m.lane_inflight.clone(),
        );
        r.register_with_unit(
            "tollgate_queue_wait",
            "Seconds admitted requests waited for a slot or the quota pool, by lane",
            Unit::Seconds,
            m.queue_wait.clone(),
        );
        r.register(
            "tollgate_quota_queued_requests",
            "Heavy requests waiting in the fair queues",
            m.queued.clone(),
        );
        r.register_with_unit(
            "tollgate_quota_available",
            "Bytes in the quota pool (negative: debt)",
            Unit::Bytes,
            m.quota_available.clone(),
        );
        r.register_with_unit(
            "tollgate_quota_rate",
            "Effective refill rate of the quota pool in bytes per second (scaling and relist guard applied)",
            bytes_per_second(),
            m.quota_rate.clone(),
        );
        r.register_with_unit(
            "tollgate_quota_burst",
            "Effective capacity of the quota pool in bytes (scaling and relist guard applied)",
            Unit::Bytes,
            m.quota_burst.clone(),
        );
        r.register_with_unit(
            "tollgate_quota_debited",
            "Predicted bytes debited from the quota pool at admission",
            Unit::Bytes,
            m.quota_debited.clone(),
        );
        r.register_with_unit(
            "tollgate_quota_reconciled",
            "Bytes settled when responses ended, by direction (refund: cost less than debited; debt: more)",
            Unit::Bytes,
            m.quota_reconciled.clone(),
        );
        r.register(
            "tollgate_relist_guard_active",
            "1 while the relist-storm guard ramps heavy admission after an upstream came back",
            m.guard_active.clone(),
        );
        r.register(
            "tollgate_relist_guard_triggers",
            "Warm-ups started by the relist-storm guard, by cause (recovered, restarted)",
            m.guard_triggers.clone(),
        );
        r.register(
            "tollgate_cluster_size",
            "Cluster size for the pool's scaling, by unit (nodes, containers)",
            m.cluster_size.clone(),
        );
        r.register(
            "tollgate_cache_rewrites",
            "Consistent LISTs rewritten to resourceVersion=0 by the relist guard's policy",
            m.rewrites.clone(),
        );
        m
    }
}

/// Serve the admin endpoints on `listener` until `stop`.
pub async fn serve(gateway: Gateway, listener: TcpListener, stop: CancellationToken) {
    loop {
        let (tcp, _) = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    continue;
                }
            },
        };
        let g = gateway.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let g = g.clone();
                async move { Ok::<_, Infallible>(route(&g, &req)) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(tcp), svc);
            tokio::select! {
                _ = conn => {}
                _ = stop.cancelled() => {}
            }
        });
    }
}

fn text(code: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = code;
    resp.headers_mut()
        .insert(CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    resp
}

/// The admin routes.
pub fn route(g: &Gateway, req: &Request<Incoming>) -> Response<Body> {
    match req.uri().path() {
        "/metrics" => match g.encode_metrics() {
            Ok(s) => text(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                s,
            ),
            Err(_) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                "encoding failed\n".into(),
            ),
        },
        "/healthz" | "/livez" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" if g.ready() => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready\n".into(),
        ),
        "/debug/patterns" => {
            let body = serde_json::to_string_pretty(&g.patterns()).unwrap_or_else(|_| "[]".into());
            text(StatusCode::OK, "application/json", body)
        }
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

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
        let readme = include_str!("../README.md");
        let section = readme
            .split("## Metrics")
            .nth(1)
            .expect("a Metrics section");
        let documented: BTreeSet<String> = section
            .lines()
            .filter_map(|l| l.strip_prefix("| `tollgate_"))
            .filter_map(|l| l.split('`').next())
            .map(|n| format!("tollgate_{n}"))
            .collect();
        assert_eq!(exported, documented);
    }
}
