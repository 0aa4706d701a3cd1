//! Upstreams that stall after the connection is made (issue 34): one that
//! completes TLS and never sends response headers, one that sends headers
//! and part of a body and then nothing, over HTTP/1.1 and HTTP/2 to the
//! upstream, and one whose HTTP/2 connection goes dead under a watch. The
//! client gets a bounded answer — a 504 Status before headers, a broken
//! stream after — within `upstream.timeouts` (set small here), and the
//! stall is counted in `tollgate_upstream_stalls_total`, a body stall as an
//! upstream error under code 504, not as the 200 its headers said. Without
//! the bounds each of these waited 100 s and more (a watch forever).
#![allow(clippy::unwrap_used)]

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The stub apiserver's TLS config, offering `alpn` only.
fn stub_tls(pki: &Pki, alpn: &[&[u8]]) -> Arc<rustls::ServerConfig> {
    let (cert, key) = pki.leaf(&pki.serving_ca, "stub", "apiserver", None, true);
    let id = tollgate::tls::load_identity(&cert, &key).unwrap();
    let mut cfg = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(id.chain, id.key)
        .unwrap();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(cfg)
}

/// A stub apiserver over TLS: a path under `/namespaces/silent/` never gets
/// response headers; any other gets 200, one chunk, and then nothing. Its
/// HTTP/2 server answers pings (hyper does) while it stalls.
async fn stalling_upstream(
    tls: Arc<rustls::ServerConfig>,
) -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let service =
                    hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                        if req.uri().path().contains("/namespaces/silent/") {
                            std::future::pending::<()>().await;
                        }
                        let first = futures_util::stream::once(async {
                            Ok::<_, Infallible>(Frame::data(Bytes::from_static(
                                b"{\"type\":\"ADDED\",\"object\":{\"kind\":\"Pod\"}}\n",
                            )))
                        });
                        let body = StreamBody::new(futures_util::StreamExt::chain(
                            first,
                            futures_util::stream::pending(),
                        ));
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "application/json")
                                .body(body)
                                .unwrap(),
                        )
                    });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (format!("https://{addr}"), task)
}

/// tollgate in front of `url` with small bounds: headers of a watch 2 s (a
/// watch's `timeoutSeconds` + 0.5 s when shorter), of anything else 1.5 s;
/// 1 s without a byte of a body (a watch: its `timeoutSeconds` + 0.5 s).
fn small_bounds(url: &str, ca: std::path::PathBuf) -> tollgate::Config {
    let mut c = config(&[url]);
    c.upstream.ca_file = Some(ca);
    c.upstream.health_check.enabled = false;
    c.upstream.metrics_scrape.enabled = false;
    c.timeouts.request_seconds = 1.5;
    let t = &mut c.upstream.timeouts;
    t.watch_header_seconds = 2.0;
    t.watch_margin_seconds = 0.5;
    t.watch_idle_seconds = 60.0;
    t.body_idle_seconds = 1.0;
    c
}

