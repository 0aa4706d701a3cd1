//! What the client and admin listeners share:
//! - accepting with a backoff when accept fails (out of file descriptors:
//!   EMFILE, ENFILE), 10 ms doubling to 1 s, one log line a second at most
//!   and a counter (`tollgate_accept_errors_total`) — the admin listener
//!   used to retry at once and log millions of lines a second;
//! - the cap on connections open at once: past it a new connection is
//!   closed as soon as it is accepted (`tollgate_connections_refused_total`),
//!   so the kernel's backlog keeps draining and clients fail fast instead
//!   of waiting on a connection nobody serves;
//! - a cap per source address under it ([`Caps::per_source`]), so one address
//!   holding silent connections cannot lock the others out (it once could, until
//!   the handshake timeout);
//! - a reserve past the cap ([`Caps::reserve`]) whose connections are marked
//!   [`Accepted::reserved`]: the admin listener serves only its health endpoints
//!   on them, briefly, so a local user holding every admin connection cannot get
//!   tollgate restarted by its liveness probe;
//! - each connection's requests in flight ([`Activity`]) and serving it
//!   until it ends, is stopped, or has been idle too long ([`serve_until`]).

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::enforce::retry::LogLimiter;
use crate::metrics::{ListenerLabel, Metrics};
use crate::Body;

/// The first wait after a failed accept.
pub const BACKOFF_FIRST: Duration = Duration::from_millis(10);

/// The longest wait between accepts that keep failing.
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);

// === impl Backoff ===

/// The waits after consecutive accept failures: [`BACKOFF_FIRST`] doubling
/// to [`BACKOFF_MAX`]; a success starts over.
#[derive(Debug, Default)]
pub struct Backoff {
    next: Option<Duration>,
}

impl Backoff {
    /// An accept failed: how long to wait before the next.
    pub fn failed(&mut self) -> Duration {
        let wait = self.next.unwrap_or(BACKOFF_FIRST);
        self.next = Some((wait * 2).min(BACKOFF_MAX));
        wait
    }

    pub fn succeeded(&mut self) {
        self.next = None;
    }
}

// === impl Listener ===

/// A listener's bounds, read at each accept (so a reload applies at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Connections open at once.
    pub total: usize,
    /// Connections open at once from one address; `0`: no such cap.
    pub per_source: usize,
    /// Connections accepted past `total` (and past `per_source`), marked reserved.
    pub reserve: usize,
}

impl Caps {
    /// `total` connections, nothing else.
    pub fn total(total: usize) -> Caps {
        Caps {
            total,
            per_source: 0,
            reserve: 0,
        }
    }
}

/// A bound listener with its name (`client`, `admin`: the metrics' label).
pub struct Listener {
    tcp: TcpListener,
    name: &'static str,
    backoff: Backoff,
    /// One line a second for accept errors and refused connections together.
    log: LogLimiter,
    errors: Counter,
    refused: Counter,
    open: Gauge,
    /// Reserved connections open.
    reserved: Gauge,
    /// Connections open per source address; an address leaves at zero, so it
    /// holds at most as many as are open.
    sources: Sources,
}

/// An accepted connection; its `slot` under the cap is given back when dropped.
pub struct Accepted {
    pub tcp: TcpStream,
    pub remote: SocketAddr,
    pub slot: Slot,
    /// Accepted past the cap, into the reserve.
    pub reserved: bool,
}

/// Connections open per source address.
type Sources = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// One connection counted against its listener's caps until dropped.
#[derive(Debug)]
pub struct Slot {
    open: Gauge,
    source: Option<(Sources, IpAddr)>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.dec();
        if let Some((sources, ip)) = &self.source {
            let mut sources = sources.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = sources.get_mut(ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    sources.remove(ip);
                }
            }
        }
    }
}

