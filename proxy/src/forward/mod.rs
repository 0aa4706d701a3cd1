//! The forward step: the request's headers rewritten for the apiserver
//! (hop-by-hop removed, identity headers set), sent to the least busy
//! upstream ([`send`]: once more on another upstream if the first cannot be
//! reached and the request has no body), the response's headers cleaned, and
//! an upgraded connection (exec, attach, port-forward) carried both ways by
//! a tunnel ([`Tunnels`]).
//! - [`pool`]: the upstreams, their health, and tollgate's own requests.
//! - [`connect`]: each upstream connection opened within a deadline.
//! - [`h2_spread`]: each worker's HTTP/2 connections, spread so no connection
//!   carries more streams than the apiserver allows; [`h2_conn`] opens one.
//! - [`light_h1`]: light requests over HTTP/1.1, when so configured.
//! - [`hop`]: hop-by-hop headers and upgrades.
//! - [`stall`]: how long the response headers and each pause in a body may
//!   take (`upstream.timeouts`), and the body wrapper that ends a stalled one.

mod coalesce;
mod connect;
mod h2_conn;
mod h2_spread;
mod hop;
mod light_h1;
mod pool;
mod read_ahead;
pub mod stall;

pub(crate) use coalesce::Coalesce;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::header::HOST;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::counter::Counter;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::context::RequestCtx;
use crate::enforce::lane::Lane;
use crate::status::{self, ProxyError};
use crate::Body;

pub use connect::ConnectTimeout;
pub use h2_conn::Boxed;
pub use h2_spread::StreamSlot;
pub use hop::{is_upgrade, strip_hop_by_hop};
pub use pool::{Outstanding, SendError, Upstream, UpstreamPool};
pub use stall::{is_stall, Bounds, IdleBody, UpstreamTimeouts};

/// The response header saying a consistent LIST was served from the cache
/// (rewritten by the relist guard's policy, see [`crate::admit::rewrite_to_cache`]).
pub const REWRITE_HEADER: &str = "x-tollgate-rewritten";

/// What came back from the upstream.
pub enum Forwarded {
    /// A response whose body streams on (ended if it stalls), holding its
    /// upstream slot until it ends.
    Stream(Response<IdleBody<Incoming>>, Outstanding),
    /// The connection was upgraded and a tunnel carries it; this is the head to answer.
    Upgraded(Response<Body>),
}

impl Forwarded {
    /// The status of the response head.
    pub fn status(&self) -> http::StatusCode {
        match self {
            Forwarded::Stream(resp, _) => resp.status(),
            Forwarded::Upgraded(head) => head.status(),
        }
    }
}

/// Where upgraded connections run: in the drain's task tracker, closed at
/// its hard stop, counted.
#[derive(Debug, Clone)]
pub struct Tunnels {
    pub tasks: TaskTracker,
    pub hard_stop: CancellationToken,
    /// `tollgate_upgrades`.
    pub upgrades: Counter,
}

/// The forward step.
pub async fn forward(
    pool: &UpstreamPool,
    tunnels: &Tunnels,
    mut req: Request<Incoming>,
    ctx: &RequestCtx,
) -> Result<Forwarded, ProxyError> {
    let on_client_upgrade = ctx.upgrade.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers, ctx.upgrade);
    let identity = &ctx.client.identity;
    pool.trusted_headers()
        .get()
        .rewrite(&mut parts.headers, identity, pool.has_front_proxy());
    parts.headers.remove(HOST);
    let front_proxy = identity.needs_front_proxy() && pool.has_front_proxy();
    // A request without a body can be sent again if the upstream cannot be reached.
    let replay = (body.is_end_stream() && pool.upstreams().len() > 1).then(|| {
        Box::new(Replay {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            headers: parts.headers.clone(),
        })
    });
    let bounds = Bounds::of(
        &ctx.kind,
        &parts.uri,
        &ctx.config.upstream.timeouts,
        ctx.config.timeouts.request_seconds,
    );
    // A client body that breaks off (a chunk size past 64 bits, a malformed chunk) fails
    // the send too: the client's fault, a 400, not the upstream's 502 (issue 34).
    let body_failed = (!body.is_end_stream()).then(|| Arc::new(AtomicBool::new(false)));
    let outbound = match &body_failed {
        None => Request::from_parts(parts, body.map_err(crate::BoxError::from).boxed()),
        Some(flag) => {
            let flag = flag.clone();
            let body = body.map_err(move |e| {
                flag.store(true, Ordering::Relaxed);
                crate::BoxError::from(e)
            });
            Request::from_parts(parts, body.boxed())
        }
    };
    let how = How {
        front_proxy,
        upgrade: ctx.upgrade,
        bulk: ctx.long_running() || ctx.key.is_list_like() || ctx.lane == Lane::Heavy,
    };
    let (mut resp, outstanding) = match send(pool, outbound, replay, how, bounds.headers).await {
        Ok(sent) => sent,
        Err(ProxyError::Upstream { source, .. })
            if body_failed.is_some_and(|f| f.load(Ordering::Relaxed)) =>
        {
            return Err(ProxyError::BadBody(kubeio::error_chain(&*source)))
        }
        Err(e) => return Err(e),
    };
    if let (StatusCode::SWITCHING_PROTOCOLS, Some(client_side)) = (resp.status(), on_client_upgrade)
    {
        let upstream_side = hyper::upgrade::on(&mut resp);
        tunnels.open(client_side, upstream_side, outstanding);
        let (mut parts, _) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers, true);
        let head = Response::from_parts(parts, status::full(bytes::Bytes::new()));
        return Ok(Forwarded::Upgraded(head));
    }
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    if ctx.rewritten {
        parts.headers.insert(
            REWRITE_HEADER,
            HeaderValue::from_static("resourceVersion=0"),
        );
    }
    Ok(Forwarded::Stream(
        Response::from_parts(parts, IdleBody::new(body, bounds.idle)),
        outstanding,
    ))
}

