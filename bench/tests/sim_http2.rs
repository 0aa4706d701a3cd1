//! HTTP/2 as kube-apiserver speaks it: the same port serves h2 (prior
//! knowledge here; ALPN over TLS is covered by the authn/TLS tests) and each
//! connection allows 250 concurrent streams.
#![allow(clippy::unwrap_used)] // tests may unwrap

#[macro_use]
mod common;

use common::{sim_on, Backend};
use std::time::Duration;
use tokio::net::TcpStream;

on_both_stores!(http2_connections_allow_250_concurrent_streams);

async fn http2_connections_allow_250_concurrent_streams(backend: Backend) {
    let s = sim_on(backend, &["--nodes", "3"]).await;
    let tcp = TcpStream::connect(s.addr).await.unwrap();
    let (client, mut conn) = h2::client::handshake(tcp).await.unwrap();
    // The server's SETTINGS arrive while the connection is driven.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while conn.max_concurrent_send_streams() != 250 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "server never advertised 250 streams (saw {})",
            conn.max_concurrent_send_streams()
        );
        let _ = tokio::time::timeout(
            Duration::from_millis(20),
            std::future::poll_fn(|cx| std::future::Future::poll(std::pin::Pin::new(&mut conn), cx)),
        )
        .await;
    }
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut client = client.ready().await.unwrap();
    let req = http::Request::get(format!("{}/api/v1/nodes", s.url))
        .body(())
        .unwrap();
    let (resp, _) = client.send_request(req, true).unwrap();
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut bytes = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    let list: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 3);
}
