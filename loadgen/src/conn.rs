//! The connections of one operation's driver: hyper's per-connection senders
//! (`client::conn::http1` / `http2`) owned by the driver's own thread, instead
//! of the pooled legacy client. No pool task and no cross-thread dispatch: the
//! driver, its requests and their connections all run on one current-thread
//! runtime, as wrk's thread owns its connections.
//!
//! HTTP/1.1 keeps a LIFO list of idle senders (a connection is idle again once
//! its response body has been read to the end) and opens another connection
//! when none is idle, so there are as many as requests in flight. HTTP/2 keeps
//! one multiplexed connection, opened on first use and replaced when it closes.
//! With `--http-version auto` over TLS, ALPN decides which of the two.
//!
//! The scheduled operations' drivers send HTTP/1.1 on their own client path
//! instead (`drive::h1`, on the wire in [`h1`]); they connect through
//! [`Conns::dial_h1`] and hand an HTTP/2 connection that ALPN chose to hyper here.

pub(crate) mod h1;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;

use crate::credentials::Credentials;
use crate::ops::Planned;
use crate::record::ErrorClass;
use crate::target::{HttpVersion, Target};

/// Connections one driver opens at once. When a driver falls behind (a busy
/// machine, a slow server), its due ticks leave together; without a bound each
/// opened a connection, the server's accept queue overflowed, SYNs were
/// retried after 1 s and 3 s, requests piled up and opened still more
/// connections. Beyond it, requests wait for a slot or for a connection
/// given back, whichever comes first (their latency still counts from the
/// intended start).
pub(crate) const MAX_OPENING: usize = 32;
/// How long opening a connection (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Sent with every request.
const USER_AGENT: HeaderValue = HeaderValue::from_static("loadgen/0.1");
const ACCEPT_JSON: HeaderValue = HeaderValue::from_static("application/json");

type H1 = http1::SendRequest<Full<Bytes>>;
type H2 = http2::SendRequest<Full<Bytes>>;

/// A freshly opened connection, of the version the server agreed to.
enum Opened {
    H1(H1),
    H2(H2),
}

/// A connection opened for the drivers' HTTP/1.1 path.
pub(crate) enum Dialed {
    H1(h1::Stream),
    /// ALPN chose HTTP/2: the connection is this [`Conns`]' HTTP/2 connection now.
    H2,
}

/// Which connection carried a request; given back with [`Conns::release`]
/// once the response body has been read to its end.
pub enum Lease {
    /// An HTTP/1.1 connection, idle again after its body.
    H1(H1),
    /// The shared HTTP/2 connection (nothing to give back).
    H2,
}

/// Opens connections; shared with connects that finish in the background.
struct Dialer {
    /// `host:port` to connect to.
    addr: String,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    http: HttpVersion,
    /// Connections being opened at once, at most [`MAX_OPENING`].
    opening: tokio::sync::Semaphore,
}

/// HTTP/1.1 senders not carrying a request, and requests waiting for one.
#[derive(Default)]
struct Idle {
    /// Most recently used last.
    senders: Vec<H1>,
    /// Requests that found no idle sender and are opening a connection: a
    /// sender given back goes to the oldest of them (whichever comes first,
    /// the connection or the sender, is used), as hyper's legacy pool does.
    /// Without it, a burst of ticks (a driver descheduled for a few
    /// milliseconds on a busy machine) opened a connection per request, and
    /// the server's accept queue overflowed.
    waiters: std::collections::VecDeque<tokio::sync::oneshot::Sender<H1>>,
}

/// One driver's connections to the target.
pub struct Conns {
    scheme: Scheme,
    authority: Authority,
    /// `Host` for HTTP/1.1.
    host: HeaderValue,
    /// The server URL's path prefix (`https://host/prefix`), without the trailing `/`.
    prefix: String,
    dialer: Arc<Dialer>,
    http: HttpVersion,
    credentials: Credentials,
    idle: Arc<Mutex<Idle>>,
    /// The HTTP/2 connection; a tokio mutex so that one handshake serves
    /// everyone waiting for it instead of each opening its own connection.
    h2: tokio::sync::Mutex<Option<H2>>,
    /// ALPN chose HTTP/2 (with `auto` over TLS); from then on every request uses it.
    negotiated_h2: AtomicBool,
}

