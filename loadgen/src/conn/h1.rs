//! HTTP/1.1 on the wire for the drivers' own client path: a request written
//! from pre-serialized bytes, the response head parsed with `httparse`, the
//! body (Content-Length, chunked, or to the connection's end) read and
//! counted through one buffer reused for every request on the connection.
//!
//! Why not hyper here: its client splits each request between the caller and
//! a connection task (an mpsc send and a oneshot per request, a second task
//! woken per response) and builds header maps both ways. A driver sends one
//! request at a time per connection and reads four response headers, so the
//! request future does the I/O itself (see `drive::h1`).

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use apimodel::headers::{LANE_HEADER, PRIORITY_LEVEL_HEADER};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::ops::Planned;
use crate::record::{ClassSource, ErrorClass};

/// Largest response head read; a longer one is a protocol error (hyper's
/// default limit is larger, but an apiserver head is well under 1 KB).
const MAX_HEAD: usize = 64 * 1024;
/// Most response headers parsed (hyper's limit).
const MAX_HEADERS: usize = 100;
/// The read buffer's size: one read takes a whole small response.
const READ_CHUNK: usize = 16 * 1024;
/// Longest chunk-size or trailer line.
const MAX_LINE: usize = 4 * 1024;

/// A connection's byte stream: plain TCP or TLS (rustls) over it.
pub enum Stream {
    Plain(TcpStream),
    /// Boxed: a rustls connection is ~1 KB, moved with every checkout otherwise.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// What the driver's client reads from a response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// Body bytes (after chunked decoding), as hyper's data frames count them.
    pub bytes: u64,
    /// `X-Tollgate-Lane`, else `X-Kubernetes-PF-PriorityLevel-UID`.
    pub class: Option<(ClassSource, String)>,
    /// `Retry-After` in seconds.
    pub retry_after: Option<Duration>,
    /// The first bytes of the body, when asked for (see [`Conn::exchange`]).
    pub kept: Vec<u8>,
}

/// How the body of a response ends.
#[derive(Debug, Clone, Copy)]
enum Framing {
    Empty,
    Length(u64),
    Chunked,
    /// No length: the body ends when the server closes the connection.
    Close,
}

/// The facts of a response head, owned (the parsed head borrows the buffer).
struct Head {
    status: u16,
    framing: Framing,
    /// The server will close the connection after this response.
    close: bool,
    class: Option<(ClassSource, String)>,
    retry_after: Option<Duration>,
}

/// Why an exchange failed; `fresh_retry` says the request may go out once more
/// on a new connection (see [`Conn::exchange`]).
#[derive(Debug, Clone, Copy)]
pub struct Failure {
    pub class: ErrorClass,
    pub fresh_retry: bool,
}

/// One HTTP/1.1 connection and its buffers.
pub struct Conn {
    io: Stream,
    /// The request being written; kept for its capacity.
    wbuf: Vec<u8>,
    /// Bytes read; `rbuf[pos..]` not yet consumed.
    rbuf: Vec<u8>,
    pos: usize,
    /// Responses read on this connection so far.
    served: u64,
}

impl Conn {
    pub fn new(io: Stream) -> Conn {
        Conn {
            io,
            wbuf: Vec::with_capacity(512),
            rbuf: Vec::with_capacity(READ_CHUNK),
            pos: 0,
            served: 0,
        }
    }

    /// Whether an idle connection can carry a request: the server has not
    /// closed it or sent anything unasked. Costs a system call only when the
    /// socket was reported readable (a close, or TLS 1.3's session tickets,
    /// which the TLS layer takes in without returning data).
    pub fn poll_usable(&mut self, cx: &mut Context<'_>) -> bool {
        match self.io.tcp().poll_read_ready(cx) {
            Poll::Pending => return true,
            Poll::Ready(Err(_)) => return false,
            Poll::Ready(Ok(())) => {}
        }
        let mut probe = [0u8; 64];
        let mut buf = ReadBuf::new(&mut probe);
        // Ready means the end of the stream, bytes nobody asked for, or an error.
        Pin::new(&mut self.io).poll_read(cx, &mut buf).is_pending()
    }

