//! The spread against a TLS upstream on loopback that counts the connections it accepts.

use std::convert::Infallible;
use std::path::Path;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use super::*;

const WAIT: Duration = Duration::from_secs(10);

/// A TLS upstream answering every request 200 at once.
struct Server {
    upstream: Upstream,
    tls: rustls::ClientConfig,
    accepted: Arc<AtomicUsize>,
    /// Changed: every connection is shut down gracefully (GOAWAY).
    goaway: watch::Sender<()>,
}

impl Server {
    /// Offering `alpn` (h2 and http/1.1, or one of them).
    async fn start(alpn: &[&[u8]]) -> Server {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let origin = Path::new("test");
        let identity = crate::tls::identity_from_pem(
            cert.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
            origin,
        )
        .expect("identity");
        let mut config = crate::tls::server_config(identity, None).expect("server config");
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let roots = crate::tls::roots_from_pem(cert.pem().as_bytes(), origin).expect("roots");
        let tls = crate::tls::client_config(Some(&roots), None).expect("client config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let (goaway, goaway_rx) = watch::channel(());
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::Relaxed);
                let (acceptor, mut goaway) = (acceptor.clone(), goaway_rx.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                    let svc = service_fn(|_req| async {
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                    });
                    if !h2 {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tls), svc)
                            .await;
                        return;
                    }
                    let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc);
                    tokio::pin!(conn);
                    tokio::select! {
                        _ = conn.as_mut() => return,
                        _ = goaway.changed() => conn.as_mut().graceful_shutdown(),
                    }
                    let _ = conn.await;
                });
            }
        });
        Server {
            upstream: Upstream::parse(&format!("https://{addr}"), 0).expect("upstream"),
            tls,
            accepted,
            goaway,
        }
    }

    fn spread(&self, limit: usize, max_connections: usize) -> H2Spread {
        let connect = Connect {
            tls: self.tls.clone(),
            timeout: Duration::from_secs(5),
            ping: (Duration::from_secs(30), Duration::from_secs(20)),
            read_pace: None,
        };
        H2Spread::new(&connect, limit, None, max_connections)
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

fn get(upstream: &Upstream) -> Request<Body> {
    let uri = format!("{}x", upstream.origin());
    Request::get(uri)
        .body(crate::status::full(Bytes::new()))
        .expect("request")
}

/// A 200 over HTTP/2 and its stream's slot.
async fn send(spread: &H2Spread, upstream: &Upstream) -> StreamSlot {
    let sent = tokio::time::timeout(WAIT, spread.send(upstream, get(upstream)))
        .await
        .expect("answered in time");
    match sent {
        Ok(Sent::Response(resp, slot)) => {
            assert_eq!(resp.status(), http::StatusCode::OK);
            assert_eq!(resp.version(), http::Version::HTTP_2);
            slot
        }
        Ok(Sent::Http1(_)) => panic!("sent back to HTTP/1.1"),
        Err(e) => panic!("failed: {e:?}"),
    }
}

fn install() {
    crate::install_crypto_provider();
}

/// Requests sent together into a new spread wait for the one connection being opened instead
/// of each opening its own.
#[tokio::test]
async fn a_burst_opens_one_connection() {
    install();
    let server = Server::start(&[b"h2", b"http/1.1"]).await;
    let spread = server.spread(100, MAX_CONNECTIONS);
    let slots =
        futures_util::future::join_all((0..20).map(|_| send(&spread, &server.upstream))).await;
    assert_eq!(slots.len(), 20);
    assert_eq!(server.accepted(), 1, "one connection for the burst");
    assert_eq!(spread.opened(), 1);
}

/// No connection carries more than `limit` open streams: the third opens another, and a freed
/// slot is taken again before anything new opens.
#[tokio::test]
async fn streams_per_connection_are_capped() {
    install();
    let server = Server::start(&[b"h2", b"http/1.1"]).await;
    let spread = server.spread(2, MAX_CONNECTIONS);
    let first = send(&spread, &server.upstream).await;
    let _second = send(&spread, &server.upstream).await;
    assert_eq!(server.accepted(), 1, "two streams share the first");
    let _third = send(&spread, &server.upstream).await;
    assert_eq!(server.accepted(), 2, "the third opens another");
    drop(first);
    let _fourth = send(&spread, &server.upstream).await;
    assert_eq!(server.accepted(), 2, "the first has room again");
    assert_eq!(spread.opened(), 2);
}

/// Past `max_connections` full connections a request is refused, not queued; a stream that
/// ends makes room again.
#[tokio::test]
async fn connections_per_upstream_are_capped() {
    install();
    let server = Server::start(&[b"h2", b"http/1.1"]).await;
    let spread = server.spread(1, 2);
    let first = send(&spread, &server.upstream).await;
    let _second = send(&spread, &server.upstream).await;
    match spread.send(&server.upstream, get(&server.upstream)).await {
        Err(SendError::Busy {
            connections: 2,
            streams: 1,
        }) => {}
        Err(e) => panic!("not refused as busy: {e:?}"),
        Ok(_) => panic!("a third connection opened past the cap"),
    }
    assert_eq!(server.accepted(), 2);
    drop(first);
    let _third = send(&spread, &server.upstream).await;
    assert_eq!(server.accepted(), 2, "the freed stream was used");
}

/// A connection the upstream closes (GOAWAY) is replaced by a new one for the next request.
#[tokio::test]
async fn a_closed_connection_is_replaced() {
    install();
    let server = Server::start(&[b"h2", b"http/1.1"]).await;
    let spread = server.spread(100, MAX_CONNECTIONS);
    drop(send(&spread, &server.upstream).await);
    assert_eq!(server.accepted(), 1);
    server.goaway.send_replace(());
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let closed = {
            let mut w = spread.worker();
            let conns = w.conns(0);
            conns.prune(Instant::now());
            conns.open.is_empty()
        };
        if closed {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the GOAWAY never closed the connection"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(send(&spread, &server.upstream).await);
    assert_eq!(server.accepted(), 2, "a new connection");
    assert_eq!(spread.opened(), 1, "the closed one dropped");
}

/// An upstream whose ALPN chooses HTTP/1.1 gets the request back for the HTTP/1.1 client, then
/// and from then on, without another connection attempt.
#[tokio::test]
async fn an_upstream_choosing_http1_is_sent_over_http1() {
    install();
    let server = Server::start(&[b"http/1.1"]).await;
    let spread = server.spread(100, MAX_CONNECTIONS);
    for _ in 0..2 {
        let sent = spread.send(&server.upstream, get(&server.upstream)).await;
        assert!(matches!(sent, Ok(Sent::Http1(_))), "not handed back");
    }
    assert_eq!(server.accepted(), 1);
    assert_eq!(spread.opened(), 0);
}

/// A connection that cannot be opened fails every request that waited for it as a connect
/// error (the pool ejects the upstream and may try another), and is not kept.
#[tokio::test]
async fn a_failed_connection_is_a_connect_error_for_each_waiter() {
    install();
    let server = Server::start(&[b"h2"]).await;
    let spread = server.spread(100, MAX_CONNECTIONS);
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let gone = Upstream::parse(
        &format!("https://{}", closed.local_addr().expect("addr")),
        0,
    )
    .expect("upstream");
    drop(closed);
    let sent = futures_util::future::join_all((0..3).map(|_| spread.send(&gone, get(&gone)))).await;
    for s in sent {
        assert!(matches!(s, Err(SendError::Connect(_))), "{:?}", s.err());
    }
    assert_eq!(spread.opened(), 0);
}

/// Requests made on different workers go over different connections (so their tasks run on
/// the worker that uses them); on one worker they share one.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn each_worker_has_its_own_connections() {
    install();
    let workers = crate::workers::Workers::start(2).expect("workers");
    let server = Arc::new(Server::start(&[b"h2", b"http/1.1"]).await);
    let spread = Arc::new(server.spread(10, MAX_CONNECTIONS));
    let (got, mut on) = tokio::sync::mpsc::channel(2);
    let (release, released) = watch::channel(());
    for _ in 0..2 {
        let (server, spread, got, mut released) = (
            server.clone(),
            spread.clone(),
            got.clone(),
            released.clone(),
        );
        workers.spawn(move || async move {
            let _a = send(&spread, &server.upstream).await;
            let _b = send(&spread, &server.upstream).await;
            let _ = got.send(crate::workers::current()).await;
            let _ = released.changed().await;
        });
    }
    let first = tokio::time::timeout(WAIT, on.recv()).await.expect("first");
    let second = tokio::time::timeout(WAIT, on.recv()).await.expect("second");
    assert_ne!(first, second, "both workers served");
    assert_eq!(server.accepted(), 2, "one connection per worker");
    assert_eq!(spread.opened(), 2);
    drop(release);
    workers.shutdown();
}
