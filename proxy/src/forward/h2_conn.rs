//! Opening one HTTP/2 connection to an apiserver on the worker that will use it: TCP and TLS
//! through the deadline-bound connector ([`super::connect`]), ALPN's answer read, then hyper's
//! HTTP/2 handshake, its connection future spawned on the caller's runtime (the worker's own, so
//! the connection's frames are never handed between threads).

use std::error::Error;
use std::future::Future;
use std::sync::Arc;

use http::Uri;
use hyper::client::conn::http2;
use hyper_util::client::legacy::connect::Connection as _;
use hyper_util::rt::TokioTimer;
use tower_service::Service as _;

use super::connect::TimedConnector;
use super::h2_spread::Connect;
use crate::Body;

/// The sending side of an upstream HTTP/2 connection.
pub(crate) type Sender = http2::SendRequest<Body>;

/// What opening a connection gave.
#[derive(Debug, Clone)]
pub(crate) enum Opened {
    H2(Sender),
    /// ALPN chose HTTP/1.1: the upstream is reached over HTTP/1.1 instead.
    Http1,
}

/// A connection could not be opened (TCP, TLS or the HTTP/2 handshake). Shared by every
/// request that waited for that connection, so the cause is behind an `Arc`; it is the
/// error's source, so [`super::ConnectTimeout::find`] sees a timeout through it.
#[derive(Debug, Clone)]
pub struct ConnectError(Arc<dyn Error + Send + Sync>);

impl ConnectError {
    pub(crate) fn new(e: impl Error + Send + Sync + 'static) -> ConnectError {
        ConnectError(Arc::new(e))
    }
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("cannot open a connection")
    }
}

impl Error for ConnectError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.0)
    }
}

/// What every connection of one spread is opened with.
#[derive(Debug, Clone)]
pub(crate) struct Opener {
    connector: TimedConnector,
    h2: http2::Builder<Boxed>,
}

/// Spawns hyper's HTTP/2 client futures (the connection's, and one per request) boxed, as
/// hyper-util's pooled client did. They are one enum whose size is its largest variant's (the
/// connection's), and a tokio task keeps its future inline and rewrites its whole stage when
/// the future ends: spawned as they are, each request's small future cost several copies of
/// that size (2.6 k instructions a request in the spawn, against 0.4 k boxed).
#[derive(Debug, Clone, Copy)]
pub struct Boxed;

impl<F> hyper::rt::Executor<F> for Boxed
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        tokio::spawn(Box::pin(fut));
    }
}

impl Opener {
    /// `windows`: HTTP/2 flow-control windows `(stream, connection)`, hyper's defaults if `None`.
    pub(crate) fn new(config: &Connect, windows: Option<(u32, u32)>) -> Opener {
        let mut h2 = http2::Builder::new(Boxed);
        h2.timer(TokioTimer::new())
            .keep_alive_interval(config.ping.0)
            .keep_alive_timeout(config.ping.1)
            .keep_alive_while_idle(true);
        if let Some((stream, connection)) = windows {
            h2.initial_stream_window_size(stream)
                .initial_connection_window_size(connection);
        }
        Opener {
            connector: super::h2_spread::connector(config.clone(), true),
            h2,
        }
    }

    /// Opens a connection to `origin` (`scheme://authority`), its task on this runtime.
    pub(crate) async fn open(&self, origin: Uri) -> Result<Opened, ConnectError> {
        let mut connector = self.connector.clone();
        let failed = |e: crate::BoxError| ConnectError(Arc::from(e));
        std::future::poll_fn(|cx| connector.poll_ready(cx))
            .await
            .map_err(failed)?;
        let io = connector.call(origin).await.map_err(failed)?;
        if !io.connected().is_negotiated_h2() {
            return Ok(Opened::Http1);
        }
        let (sender, connection) = self
            .h2
            .handshake(io)
            .await
            .map_err(|e| failed(Box::new(e)))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream HTTP/2 connection failed");
            }
        });
        Ok(Opened::H2(sender))
    }
}
