//! `--max-connections`: an operation keeps at most that many HTTP/1.1
//! connections open, like wrk's `-c`; requests beyond them wait for one
//! (their latency still counted from the intended start), and a connection
//! the server closes makes room for a new one.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Connections a test server saw: accepted in all, and most open at once.
#[derive(Default)]
struct Seen {
    accepted: AtomicUsize,
    open: AtomicUsize,
    most_open: AtomicUsize,
}

/// A plain HTTP/1.1 server answering every request with `{}` after `delay`;
/// with `close`, it closes each connection after one response.
async fn server(delay: Duration, close: bool) -> (String, Arc<Seen>, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let seen = Arc::new(Seen::default());
    let stop = CancellationToken::new();
    let (s, st) = (seen.clone(), stop.clone());
    tokio::spawn(async move {
        loop {
            let (mut tcp, _) = tokio::select! {
                _ = st.cancelled() => return,
                r = listener.accept() => match r { Ok(c) => c, Err(_) => continue },
            };
            s.accepted.fetch_add(1, Ordering::SeqCst);
            let now = s.open.fetch_add(1, Ordering::SeqCst) + 1;
            s.most_open.fetch_max(now, Ordering::SeqCst);
            let s = s.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                'conn: loop {
                    // One request head (the GETs carry no body).
                    let end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        match tcp.read(&mut chunk).await {
                            Ok(0) | Err(_) => break 'conn,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    buf.drain(..end);
                    tokio::time::sleep(delay).await;
                    let connection = if close { "close" } else { "keep-alive" };
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                         content-length: 2\r\nconnection: {connection}\r\n\r\n{{}}"
                    );
                    if tcp.write_all(resp.as_bytes()).await.is_err() || close {
                        break;
                    }
                }
                s.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (url, seen, stop)
}

/// 100 GETs/s for 2 s, each answered after 50 ms (~5 connections' worth),
/// with `--max-connections max`: the GET summary and what the server saw.
async fn gets_through(max: &str, close: bool) -> (loadgen::report::OperationSummary, Arc<Seen>) {
    let (url, seen, stop) = server(Duration::from_millis(50), close).await;
    let args = [
        "--gets",
        "100/s",
        "--duration",
        "2s",
        "--max-connections",
        max,
        "--timeout",
        "10s",
    ];
    let report = loadgen::run(config(&url, &args), CancellationToken::new())
        .await
        .expect("run");
    stop.cancel();
    (report.operation("get").expect("get").clone(), seen)
}

/// With 3 connections requests wait for one, and every request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_wait_for_a_connection_beyond_the_limit() {
    let (get, seen) = gets_through("3", false).await;
    assert_eq!((get.requests, get.ok, get.dropped), (200, 200, 0));
    // The run's own check of the target (GET /version) may use one more.
    let most = seen.most_open.load(Ordering::SeqCst);
    assert!(most <= 4, "{most} connections open at once");
    // Three connections carry 60 requests/s: the backlog grows, and shows.
    assert!(
        get.latency_ms.p99 > 300.0,
        "p99 {} ms: no wait for a connection",
        get.latency_ms.p99
    );
}

/// The server closes every connection after one response: each close makes
/// room for a new connection, never more than the limit at once, and no
/// request is left waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_connection_makes_room_for_a_new_one() {
    let (get, seen) = gets_through("2", true).await;
    assert_eq!((get.requests, get.ok, get.errors), (200, 200, 0));
    let most = seen.most_open.load(Ordering::SeqCst);
    assert!(most <= 3, "{most} connections open at once");
    let accepted = seen.accepted.load(Ordering::SeqCst);
    assert!(accepted >= 200, "{accepted} connections for 200 requests");
}
