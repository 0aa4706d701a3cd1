//! The HTTP/2 stream spreader: the upstream connections that carry forwarded requests to the
//! apiservers, each worker's own, spread so that no HTTP/2 connection carries more streams than
//! the apiserver allows. (Not admission's lanes: those are in [`crate::enforce::lane`].)
//!
//! Built on hyper's connection API (`client::conn::http2`), not on hyper-util's pooled client:
//! a request takes a stream on a connection of its worker's in one short critical section (no
//! pool checkout, no pool key hashed, no client copied) and its request is handed to the
//! connection's task there.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::sync::watch;
use tokio::time::Instant;

use super::connect::TimedConnector;
use super::h2_conn::{ConnectError, Opened, Opener, Sender};
use super::light_h1::LightH1;
use super::pool::{SendError, Upstream};
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
    /// The pause between reads of a connection's socket that found it nearly empty
    /// ([`super::read_ahead::BULK_PACE`] on the bulk connections, none on the others).
    pub read_pace: Option<Duration>,
}

/// The most HTTP/2 connections one worker opens to one upstream for one spread: at the default
/// 100 streams each, 102,400 requests in flight. Past it a request is refused with a 503
/// ([`SendError::Busy`]) rather than queued behind streams that may never end (watches).
pub(crate) const MAX_CONNECTIONS: usize = 1024;

/// A connection that carried no stream for this long is closed when its worker next looks
/// (as hyper-util's pool closed idle ones after 90 s).
const IDLE: Duration = Duration::from_secs(90);

/// HTTP/2 connections are shared by many streams, and the apiserver caps
/// streams per connection (250 in 1.20, 100 in recent releases); a stream
/// past the cap waits for one to end, which for a watch is never. So
/// requests are spread over connections, each carrying at most `limit` open
/// requests; a new one opens when all are full, up to [`MAX_CONNECTIONS`]
/// per upstream on each worker.
///
/// Requests that arrive while a connection is being opened wait for it (while it has room)
/// instead of opening their own: a burst into a new spread opens one connection, not one per
/// request (10,000 watches opened at once once made ~2,000 TLS connections).
#[derive(Debug)]
pub struct H2Spread {
    opener: Opener,
    limit: usize,
    max_connections: usize,
    /// The connections of each worker ([`crate::workers`]): a worker's requests go over its own
    /// connections, whose tasks run on it, so a request's frames are not handed between threads.
    workers: Box<[Mutex<Worker>]>,
}

/// One worker's connections, by upstream index.
#[derive(Debug, Default)]
struct Worker {
    upstreams: Vec<Conns>,
}

/// One worker's connections to one upstream.
#[derive(Debug, Default)]
struct Conns {
    open: Vec<Conn>,
    /// ALPN chose HTTP/1.1: requests go over HTTP/1.1 from then on.
    http1: bool,
}

#[derive(Debug)]
struct Conn {
    state: State,
    /// Streams open (or waiting for the connection), freed by [`StreamSlot`]s.
    streams: Arc<AtomicUsize>,
    last_used: Instant,
}

type Opening = watch::Receiver<Option<Result<Opened, ConnectError>>>;

#[derive(Debug)]
enum State {
    Opening(Opening),
    Ready(Sender),
}

/// What a request got from [`H2Spread::send`].
pub(crate) enum Sent {
    Response(Response<Incoming>, StreamSlot),
    /// The upstream speaks HTTP/1.1 only (ALPN): send it there.
    Http1(Request<Body>),
}

