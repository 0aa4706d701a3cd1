//! Lanes: the HTTP clients that carry forwarded requests to the apiservers, spread so that no
//! HTTP/2 connection carries more streams than the apiserver allows.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::Body;

pub(crate) type HttpClient = Client<HttpsConnector<HttpConnector>, Body>;

/// HTTP/2 connections are shared by many streams, and the apiserver caps
/// streams per connection (250 in 1.20, 100 in recent releases); a stream
/// past the cap waits for one to end, which for a watch is never. So
/// requests are spread over lanes, each its own client (its own connection
/// per upstream) carrying at most `limit` open requests; a new lane opens
/// when all are full. Lanes are few: concurrent requests / limit.
///
/// Until the upstream is known to speak HTTP/2 (a response came back over it), a lane's
/// client negotiates by ALPN, and its pool cannot tell that one connection will do: a burst
/// of requests into a new lane races a TLS connection per request while the first handshake
/// is in flight (10,000 watches opened at once made ~2,000 connections, all but one per lane
/// dropped again). Once HTTP/2 is known, new lanes are HTTP/2-only, and their pool opens one
/// connection and queues the burst on it.
#[derive(Debug)]
pub struct Lanes {
    config: rustls::ClientConfig,
    limit: usize,
    lanes: Mutex<Vec<(HttpClient, Arc<AtomicUsize>)>>,
    h2_known: AtomicBool,
}

/// One open request's place in a lane; freed on drop.
#[derive(Debug)]
pub struct StreamSlot(Arc<AtomicUsize>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Lanes {
    pub(crate) fn new(config: rustls::ClientConfig, limit: usize) -> Lanes {
        Lanes {
            config,
            limit: limit.max(1),
            lanes: Mutex::new(Vec::new()),
            h2_known: AtomicBool::new(false),
        }
    }

    /// Records the HTTP version of a response from the upstream.
    pub(crate) fn learn(&self, version: http::Version) {
        if version == http::Version::HTTP_2 && !self.h2_known.swap(true, Ordering::Relaxed) {
            tracing::debug!("upstream speaks HTTP/2: new lanes open one connection each");
        }
    }

    pub(crate) fn acquire(&self) -> (HttpClient, StreamSlot) {
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        for (client, active) in lanes.iter() {
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
        let lane = (client, Arc::new(AtomicUsize::new(1)));
        lanes.push(lane.clone());
        tracing::debug!(lanes = lanes.len(), "opened another upstream lane");
        (lane.0, StreamSlot(lane.1))
    }

    pub fn len(&self) -> usize {
        self.lanes.lock().map(|l| l.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The upstreams and the clients that reach them.
pub(crate) fn http_client(config: rustls::ClientConfig, h2: bool) -> HttpClient {
    client_builder().build(connector(config, h2))
}

fn h2_only_client(config: rustls::ClientConfig) -> HttpClient {
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

fn connector(
    config: rustls::ClientConfig,
    h2: bool,
) -> hyper_rustls::HttpsConnector<HttpConnector> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(5)));
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1();
    if h2 {
        builder.enable_http2().wrap_connector(http)
    } else {
        builder.wrap_connector(http)
    }
}
