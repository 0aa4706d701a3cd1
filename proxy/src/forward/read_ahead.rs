//! Upstream sockets read in large gulps. rustls asks its transport for at most 4 KiB at a time
//! (its deframer's read size), and kube-apiserver's HTTP/2 server writes a TLS record per 4 KiB
//! of a response (Go's HTTP/2 write buffer): 4,122 bytes on the wire, so relaying a LIST cost two
//! `recvfrom` calls per 4 KiB, each after its own readiness event. On kube-apiserver 1.37.2 with
//! 120 LISTs of 10,000 pods a minute, tollgate made ~11,000 reads and ~11,000 writes a second and
//! spent 0.46 of a core relaying them (bench/RESULTS.md, "What relaying a LIST costs"). A buffer
//! beneath TLS takes whatever the socket holds in one call and hands rustls its 4 KiB from memory.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, BufReader, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The buffer's size: 16 of the apiserver's records, or four of the largest TLS allows, in one
/// `recvfrom`. Allocated per upstream connection, whose number is bounded
/// ([`super::h2_spread::MAX_CONNECTIONS`] and the HTTP/1.1 client's limits).
pub const CAPACITY: usize = 64 * 1024;

/// On the connections that carry LISTs and watches ([`super::h2_spread::Spreads`]), after a read
/// that found less than the buffer holds, the next waits this long. Reading as soon as the
/// socket is readable takes one record per wake-up, since tollgate relays faster than the
/// apiserver encodes: with the buffer alone, 120 LISTs of 10,000 pods a minute on 1.37.2 still
/// cost 0.46 of a core in ~12,000 reads and writes a second. With a pause the records gather
/// and are relayed together ([`super::Coalesce`]): 0.33 of a core at 1 ms, 0.30 at 2 ms, with
/// the heartbeats' p99 from 57.6 ms to 40.9 and 36.4 (bench/RESULTS.md, "What relaying a LIST
/// costs"). A read that fills the buffer is not followed by a pause, so a stream faster than
/// the buffer per pause is never slowed; what a pause adds to a chunk of a bulk response is at
/// most 2 ms and tokio's timer millisecond. Light requests' connections read at once.
pub const BULK_PACE: Duration = Duration::from_millis(2);

/// A TCP connection whose reads go through a [`CAPACITY`] buffer, paced when `pace` is set;
/// writes go straight through.
#[derive(Debug)]
pub struct ReadAhead {
    io: BufReader<TcpStream>,
    pace: Option<Duration>,
    /// Set after a read that did not fill the buffer; the next socket read waits for it. One
    /// timer per connection, made at its first pause and reset at each later one.
    pause: Option<Pin<Box<Sleep>>>,
    paused: bool,
}

impl ReadAhead {
    pub fn new(tcp: TcpStream, pace: Option<Duration>) -> Self {
        ReadAhead {
            io: BufReader::with_capacity(CAPACITY, tcp),
            pace,
            pause: None,
            paused: false,
        }
    }
}

