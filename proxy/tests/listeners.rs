//! The listeners' bounds on the wire: the client listener's connection cap,
//! and the admin listener's cap, header-read timeout and idle timeout (it
//! kept 300 idle connections open for as long as their clients liked).
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long until the server closes `tcp` (EOF or reset), up to `within`.
async fn closed_after(tcp: &mut TcpStream, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(within.saturating_sub(start.elapsed()), tcp.read(&mut buf)).await
        {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// A connection the server has accepted (it answered a request on it).
async fn served_connection(addr: SocketAddr, path: &str) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = [0u8; 12];
    tcp.read_exact(&mut buf).await.unwrap();
    assert!(buf.starts_with(b"HTTP/1.1 "), "{buf:?}");
    tcp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_closes_idle_and_slow_connections() {
    let up = Upstream::start(None).await;
    let mut c = config(&[&up.url]);
    c.admin.idle_seconds = 0.5;
    c.admin.header_read_seconds = 60.0;
    let tg = start(c.clone()).await;

    // Connected, never a byte: closed once idle.
    let mut silent = TcpStream::connect(tg.admin).await.unwrap();
    let t = closed_after(&mut silent, Duration::from_secs(10)).await;
    assert!(
        t.is_some_and(|t| t >= Duration::from_millis(400)),
        "silent connection closed after {t:?}"
    );

    // Kept alive after a response: closed once idle.
    let mut kept = served_connection(tg.admin, "/healthz").await;
    let t = closed_after(&mut kept, Duration::from_secs(10)).await;
    assert!(t.is_some(), "an idle keep-alive connection stays open");

    // Headers begun and never finished: closed by the header-read timeout
    // (the idle timeout now far away; the settings apply on reload).
    c.admin.idle_seconds = 60.0;
    c.admin.header_read_seconds = 0.5;
    tg.gateway.reload(c).unwrap();
    let mut slow = TcpStream::connect(tg.admin).await.unwrap();
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let t = closed_after(&mut slow, Duration::from_secs(10)).await;
    assert!(
        t.is_some_and(|t| t >= Duration::from_millis(400)),
        "a slow request's connection closed after {t:?}"
    );

    // The admin listener still serves.
    let (code, _) = get_text(&h1_client(), &tg.admin_url("/healthz")).await;
    assert_eq!(code, StatusCode::OK);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_listeners_close_connections_past_their_cap_and_count_them() {
    let up = Upstream::start(None).await;
    let mut c = config(&[&up.url]);
    c.max_connections = 2;
    c.admin.max_connections = 1;
    let tg = start(c).await;
    let g = tg.gateway.clone();

    for (addr, path, cap, listener) in [
        (tg.addr, "/api/v1/namespaces/a/pods/x", 2, "client"),
        (tg.admin, "/healthz", 1, "admin"),
    ] {
        let mut open = Vec::new();
        for _ in 0..cap {
            open.push(served_connection(addr, path).await);
        }
        let series = format!("tollgate_open_connections{{listener=\"{listener}\"}}");
        assert_eq!(metric(&g.encode_metrics().unwrap(), &series), cap as f64);
        // One more: closed at once, before any request is read (past the admin
        // listener's cap, once its health reserve is taken too).
        let reserve: Vec<TcpStream> = if listener == "admin" {
            let mut held = Vec::new();
            for _ in 0..tollgate::admin::HEALTH_RESERVE {
                held.push(TcpStream::connect(addr).await.unwrap());
            }
            held
        } else {
            Vec::new()
        };
        let mut extra = TcpStream::connect(addr).await.unwrap();
        let t = closed_after(&mut extra, Duration::from_millis(1500)).await;
        assert!(
            t.is_some(),
            "{listener}: a connection past the cap stays open"
        );
        let refused = format!("tollgate_connections_refused_total{{listener=\"{listener}\"}}");
        assert_eq!(metric(&g.encode_metrics().unwrap(), &refused), 1.0);
        drop(reserve);
        // A slot freed: served again.
        open.pop();
        let g2 = g.clone();
        eventually("the slot is given back", Duration::from_secs(10), || {
            metric(&g2.encode_metrics().unwrap(), &series) == (cap - 1) as f64
        })
        .await;
        served_connection(addr, path).await;
    }
    let m = g.encode_metrics().unwrap();
    for listener in ["client", "admin"] {
        let series = format!("tollgate_accept_errors_total{{listener=\"{listener}\"}}");
        assert_eq!(metric(&m, &series), 0.0, "{m}");
    }
    tg.stop().await;
}