    /// Writes `request` (already serialized by [`write_request`] into
    /// [`Conn::request_buf`]) and reads the response to its end. The body is
    /// counted; its first `keep(status)` bytes are kept. On success, whether
    /// the connection may carry another request.
    pub async fn exchange(
        &mut self,
        keep: impl Fn(u16) -> usize,
        idempotent: bool,
    ) -> Result<(Response, bool), Failure> {
        let reused = self.served > 0;
        // A kept-alive connection the server closed meanwhile fails before a
        // response byte arrives: a request that was not (fully) written, or an
        // idempotent one, may go out once more on a fresh connection, as
        // hyper's pool and browsers do.
        let early = |class: ErrorClass, written: bool| Failure {
            class,
            fresh_retry: reused && (!written || idempotent),
        };
        if self.io.write_all(&self.wbuf).await.is_err() {
            return Err(early(ErrorClass::Connection, false));
        }
        if self.io.flush().await.is_err() {
            return Err(early(ErrorClass::Connection, false));
        }
        self.rbuf.clear();
        self.pos = 0;
        let head = loop {
            // What is buffered is parsed first: an informational response may
            // have arrived together with the real one.
            let parsed = if self.rbuf.is_empty() {
                None
            } else {
                parse_head(&self.rbuf).map_err(fail)?
            };
            match parsed {
                Some((n, head)) if (100..200).contains(&head.status) && head.status != 101 => {
                    // An informational response (100 Continue): the real one follows.
                    self.rbuf.drain(..n);
                    continue;
                }
                Some((n, head)) => {
                    self.pos = n;
                    break head;
                }
                None if self.rbuf.len() > MAX_HEAD => return Err(fail(ErrorClass::Protocol)),
                None => {}
            }
            match self.read_more().await {
                Ok(0) if self.rbuf.is_empty() => return Err(early(ErrorClass::Connection, true)),
                Ok(0) => return Err(fail(ErrorClass::Connection)),
                Ok(_) => {}
                Err(_) if self.rbuf.is_empty() => return Err(early(ErrorClass::Connection, true)),
                Err(_) => return Err(fail(ErrorClass::Connection)),
            }
        };
        if head.status == 101 {
            // Switching protocols: nothing this client asked for.
            return Err(fail(ErrorClass::Protocol));
        }
        let limit = keep(head.status);
        let mut body = Body {
            bytes: 0,
            kept: Vec::new(),
            limit,
        };
        let mut reusable = !head.close;
        match head.framing {
            Framing::Empty => {}
            Framing::Length(n) => self.read_length(n, &mut body).await?,
            Framing::Chunked => self.read_chunked(&mut body).await?,
            Framing::Close => {
                self.read_to_close(&mut body).await?;
                reusable = false;
            }
        }
        // Bytes after the response were never asked for: the connection's
        // framing is off, so it is not used again.
        reusable &= self.pos == self.rbuf.len();
        self.served += 1;
        Ok((
            Response {
                status: head.status,
                bytes: body.bytes,
                class: head.class,
                retry_after: head.retry_after,
                kept: body.kept,
            },
            reusable,
        ))
    }

    /// The buffer [`write_request`] fills.
    pub fn request_buf(&mut self) -> &mut Vec<u8> {
        &mut self.wbuf
    }

