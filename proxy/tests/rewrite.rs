//! The relist guard's optional policy: consistent LISTs of the clients a
//! rule names are rewritten to `resourceVersion=0` (served from the watch
//! cache); others, and LISTs with a `limit`, are left alone.
#![allow(clippy::unwrap_used)]

mod common;

use bytes::Bytes;
use common::*;
use http::Request;
use http_body_util::BodyExt;
use tollgate::enforce::settings::RewriteRule;

async fn get(client: &HttpClient, url: &str) -> Option<String> {
    let resp = client
        .request(Request::get(url).body(body(Bytes::new())).unwrap())
        .await
        .unwrap();
    let header = resp
        .headers()
        .get("x-tollgate-rewritten")
        .map(|v| v.to_str().unwrap().to_string());
    let _ = resp.into_body().collect().await.unwrap();
    header
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_lists_are_rewritten_to_the_cache_by_rule() {
    let up = Upstream::start(None).await;
    let mut c = config(&[&up.url]);
    c.relist_guard.rewrite_to_cache = vec![RewriteRule {
        resources: vec!["pods".into()],
        during_warmup_only: false,
        ..RewriteRule::default()
    }];
    let tg = start(c).await;
    let client = h1_client();

    let header = get(
        &client,
        &tg.url("http", "/api/v1/pods?labelSelector=app%3Dx"),
    )
    .await;
    assert_eq!(header.as_deref(), Some("resourceVersion=0"));
    assert!(up
        .last_for("labelSelector")
        .path
        .ends_with("labelSelector=app%3Dx&resourceVersion=0"));

    for untouched in [
        "/api/v1/pods?limit=500",
        "/api/v1/pods?resourceVersion=7&size=1",
        "/api/v1/configmaps",
    ] {
        assert_eq!(
            get(&client, &tg.url("http", untouched)).await,
            None,
            "{untouched}"
        );
        assert!(!up.last_for(untouched).path.contains("resourceVersion=0"));
    }
    let m = tg.gateway.encode_metrics().unwrap();
    assert!(m.contains("tollgate_cache_rewrites_total 1"), "{m}");
    tg.stop().await;
}