/// One step of a send, taken under the worker's lock.
enum Step<F> {
    /// Handed to a ready connection.
    Sent(F, StreamSlot),
    /// A connection is being opened; the request waits for it.
    Wait(Opening, StreamSlot, Request<Body>),
    Http1(Request<Body>),
    Busy,
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
/// Upgrades, plain `http://` upstreams and those that choose HTTP/1.1 by ALPN
/// go over the HTTP/1.1 client.
#[derive(Debug)]
pub struct Spreads {
    light: H2Spread,
    light_h1: Option<LightH1>,
    bulk: H2Spread,
    h1: HttpClient,
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
            light: H2Spread::new(&config, limit, windows, MAX_CONNECTIONS),
            light_h1,
            bulk: H2Spread::new(
                &Connect {
                    read_pace: Some(super::read_ahead::BULK_PACE),
                    ..config.clone()
                },
                limit,
                windows,
                MAX_CONNECTIONS,
            ),
            h1: http_client(config, false),
        }
    }

    /// Sends `req` (its URI already on `upstream`) and returns the response head with the
    /// stream's slot, held until the response ends.
    pub(crate) async fn send(
        &self,
        upstream: &Upstream,
        req: Request<Body>,
        bulk: bool,
    ) -> Result<(Response<Incoming>, Option<StreamSlot>), SendError> {
        if !bulk {
            if let Some((client, slot)) = self.light_h1.as_ref().and_then(LightH1::acquire) {
                let resp = client.request(req).await.map_err(SendError::legacy)?;
                return Ok((resp, Some(slot)));
            }
        }
        if !upstream.is_https() {
            return Ok((self.send_h1(req).await?, None));
        }
        let spread = if bulk { &self.bulk } else { &self.light };
        match spread.send(upstream, req).await? {
            Sent::Response(resp, slot) => Ok((resp, Some(slot))),
            Sent::Http1(req) => Ok((self.send_h1(req).await?, None)),
        }
    }

    /// Sends `req` over HTTP/1.1 (an upgrade: the connection becomes the tunnel).
    pub(crate) async fn send_h1(
        &self,
        req: Request<Body>,
    ) -> Result<Response<Incoming>, SendError> {
        self.h1.request(req).await.map_err(SendError::legacy)
    }
}

/// A stream's flow-control window: on loopback or a LAN, 512 KiB in flight
/// streams far faster than an apiserver encodes.
const STREAM_WINDOW: u32 = 512 * 1024;
/// The largest window HTTP/2 allows (2^31 − 1).
const MAX_WINDOW: u32 = (1 << 31) - 1;

/// One open request's place on a connection; freed on drop.
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
    pub(crate) fn new(
        config: &Connect,
        limit: usize,
        windows: Option<(u32, u32)>,
        max_connections: usize,
    ) -> H2Spread {
        H2Spread {
            opener: Opener::new(config, windows),
            limit: limit.max(1),
            max_connections: max_connections.max(1),
            workers: (0..crate::workers::count())
                .map(|_| Mutex::new(Worker::default()))
                .collect(),
        }
    }

    fn worker(&self) -> MutexGuard<'_, Worker> {
        let index = crate::workers::current() % self.workers.len();
        self.workers[index]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `req` on a connection of this worker's to `upstream` with room for a stream,
    /// opening one if none has. A request that a connection closing (GOAWAY, a peer gone)
    /// hands back unsent goes out once more on another.
    pub(crate) async fn send(
        &self,
        upstream: &Upstream,
        mut req: Request<Body>,
    ) -> Result<Sent, SendError> {
        let mut again = true;
        loop {
            let step = {
                let mut worker = self.worker();
                let conns = worker.conns(upstream.index());
                // `None` when the upstream chose HTTP/1.1, checked first.
                match conns.pick(self.limit) {
                    _ if conns.http1 => Step::Http1(req),
                    Some(i) => {
                        let conn = &mut conns.open[i];
                        let slot = StreamSlot(conn.streams.clone());
                        match &mut conn.state {
                            State::Ready(sender) => Step::Sent(sender.try_send_request(req), slot),
                            State::Opening(rx) => Step::Wait(rx.clone(), slot, req),
                        }
                    }
                    None if conns.open.len() >= self.max_connections => Step::Busy,
                    None => {
                        let rx = self.open(upstream);
                        let streams = Arc::new(AtomicUsize::new(1));
                        let slot = StreamSlot(streams.clone());
                        conns.open.push(Conn {
                            state: State::Opening(rx.clone()),
                            streams,
                            last_used: Instant::now(),
                        });
                        Step::Wait(rx, slot, req)
                    }
                }
            };
            let (result, slot) = match step {
                Step::Sent(sending, slot) => (sending.await, slot),
                Step::Http1(req) => return Ok(Sent::Http1(req)),
                Step::Busy => {
                    return Err(SendError::Busy {
                        connections: self.max_connections,
                        streams: self.limit,
                    })
                }
                Step::Wait(rx, slot, req) => match wait(rx).await {
                    Ok(Opened::H2(mut sender)) => (sender.try_send_request(req).await, slot),
                    Ok(Opened::Http1) => {
                        self.worker().conns(upstream.index()).prune(Instant::now());
                        tracing::debug!(upstream = %upstream.url, "upstream chose HTTP/1.1");
                        return Ok(Sent::Http1(req));
                    }
                    Err(e) => {
                        self.worker().conns(upstream.index()).prune(Instant::now());
                        return Err(SendError::Connect(Box::new(e)));
                    }
                },
            };
            match result {
                Ok(resp) => return Ok(Sent::Response(resp, slot)),
                Err(mut e) => match e.take_message() {
                    Some(unsent) if again => {
                        tracing::debug!(error = %e.error(), "upstream connection closed; sending again");
                        again = false;
                        req = unsent;
                    }
                    _ => return Err(SendError::Request(Box::new(e.into_error()))),
                },
            }
        }
    }

    /// Starts opening a connection to `upstream` on this runtime; its result is published to
    /// every request that waits for it.
    fn open(&self, upstream: &Upstream) -> Opening {
        let (tx, rx) = watch::channel(None);
        let opener = self.opener.clone();
        let origin = upstream.origin().clone();
        tokio::spawn(async move {
            let opened = opener.open(origin).await;
            let _ = tx.send(Some(opened));
        });
        rx
    }

    /// HTTP/2 connections open or opening, on all workers.
    #[cfg(test)]
    fn opened(&self) -> usize {
        self.workers
            .iter()
            .map(|w| {
                let w = w.lock().unwrap_or_else(|e| e.into_inner());
                w.upstreams.iter().map(|c| c.open.len()).sum::<usize>()
            })
            .sum()
    }
}

