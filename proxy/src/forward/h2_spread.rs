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
use super::light_h1::LightH1;
use crate::Body;

pub(crate) type HttpClient = Client<TimedConnector, Body>;

/// What each new upstream connection is opened with: TLS settings and the
/// deadline on connect plus handshake.
#[derive(Debug, Clone)]
pub(crate) struct Connect {
    pub tls: rustls::ClientConfig,
    pub timeout: Duration,
    /// HTTP/2 pings on each connection: every `.0`, closed if one is not
    /// answered within `.1` (`upstream.timeouts.ping*Seconds`). A
    /// connection whose peer is gone fails its streams (a watch's too)
    /// instead of holding them.
    pub ping: (Duration, Duration),
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
    /// HTTP/2 flow-control windows `(stream, connection)`; hyper's defaults if `None`.
    windows: Option<(u32, u32)>,
    /// The clients of each worker ([`crate::workers`]): a worker's requests go over its own
    /// connections, whose tasks run on it, so a request's frames are not handed between
    /// threads. Each client behind an `Arc`: a request takes one reference, not a copy of
    /// the client (its connector, executor, builders and pool: five shared counts
    /// touched and released per request; `request` copies it once more itself).
    clients: Box<[Mutex<Vec<ClientSlots>>]>,
    h2_known: AtomicBool,
}

/// The spreads of one identity: one for light requests, one for bulk ones
/// (LISTs, watches, anything long-running or in the heavy lane). HTTP/2
/// flow control is per connection as well as per stream: with hyper's
/// defaults (5 MB per connection, 2 MB per stream) three LISTs whose
/// clients stop reading fill the connection's window with bytes tollgate
/// cannot pass on, and every other stream on it then gets its headers but
/// not its body. So heartbeats and other light requests never share a
/// connection with bulk ones (tests/h2_isolation.rs). With
/// `upstream.lightProtocol: http1` light requests go over HTTP/1.1
/// ([`LightH1`]) while it has room, and over the light HTTP/2 spread past it.
#[derive(Debug)]
pub struct Spreads {
    light: H2Spread,
    light_h1: Option<LightH1>,
    bulk: H2Spread,
}

impl Spreads {
    pub(crate) fn new(config: Connect, limit: usize, light_h1: Option<LightH1>) -> Spreads {
        // Streams of one kind share connections too (bulk ones with watches);
        // each connection's window covers all its streams' windows, so one
        // stream's unread bytes never hold up another's. What that costs is
        // bounded: at most `limit` × `STREAM_WINDOW` unread bytes per
        // connection (125 MiB at 1.20's 250 streams, only if every client
        // stops reading).
        let connection = (STREAM_WINDOW as u64 * limit.max(1) as u64).min(MAX_WINDOW as u64);
        let windows = Some((STREAM_WINDOW, connection as u32));
        Spreads {
            light: H2Spread::new(config.clone(), limit, windows),
            light_h1,
            bulk: H2Spread::new(config, limit, windows),
        }
    }

    /// The client for a request and its slot there.
    pub(crate) fn acquire(&self, bulk: bool) -> (Arc<HttpClient>, StreamSlot) {
        if bulk {
            return self.bulk.acquire();
        }
        match self.light_h1.as_ref().and_then(LightH1::acquire) {
            Some(h1) => h1,
            None => self.light.acquire(),
        }
    }

    /// Records the HTTP version of a response from the upstream, for both.
    pub(crate) fn learn(&self, version: http::Version) {
        self.light.learn(version);
        self.bulk.learn(version);
    }

    /// Clients opened so far, light and bulk.
    pub fn opened(&self) -> usize {
        self.light.opened() + self.bulk.opened()
    }
}

/// A stream's flow-control window: on loopback or a LAN, 512 KiB in flight
/// streams far faster than an apiserver encodes.
const STREAM_WINDOW: u32 = 512 * 1024;
/// The largest window HTTP/2 allows (2^31 − 1).
const MAX_WINDOW: u32 = (1 << 31) - 1;

/// A client and its open requests.
type ClientSlots = (Arc<HttpClient>, Arc<AtomicUsize>);

/// One open request's place on a client's connection; freed on drop.
#[derive(Debug)]
pub struct StreamSlot(Arc<AtomicUsize>);

