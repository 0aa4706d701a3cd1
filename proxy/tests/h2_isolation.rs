//! Light requests never wait behind LISTs whose clients read slowly. Over
//! HTTP/2 to the apiserver, flow control is per connection as well as per
//! stream: LISTs whose clients do not read fill the connection's window
//! with bytes tollgate cannot pass on, and on a shared connection every
//! other stream's body then waits for them: light requests get connections
//! of their own, and a bulk connection's window covers all its streams'.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_gets_and_other_lists_are_answered_while_large_lists_sit_unread() {
    tollgate::install_crypto_provider();
    let pki = Pki::new();
    let (up_cert, up_key) = pki.leaf(&pki.serving_ca, "upstream", "apiserver", None, true);
    let up_tls = tollgate::tls::server_config(
        tollgate::tls::load_identity(&up_cert, &up_key).unwrap(),
        None,
    )
    .unwrap();
    let up = Upstream::start(Some(Arc::new(up_tls))).await;
    let mut c = config(&[&up.url]);
    c.upstream.ca_file = Some(pki.write("serving-ca.crt", &pki.serving_ca.pem));
    let tg = start(c).await;
    let client = h1_client();

    // Eight 20 MB LISTs, their headers read and their bodies left unread (a
    // client on a slow link, or one that stopped reading).
    let mut lists = Vec::new();
    for _ in 0..8 {
        let req = Request::get(tg.url("http", "/api/v1/pods?size=20000000"))
            .body(body(Bytes::new()))
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
            .await
            .expect("a LIST's headers")
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        lists.push(resp);
    }
    // Small GETs for two seconds, while the unread bytes fill every buffer
    // on the way: each is answered at once.
    for i in 0..20 {
        let req = Request::get(tg.url("http", "/api/v1/namespaces/default/pods/one"))
            .body(body(Bytes::new()))
            .unwrap();
        let small = async {
            let resp = client.request(req).await.unwrap();
            let status = resp.status();
            (status, resp.into_body().collect().await.unwrap().to_bytes())
        };
        let (status, text) = tokio::time::timeout(Duration::from_secs(3), small)
            .await
            .unwrap_or_else(|_| panic!("small GET {i} waited behind the unread LISTs"));
        assert_eq!(status, StatusCode::OK);
        assert!(!text.is_empty());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Nor does another LIST, on the same connections as the unread ones.
    let req = Request::get(tg.url("http", "/api/v1/pods?size=2000000"))
        .body(body(Bytes::new()))
        .unwrap();
    let list = async {
        let resp = client.request(req).await.unwrap();
        resp.into_body().collect().await.unwrap().to_bytes().len()
    };
    let n = tokio::time::timeout(Duration::from_secs(5), list)
        .await
        .expect("a LIST waited behind the unread ones");
    assert_eq!(n, 2_000_000);
    drop(lists);
    tg.stop().await;
}
