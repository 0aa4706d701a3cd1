//! The client listener: accept TCP (under `maxConnections` and
//! `maxConnectionsPerSource`, backing off
//! when accept fails: [`crate::listener`]), handshake TLS (ALPN h2 / http/1.1,
//! optional client certificate, checked against the client CA after the
//! handshake as kube-apiserver does: see [`PeerIdentity`]), serve HTTP/1.1
//! and HTTP/2 with upgrades,
//! and on shutdown close connections spread over the drain window: each
//! connection gets its own moment in the window, is told to go away
//! (HTTP/2 GOAWAY, HTTP/1 close after the current response), and is closed
//! for good `CLOSE_GRACE` later, so long-running watches end at different
//! times and their clients do not all relist at once. A connection with no
//! request in flight is closed at once: an idle tollgate stops at once.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::gateway::Gateway;
use crate::handle::handle;
use crate::identity::{bearer_token, PeerCertificate};
use crate::listener::{
    serve_until, Accepted, ActiveBody, Activity, Caps, ConnResult, Listener, Until,
};
use crate::status::status_response;
use crate::tls::serving::ServingCerts;
use crate::tls::ClientCertAuthority;
use crate::workers::Workers;

/// hyper's bound on what an HTTP/1.1 connection queues toward a client that reads slower than
/// the apiserver sends: hyper's default (~400 KB) let slow clients of large responses hold too
/// much memory. The upstream read buffer keeps hyper's default: bounding it too cost CPU per GB
/// streamed (figures: bench/RESULTS.md, "tollgate memory").
pub const MAX_H1_WRITE_BUFFER: usize = 128 * 1024;