    /// Reads more bytes after `rbuf`'s end; `Ok(0)` at the end of the stream.
    async fn read_more(&mut self) -> io::Result<usize> {
        if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
            self.rbuf.reserve(READ_CHUNK);
        }
        self.io.read_buf(&mut self.rbuf).await
    }

    /// Makes room for the next read once everything read was consumed, so a
    /// large body streams through the same buffer.
    fn consumed_all(&mut self) {
        if self.pos == self.rbuf.len() {
            self.rbuf.clear();
            self.pos = 0;
        }
    }

    async fn read_length(&mut self, mut left: u64, body: &mut Body) -> Result<(), Failure> {
        loop {
            let avail = &self.rbuf[self.pos..];
            let take = usize::try_from(left).unwrap_or(usize::MAX).min(avail.len());
            body.data(&avail[..take]);
            self.pos += take;
            left -= take as u64;
            if left == 0 {
                return Ok(());
            }
            self.consumed_all();
            match self.read_more().await {
                // The body broke off.
                Ok(0) | Err(_) => return Err(fail(ErrorClass::Connection)),
                Ok(_) => {}
            }
        }
    }

    async fn read_to_close(&mut self, body: &mut Body) -> Result<(), Failure> {
        loop {
            body.data(&self.rbuf[self.pos..]);
            self.pos = self.rbuf.len();
            self.consumed_all();
            match self.read_more().await {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(_) => return Err(fail(ErrorClass::Connection)),
            }
        }
    }

    async fn read_chunked(&mut self, body: &mut Body) -> Result<(), Failure> {
        let mut state = Chunk::Size;
        loop {
            // Decode what is buffered, then read more.
            loop {
                let avail = &self.rbuf[self.pos..];
                let step = match state {
                    Chunk::Size => match httparse::parse_chunk_size(avail) {
                        Ok(httparse::Status::Complete((n, 0))) => {
                            self.pos += n;
                            state = Chunk::Trailers;
                            continue;
                        }
                        Ok(httparse::Status::Complete((n, size))) => {
                            self.pos += n;
                            state = Chunk::Data(size);
                            continue;
                        }
                        Ok(httparse::Status::Partial) if avail.len() > MAX_LINE => {
                            return Err(fail(ErrorClass::Protocol))
                        }
                        Ok(httparse::Status::Partial) => None,
                        Err(_) => return Err(fail(ErrorClass::Protocol)),
                    },
                    Chunk::Data(left) => {
                        let take = usize::try_from(left).unwrap_or(usize::MAX).min(avail.len());
                        body.data(&avail[..take]);
                        self.pos += take;
                        let left = left - take as u64;
                        state = if left == 0 {
                            Chunk::DataEnd
                        } else {
                            Chunk::Data(left)
                        };
                        if left == 0 {
                            continue;
                        }
                        None
                    }
                    Chunk::DataEnd => match avail {
                        [b'\r', b'\n', ..] => {
                            self.pos += 2;
                            state = Chunk::Size;
                            continue;
                        }
                        [] | [b'\r'] => None,
                        _ => return Err(fail(ErrorClass::Protocol)),
                    },
                    // Trailer lines up to an empty one; their content is not used.
                    Chunk::Trailers => match avail.windows(2).position(|w| w == b"\r\n") {
                        Some(0) => Some(2),
                        Some(line) => {
                            self.pos += line + 2;
                            continue;
                        }
                        None if avail.len() > MAX_LINE => return Err(fail(ErrorClass::Protocol)),
                        None => None,
                    },
                };
                if let Some(last) = step {
                    self.pos += last;
                    return Ok(());
                }
                break;
            }
            // Keep an unfinished line, drop what was consumed.
            if self.pos > 0 {
                self.rbuf.drain(..self.pos);
                self.pos = 0;
            }
            match self.read_more().await {
                Ok(0) | Err(_) => return Err(fail(ErrorClass::Connection)),
                Ok(_) => {}
            }
        }
    }
}

/// Where the chunked decoder is.
#[derive(Clone, Copy)]
enum Chunk {
    Size,
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    Trailers,
}

/// A body being read: counted, its start kept up to `limit`.
struct Body {
    bytes: u64,
    kept: Vec<u8>,
    limit: usize,
}

impl Body {
    fn data(&mut self, data: &[u8]) {
        self.bytes += data.len() as u64;
        let room = self.limit.saturating_sub(self.kept.len());
        if room > 0 {
            self.kept.extend_from_slice(&data[..data.len().min(room)]);
        }
    }
}

fn fail(class: ErrorClass) -> Failure {
    Failure {
        class,
        fresh_retry: false,
    }
}