impl Listener {
    pub fn new(tcp: TcpListener, name: &'static str, metrics: &Metrics) -> Listener {
        let label = ListenerLabel { listener: name };
        Listener {
            tcp,
            name,
            backoff: Backoff::default(),
            log: LogLimiter::new(Instant::now()),
            errors: metrics.accept_errors.get_or_create(&label).clone(),
            refused: metrics.connections_refused.get_or_create(&label).clone(),
            open: metrics.open_connections.get_or_create(&label).clone(),
            reserved: Gauge::default(),
            sources: Arc::default(),
        }
    }

    /// The next connection within `caps()`; `None` once `stop` is cancelled.
    pub async fn accept(
        &mut self,
        caps: impl Fn() -> Caps,
        stop: &CancellationToken,
    ) -> Option<Accepted> {
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => return None,
                accepted = self.tcp.accept() => accepted,
            };
            match accepted {
                Ok((tcp, remote)) => {
                    self.backoff.succeeded();
                    let caps = caps();
                    match self.admit(remote.ip(), caps) {
                        Some((slot, reserved)) => {
                            return Some(Accepted {
                                tcp,
                                remote,
                                slot,
                                reserved,
                            })
                        }
                        None => {
                            self.refused.inc();
                            if let Some(suppressed) = self.log.allow(1.0, Instant::now()) {
                                tracing::warn!(
                                    listener = self.name,
                                    cap = caps.total,
                                    per_source = caps.per_source,
                                    %remote,
                                    suppressed,
                                    "connection cap reached (for all or for this address): new connections are closed"
                                );
                            }
                        }
                    }
                }
                Err(e) => {
                    self.errors.inc();
                    let wait = self.backoff.failed();
                    if let Some(suppressed) = self.log.allow(1.0, Instant::now()) {
                        tracing::warn!(
                            listener = self.name,
                            error = %e,
                            retry_in = ?wait,
                            suppressed,
                            "accept failed; backing off"
                        );
                    }
                    tokio::select! {
                        _ = stop.cancelled() => return None,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// A slot for a connection from `ip` within `caps`, and whether it is a
    /// reserved one; `None` past every cap.
    fn admit(&self, ip: IpAddr, caps: Caps) -> Option<(Slot, bool)> {
        let at_cap =
            |gauge: &Gauge, cap: usize| usize::try_from(gauge.get()).is_ok_and(|open| open >= cap);
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let from_ip = sources.get(&ip).copied().unwrap_or(0);
        let over_source = caps.per_source > 0 && from_ip >= caps.per_source;
        if !over_source && !at_cap(&self.open, caps.total) {
            self.open.inc();
            *sources.entry(ip).or_insert(0) += 1;
            let slot = Slot {
                open: self.open.clone(),
                source: Some((self.sources.clone(), ip)),
            };
            return Some((slot, false));
        }
        if caps.reserve > 0 && !at_cap(&self.reserved, caps.reserve) {
            self.reserved.inc();
            let slot = Slot {
                open: self.reserved.clone(),
                source: None,
            };
            return Some((slot, true));
        }
        None
    }
}

// === serving one connection ===

/// What a connection served by a hyper connection future returns.
pub type ConnResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Why [`serve_until`] returned.
pub enum Until {
    /// The connection ended by itself.
    Ended(ConnResult),
    /// `stop` was cancelled: the caller closes the connection its own way.
    Stopped,
    /// No request in flight for `idle`: the caller closes it.
    Idle,
}

/// Serve `conn` until it ends, `stop` is cancelled, or it has had no
/// request in flight (per `activity`) for `idle`.
pub async fn serve_until<F>(
    mut conn: Pin<&mut F>,
    activity: &Activity,
    idle: Duration,
    stop: &CancellationToken,
) -> Until
where
    F: Future<Output = ConnResult>,
{
    let check = (idle / 4).max(Duration::from_millis(10));
    let side = Arc::new(SideWaker::default());
    let side_waker = Waker::from(side.clone());
    loop {
        let tick = tokio::time::sleep(check);
        let stopped = stop.cancelled();
        tokio::pin!(tick, stopped);
        side.woken.store(true, Ordering::Release);
        // The connection is polled at every wake-up; the stop signal and the idle check only
        // when their own waker fired (`select!` polled all three each time).
        let event = std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = conn.as_mut().poll(cx) {
                return Poll::Ready(Some(Until::Ended(r)));
            }
            side.task.register(cx.waker());
            if side.woken.swap(false, Ordering::AcqRel) {
                let mut side_cx = Context::from_waker(&side_waker);
                if stopped.as_mut().poll(&mut side_cx).is_ready() {
                    return Poll::Ready(Some(Until::Stopped));
                }
                if tick.as_mut().poll(&mut side_cx).is_ready() {
                    return Poll::Ready(None);
                }
            }
            Poll::Pending
        })
        .await;
        match event {
            Some(until) => return until,
            None if activity.idle_for() >= idle => return Until::Idle,
            None => {}
        }
    }
}

/// The waker of a connection's side futures (stop signal, idle check): it notes that one
/// of them was woken, then wakes the connection's task.
#[derive(Default)]
struct SideWaker {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for SideWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

// === impl Activity ===

/// Requests in flight on one connection and since when it has had none.
pub struct Activity {
    active: AtomicUsize,
    idle_since: std::sync::Mutex<Instant>,
}

/// One request in flight, until dropped.
pub struct ActiveGuard(Arc<Activity>);

impl Activity {
    pub fn new() -> Self {
        Activity {
            active: AtomicUsize::new(0),
            idle_since: std::sync::Mutex::new(Instant::now()),
        }
    }

