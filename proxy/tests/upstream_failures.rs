//! Upstreams that fail. One that accepts TCP and never speaks TLS: every path, a watch as well
//! as a LIST, gets a 504 Status within `upstream.connectTimeoutSeconds`, counted as an
//! upstream error. A watch used to hang with no response and no error, a LIST until its
//! response timeout (70 s). One that cuts a response short: counted as an upstream error,
//! not only as the 200 its headers said.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tokio::net::TcpListener;

/// A listener that accepts connections and holds them without a byte.
async fn black_hole() -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    (format!("https://{addr}"), task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_and_a_watch_to_a_silent_upstream_get_504_within_the_connect_timeout() {
    let pki = Pki::new();
    let ca = pki.write("upstream-ca.crt", &pki.serving_ca.pem);
    let (url, hole) = black_hole().await;
    for path in [
        "/api/v1/pods",
        "/api/v1/pods?watch=1",
        "/api/v1/namespaces/a/pods/x",
    ] {
        let mut c = config(&[&url]);
        c.upstream.ca_file = Some(ca.clone());
        c.upstream.connect_timeout_seconds = 0.5;
        c.upstream.health_check.enabled = false;
        c.upstream.metrics_scrape.enabled = false;
        c.timeouts.request_seconds = 30.0;
        let tg = start(c).await;
        for client in [h1_client(), h2_client()] {
            let started = Instant::now();
            let req = Request::get(tg.url("http", path))
                .body(body(Bytes::new()))
                .unwrap();
            let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
                .await
                .unwrap_or_else(|_| panic!("{path}: no response within 10 s"))
                .unwrap();
            let took = started.elapsed();
            assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT, "{path}");
            assert!(
                took < Duration::from_secs(5),
                "{path}: answered after {took:?}"
            );
            let text = resp.into_body().collect().await.unwrap().to_bytes();
            let status: serde_json::Value = serde_json::from_slice(&text).unwrap();
            assert_eq!(status["kind"], "Status", "{path}");
            assert_eq!(status["code"], 504, "{path}");
            assert!(
                status["message"]
                    .as_str()
                    .unwrap()
                    .contains("TLS handshake"),
                "{path}: {status}"
            );
        }
        let m = tg.gateway.encode_metrics().unwrap();
        assert_eq!(
            metric(&m, "tollgate_errors_total{source=\"upstream\"}"),
            2.0,
            "{path}: {m}"
        );
        tg.stop().await;
    }
    hole.abort();
}

/// An upstream that answers every request with headers promising 1000 bytes, sends 100 and
/// closes the connection.
async fn cutting_upstream() -> (String, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n";
                let _ = tcp.write_all(head.as_bytes()).await;
                let _ = tcp.write_all(&[b'x'; 100]).await;
            });
        }
    });
    (format!("http://{addr}"), task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_cut_short_by_the_upstream_counts_as_an_upstream_error() {
    let (url, upstream) = cutting_upstream().await;
    let mut c = config(&[&url]);
    c.upstream.health_check.enabled = false;
    c.upstream.metrics_scrape.enabled = false;
    let tg = start(c).await;
    let resp = h1_client()
        .request(
            Request::get(tg.url("http", "/api/v1/namespaces/a/pods/x"))
                .body(body(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        StatusCode::OK,
        "the status came before the cut"
    );
    assert!(
        resp.into_body().collect().await.is_err(),
        "the client sees the body broken, not a clean short body"
    );
    let g = tg.gateway.clone();
    eventually("the cut is counted", Duration::from_secs(10), || {
        metric(
            &g.encode_metrics().unwrap(),
            "tollgate_errors_total{source=\"upstream\"}",
        ) == 1.0
    })
    .await;
    let m = g.encode_metrics().unwrap();
    assert_eq!(
        metric(&m, "tollgate_requests_total{verb=\"get\",code=\"200\"}"),
        1.0,
        "{m}"
    );
    tg.stop().await;
    upstream.abort();
}