/// Parses a response head: `None` while incomplete, else its length and facts.
fn parse_head(buf: &[u8]) -> Result<Option<(usize, Head)>, ErrorClass> {
    // Uninitialized: filling 100 empty headers cost more than parsing a head.
    let mut headers = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    let n = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut resp,
        buf,
        &mut headers,
    ) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(ErrorClass::Protocol),
    };
    let status = resp.code.ok_or(ErrorClass::Protocol)?;
    // HTTP/1.0 closes after each response (this client never asks for keep-alive there).
    let mut close = resp.version != Some(1);
    let mut length = None;
    let mut chunked = false;
    let mut lane = None;
    let mut level = None;
    let mut retry_after = None;
    for h in resp.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or(ErrorClass::Protocol)?;
            // Differing lengths make the framing ambiguous (RFC 9112 §6.3).
            if length.is_some_and(|l| l != v) {
                return Err(ErrorClass::Protocol);
            }
            length = Some(v);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // Chunked only when it is the last coding (RFC 9112 §6.3).
            chunked = h
                .value
                .rsplit(|&b| b == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            if !chunked {
                return Err(ErrorClass::Protocol);
            }
        } else if name.eq_ignore_ascii_case("connection") {
            close |= h
                .value
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
        } else if name.eq_ignore_ascii_case(LANE_HEADER) {
            lane = lane.or(visible_ascii(h.value));
        } else if name.eq_ignore_ascii_case(PRIORITY_LEVEL_HEADER) {
            level = level.or(visible_ascii(h.value));
        } else if name.eq_ignore_ascii_case("retry-after") {
            retry_after = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
        }
    }
    let framing = if status == 204 || status == 304 || (100..200).contains(&status) {
        Framing::Empty
    } else if chunked {
        // Transfer-Encoding overrides Content-Length (RFC 9112 §6.3); the
        // connection is not trusted afterwards.
        close |= length.is_some();
        Framing::Chunked
    } else {
        match length {
            Some(0) => Framing::Empty,
            Some(n) => Framing::Length(n),
            None => Framing::Close,
        }
    };
    let class = lane
        .map(|v| (ClassSource::Lane, v))
        .or(level.map(|v| (ClassSource::PriorityLevel, v)));
    Ok(Some((
        n,
        Head {
            status,
            framing,
            close,
            class,
            retry_after,
        },
    )))
}

/// A header value as text when it is visible ASCII, as `HeaderValue::to_str` requires.
fn visible_ascii(v: &[u8]) -> Option<String> {
    v.iter()
        .all(|&b| b == b'\t' || (b' '..0x7f).contains(&b))
        .then(|| String::from_utf8_lossy(v).into_owned())
}

/// Serializes the request for `planned` into `out`: the request line, `fixed`
/// (headers the same for every request, serialized once per driver), the
/// credentials' header, and the body with its type and length.
pub fn write_request(
    out: &mut Vec<u8>,
    planned: &Planned,
    prefix: &str,
    fixed: &[u8],
    authorization: Option<&http::HeaderValue>,
) -> Result<(), ErrorClass> {
    // Bytes that would end the request line early (or split the request) are
    // refused, as hyper's URI parser refuses them.
    if prefix
        .bytes()
        .chain(planned.path.bytes())
        .any(|b| b <= b' ' || b == 0x7f)
        || !planned.path.starts_with('/')
    {
        return Err(ErrorClass::Protocol);
    }
    out.clear();
    out.extend_from_slice(planned.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(prefix.as_bytes());
    out.extend_from_slice(planned.path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    out.extend_from_slice(fixed);
    if let Some(auth) = authorization {
        out.extend_from_slice(b"authorization: ");
        out.extend_from_slice(auth.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match &planned.body {
        Some((content_type, body)) => {
            out.extend_from_slice(b"content-type: ");
            out.extend_from_slice(content_type.as_bytes());
            out.extend_from_slice(b"\r\ncontent-length: ");
            out.extend_from_slice(body.len().to_string().as_bytes());
            out.extend_from_slice(b"\r\n\r\n");
            out.extend_from_slice(body);
        }
        None => {
            // A body-less POST/PUT/PATCH still says so (servers may insist on a length).
            if matches!(
                planned.method,
                http::Method::POST | http::Method::PUT | http::Method::PATCH
            ) {
                out.extend_from_slice(b"content-length: 0\r\n");
            }
            out.extend_from_slice(b"\r\n");
        }
    }
    Ok(())
}

/// The headers every request of a driver carries: `host`, `accept`, `user-agent`.
pub fn fixed_headers(host: &http::HeaderValue, accept: &[u8], user_agent: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(96);
    for (name, value) in [
        (&b"host"[..], host.as_bytes()),
        (b"accept", accept),
        (b"user-agent", user_agent),
    ] {
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out
}

#[cfg(test)]
mod tests;
