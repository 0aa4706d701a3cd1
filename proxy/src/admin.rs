//! The admin listener and its routes: `/metrics` (Prometheus text, see
//! [`crate::metrics`]), `/healthz`, `/readyz` (an upstream is healthy and
//! tollgate is not draining), `/debug/patterns` (learned patterns as a JSON
//! array, heaviest first), `/debug/budget` (the heavy lane's budget: limits,
//! signal, target and the controller's state, as JSON).

use std::convert::Infallible;

use http::header::CONTENT_TYPE;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::gateway::Gateway;
use crate::status::full;
use crate::Body;

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
        "/debug/budget" => {
            let body = serde_json::to_string_pretty(&g.budget()).unwrap_or_else(|_| "{}".into());
            text(StatusCode::OK, "application/json", body)
        }
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}