    pub fn begin(self: &Arc<Self>) -> ActiveGuard {
        self.active.fetch_add(1, Ordering::Relaxed);
        ActiveGuard(self.clone())
    }

    /// Requests in flight on the connection now.
    pub fn in_flight(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// How long the connection has had no request in flight (zero if it has one).
    pub fn idle_for(&self) -> Duration {
        if self.active.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        self.idle_since
            .lock()
            .map(|t| t.elapsed())
            .unwrap_or_default()
    }
}

impl Default for Activity {
    fn default() -> Self {
        Activity::new()
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::Relaxed) == 1 {
            if let Ok(mut t) = self.0.idle_since.lock() {
                *t = Instant::now();
            }
        }
    }
}

/// A response body that keeps its request active until dropped.
pub struct ActiveBody {
    body: Body,
    _guard: ActiveGuard,
}

impl ActiveBody {
    pub fn new(body: Body, guard: ActiveGuard) -> Self {
        ActiveBody {
            body,
            _guard: guard,
        }
    }
}

impl http_body::Body for ActiveBody {
    type Data = bytes::Bytes;
    type Error = crate::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, crate::BoxError>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_10_ms_to_1_s_and_starts_over_after_a_success() {
        let mut b = Backoff::default();
        let waits: Vec<u64> = (0..9).map(|_| b.failed().as_millis() as u64).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.succeeded();
        assert_eq!(b.failed(), BACKOFF_FIRST);
    }

    /// A listener on an ephemeral loopback port, with metrics of its own.
    async fn on_loopback(name: &'static str) -> (Metrics, Listener, SocketAddr) {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::register(&mut registry);
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = tcp.local_addr().expect("addr");
        let listener = Listener::new(tcp, name, &metrics);
        (metrics, listener, addr)
    }