impl Conns {
    /// Connections to `target`; nothing is opened until the first request.
    pub fn new(target: &Target) -> Conns {
        let server = &target.server;
        let scheme = server.scheme().cloned().unwrap_or(Scheme::HTTP);
        let authority = server
            .authority()
            .cloned()
            .unwrap_or_else(|| Authority::from_static("localhost"));
        let port = authority
            .port_u16()
            .unwrap_or(if scheme == Scheme::HTTPS { 443 } else { 80 });
        let host_name = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let tls = target.tls_config().map(|cfg| {
            let mut cfg = (*cfg).clone();
            cfg.alpn_protocols = match target.http {
                HttpVersion::Auto => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
                HttpVersion::Http1 => vec![b"http/1.1".to_vec()],
                HttpVersion::Http2 => vec![b"h2".to_vec()],
            };
            let name = target.tls_server_name().unwrap_or(host_name).to_string();
            // An invalid name fails the handshake, and so every request, with a clear class.
            let name = ServerName::try_from(name)
                .unwrap_or_else(|_| ServerName::try_from("invalid.invalid").expect("valid name"));
            (tokio_rustls::TlsConnector::from(Arc::new(cfg)), name)
        });
        Conns {
            host: HeaderValue::from_str(authority.as_str())
                .unwrap_or_else(|_| HeaderValue::from_static("localhost")),
            prefix: server.path().trim_end_matches('/').to_string(),
            dialer: Arc::new(Dialer {
                addr: format!("{}:{port}", authority.host()),
                tls,
                http: target.http,
                opening: tokio::sync::Semaphore::new(MAX_OPENING),
            }),
            scheme,
            authority,
            http: target.http,
            credentials: target.credentials.clone(),
            idle: Arc::default(),
            h2: tokio::sync::Mutex::new(None),
            negotiated_h2: AtomicBool::new(false),
        }
    }

    /// Requests go over HTTP/2 (asked for, or chosen by ALPN).
    pub(crate) fn use_h2(&self) -> bool {
        self.http == HttpVersion::Http2 || self.negotiated_h2.load(Ordering::Relaxed)
    }

    /// Sends `planned`; the caller reads the body, then calls [`release`](Self::release).
    pub async fn send(&self, planned: &Planned) -> Result<(Response<Incoming>, Lease), ErrorClass> {
        // The HTTP/2 path and connecting (a TLS handshake holds a whole
        // rustls connection) are boxed: inline, they made every request's
        // state machine ~10 KB, copied and allocated outside malloc's fast
        // bins for each request (10% of the driver's time).
        if self.use_h2() {
            return Box::pin(self.send_h2(planned)).await;
        }
        // A kept-alive connection the server closed while it was idle fails
        // before the request is written: hyper hands the request back, and it
        // goes out once more on a fresh connection (as the legacy pool did).
        let mut req = self.request(planned, false)?;
        for fresh in [false, true] {
            let mut sender = match self.checkout(fresh).await? {
                Opened::H1(s) => s,
                Opened::H2(s) => {
                    self.negotiated_h2.store(true, Ordering::Relaxed);
                    *self.h2.lock().await = Some(s);
                    return Box::pin(self.send_h2(planned)).await;
                }
            };
            match sender.try_send_request(req).await {
                Ok(resp) => return Ok((resp, Lease::H1(sender))),
                Err(mut e) => match e.take_message() {
                    Some(again) if !fresh => req = again,
                    _ => return Err(classify(e.error())),
                },
            }
        }
        Err(ErrorClass::Connection)
    }

    /// Gives a connection back after its response body was read to the end.
    pub fn release(&self, lease: Lease) {
        if let Lease::H1(s) = lease {
            put_idle(&self.idle, s);
        }
    }