impl StreamSlot {
    /// A slot already counted in `active`.
    pub(super) fn counted(active: Arc<AtomicUsize>) -> StreamSlot {
        StreamSlot(active)
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl H2Spread {
    pub(crate) fn new(config: Connect, limit: usize, windows: Option<(u32, u32)>) -> H2Spread {
        H2Spread {
            config,
            limit: limit.max(1),
            windows,
            clients: (0..crate::workers::count())
                .map(|_| Mutex::new(Vec::new()))
                .collect(),
            h2_known: AtomicBool::new(false),
        }
    }

    /// Records the HTTP version of a response from the upstream.
    ///
    /// Read before it is written: every response passes here, and a write to
    /// the shared flag would move its cache line between cores each time.
    pub(crate) fn learn(&self, version: http::Version) {
        if version == http::Version::HTTP_2
            && !self.h2_known.load(Ordering::Relaxed)
            && !self.h2_known.swap(true, Ordering::Relaxed)
        {
            tracing::debug!("upstream speaks HTTP/2: new clients open one connection each");
        }
    }

    pub(crate) fn acquire(&self) -> (Arc<HttpClient>, StreamSlot) {
        let worker = crate::workers::current() % self.clients.len();
        let mut clients = self.clients[worker]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (client, active) in clients.iter() {
            if active.load(Ordering::Relaxed) < self.limit {
                active.fetch_add(1, Ordering::Relaxed);
                return (client.clone(), StreamSlot(active.clone()));
            }
        }
        let mut builder = client_builder(&self.config);
        if let Some((stream, connection)) = self.windows {
            builder
                .http2_initial_stream_window_size(stream)
                .http2_initial_connection_window_size(connection);
        }
        let h2_only = self.h2_known.load(Ordering::Relaxed);
        let client = Arc::new(
            builder
                .http2_only(h2_only)
                .build(connector(self.config.clone(), true)),
        );
        let opened = (client, Arc::new(AtomicUsize::new(1)));
        clients.push(opened.clone());
        tracing::debug!(
            worker,
            clients = clients.len(),
            "opened another upstream client"
        );
        (opened.0, StreamSlot(opened.1))
    }

    /// Clients opened so far, on all workers.
    pub fn opened(&self) -> usize {
        self.clients
            .iter()
            .map(|c| c.lock().map(|l| l.len()).unwrap_or(0))
            .sum()
    }
}

/// The upstreams and the clients that reach them.
pub(crate) fn http_client(config: Connect, h2: bool) -> HttpClient {
    client_builder(&config).build(connector(config, h2))
}

pub(super) fn client_builder(config: &Connect) -> hyper_util::client::legacy::Builder {
    let mut b = Client::builder(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .http2_keep_alive_interval(config.ping.0)
        .http2_keep_alive_timeout(config.ping.1)
        .http2_keep_alive_while_idle(true);
    b
}

pub(super) fn connector(config: Connect, h2: bool) -> TimedConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    // A peer host that is gone is found under an HTTP/1.1 watch too.
    http.set_keepalive(Some(config.ping.0));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spread(limit: usize) -> H2Spread {
        crate::install_crypto_provider();
        let connect = Connect {
            tls: crate::tls::client_config(None, None).expect("tls"),
            timeout: Duration::from_secs(1),
            ping: (Duration::from_secs(30), Duration::from_secs(20)),
        };
        H2Spread::new(connect, limit, None)
    }

    /// Requests under the limit share one client (the same `Arc`, not
    /// copies); past it another opens; a freed slot is taken again first.
    #[test]
    fn requests_share_a_client_up_to_the_limit() {
        let s = spread(2);
        let (a, slot_a) = s.acquire();
        let (b, _slot_b) = s.acquire();
        assert!(Arc::ptr_eq(&a, &b), "one client for both");
        let (c, _slot_c) = s.acquire();
        assert!(!Arc::ptr_eq(&a, &c), "the third opens another");
        assert_eq!(s.opened(), 2);
        drop(slot_a);
        let (d, _slot_d) = s.acquire();
        assert!(Arc::ptr_eq(&a, &d), "the first has room again");
        assert_eq!(s.opened(), 2);
    }

    /// Requests made on different workers go over different clients (so their connections'
    /// tasks run on the worker that uses them); on one worker they share one.
    #[test]
    fn each_worker_has_its_own_clients() {
        let workers = crate::workers::Workers::start(2).expect("workers");
        let s = Arc::new(spread(10));
        let (got, on) = std::sync::mpsc::channel();
        let (release, released) = tokio::sync::watch::channel(());
        for _ in 0..2 {
            let (s, got, mut released) = (s.clone(), got.clone(), released.clone());
            workers.spawn(move || async move {
                let (a, _slot_a) = s.acquire();
                let (b, _slot_b) = s.acquire();
                let _ = got.send((Arc::as_ptr(&a) as usize, Arc::ptr_eq(&a, &b)));
                let _ = released.changed().await;
            });
        }
        let wait = Duration::from_secs(10);
        let first = on.recv_timeout(wait).expect("first worker");
        let second = on.recv_timeout(wait).expect("second worker");
        assert!(first.1 && second.1, "one worker's requests share a client");
        assert_ne!(first.0, second.0, "each worker has its own");
        assert_eq!(s.opened(), 2);
        drop(release);
        workers.shutdown();
    }

    #[test]
    fn the_version_is_learned_once() {
        let s = spread(1);
        s.learn(http::Version::HTTP_11);
        assert!(!s.h2_known.load(Ordering::Relaxed));
        s.learn(http::Version::HTTP_2);
        s.learn(http::Version::HTTP_2);
        assert!(s.h2_known.load(Ordering::Relaxed));
    }
}
