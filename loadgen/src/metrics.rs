//! `--metrics-listen ADDR`: loadgen's own live metrics for Prometheus during
//! the run, read from the recorders at each scrape (a prometheus-client
//! `Collector`, so nothing is counted twice):
//!
//! | name | type | labels |
//! |---|---|---|
//! | `loadgen_requests_total` | counter | `operation`, `code` (HTTP status, or `timeout`/`connection`/`protocol`) |
//! | `loadgen_rejected_total` | counter | `operation` (final answer 429) |
//! | `loadgen_dropped_total` | counter | `operation` (not sent: `--max-in-flight` reached) |
//! | `loadgen_response_bytes_total` | counter | `operation` |
//! | `loadgen_request_duration_seconds` | histogram | `operation` (from the intended start) |
//! | `loadgen_watches_active` | gauge | — |
//! | `loadgen_watch_events_total` | counter | — |

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::record::OpRecorder;
use crate::watch::WatchStats;

/// Histogram bucket bounds, seconds.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Reads the recorders at scrape time.
#[derive(Debug)]
pub struct RunCollector {
    pub recorders: Vec<Arc<OpRecorder>>,
    pub watch: Arc<WatchStats>,
}

type Labels = Vec<(&'static str, String)>;

fn counter(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, u64)],
) -> Result<(), std::fmt::Error> {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in rows {
        ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for RunCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snaps: Vec<_> = self
            .recorders
            .iter()
            .map(|r| (r.name().to_string(), r.snapshot()))
            .collect();
        let op = |name: &str| vec![("operation", name.to_string())];
        let mut requests = Vec::new();
        for (name, s) in &snaps {
            for (code, n) in &s.by_status {
                requests.push((
                    vec![("operation", name.clone()), ("code", code.to_string())],
                    *n,
                ));
            }
            for (class, n) in &s.by_error {
                let code = serde_json::to_value(class)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                requests.push((vec![("operation", name.clone()), ("code", code)], *n));
            }
        }
        counter(
            &mut e,
            "loadgen_requests",
            "Requests completed, by final status code or error class.",
            &requests,
        )?;
        let per_op = |f: &dyn Fn(&crate::record::OpStats) -> u64| -> Vec<(Labels, u64)> {
            snaps.iter().map(|(n, s)| (op(n), f(s))).collect()
        };
        counter(
            &mut e,
            "loadgen_rejected",
            "Requests whose final answer was 429.",
            &per_op(&|s| s.rejected_429()),
        )?;
        counter(
            &mut e,
            "loadgen_dropped",
            "Requests not sent because --max-in-flight was reached.",
            &per_op(&|s| s.dropped),
        )?;
        counter(
            &mut e,
            "loadgen_response_bytes",
            "Response body bytes received.",
            &per_op(&|s| s.bytes),
        )?;
        {
            let mut m = e.encode_descriptor(
                "loadgen_request_duration_seconds",
                "Request latency from the intended start (open loop).",
                None,
                MetricType::Histogram,
            )?;
            for (name, s) in &snaps {
                let h = &s.latency;
                let buckets: Vec<(f64, u64)> = BUCKETS
                    .iter()
                    .map(|b| {
                        (
                            *b,
                            if h.is_empty() {
                                0
                            } else {
                                h.count_between(0, (*b * 1e6) as u64)
                            },
                        )
                    })
                    .chain(std::iter::once((f64::INFINITY, h.len())))
                    .collect();
                let sum = h.mean() * h.len() as f64 / 1e6;
                let labels = op(name);
                m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
                    sum,
                    h.len(),
                    &buckets,
                    None,
                )?;
            }
        }
        let active = i64::try_from(self.watch.active.load(Ordering::Relaxed)).unwrap_or(i64::MAX);
        let g = ConstGauge::new(active);
        g.encode(e.encode_descriptor(
            "loadgen_watches_active",
            "Watch streams open now.",
            None,
            g.metric_type(),
        )?)?;
        let c = ConstCounter::new(self.watch.events.load(Ordering::Relaxed));
        c.encode(e.encode_descriptor(
            "loadgen_watch_events",
            "Watch events received (not bookmarks).",
            None,
            c.metric_type(),
        )?)?;
        Ok(())
    }
}

/// Serves `GET /metrics` (Prometheus text) on `listener` until `stop`.
pub fn serve(
    listener: std::net::TcpListener,
    registry: Arc<Registry>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    tokio::spawn(async move {
        loop {
            let tcp = tokio::select! {
                _ = stop.cancelled() => return,
                r = listener.accept() => match r { Ok((tcp, _)) => tcp, Err(_) => continue },
            };
            let registry = registry.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let registry = registry.clone();
                        async move {
                            let mut text = String::new();
                            let (status, body) = if req.uri().path() != "/metrics" {
                                (404, "not found\n".to_string())
                            } else if prometheus_client::encoding::text::encode(
                                &mut text, &registry,
                            )
                            .is_ok()
                            {
                                (200, text)
                            } else {
                                (500, "encoding failed\n".to_string())
                            };
                            let resp = hyper::Response::builder()
                                .status(status)
                                .header(
                                    "content-type",
                                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                                )
                                .body(Full::new(Bytes::from(body)))
                                .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new())));
                            Ok::<_, Infallible>(resp)
                        }
                    },
                );
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let conn = builder.serve_connection(TokioIo::new(tcp), svc);
                tokio::select! { _ = conn => {}, _ = stop.cancelled() => {} }
            });
        }
    });
    Ok(())
}
