//! The admin listener and its routes: `/metrics` (Prometheus text, see
//! [`crate::metrics`]), `/healthz`, `/readyz` (an upstream is healthy and
//! tollgate is not draining), `/debug/patterns` (learned patterns as a JSON
//! array, heaviest first), `/debug/budget` (the heavy lane's budget: limits,
//! signal, target and the controller's state, as JSON). Bounded like the
//! client listener ([`crate::listener`]): a connection cap, a backoff on
//! accept errors, header-read and idle timeouts. Past the cap a reserve of
//! [`HEALTH_RESERVE`] connections serves the health endpoints only, one request
//! each within [`RESERVED_SECONDS`]: holding every admin connection open (any
//! local user can) once left the liveness probe unanswered, and tollgate restarted.
//!
//! `/debug/patterns` names users and `/metrics` tells the cluster's shape, so
//! the listener binds to 127.0.0.1 by default; elsewhere it serves TLS
//! (`admin.tls`) and, with a client CA, `/metrics` and `/debug/*` answer only
//! clients whose certificate that CA signed (401 otherwise). The health
//! endpoints stay open: kubelet and load-balancer probes send no certificate.
//! As on the client listener, the handshake accepts any certificate and the
//! chain is checked afterwards ([`crate::tls::ClientCertAuthority`]), so a
//! probe without one is still served. Its certificate files are reloaded
//! when they change, as the client listener's ([`crate::tls::serving`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::accept::CLOSE_GRACE;
use crate::gateway::Gateway;
use crate::listener::{serve_until, Accepted, ActiveBody, Activity, Caps, Listener, Until};
use crate::status::full;
use crate::Body;

/// Connections past `admin.maxConnections` served the health endpoints only.
pub const HEALTH_RESERVE: usize = 8;

/// How long a reserved connection has for its handshake, its request and its
/// answer: probes send one request at once.
pub const RESERVED_SECONDS: f64 = 2.0;

/// Who may read what on one admin connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No client CA: every route.
    Open,
    /// A client certificate the client CA signed: every route.
    Verified,
    /// A client CA and no certificate it signed: the health endpoints only.
    HealthOnly,
    /// A connection past `admin.maxConnections`: the health endpoints only.
    Reserve,
}

/// Serve the admin endpoints on `listener` until `stop`: at most
/// `admin.maxConnections` at once (and [`HEALTH_RESERVE`] for health probes past
/// it), each closed when its request headers take longer than
/// `admin.headerReadSeconds` or it has been idle for `admin.idleSeconds`.
pub async fn serve(gateway: Gateway, listener: TcpListener, stop: CancellationToken) {
    let mut listener = Listener::new(listener, "admin", gateway.metrics());
    let caps = || Caps {
        total: gateway.config().admin.max_connections,
        per_source: 0,
        reserve: HEALTH_RESERVE,
    };
    while let Some(Accepted {
        tcp,
        remote,
        slot,
        reserved,
    }) = listener.accept(caps, &stop).await
    {
        let g = gateway.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let bounds = Bounds::of(&g.config().admin, reserved);
            let Some(tls) = g.admin_tls().map(|t| t.current()) else {
                return serve_connection(g, tcp, Access::Open, bounds, stop).await;
            };
            // A handshake is bounded like the request headers that follow it.
            let acceptor = TlsAcceptor::from(tls.config.clone());
            match tokio::time::timeout(bounds.header_read, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let chain = stream.get_ref().1.peer_certificates().unwrap_or(&[]);
                    let access = match &tls.clients {
                        None => Access::Open,
                        Some(ca) if ca.verify(chain) => Access::Verified,
                        Some(_) => Access::HealthOnly,
                    };
                    serve_connection(g, stream, access, bounds, stop).await
                }
                Ok(Err(e)) => tracing::debug!(%remote, error = %e, "admin TLS handshake failed"),
                Err(_) => tracing::debug!(%remote, "admin TLS handshake timed out"),
            }
        });
    }
}

/// One admin connection's timeouts.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    header_read: Duration,
    idle: Duration,
    /// A reserved connection: health endpoints only, one request, then closed.
    reserved: bool,
}

impl Bounds {
    fn of(settings: &crate::config::Admin, reserved: bool) -> Bounds {
        let seconds =
            |s: f64| Duration::from_secs_f64(if reserved { s.min(RESERVED_SECONDS) } else { s });
        Bounds {
            header_read: seconds(settings.header_read_seconds),
            idle: seconds(settings.idle_seconds),
            reserved,
        }
    }
}

async fn serve_connection<I>(
    gateway: Gateway,
    io: I,
    access: Access,
    bounds: Bounds,
    stop: CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let access = if bounds.reserved {
        Access::Reserve
    } else {
        access
    };
    let activity = Arc::new(Activity::new());
    let act = activity.clone();
    let svc = service_fn(move |req: Request<Incoming>| {
        let g = gateway.clone();
        let guard = act.begin();
        async move {
            let resp = route(&g, &req, access);
            Ok::<_, Infallible>(resp.map(|b| ActiveBody::new(b, guard)))
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .keep_alive(!bounds.reserved)
        .header_read_timeout(bounds.header_read);
    builder.http2().timer(TokioTimer::new());
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    // A connection that never sends a byte is idle from the start: it is closed too. A
    // reserved one lives a few seconds at most, however busy.
    let serving = serve_until(conn.as_mut(), &activity, bounds.idle, &stop);
    let until = if bounds.reserved {
        let life = Duration::from_secs_f64(2.0 * RESERVED_SECONDS);
        tokio::time::timeout(life, serving)
            .await
            .unwrap_or(Until::Idle)
    } else {
        serving.await
    };
    if !matches!(until, Until::Idle) {
        return;
    }
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(CLOSE_GRACE, conn).await;
}

fn text(code: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = code;
    resp.headers_mut()
        .insert(CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    resp
}

/// The admin routes; with [`Access::HealthOnly`] only the health endpoints.
pub fn route(g: &Gateway, req: &Request<Incoming>, access: Access) -> Response<Body> {
    let path = req.uri().path();
    let health = matches!(path, "/healthz" | "/livez" | "/readyz");
    if access == Access::Reserve && !health {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "admin.maxConnections are open: only /healthz, /livez and /readyz are served\n".into(),
        );
    }
    if access == Access::HealthOnly && !health {
        return text(
            StatusCode::UNAUTHORIZED,
            "text/plain",
            "a client certificate signed by admin.tls.clientCaFile is required\n".into(),
        );
    }
    match path {
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
        "/readyz" => match g.readiness() {
            Ok(()) => text(StatusCode::OK, "text/plain", "ok\n".into()),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("not ready: {why}\n"),
            ),
        },
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