    #[tokio::test]
    async fn a_listener_past_its_cap_closes_new_connections_and_counts_them() {
        let (metrics, mut listener, addr) = on_loopback("client").await;
        let stop = CancellationToken::new();
        let label = ListenerLabel { listener: "client" };
        let _a = TcpStream::connect(addr).await.expect("connects");
        let first = listener
            .accept(|| Caps::total(1), &stop)
            .await
            .expect("accepted");
        assert_eq!(metrics.open_connections.get_or_create(&label).get(), 1);
        // A second one is closed at once; a third waits for the accept after the first closed.
        let mut b = TcpStream::connect(addr).await.expect("connects");
        let _c = TcpStream::connect(addr).await.expect("connects");
        let refused = metrics.connections_refused.get_or_create(&label).clone();
        let waiting = listener.accept(|| Caps::total(1), &stop);
        tokio::pin!(waiting);
        tokio::select! {
            _ = &mut waiting => panic!("accepted past the cap"),
            _ = async {
                while refused.get() < 2 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            } => {}
        }
        let mut buf = [0u8; 1];
        let n = tokio::io::AsyncReadExt::read(&mut b, &mut buf)
            .await
            .unwrap_or(0);
        assert_eq!(n, 0, "the refused connection is closed");
        drop(first);
        assert_eq!(metrics.open_connections.get_or_create(&label).get(), 0);
        let _d = TcpStream::connect(addr).await.expect("connects");
        let again = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        assert!(matches!(again, Ok(Some(_))), "accepted again under the cap");
    }

    /// Issue 34: with `maxConnections: 50`, 50 silent connections from one address
    /// locked out every other address.
    #[tokio::test]
    async fn one_address_at_its_cap_does_not_lock_out_another() {
        let (metrics, mut listener, addr) = on_loopback("client").await;
        let stop = CancellationToken::new();
        let caps = || Caps {
            total: 50,
            per_source: 10,
            reserve: 0,
        };
        // Two loopback source addresses: 127.0.0.1 holds its cap and keeps trying.
        let from = move |ip: [u8; 4]| async move {
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            socket
                .bind(SocketAddr::from((ip, 0)))
                .expect("binds a loopback source");
            socket.connect(addr).await.expect("connects")
        };
        let (a, b) = ([127, 0, 0, 1], [127, 0, 0, 2]);
        let mut held = Vec::new();
        let mut clients = Vec::new();
        for _ in 0..10 {
            clients.push(from(a).await);
            held.push(listener.accept(caps, &stop).await.expect("accepted"));
        }
        for _ in 0..40 {
            clients.push(from(a).await);
        }
        let _other = from(b).await;
        // The 40 past 127.0.0.1's cap are refused; 127.0.0.2's is accepted.
        let next = tokio::time::timeout(Duration::from_secs(10), listener.accept(caps, &stop))
            .await
            .expect("accepted in time")
            .expect("accepted");
        assert_eq!(next.remote.ip().to_string(), "127.0.0.2");
        let label = ListenerLabel { listener: "client" };
        assert_eq!(metrics.connections_refused.get_or_create(&label).get(), 40);
        // 127.0.0.1 gets a slot back when one of its connections closes.
        held.pop();
        let _again = from(a).await;
        let again = tokio::time::timeout(Duration::from_secs(10), listener.accept(caps, &stop))
            .await
            .expect("accepted in time")
            .expect("accepted");
        assert_eq!(again.remote.ip().to_string(), "127.0.0.1");
        assert!(!again.reserved);
    }

    #[tokio::test]
    async fn past_the_cap_the_reserve_is_marked() {
        let (metrics, mut listener, addr) = on_loopback("admin").await;
        let stop = CancellationToken::new();
        let caps = || Caps {
            total: 2,
            per_source: 0,
            reserve: 1,
        };
        let mut kept = Vec::new();
        for reserved in [false, false, true] {
            let _client = TcpStream::connect(addr).await.expect("connects");
            let c = listener.accept(caps, &stop).await.expect("accepted");
            assert_eq!(c.reserved, reserved);
            kept.push((_client, c));
        }
        // Past the reserve too: closed.
        let _client = TcpStream::connect(addr).await.expect("connects");
        let label = ListenerLabel { listener: "admin" };
        let refused = metrics.connections_refused.get_or_create(&label).clone();
        tokio::select! {
            _ = listener.accept(caps, &stop) => panic!("accepted past the reserve"),
            _ = async {
                while refused.get() < 1 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            } => {}
        }
        // A reserved connection closed frees its place in the reserve.
        kept.pop();
        let _client = TcpStream::connect(addr).await.expect("connects");
        let c = listener.accept(caps, &stop).await.expect("accepted");
        assert!(c.reserved);
    }
}
