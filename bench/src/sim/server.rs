//! Accepting connections: plain TCP or rustls, HTTP/1.1 and HTTP/2 on the
//! same port (250 concurrent streams per HTTP/2 connection, as kube-apiserver
//! advertises), and a graceful stop that ends open watches.

use crate::sim::api::{Api, Peer};
use crate::sim::auth::tls::peer_certificates;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// kube-apiserver's `--http2-max-streams-per-connection` default.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 250;
/// A client that has not finished its TLS handshake or request headers by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open requests may run on after a stop before their connections are cut.
const DRAIN: Duration = Duration::from_secs(5);

/// Serves until `stop` is cancelled, then drains. At a modeled crash
/// (`--cost-model modeled`), every connection is dropped at once and the
/// port is closed until the modeled restart is over, then bound again.
pub async fn serve(
    listener: TcpListener,
    addr: SocketAddr,
    tls: Option<TlsAcceptor>,
    api: Arc<Api>,
    stop: CancellationToken,
) {
    let tracker = TaskTracker::new();
    let mut listener = Some(listener);
    // Kept across iterations: a crash between two accepts must still close
    // the port (fetching the token anew each time would get the next
    // incarnation's and go on accepting while "down").
    let mut incarnation = api.model.connections();
    loop {
        let Some(bound) = listener.as_ref() else {
            listener = rebind(addr, api.model.up_at(), &stop).await;
            if listener.is_none() {
                break;
            }
            incarnation = api.model.connections();
            continue;
        };
        let (tcp, remote) = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            _ = incarnation.cancelled() => {
                // A modeled crash: new connections are refused while it restarts.
                listener = None;
                continue;
            }
            r = bound.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and similar: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let api = api.clone();
        let tls = tls.clone();
        let stop = stop.clone();
        let incarnation = incarnation.clone();
        tracker.spawn(async move {
            match tls {
                None => {
                    connection(TokioIo::new(tcp), Peer::default(), api, stop, incarnation).await
                }
                Some(acceptor) => {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let peer = Peer {
                                certs: peer_certificates(&stream),
                            };
                            connection(TokioIo::new(stream), peer, api, stop, incarnation).await
                        }
                        Ok(Err(e)) => tracing::debug!(%remote, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%remote, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
    tracker.close();
    tracker.wait().await;
}

/// Binds `addr` again once the modeled restart is over (retrying if the port
/// is briefly taken); `None` if the server is stopped meanwhile.
async fn rebind(
    addr: SocketAddr,
    up_at: tokio::time::Instant,
    stop: &CancellationToken,
) -> Option<TcpListener> {
    tokio::select! {
        _ = tokio::time::sleep_until(up_at) => {}
        _ = stop.cancelled() => return None,
    }
    loop {
        match TcpListener::bind(addr).await {
            Ok(l) => {
                tracing::info!(%addr, "modeled apiserver restarted: accepting connections");
                return Some(l);
            }
            Err(e) => {
                tracing::warn!(%addr, error = %e, "binding again after the modeled restart");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    _ = stop.cancelled() => return None,
                }
            }
        }
    }
}

async fn connection<I>(
    io: TokioIo<I>,
    peer: Peer,
    api: Arc<Api>,
    stop: CancellationToken,
    incarnation: CancellationToken,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let peer = Arc::new(peer);
    let svc = service_fn(move |req| {
        let api = api.clone();
        let peer = peer.clone();
        async move { Ok::<_, Infallible>(api.handle(req, &peer).await) }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION);
    let conn = builder.serve_connection_with_upgrades(io, svc);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        }
        _ = incarnation.cancelled() => {
            // The incarnation token is a child of `stop`: a stop drains, a
            // modeled crash drops the connection on the spot.
            if stop.is_cancelled() {
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(DRAIN, conn).await;
            }
        }
    }
}
