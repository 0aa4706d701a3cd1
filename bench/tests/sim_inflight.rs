//! The max-in-flight filter as kube-apiserver has it: beyond the limit a
//! non-long-running request gets 429, `Retry-After: 1` and the plain-text
//! body; watches are not counted and system:masters is never refused.

#![allow(clippy::unwrap_used)] // tests may unwrap

#[macro_use]
mod common;

use common::{sim_on, Backend, Http};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

on_both_stores!(beyond_the_read_only_limit_requests_get_the_apiservers_429);

/// A LIST whose client never reads: the response cannot finish, so its slot stays taken.
async fn stalled_list(addr: std::net::SocketAddr, token: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req =
        format!("GET /api/v1/pods HTTP/1.1\r\nHost: sim\r\nAuthorization: Bearer {token}\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    s
}

async fn beyond_the_read_only_limit_requests_get_the_apiservers_429(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(
        &tokens,
        "dev-token,dev,1,\"devs\"\nadmin-token,admin,2,\"system:masters\"\n",
    )
    .unwrap();
    // 10,000 pods of 2 KB: a 20 MB LIST, more than loopback socket buffers hold.
    let s = sim_on(
        backend,
        &[
            "--pods",
            "10000",
            "--nodes",
            "10",
            "--max-requests-inflight",
            "2",
            "--token-auth-file",
            tokens.to_str().unwrap(),
        ],
    )
    .await;
    let dev = Http::with_token(&s.url, "dev-token");
    let held = vec![
        stalled_list(s.addr, "dev-token").await,
        stalled_list(s.addr, "dev-token").await,
    ];
    // Wait until both stalled LISTs hold their slots.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let refused = loop {
        let r = dev.get("/api/v1/namespaces/default/configmaps").await;
        if r.status == 429 {
            break r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the limit never took effect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(refused.headers["retry-after"], "1");
    assert_eq!(
        &refused.body[..],
        b"Too many requests, please try again later.\n"
    );
    assert!(refused.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    // Watches are long-running: not counted, not refused.
    let _watch = dev
        .watch("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=0&timeoutSeconds=5")
        .await;
    // system:masters is never refused by this filter.
    let admin = Http::with_token(&s.url, "admin-token");
    assert_eq!(
        admin
            .get("/api/v1/namespaces/default/configmaps")
            .await
            .status,
        200
    );
    // The metric shows the slots in use.
    let metrics = String::from_utf8_lossy(&admin.get("/metrics").await.body).to_string();
    assert!(
        metrics.contains("apiserver_current_inflight_requests{request_kind=\"readOnly\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("code=\"429\""));
    // Once the stalled clients go away, their slots come back.
    drop(held);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while dev
        .get("/api/v1/namespaces/default/configmaps")
        .await
        .status
        != 200
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "slots were never released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