    /// The server URL's path prefix, put before every request's path.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// `host`, `accept` and `user-agent` as HTTP/1.1 header lines.
    pub(crate) fn fixed_headers(&self) -> Vec<u8> {
        h1::fixed_headers(&self.host, ACCEPT_JSON.as_bytes(), USER_AGENT.as_bytes())
    }

    /// Opens a connection for the drivers' HTTP/1.1 path. If ALPN chooses
    /// HTTP/2 (`--http-version auto` over TLS), it becomes the HTTP/2
    /// connection here, and every later request goes to hyper's HTTP/2 client.
    pub(crate) async fn dial_h1(&self) -> Result<Dialed, ErrorClass> {
        let (stream, h2) = self.dialer.stream().await?;
        if !h2 {
            return Ok(Dialed::H1(stream));
        }
        let Opened::H2(s) = Dialer::handshake(TokioIo::new(stream), true).await? else {
            return Err(ErrorClass::Protocol);
        };
        self.negotiated_h2.store(true, Ordering::Relaxed);
        *self.h2.lock().await = Some(s);
        Ok(Dialed::H2)
    }

    /// A request's credentials were refused (401).
    pub fn unauthorized(&self) {
        self.credentials.unauthorized();
    }

    /// An idle HTTP/1.1 sender ready for a request, else whichever comes
    /// first: a new connection or a sender given back meanwhile (the
    /// connection is then finished in the background and kept idle).
    async fn checkout(&self, fresh: bool) -> Result<Opened, ErrorClass> {
        if fresh {
            return Box::pin(self.dialer.clone().open()).await;
        }
        let mut connecting = None;
        loop {
            let waiting = {
                let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                match idle.senders.pop() {
                    Some(s) => Ok(s),
                    None => {
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        idle.waiters.push_back(tx);
                        Err(rx)
                    }
                }
            };
            let mut sender = match waiting {
                Ok(s) => s,
                Err(mut rx) => {
                    let connect =
                        connecting.get_or_insert_with(|| Box::pin(self.dialer.clone().open()));
                    tokio::select! {
                        biased;
                        opened = connect.as_mut() => {
                            // A sender handed over at the same moment would
                            // be dropped with `rx`, closing its connection.
                            rx.close();
                            if let Ok(s) = rx.try_recv() {
                                put_idle(&self.idle, s);
                            }
                            return opened;
                        }
                        Ok(s) = &mut rx => s,
                    }
                }
            };
            // Ready at once unless the connection task has not yet seen the
            // end of the previous response; an error means it closed.
            if sender.ready().await.is_ok() {
                if let Some(connect) = connecting {
                    let idle = self.idle.clone();
                    tokio::spawn(async move {
                        if let Ok(Opened::H1(s)) = connect.await {
                            put_idle(&idle, s);
                        }
                    });
                }
                return Ok(Opened::H1(sender));
            }
        }
    }

    async fn send_h2(&self, planned: &Planned) -> Result<(Response<Incoming>, Lease), ErrorClass> {
        let mut sender = {
            let mut slot = self.h2.lock().await;
            match slot.as_ref().filter(|s| !s.is_closed()) {
                Some(s) => s.clone(),
                None => {
                    let Opened::H2(s) = Box::pin(self.dialer.clone().open()).await? else {
                        // The server chose HTTP/1.1 though only h2 was offered.
                        return Err(ErrorClass::Protocol);
                    };
                    *slot = Some(s.clone());
                    s
                }
            }
        };
        let req = self.request(planned, true)?;
        // Waits for a stream slot when the server's concurrency limit is reached.
        sender.ready().await.map_err(|e| classify(&e))?;
        let resp = sender.send_request(req).await.map_err(|e| classify(&e))?;
        Ok((resp, Lease::H2))
    }