impl Worker {
    fn conns(&mut self, upstream: usize) -> &mut Conns {
        if self.upstreams.len() <= upstream {
            self.upstreams.resize_with(upstream + 1, Conns::default);
        }
        &mut self.upstreams[upstream]
    }
}

impl Conns {
    /// The first connection with room for a stream (its stream counted), after [`Conns::prune`];
    /// `None` if every one is full, or the upstream chose HTTP/1.1.
    fn pick(&mut self, limit: usize) -> Option<usize> {
        let now = Instant::now();
        self.prune(now);
        if self.http1 {
            return None;
        }
        let i = self
            .open
            .iter()
            .position(|c| c.streams.load(Ordering::Relaxed) < limit)?;
        let conn = &mut self.open[i];
        conn.streams.fetch_add(1, Ordering::Relaxed);
        conn.last_used = now;
        Some(i)
    }

    /// Takes in the connections opened since, drops those closed (GOAWAY, the peer gone), failed
    /// or idle past [`IDLE`], and notes an upstream that chose HTTP/1.1.
    fn prune(&mut self, now: Instant) {
        let mut http1 = false;
        self.open.retain_mut(|c| {
            if let State::Opening(rx) = &c.state {
                let done = rx.borrow().clone();
                match done {
                    // Its task gone without a result (the runtime stopping): dropped.
                    None => return rx.has_changed().is_ok(),
                    Some(Ok(Opened::H2(sender))) => c.state = State::Ready(sender),
                    Some(Ok(Opened::Http1)) => {
                        http1 = true;
                        return false;
                    }
                    Some(Err(_)) => return false,
                }
            }
            let State::Ready(sender) = &c.state else {
                return true;
            };
            let idle = c.streams.load(Ordering::Relaxed) == 0
                && now.saturating_duration_since(c.last_used) >= IDLE;
            !sender.is_closed() && !idle
        });
        self.http1 |= http1;
    }
}

/// The connection a request waited for, once opened.
async fn wait(mut rx: Opening) -> Result<Opened, ConnectError> {
    match rx.wait_for(Option::is_some).await {
        Ok(done) => done.clone().unwrap_or_else(|| Err(abandoned())),
        Err(_) => Err(abandoned()),
    }
}

/// The task opening a connection ended without a result (its runtime shutting down).
fn abandoned() -> ConnectError {
    ConnectError::new(std::io::Error::other(
        "the connection attempt was abandoned",
    ))
}

/// The HTTP/1.1 clients (upgrades, tollgate's own requests) and the HTTPS-or-HTTP ones.
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
    let tcp = super::read_ahead::ReadAheadConnector {
        tcp: http,
        pace: config.read_pace,
    };
    let https = if h2 {
        builder.enable_http2().wrap_connector(tcp)
    } else {
        builder.wrap_connector(tcp)
    };
    TimedConnector::new(https, config.timeout)
}

#[cfg(test)]
#[path = "h2_spread_tests.rs"]
mod tests;
