//! Metrics and the admin listener: `/metrics` (Prometheus text, names
//! `tollgate_*`, bounded labels only: verbs, codes, pattern classes,
//! configured upstream URLs), `/healthz`, `/readyz` (an upstream is healthy
//! and tollgate is not draining), `/debug/patterns` (learned patterns as a
//! JSON array, heaviest first).

use std::convert::Infallible;

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
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::handle::Gateway;
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
        };
        let r = registry;
        r.register(
            "tollgate_requests",
            "Requests forwarded or answered, by verb and HTTP code",
            m.requests.clone(),
        );
        r.register(
            "tollgate_response_bytes",
            "Response body bytes sent to clients (as on the wire), by verb",
            m.response_bytes.clone(),
        );
        r.register(
            "tollgate_request_duration_seconds",
            "Time from request to the end of its response, by verb (watches and connects excluded)",
            m.duration.clone(),
        );
        r.register(
            "tollgate_inflight_requests",
            "Requests whose response has not ended",
            m.inflight.clone(),
        );
        r.register("tollgate_errors", "Requests tollgate answered itself with an error, by side (downstream, upstream, internal)", m.errors.clone());
        r.register(
            "tollgate_predicted_bytes",
            "Predicted response bytes, by pattern verb and consistency",
            m.predicted_bytes.clone(),
        );
        r.register(
            "tollgate_actual_bytes",
            "Actual response bytes (uncompressed estimate), by pattern verb and consistency",
            m.actual_bytes.clone(),
        );
        r.register(
            "tollgate_prediction_ratio",
            "Actual over predicted response bytes, by pattern verb and consistency",
            m.prediction_ratio.clone(),
        );
        r.register(
            "tollgate_patterns",
            "Patterns in the pattern cache",
            m.patterns.clone(),
        );
        r.register(
            "tollgate_upstream_healthy",
            "1 if the upstream is in rotation",
            m.upstream_healthy.clone(),
        );
        r.register(
            "tollgate_upstream_outstanding_requests",
            "Requests outstanding on the upstream",
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
            "Objects per resource as last scraped from the apiserver's metrics",
            m.resource_objects.clone(),
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