impl AsyncRead for ReadAhead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Only an empty buffer reads the socket: only then does a pause apply.
        let from_socket = this.io.buffer().is_empty();
        if from_socket && this.paused {
            if let Some(pause) = this.pause.as_mut() {
                ready!(pause.as_mut().poll(cx));
            }
            this.paused = false;
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        if from_socket {
            let got = buf.filled().len() - before + this.io.buffer().len();
            if let Some(pace) = this.pace.filter(|_| got > 0 && got < CAPACITY) {
                let until = tokio::time::Instant::now() + pace;
                match this.pause.as_mut() {
                    Some(pause) => pause.as_mut().reset(until),
                    None => this.pause = Some(Box::pin(tokio::time::sleep_until(until))),
                }
                this.paused = true;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ReadAhead {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl Connection for ReadAhead {
    fn connected(&self) -> Connected {
        self.io.get_ref().connected()
    }
}

/// hyper-util's TCP connector, its connections read ahead (and paced when `pace` is set).
#[derive(Debug, Clone)]
pub struct ReadAheadConnector {
    pub tcp: HttpConnector,
    pub pace: Option<Duration>,
}

impl tower_service::Service<Uri> for ReadAheadConnector {
    type Response = TokioIo<ReadAhead>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.tcp.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.tcp.call(uri);
        let pace = self.pace;
        Box::pin(async move {
            let tcp = connecting.await?;
            Ok(TokioIo::new(ReadAhead::new(tcp.into_inner(), pace)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn small_reads_are_served_from_one_large_read() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let sent: Vec<u8> = (0..48 * 1024).map(|i| (i % 251) as u8).collect();
        let payload = sent.clone();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            s.write_all(&payload).await.expect("write");
            // The client's echo of one byte: writes pass through.
            let mut b = [0u8; 1];
            s.read_exact(&mut b).await.expect("echo");
            b[0]
        });
        let mut r = ReadAhead::new(TcpStream::connect(addr).await.expect("connect"), None);
        // Wait until the whole payload is in the socket, so one read can take it.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut peek = vec![0u8; sent.len()];
        while r.io.get_ref().peek(&mut peek).await.expect("peek") < sent.len() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the payload never arrived"
            );
            tokio::task::yield_now().await;
        }
        let mut got = vec![0u8; 4096];
        r.read_exact(&mut got).await.expect("first 4 KiB");
        assert_eq!(&got[..], &sent[..4096]);
        // The rest is already in the buffer: no socket read is needed for it.
        assert_eq!(r.io.buffer().len(), sent.len() - 4096, "read in one gulp");
        let mut rest = Vec::new();
        while rest.len() < sent.len() - 4096 {
            let mut chunk = [0u8; 4096];
            let n = r.read(&mut chunk).await.expect("read");
            rest.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(&rest[..], &sent[4096..]);
        r.write_all(&[7]).await.expect("write through");
        r.flush().await.expect("flush");
        assert_eq!(server.await.expect("server"), 7);
    }

    /// A connected pair: the server's end and the client's, read ahead with `pace`.
    async fn pair(pace: Option<Duration>) -> (TcpStream, ReadAhead) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = TcpStream::connect(addr).await.expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        (server, ReadAhead::new(client, pace))
    }

    /// Until `n` bytes wait in `r`'s socket.
    async fn arrived(r: &ReadAhead, n: usize) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut peek = vec![0u8; n];
        while r.io.get_ref().peek(&mut peek).await.expect("peek") < n {
            assert!(tokio::time::Instant::now() < deadline, "never arrived");
            tokio::task::yield_now().await;
        }
    }

    fn poll_once(r: &mut ReadAhead, buf: &mut [u8]) -> Poll<io::Result<()>> {
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        Pin::new(r).poll_read(&mut cx, &mut ReadBuf::new(buf))
    }

    #[tokio::test]
    async fn after_a_read_that_found_little_the_next_waits_for_the_pace() {
        let pace = Duration::from_millis(50);
        let (mut server, mut r) = pair(Some(pace)).await;
        let mut buf = [0u8; 4096];
        server.write_all(&[1; 100]).await.expect("write");
        arrived(&r, 100).await;
        let started = tokio::time::Instant::now();
        assert!(
            poll_once(&mut r, &mut buf).is_ready(),
            "the first read is at once"
        );
        server.write_all(&[2; 100]).await.expect("write");
        arrived(&r, 100).await;
        assert!(
            poll_once(&mut r, &mut buf).is_pending(),
            "paused though data waits"
        );
        let n = r.read(&mut buf).await.expect("read");
        assert_eq!((n, buf[0]), (100, 2));
        assert!(started.elapsed() >= pace, "{:?}", started.elapsed());
        // Unpaced, the same is read at once.
        let (mut server, mut r) = pair(None).await;
        for b in [1u8, 2] {
            server.write_all(&[b; 100]).await.expect("write");
            arrived(&r, 100).await;
            assert!(poll_once(&mut r, &mut buf).is_ready(), "no pace");
        }
    }

    #[tokio::test]
    async fn a_read_that_fills_the_buffer_is_not_paused_after() {
        let (mut server, mut r) = pair(Some(Duration::from_secs(60))).await;
        let mut buf = [0u8; 4096];
        for round in 0..2u8 {
            server
                .write_all(&vec![round; CAPACITY])
                .await
                .expect("write");
            arrived(&r, CAPACITY).await;
            // The socket read fills the buffer whole: no pause of a minute after it.
            assert!(poll_once(&mut r, &mut buf).is_ready(), "round {round}");
            assert_eq!(buf[0], round);
            let mut rest = vec![0u8; CAPACITY - buf.len()];
            r.read_exact(&mut rest).await.expect("from the buffer");
        }
    }
}