/// Send a GET of `path`; its status, when the head came, and how its body
/// ended (`Ok(bytes)` or broken) and when.
async fn exchange(tg: &Running, path: &str) -> (StatusCode, Duration, Result<usize, ()>, Duration) {
    let started = Instant::now();
    let req = Request::get(tg.url("http", path))
        .body(body(Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(20), h1_client().request(req))
        .await
        .unwrap_or_else(|_| panic!("{path}: no response head within 20 s"))
        .unwrap();
    let head = started.elapsed();
    let status = resp.status();
    let body = tokio::time::timeout(Duration::from_secs(20), resp.into_body().collect())
        .await
        .unwrap_or_else(|_| panic!("{path}: the body neither ended nor broke within 20 s"));
    (
        status,
        head,
        body.map(|b| b.to_bytes().len()).map_err(|_| ()),
        started.elapsed(),
    )
}

async fn stalls_are_bounded_and_counted(alpn: &'static [u8]) {
    tollgate::install_crypto_provider();
    let pki = Pki::new();
    let ca = pki.write("serving-ca.crt", &pki.serving_ca.pem);
    let (url, stub) = stalling_upstream(stub_tls(&pki, &[alpn])).await;
    let tg = start(small_bounds(&url, ca)).await;
    let proto = String::from_utf8_lossy(alpn);

    // (a) No headers: a 504 Status within the bound, not before it.
    let no_headers = [
        (
            "/api/v1/namespaces/silent/pods?watch=1&timeoutSeconds=1",
            1.5,
        ),
        ("/api/v1/namespaces/silent/pods?watch=1", 2.0),
        ("/api/v1/namespaces/silent/pods", 1.5),
        ("/api/v1/namespaces/silent/pods/p", 1.5),
    ];
    for (path, bound) in no_headers {
        let (status, head, body, _) = exchange(&tg, path).await;
        eprintln!("{proto} no headers {path}: {status} after {head:?} (bound {bound} s)");
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{proto} {path}");
        let bound = Duration::from_secs_f64(bound);
        assert!(
            head >= bound.mul_f64(0.9) && head < bound + Duration::from_secs(2),
            "{proto} {path}: answered after {head:?}, bound {bound:?}"
        );
        assert!(body.is_ok(), "{proto} {path}: the Status body is whole");
    }

    // (b) Headers, one chunk, then nothing: the stream is cut within the
    // bound after the chunk.
    let stalled = [
        (
            "/api/v1/namespaces/stall/pods?watch=1&timeoutSeconds=1",
            1.5,
            "watch",
        ),
        ("/api/v1/namespaces/stall/pods", 1.0, "list"),
        ("/api/v1/namespaces/stall/pods/p", 1.0, "get"),
    ];
    for (path, bound, _) in stalled {
        let (status, head, body, end) = exchange(&tg, path).await;
        eprintln!("{proto} stalled body {path}: {status} head after {head:?}, cut {} after {end:?} (bound {bound} s)", body.is_err());
        assert_eq!(status, StatusCode::OK, "{proto} {path}: the head came");
        assert!(
            head < Duration::from_secs(1),
            "{proto} {path}: head after {head:?}"
        );
        assert!(
            body.is_err(),
            "{proto} {path}: the stream is cut, not ended cleanly"
        );
        let bound = Duration::from_secs_f64(bound);
        assert!(
            end >= bound.mul_f64(0.9) && end < bound + Duration::from_secs(2),
            "{proto} {path}: cut after {end:?}, bound {bound:?}"
        );
    }

    let g = tg.gateway.clone();
    eventually("every stall counted", Duration::from_secs(5), || {
        let m = g.encode_metrics().unwrap();
        metric(&m, "tollgate_upstream_stalls_total{phase=\"body\"}") == 3.0
    })
    .await;
    let m = g.encode_metrics().unwrap();
    assert_eq!(
        metric(&m, "tollgate_upstream_stalls_total{phase=\"headers\"}"),
        4.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "tollgate_errors_total{source=\"upstream\"}"),
        7.0,
        "{m}"
    );
    for (_, _, verb) in stalled {
        let ok = format!("tollgate_requests_total{{verb=\"{verb}\",code=\"200\"}}");
        assert!(
            !m.contains(&ok),
            "{proto}: a stall counted as 200: {ok}\n{m}"
        );
        let timeout = format!("tollgate_requests_total{{verb=\"{verb}\",code=\"504\"}}");
        assert!(metric(&m, &timeout) >= 1.0, "{proto}: {timeout}\n{m}");
    }
    tg.stop().await;
    stub.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalls_over_http1_upstream_connections_are_bounded_and_counted() {
    stalls_are_bounded_and_counted(b"http/1.1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalls_over_http2_upstream_connections_are_bounded_and_counted() {
    stalls_are_bounded_and_counted(b"h2").await;
}

/// A TCP relay to `backend` that passes bytes both ways until `frozen`,
/// then passes nothing more and holds both connections open: a peer that
/// is gone without a FIN or a reset (a dead host, a partition).
async fn freezable_relay(
    backend: String,
    frozen: Arc<AtomicBool>,
) -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let backend = backend.trim_start_matches("https://").to_string();
    let task = tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(&backend).await else {
                return;
            };
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            for (mut from, mut to) in [(cr, sw), (sr, cw)].map(|(r, w)| {
                (
                    Box::new(r) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
                    Box::new(w) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
                )
            }) {
                let frozen = frozen.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        let n = match from.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if frozen.load(Ordering::SeqCst) {
                            // Hold both ends, pass nothing.
                            std::future::pending::<()>().await;
                        }
                        if to.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        }
    });
    (format!("https://{addr}"), task)
}

/// A watch without `timeoutSeconds` (its idle bound 60 s here) on an
/// HTTP/2 connection that goes dead: tollgate's pings go unanswered and the
/// connection, with the watch on it, is closed within the ping interval
/// plus the ping timeout (0.5 s + 0.5 s here; 30 s + 20 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_dead_http2_connection_ends_by_the_pings() {
    tollgate::install_crypto_provider();
    let pki = Pki::new();
    let ca = pki.write("serving-ca.crt", &pki.serving_ca.pem);
    let (backend, stub) = stalling_upstream(stub_tls(&pki, &[b"h2"])).await;
    let frozen = Arc::new(AtomicBool::new(false));
    let (url, relay) = freezable_relay(backend, frozen.clone()).await;
    let mut c = small_bounds(&url, ca);
    c.upstream.timeouts.ping_interval_seconds = 0.5;
    c.upstream.timeouts.ping_timeout_seconds = 0.5;
    // The stub's one chunk comes at once; then nothing (its server still
    // answers pings until the relay freezes).
    c.upstream.timeouts.watch_idle_seconds = 60.0;
    let tg = start(c).await;
    let req = Request::get(tg.url("http", "/api/v1/namespaces/stall/pods?watch=1"))
        .body(body(Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), h1_client().request(req))
        .await
        .expect("the watch's head")
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let first = body
        .frame()
        .await
        .expect("a first chunk")
        .expect("not broken");
    assert!(first.data_ref().is_some_and(|d| !d.is_empty()));
    // Live connection, answered pings: the watch stays open.
    let alive = tokio::time::timeout(Duration::from_secs(2), body.frame()).await;
    assert!(
        alive.is_err(),
        "the watch ended while its connection was alive: {alive:?}"
    );
    frozen.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let end = tokio::time::timeout(Duration::from_secs(10), body.collect())
        .await
        .expect("the watch ended within 10 s of its connection going dead");
    assert!(end.is_err(), "the watch is cut, not ended cleanly");
    let took = started.elapsed();
    eprintln!("dead HTTP/2 connection: the watch cut {took:?} after it froze");
    assert!(
        took < Duration::from_secs(4),
        "ended {took:?} after the connection went dead"
    );
    let g = tg.gateway.clone();
    eventually("the cut counted", Duration::from_secs(5), || {
        metric(
            &g.encode_metrics().unwrap(),
            "tollgate_errors_total{source=\"upstream\"}",
        ) == 1.0
    })
    .await;
    tg.stop().await;
    relay.abort();
    stub.abort();
}