    /// The request for `planned`: origin-form with `Host` for HTTP/1.1, the
    /// absolute URI (HTTP/2's `:scheme` and `:authority`) for HTTP/2.
    fn request(&self, planned: &Planned, h2: bool) -> Result<Request<Full<Bytes>>, ErrorClass> {
        let path = if self.prefix.is_empty() {
            Bytes::from(planned.path.clone())
        } else {
            Bytes::from(format!("{}{}", self.prefix, planned.path))
        };
        let path = PathAndQuery::from_maybe_shared(path).map_err(|_| ErrorClass::Protocol)?;
        let uri = if h2 {
            let mut parts = http::uri::Parts::default();
            parts.scheme = Some(self.scheme.clone());
            parts.authority = Some(self.authority.clone());
            parts.path_and_query = Some(path);
            Uri::from_parts(parts).map_err(|_| ErrorClass::Protocol)?
        } else {
            Uri::from(path)
        };
        let body = match &planned.body {
            Some((_, bytes)) => Full::new(bytes.clone()),
            None => Full::new(Bytes::new()),
        };
        let mut req = Request::new(body);
        *req.method_mut() = planned.method.clone();
        *req.uri_mut() = uri;
        let headers = req.headers_mut();
        if !h2 {
            headers.insert(http::header::HOST, self.host.clone());
        }
        headers.insert(http::header::ACCEPT, ACCEPT_JSON);
        headers.insert(http::header::USER_AGENT, USER_AGENT);
        if let Some(auth) = self.credentials.authorization() {
            headers.insert(http::header::AUTHORIZATION, auth);
        }
        if let Some((content_type, _)) = &planned.body {
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static(content_type),
            );
        }
        Ok(req)
    }
}

// === impl Dialer ===

impl Dialer {
    /// Opens a connection (TCP, then TLS with ALPN) and starts its task on
    /// this thread's runtime.
    async fn open(self: Arc<Self>) -> Result<Opened, ErrorClass> {
        let (stream, h2) = self.stream().await?;
        Self::handshake(TokioIo::new(stream), h2).await
    }

    /// Opens a byte stream (TCP, then TLS with ALPN): whether to speak HTTP/2 on it.
    async fn stream(&self) -> Result<(h1::Stream, bool), ErrorClass> {
        // Never closed, so acquiring cannot fail.
        let _slot = self
            .opening
            .acquire()
            .await
            .map_err(|_| ErrorClass::Connection)?;
        let connect = async {
            let tcp = tokio::net::TcpStream::connect(&self.addr)
                .await
                .map_err(|_| ErrorClass::Connection)?;
            tcp.set_nodelay(true).map_err(|_| ErrorClass::Connection)?;
            match &self.tls {
                None => Ok((h1::Stream::Plain(tcp), self.http == HttpVersion::Http2)),
                Some((connector, name)) => {
                    let tls = connector
                        .connect(name.clone(), tcp)
                        .await
                        .map_err(|_| ErrorClass::Connection)?;
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                    Ok((
                        h1::Stream::Tls(Box::new(tls)),
                        h2 || self.http == HttpVersion::Http2,
                    ))
                }
            }
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| ErrorClass::Connection)?
    }

    async fn handshake<T>(io: TokioIo<T>, h2: bool) -> Result<Opened, ErrorClass>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        if h2 {
            let (sender, conn) = http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| classify(&e))?;
            tokio::spawn(conn);
            Ok(Opened::H2(sender))
        } else {
            let (sender, conn) = http1::handshake(io).await.map_err(|e| classify(&e))?;
            tokio::spawn(conn);
            Ok(Opened::H1(sender))
        }
    }
}

/// Gives an HTTP/1.1 sender to the oldest request still waiting, else keeps it idle.
fn put_idle(idle: &Mutex<Idle>, mut sender: H1) {
    if sender.is_closed() {
        return;
    }
    let mut idle = idle.lock().unwrap_or_else(|p| p.into_inner());
    while let Some(waiter) = idle.waiters.pop_front() {
        match waiter.send(sender) {
            Ok(()) => return,
            // That request got its own connection first.
            Err(back) => sender = back,
        }
    }
    idle.senders.push(sender);
}

/// A hyper error as an error class: a broken or refused connection, or a
/// protocol violation.
pub fn classify(e: &hyper::Error) -> ErrorClass {
    if e.is_closed() || e.is_incomplete_message() || e.is_canceled() {
        return ErrorClass::Connection;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<std::io::Error>() {
            return ErrorClass::Connection;
        }
        source = s.source();
    }
    ErrorClass::Protocol
}
