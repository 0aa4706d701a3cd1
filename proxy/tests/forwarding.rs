//! Forwarding through tollgate on loopback: byte-exact bodies (h1, h2,
//! chunked, fixed-length, both directions), counted bytes, watches,
//! upgrades, hop-by-hop headers, malformed requests, several upstreams, drain.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;

const SIZES: [usize; 5] = [0, 1, 65_537, 1_000_000, 8_000_000];

fn metric(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name_and_labels))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_and_requests_arrive_byte_exact_and_are_counted() {
    let up = Upstream::start(None).await;
    let tg = start(config(&[&up.url])).await;
    let mut total = 0u64;
    for (proto, client) in [("h1", h1_client()), ("h2", h2_client())] {
        for size in SIZES {
            for mode in ["fixed", "chunked"] {
                let url = tg.url(
                    "http",
                    &format!("/bytes/{size}?mode={mode}&seed={}", size + 7),
                );
                let resp = client
                    .request(Request::get(&url).body(body(Bytes::new())).unwrap())
                    .await
                    .unwrap();
                assert_eq!(resp.status(), StatusCode::OK, "{proto} {mode} {size}");
                let want = resp.headers()["x-sha256"].to_str().unwrap().to_string();
                let got = resp.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(got.len(), size, "{proto} {mode} {size}");
                assert_eq!(sha(&got), want, "{proto} {mode} {size}");
                total += size as u64;

                // The request body, streamed up and echoed back.
                let data = pseudo_random(size, size as u64 + 3);
                let req_body = if mode == "chunked" {
                    chunked(data.clone(), 10_000)
                } else {
                    body(data.clone())
                };
                let resp = client
                    .request(
                        Request::post(tg.url("http", "/echo"))
                            .body(req_body)
                            .unwrap(),
                    )
                    .await
                    .unwrap();
                let got = resp.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(sha(&got), sha(&data), "echo {proto} {mode} {size}");
                total += size as u64;
            }
        }
    }
    // The counting body saw exactly what was sent.
    let g = tg.gateway.clone();
    eventually("counted bytes", Duration::from_secs(10), || {
        let m = g.encode_metrics().unwrap();
        metric(&m, "tollgate_response_bytes_total{verb=\"nonresource\"}") == Some(total as f64)
    })
    .await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_events_stream_through_as_they_happen() {
    let up = Upstream::start(None).await;
    let tg = start(config(&[&up.url])).await;
    for (proto, client) in [("h1", h1_client()), ("h2", h2_client())] {
        let before = up.seen().len();
        let url = tg.url("http", "/api/v1/pods?watch=1&resourceVersion=10");
        let resp = client
            .request(Request::get(&url).body(body(Bytes::new())).unwrap())
            .await;
        // The response head only comes once the upstream answered; wait for the subscriber.
        let mut resp = resp.unwrap();
        eventually("upstream subscribed", Duration::from_secs(5), || {
            up.events.receiver_count() > 0
        })
        .await;
        assert!(up.seen().len() > before);
        for i in 0..50 {
            let event = format!("{{\"type\":\"MODIFIED\",\"n\":{i}}}\n");
            up.events.send(Bytes::from(event.clone())).unwrap();
            let mut got = Vec::new();
            while got.len() < event.len() {
                let frame = tokio::time::timeout(Duration::from_secs(5), resp.body_mut().frame())
                    .await
                    .expect("event arrives without buffering")
                    .unwrap()
                    .unwrap();
                got.extend_from_slice(frame.data_ref().unwrap());
            }
            assert_eq!(String::from_utf8(got).unwrap(), event, "{proto} event {i}");
        }
        drop(resp);
        eventually("watch released upstream", Duration::from_secs(5), || {
            up.events.receiver_count() == 0
        })
        .await;
    }
    let patterns = tg.gateway.patterns();
    let w = patterns
        .iter()
        .find(|p| p.verb == "watch")
        .expect("watch learned");
    assert_eq!(w.count, 2);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_are_carried_both_ways() {
    let up = Upstream::start(None).await;
    let tg = start(config(&[&up.url])).await;
    let tcp = tokio::net::TcpStream::connect(tg.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn.with_upgrades());
    let req = Request::post("/api/v1/namespaces/a/pods/p/exec?command=sh")
        .header("host", "x")
        .header("connection", "Upgrade")
        .header("upgrade", "SPDY/3.1")
        .body(body(Bytes::new()))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(resp.headers()["upgrade"], "SPDY/3.1");
    let upgraded = hyper::upgrade::on(resp).await.unwrap();
    let mut io = TokioIo::new(upgraded);
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for msg in [&b"hello"[..], &pseudo_random(100_000, 5)] {
        io.write_all(msg).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(5), io.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(back, msg);
    }
    let seen = up.seen();
    assert!(seen
        .iter()
        .any(|s| s.path.contains("/exec") && s.headers["upgrade"] == "SPDY/3.1"));
    drop(io);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_stop_at_tollgate_and_encodings_pass() {
    let up = Upstream::start(None).await;
    let tg = start(config(&[&up.url])).await;
    let client = h1_client();
    let req = Request::get(tg.url("http", "/api/v1/pods?resourceVersion=0"))
        .header("connection", "x-private")
        .header("x-private", "1")
        .header("keep-alive", "timeout=5")
        .header("te", "trailers")
        .header("accept-encoding", "gzip")
        .header("accept", "application/vnd.kubernetes.protobuf")
        .body(body(Bytes::new()))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let seen = up.last_for("/api/v1/pods?resourceVersion=0");
    for gone in ["x-private", "keep-alive", "te"] {
        assert!(!seen.headers.contains_key(gone), "{gone} forwarded");
    }
    assert_eq!(seen.headers["accept-encoding"], "gzip");
    assert_eq!(
        seen.headers["accept"],
        "application/vnd.kubernetes.protobuf"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_a_400_status() {
    let up = Upstream::start(None).await;
    let tg = start(config(&[&up.url])).await;
    let (code, text) = get_text(&h1_client(), &tg.url("http", "/api/v1/pods?limit=abc")).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    let status: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["code"], 400);
    assert!(up.seen().iter().all(|s| !s.path.contains("limit=abc")));
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_upstream_is_ejected_and_requests_go_to_the_live_one() {
    let up = Upstream::start(None).await;
    let dead = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let mut c = config(&[&dead, &up.url]);
    c.upstream.health_check.interval_seconds = 60.0;
    let tg = start(c).await;
    let client = h1_client();
    for i in 0..10 {
        let (code, _) = get_text(
            &client,
            &tg.url("http", &format!("/api/v1/namespaces/a/pods/p{i}")),
        )
        .await;
        assert_eq!(code, StatusCode::OK, "request {i}");
    }
    let m = tg.gateway.encode_metrics().unwrap();
    assert_eq!(
        metric(
            &m,
            &format!("tollgate_upstream_healthy{{upstream=\"{dead}\"}}")
        ),
        Some(0.0)
    );
    assert_eq!(
        metric(
            &m,
            &format!("tollgate_upstream_healthy{{upstream=\"{}\"}}", up.url)
        ),
        Some(1.0)
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_open_watches() {
    let up = Upstream::start(None).await;
    let tg = start(config(&[&up.url])).await;
    let client = h2_client();
    let mut resp = client
        .request(
            Request::get(tg.url("http", "/api/v1/pods?watch=1&resourceVersion=3"))
                .body(body(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    eventually("subscribed", Duration::from_secs(5), || {
        up.events.receiver_count() > 0
    })
    .await;
    let stopping = tokio::spawn(tg.stop());
    // The watch ends (cleanly or with a reset) instead of hanging forever.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match resp.body_mut().frame().await {
                None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "watch not closed by the drain");
    stopping.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_megabytes_stream_through_h1_and_h2() {
    use sha2::Digest;
    const SIZE: usize = 100 * 1024 * 1024;
    let up = Upstream::start(None).await;
    let tg = start(config(&[&up.url])).await;
    let want = gen_digest(SIZE, 42);
    for (proto, client) in [("h1", h1_client()), ("h2", h2_client())] {
        let url = tg.url("http", &format!("/stream/{SIZE}?seed=42"));
        let mut resp = client
            .request(Request::get(&url).body(body(Bytes::new())).unwrap())
            .await
            .unwrap();
        let mut h = sha2::Sha256::new();
        let mut n = 0usize;
        while let Some(frame) = resp.body_mut().frame().await {
            if let Some(d) = frame.unwrap().data_ref() {
                n += d.len();
                h.update(d);
            }
        }
        assert_eq!(n, SIZE, "{proto}");
        assert_eq!(format!("{:x}", h.finalize()), want, "{proto}");
    }
    let g = tg.gateway.clone();
    eventually("counted", Duration::from_secs(10), || {
        let m = g.encode_metrics().unwrap();
        metric(&m, "tollgate_response_bytes_total{verb=\"nonresource\"}") == Some(2.0 * SIZE as f64)
    })
    .await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_passes_untouched_and_is_learned_uncompressed() {
    let up = Upstream::start(None).await;
    let tg = start(config(&[&up.url])).await;
    let client = h1_client();
    let req = Request::get(tg.url("http", "/api/v1/secrets?resourceVersion=0&size=5000&gzip=1"))
        .header("accept-encoding", "gzip")
        .body(body(Bytes::new()))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.headers()["content-encoding"], "gzip");
    let got = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        got,
        Bytes::from(vec![b'x'; 5000]),
        "never inflated or re-encoded"
    );
    assert_eq!(
        up.last_for("/api/v1/secrets").headers["accept-encoding"],
        "gzip"
    );
    let g = tg.gateway.clone();
    eventually("learned", Duration::from_secs(5), || {
        g.patterns()
            .iter()
            .any(|p| p.resource == "secrets" && p.bytes_avg == 40_000.0)
    })
    .await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_client_connections_close_but_quiet_watches_stay() {
    let up = Upstream::start(None).await;
    let mut c = config(&[&up.url]);
    c.timeouts.idle_seconds = 0.3;
    let tg = start(c).await;
    let handshake = |addr| async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (send, conn) = hyper::client::conn::http1::handshake::<_, TestBody>(TokioIo::new(tcp))
            .await
            .unwrap();
        (send, tokio::spawn(conn))
    };
    // A watch, quiet for longer than the idle timeout.
    let (mut watch_send, _watch_conn) = handshake(tg.addr).await;
    let mut watch = watch_send
        .send_request(
            Request::get("/api/v1/pods?watch=1&resourceVersion=9")
                .header("host", "x")
                .body(body(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    // An ordinary request, then nothing.
    let (mut send, conn) = handshake(tg.addr).await;
    let resp = send
        .send_request(
            Request::get("/api/v1/namespaces/a/pods/p")
                .header("host", "x")
                .body(body(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    resp.into_body().collect().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("idle connection closed by tollgate")
        .unwrap()
        .unwrap();
    up.events
        .send(Bytes::from_static(b"{\"type\":\"BOOKMARK\"}\n"))
        .unwrap();
    let frame = tokio::time::timeout(Duration::from_secs(5), watch.body_mut().frame()).await;
    assert!(
        matches!(frame, Ok(Some(Ok(_)))),
        "the quiet watch is still open"
    );
    drop(watch);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_list_is_learned_by_its_initial_state() {
    let up = Upstream::start(None).await;
    let tg = start(config(&[&up.url])).await;
    let client = h2_client();
    let url = tg.url(
        "http",
        "/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
    );
    let mut resp = client
        .request(Request::get(&url).body(body(Bytes::new())).unwrap())
        .await
        .unwrap();
    eventually("subscribed", Duration::from_secs(5), || {
        up.events.receiver_count() > 0
    })
    .await;
    let added = format!(
        "{{\"type\":\"ADDED\",\"object\":{{\"pad\":\"{}\"}}}}\n",
        "x".repeat(1000)
    );
    let bookmark = "{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}}}}\n";
    let later = "{\"type\":\"MODIFIED\"}\n".repeat(50);
    let mut initial = 0;
    for (i, event) in [added.as_str(), &added, &added, bookmark, &later]
        .into_iter()
        .enumerate()
    {
        up.events.send(Bytes::from(event.to_string())).unwrap();
        let mut got = 0;
        while got < event.len() {
            let frame = tokio::time::timeout(Duration::from_secs(5), resp.body_mut().frame())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            got += frame.data_ref().map_or(0, |d| d.len());
        }
        if i <= 3 {
            initial += event.len();
        }
        // The LIST it replaces holds a heavy place until the bookmark, not for the watch's life.
        let g = tg.gateway.clone();
        let heavy = move || {
            let text = g.encode_metrics().unwrap();
            metric(&text, "tollgate_lane_inflight_requests{lane=\"heavy\"}")
        };
        if i < 3 {
            assert_eq!(heavy(), Some(1.0), "held while the initial state flows");
        } else if i == 3 {
            eventually("freed at the bookmark", Duration::from_secs(5), || {
                heavy() == Some(0.0)
            })
            .await;
            // Learned there, while the watch goes on: the next one is priced by it.
            let g = tg.gateway.clone();
            assert!(
                g.patterns()
                    .iter()
                    .any(|p| p.verb == "watchlist" && p.bytes_avg == initial as f64),
                "learned at the bookmark"
            );
        }
    }
    drop(resp);
    let g = tg.gateway.clone();
    eventually(
        "learned as a list of its initial state",
        Duration::from_secs(5),
        || {
            g.patterns()
                .iter()
                .any(|p| p.verb == "watchlist" && p.bytes_avg == initial as f64)
        },
    )
    .await;
    tg.stop().await;
}