/// Which of the pool's clients carries a request.
#[derive(Debug, Clone, Copy)]
struct How {
    /// With the front-proxy certificate (the client's identity in headers).
    front_proxy: bool,
    /// HTTP/1.1 only: the connection becomes the tunnel.
    upgrade: bool,
    /// A LIST, a watch or anything long-running: never on a light request's connection.
    bulk: bool,
}

/// What a request without a body is sent again with. Boxed: it is held
/// across the send, in every request's future, and only set where there
/// are several upstreams.
struct Replay {
    method: http::Method,
    uri: http::Uri,
    headers: http::HeaderMap,
}

impl Replay {
    fn into_request(self) -> Request<Body> {
        let mut r = Request::new(status::full(bytes::Bytes::new()));
        *r.method_mut() = self.method;
        *r.uri_mut() = self.uri;
        *r.headers_mut() = self.headers;
        r
    }
}

/// Pick the least busy upstream and send; if it cannot be reached, eject
/// it and, for a request without a body (`replay`), try another one once.
/// `timeout` bounds the wait for response headers.
async fn send(
    pool: &UpstreamPool,
    mut outbound: Request<Body>,
    mut replay: Option<Box<Replay>>,
    how: How,
    timeout: Duration,
) -> Result<(Response<Incoming>, Outstanding), ProxyError> {
    let mut avoid = None;
    loop {
        let mut outstanding = pool.pick(avoid.as_ref()).ok_or(ProxyError::NoUpstream)?;
        let upstream = outstanding.upstream().clone();
        let sent = pool.send(
            &mut outstanding,
            outbound,
            how.front_proxy,
            how.upgrade,
            how.bulk,
        );
        let result =
            tokio::time::timeout(timeout, sent)
                .await
                .map_err(|_| ProxyError::Timeout {
                    upstream: upstream.url.clone(),
                    seconds: timeout.as_secs_f64(),
                })?;
        let e = match result {
            Ok(resp) => return Ok((resp, outstanding)),
            Err(SendError::Build(e)) => return Err(ProxyError::Build(e)),
            Err(SendError::Request(source)) => {
                return Err(ProxyError::Upstream {
                    upstream: upstream.url.clone(),
                    source,
                })
            }
            Err(e @ SendError::Busy { .. }) => {
                return Err(ProxyError::UpstreamBusy {
                    upstream: upstream.url.clone(),
                    reason: e.to_string(),
                })
            }
            Err(SendError::Connect(e)) => e,
        };
        pool.eject(&upstream);
        // Once: the replay is taken by the first retry.
        match (replay.take(), avoid.is_none() && pool.upstreams().len() > 1) {
            (Some(r), true) => {
                tracing::debug!(upstream = %upstream.url, "retrying on another upstream");
                outbound = r.into_request();
                avoid = Some(upstream);
            }
            // A connection that timed out is the upstream not answering in time: 504, as
            // for a response that does not come; one refused or reset is a 502.
            _ => match ConnectTimeout::find(&*e) {
                Some(t) => {
                    return Err(ProxyError::ConnectTimeout {
                        upstream: upstream.url.clone(),
                        seconds: t.0.as_secs_f64(),
                    })
                }
                None => {
                    return Err(ProxyError::Upstream {
                        upstream: upstream.url.clone(),
                        source: e,
                    })
                }
            },
        }
    }
}

impl Tunnels {
    /// Carry an upgraded connection both ways until either side closes or
    /// the drain's hard stop.
    fn open(&self, client: OnUpgrade, upstream: OnUpgrade, outstanding: Outstanding) {
        self.upgrades.inc();
        let stop = self.hard_stop.clone();
        self.tasks.spawn(async move {
            let _outstanding = outstanding;
            let (client, upstream) = match tokio::join!(client, upstream) {
                (Ok(c), Ok(u)) => (c, u),
                (c, u) => {
                    tracing::debug!(client = ?c.err(), upstream = ?u.err(), "upgrade failed");
                    return;
                }
            };
            let mut client = TokioIo::new(client);
            let mut upstream = TokioIo::new(upstream);
            tokio::select! {
                r = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
                    tracing::debug!(result = ?r, "upgraded stream closed");
                }
                _ = stop.cancelled() => {}
            }
        });
    }
}
