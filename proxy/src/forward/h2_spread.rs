//! The HTTP/2 stream spreader: the HTTP clients that carry forwarded requests to the apiservers,
//! spread over several connections so that no HTTP/2 connection carries more streams than the
//! apiserver allows. (Not admission's lanes: those are in [`crate::enforce::lane`].)

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::connect::TimedConnector;
use crate::Body;

pub(crate) type HttpClient = Client<TimedConnector, Body>;

/// What each new upstream connection is opened with: TLS settings and the
/// deadline on connect plus handshake.
#[derive(Debug, Clone)]
pub(crate) struct Connect {
    pub tls: rustls::ClientConfig,
    pub timeout: Duration,
}

/// HTTP/2 connections are shared by many streams, and the apiserver caps
/// streams per connection (250 in 1.20, 100 in recent releases); a stream
/// past the cap waits for one to end, which for a watch is never. So
/// requests are spread over clients, each with its own connection per
/// upstream and carrying at most `limit` open requests; a new client opens
/// when all are full. Clients are few: concurrent requests / limit.
///
/// Until the upstream is known to speak HTTP/2 (a response came back over it), a new
/// client negotiates by ALPN, and its pool cannot tell that one connection will do: a burst
/// of requests into a new client races a TLS connection per request while the first handshake
/// is in flight (10,000 watches opened at once made ~2,000 connections, all but one per client
/// dropped again). Once HTTP/2 is known, new clients are HTTP/2-only, and their pool opens one
/// connection and queues the burst on it.
#[derive(Debug)]
pub struct H2Spread {
    config: Connect,
    limit: usize,
    clients: Mutex<Vec<(HttpClient, Arc<AtomicUsize>)>>,
    h2_known: AtomicBool,
}

/// One open request's place on a client's connection; freed on drop.
#[derive(Debug)]
pub struct StreamSlot(Arc<AtomicUsize>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl H2Spread {
    pub(crate) fn new(config: Connect, limit: usize) -> H2Spread {
        H2Spread {
            config,
            limit: limit.max(1),
            clients: Mutex::new(Vec::new()),
            h2_known: AtomicBool::new(false),
        }
    }

    /// Records the HTTP version of a response from the upstream.
    pub(crate) fn learn(&self, version: http::Version) {
        if version == http::Version::HTTP_2 && !self.h2_known.swap(true, Ordering::Relaxed) {
            tracing::debug!("upstream speaks HTTP/2: new clients open one connection each");
        }
    }

    pub(crate) fn acquire(&self) -> (HttpClient, StreamSlot) {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        for (client, active) in clients.iter() {
            if active.load(Ordering::Relaxed) < self.limit {
                active.fetch_add(1, Ordering::Relaxed);
                return (client.clone(), StreamSlot(active.clone()));
            }
        }
        let client = if self.h2_known.load(Ordering::Relaxed) {
            h2_only_client(self.config.clone())
        } else {
            http_client(self.config.clone(), true)
        };
        let opened = (client, Arc::new(AtomicUsize::new(1)));
        clients.push(opened.clone());
        tracing::debug!(clients = clients.len(), "opened another upstream client");
        (opened.0, StreamSlot(opened.1))
    }

    /// Clients opened so far.
    pub fn opened(&self) -> usize {
        self.clients.lock().map(|l| l.len()).unwrap_or(0)
    }
}

/// The upstreams and the clients that reach them.
pub(crate) fn http_client(config: Connect, h2: bool) -> HttpClient {
    client_builder().build(connector(config, h2))
}

fn h2_only_client(config: Connect) -> HttpClient {
    client_builder()
        .http2_only(true)
        .build(connector(config, true))
}

fn client_builder() -> hyper_util::client::legacy::Builder {
    let mut b = Client::builder(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .http2_keep_alive_while_idle(true);
    b
}

fn connector(config: Connect, h2: bool) -> TimedConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.tls)
        .https_or_http()
        .enable_http1();
    let https = if h2 {
        builder.enable_http2().wrap_connector(http)
    } else {
        builder.wrap_connector(http)
    };
    TimedConnector::new(https, config.timeout)
}
