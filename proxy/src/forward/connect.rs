//! Opening a connection to an apiserver, bounded: TCP connect and TLS
//! handshake together within `upstream.connectTimeoutSeconds`. Without it an
//! upstream that accepts TCP and never speaks TLS held a watch forever (no
//! response, no error), and a LIST until its response timeout.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::rt::TokioIo;

use super::read_ahead::{ReadAhead, ReadAheadConnector};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// No connection within the timeout.
#[derive(Debug, thiserror::Error)]
#[error("no connection (TCP connect and TLS handshake) within {}s", .0.as_secs_f64())]
pub struct ConnectTimeout(pub Duration);

impl ConnectTimeout {
    /// The timeout behind `e`, if a connection timed out somewhere in its chain.
    pub fn find<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a ConnectTimeout> {
        let mut cause = Some(e);
        while let Some(c) = cause {
            if let Some(t) = c.downcast_ref::<ConnectTimeout>() {
                return Some(t);
            }
            cause = c.source();
        }
        None
    }
}

/// The HTTPS-or-HTTP connector with a deadline on each connection.
#[derive(Debug, Clone)]
pub struct TimedConnector {
    inner: HttpsConnector<ReadAheadConnector>,
    timeout: Duration,
}

impl TimedConnector {
    pub fn new(inner: HttpsConnector<ReadAheadConnector>, timeout: Duration) -> Self {
        TimedConnector { inner, timeout }
    }
}

type Connection = MaybeHttpsStream<TokioIo<ReadAhead>>;

impl tower_service::Service<Uri> for TimedConnector {
    type Response = Connection;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Connection, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, connecting).await {
                Ok(connected) => connected,
                Err(_) => Err(Box::new(ConnectTimeout(timeout)) as BoxError),
            }
        })
    }
}