/// How long a connection told to go away may take before it is closed.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accept connections until `stop`; each is served on one of `workers`, in the gateway's task
/// tracker. With `tls`, each connection is served with the certificates current when it is
/// accepted (they are reloaded when their files change), and keeps them for its life.
pub async fn accept_loop(
    gateway: Gateway,
    listener: TcpListener,
    tls: Option<Arc<ServingCerts>>,
    workers: Workers,
    stop: CancellationToken,
) {
    let sequence = AtomicU64::new(0);
    let mut listener = Listener::new(listener, "client", gateway.metrics());
    let caps = || {
        let c = gateway.config();
        Caps {
            total: c.max_connections,
            per_source: c.max_connections_per_source,
            reserve: 0,
        }
    };
    while let Some(Accepted {
        tcp, remote, slot, ..
    }) = listener.accept(caps, &stop).await
    {
        let _ = tcp.set_nodelay(true);
        // Out of this runtime's reactor, into the worker's (below).
        let tcp = match tcp.into_std() {
            Ok(tcp) => tcp,
            Err(e) => {
                tracing::debug!(%remote, error = %e, "accepted connection lost");
                continue;
            }
        };
        let n = sequence.fetch_add(1, Ordering::Relaxed);
        let g = gateway.clone();
        let served = tls.as_ref().map(|t| t.current());
        let stop = stop.clone();
        // The drain waits for the connection from here, before a worker picks it up.
        let tracked = gateway.tasks().token();
        workers.spawn(move || async move {
            let (_tracked, _slot) = (tracked, slot);
            let tcp = match tokio::net::TcpStream::from_std(tcp) {
                Ok(tcp) => tcp,
                Err(e) => {
                    tracing::debug!(%remote, error = %e, "accepted connection not registered");
                    return;
                }
            };
            match served {
                None => {
                    serve_connection(g, tcp, PeerIdentity::None, remote, stop, n, false).await
                }
                Some(served) => {
                    let acceptor = TlsAcceptor::from(served.config.clone());
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let chain = stream.get_ref().1.peer_certificates().unwrap_or(&[]);
                            let peer = PeerIdentity::of(chain, served.clients.as_ref());
                            if matches!(peer, PeerIdentity::Unverified) {
                                tracing::debug!(%remote, "client certificate not signed by the client CA");
                            }
                            serve_connection(g, stream, peer, remote, stop, n, false).await
                        }
                        Ok(Err(e)) => tracing::debug!(%remote, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%remote, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
}

// === impl PeerIdentity ===

/// What a connection's client certificate says about its requests.
#[derive(Debug, Clone)]
enum PeerIdentity {
    /// No certificate (or one without a CN, which kube-apiserver's x509
    /// authenticator also passes over): token or anonymous.
    None,
    /// Signed by the client CA: user CN, groups O.
    Verified(Arc<PeerCertificate>),
    /// A certificate the client CA did not sign (or expired, or not for client
    /// auth). As in kube-apiserver it is no identity and an authentication
    /// error: a bearer token on the request may still authenticate it (the
    /// apiserver checks it), otherwise the request gets 401 — never anonymous.
    Unverified,
}

impl PeerIdentity {
    /// `ca`: the client CA of the configuration the handshake was made with.
    fn of(
        chain: &[rustls::pki_types::CertificateDer<'_>],
        ca: Option<&ClientCertAuthority>,
    ) -> Self {
        let Some(leaf) = chain.first() else {
            return PeerIdentity::None;
        };
        if !ca.is_some_and(|ca| ca.verify(chain)) {
            return PeerIdentity::Unverified;
        }
        match PeerCertificate::from_der(leaf) {
            Some(cert) => PeerIdentity::Verified(Arc::new(cert)),
            None => PeerIdentity::None,
        }
    }
}

/// Where in the drain window connection `n` is closed: the golden-ratio
/// sequence spreads any number of connections evenly.
fn drain_offset(n: u64, window: Duration) -> Duration {
    let frac = (n as f64 * 0.618_033_988_75).fract();
    window.mul_f64(frac)
}

/// Serve one plain (no TLS) client connection as the client listener does, for the
/// wire-level fuzz target (`fuzz/fuzz_targets/wire.rs`), which writes raw bytes into an
/// in-memory stream and closes its write half: HTTP/1.1 then finishes the responses of
/// what was read instead of dropping them, so every request goes the whole way.
pub async fn serve_for_fuzzing<I>(gateway: Gateway, io: I, remote: SocketAddr)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let stop = CancellationToken::new();
    serve_connection(gateway, io, PeerIdentity::None, remote, stop, 0, true).await
}

async fn serve_connection<I>(
    gateway: Gateway,
    io: I,
    peer: PeerIdentity,
    remote: SocketAddr,
    stop: CancellationToken,
    n: u64,
    half_close: bool,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let config = gateway.config();
    let g = gateway.clone();
    let source = remote.ip();
    let activity = Arc::new(Activity::new());
    let act = activity.clone();
    let svc = service_fn(move |req: Request<Incoming>| {
        let g = g.clone();
        let peer = peer.clone();
        let guard = act.begin();
        async move {
            // Boxed: hyper sizes each stream's task for this future for the stream's whole
            // life, and a watch lives long; inline, the handler's state would stay allocated
            // per open watch.
            let resp = match &peer {
                PeerIdentity::Verified(cert) => {
                    Box::pin(handle(&g, req, Some(cert.clone()), source)).await
                }
                PeerIdentity::None => Box::pin(handle(&g, req, None, source)).await,
                // The token is forwarded as is; the apiserver answers for it.
                PeerIdentity::Unverified if bearer_token(req.headers()).is_some() => {
                    Box::pin(handle(&g, req, None, source)).await
                }
                PeerIdentity::Unverified => status_response(&apimodel::Status::unauthorized()),
            };
            // The request stays active until its response body is done. Served as it is,
            // not boxed again: one allocation and one dynamic call per frame fewer.
            Ok::<_, Infallible>(resp.map(|body| ActiveBody::new(body, guard)))
        }
    });
    let mut builder = connection_builder(&config);
    builder.http1().half_close(half_close);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let idle = Duration::from_secs_f64(config.timeouts.idle_seconds);
    match serve_until(conn.as_mut(), &activity, idle, &stop).await {
        Until::Ended(r) => return log_end(r),
        Until::Idle => {
            tracing::debug!("closing an idle client connection");
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                r = conn.as_mut() => log_end(r),
                _ = tokio::time::sleep(CLOSE_GRACE) => {}
            }
            return;
        }
        Until::Stopped => {}
    }
    // A connection is closed at its moment in the window, or as soon as no request is in
    // flight on it: spreading is for the watches' relists; an idle connection (a client's
    // kept-alive pool) has nothing to spread, and waiting for it kept an idle tollgate
    // draining for the whole window.
    let offset = drain_offset(n, Duration::from_secs_f64(config.drain.window_seconds));
    tokio::select! {
        r = conn.as_mut() => return log_end(r),
        _ = tokio::time::sleep(offset) => {}
        _ = quiet(&activity) => {}
    }
    conn.as_mut().graceful_shutdown();
    tokio::select! {
        r = conn.as_mut() => log_end(r),
        _ = tokio::time::sleep(CLOSE_GRACE) => tracing::debug!("connection closed at the end of its grace"),
    }
}

/// Resolves once no request is in flight on the connection. Polled: a drain is rare, and
/// [`Activity`] stays two atomics on every request's way.
async fn quiet(activity: &Activity) {
    const LOOK: Duration = Duration::from_millis(20);
    while activity.in_flight() > 0 {
        tokio::time::sleep(LOOK).await;
    }
}

/// HTTP/1.1 and HTTP/2 as the configuration's timeouts say.
/// Its HTTP/2 streams' tasks are spawned boxed ([`crate::forward::Boxed`]): each holds the
/// request's whole handling, and a tokio task keeps its future inline.
fn connection_builder(config: &Config) -> auto::Builder<crate::forward::Boxed> {
    let mut builder = auto::Builder::new(crate::forward::Boxed);
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs_f64(config.timeouts.header_read_seconds))
        .keep_alive(true)
        .max_buf_size(MAX_H1_WRITE_BUFFER);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Duration::from_secs_f64(config.timeouts.keep_alive_seconds))
        .max_concurrent_streams(1000);
    builder
}

fn log_end(r: ConnResult) {
    if let Err(e) = r {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_offsets_are_spread_within_the_window() {
        let w = Duration::from_secs(30);
        let offsets: Vec<Duration> = (0..10).map(|n| drain_offset(n, w)).collect();
        assert_eq!(offsets[0], Duration::ZERO);
        assert!(offsets.iter().all(|o| *o < w));
        let mut secs: Vec<u64> = offsets.iter().map(|o| o.as_secs() / 3).collect();
        secs.sort_unstable();
        secs.dedup();
        assert!(
            secs.len() >= 8,
            "ten connections land in at least 8 of 10 slices: {secs:?}"
        );
    }
}
