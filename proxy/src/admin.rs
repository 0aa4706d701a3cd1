//! The admin listener and its routes: `/metrics` (Prometheus text, see
//! [`crate::metrics`]), `/healthz`, `/readyz` (an upstream is healthy and
//! tollgate is not draining), `/debug/patterns` (learned patterns as a JSON
//! array, heaviest first), `/debug/budget` (the heavy lane's budget: limits,
//! signal, target and the controller's state, as JSON). Bounded like the
//! client listener ([`crate::listener`]): a connection cap, a backoff on
//! accept errors, header-read and idle timeouts.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::accept::CLOSE_GRACE;
use crate::gateway::Gateway;
use crate::listener::{serve_until, Accepted, ActiveBody, Activity, Listener, Until};
use crate::status::full;
use crate::Body;

/// Serve the admin endpoints on `listener` until `stop`: at most
/// `admin.maxConnections` at once, each closed when its request headers take
/// longer than `admin.headerReadSeconds` or it has been idle for
/// `admin.idleSeconds`.
pub async fn serve(gateway: Gateway, listener: TcpListener, stop: CancellationToken) {
    let mut listener = Listener::new(listener, "admin", gateway.metrics());
    let cap = || gateway.config().admin.max_connections;
    while let Some(Accepted { tcp, slot, .. }) = listener.accept(cap, &stop).await {
        let g = gateway.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            serve_connection(g, tcp, stop).await;
        });
    }
}

async fn serve_connection(gateway: Gateway, tcp: TcpStream, stop: CancellationToken) {
    let settings = gateway.config().admin.clone();
    let activity = Arc::new(Activity::new());
    let act = activity.clone();
    let svc = service_fn(move |req: Request<Incoming>| {
        let g = gateway.clone();
        let guard = act.begin();
        async move { Ok::<_, Infallible>(route(&g, &req).map(|b| ActiveBody::new(b, guard))) }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs_f64(settings.header_read_seconds));
    builder.http2().timer(TokioTimer::new());
    let conn = builder.serve_connection(TokioIo::new(tcp), svc);
    tokio::pin!(conn);
    // A connection that never sends a byte is idle from the start: it is closed too.
    let idle = Duration::from_secs_f64(settings.idle_seconds);
    if let Until::Idle = serve_until(conn.as_mut(), &activity, idle, &stop).await {
        conn.as_mut().graceful_shutdown();
        let _ = tokio::time::timeout(CLOSE_GRACE, conn).await;
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
