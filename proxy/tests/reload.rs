//! Hot reload of the enforcement settings: a new file takes effect at once,
//! open connections (a watch) carry on, the quota pool keeps its debt, and
//! a bad file keeps the running configuration.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tollgate::config::Mode;
use tollgate::{Config, Flags};

fn file(upstream: &str, mode: &str, rate: &str) -> String {
    format!(
        "mode: {mode}\n\
         upstream: {{urls: [\"{upstream}\"], healthCheck: {{intervalSeconds: 0.2}}}}\n\
         drain: {{windowSeconds: 0}}\n\
         quota: {{bytesPerSecond: {rate}, burstBytes: 1000000, maxWaitSeconds: 0.2, perClient: {{requestsPerSecond: 0}}}}\n\
         relistGuard: {{enabled: false}}\n"
    )
}

async fn list(client: &HttpClient, url: &str) -> (StatusCode, String) {
    let resp = client
        .request(Request::get(url).body(body(Bytes::new())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let lane = resp.headers()["x-tollgate-lane"]
        .to_str()
        .unwrap()
        .to_string();
    let _ = resp.into_body().collect().await.unwrap();
    (status, lane)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_connections_and_the_pools_debt() {
    let up = Upstream::start(None).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, file(&up.url, "enforce", "1000")).unwrap();
    let flags = Flags {
        config: Some(path.clone()),
        ..Flags::default()
    };
    let tg = start(Config::load(&flags).unwrap()).await;
    let client = h1_client();

    // A watch stays open across the reloads.
    let watch = h2_client()
        .request(
            Request::get(tg.url("http", "/api/v1/pods?watch=1&resourceVersion=10"))
                .body(body(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    let mut watch = watch.into_body();

    // A 3 MB consistent LIST: charged 3 MB sent + 2 × 3 MB read from etcd,
    // 8 MB past the 1 MB burst: debt that takes hours at 1 KB/s.
    let big = tg.url("http", "/api/v1/pods?size=3000000");
    assert_eq!(list(&client, &big).await, (StatusCode::OK, "heavy".into()));
    let g = tg.gateway.clone();
    eventually("the debt is settled", Duration::from_secs(10), || {
        metric(
            &g.encode_metrics().unwrap(),
            "tollgate_quota_available_bytes",
        ) < -7e6
    })
    .await;
    let (code, lane) = list(&client, &big).await;
    assert_eq!(
        (code, lane.as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "heavy")
    );

    // A new rate: taken at once, the debt kept.
    std::fs::write(&path, file(&up.url, "enforce", "2000")).unwrap();
    tg.gateway.reload_from(Config::load(&flags));
    assert_eq!(tg.gateway.config().quota.bytes_per_second, Some(2000.0));
    let m = tg.gateway.encode_metrics().unwrap();
    assert!(metric(&m, "tollgate_quota_available_bytes") < -7e6, "{m}");
    assert_eq!(metric(&m, "tollgate_quota_rate_bytes_per_second"), 2000.0);
    assert_eq!(list(&client, &big).await.0, StatusCode::TOO_MANY_REQUESTS);

    // A bad file is refused; the running configuration stays.
    std::fs::write(
        &path,
        file(&up.url, "enforce", "2000").replace("burstBytes: 1000000", "burstBytes: -1"),
    )
    .unwrap();
    tg.gateway.reload_from(Config::load(&flags));
    assert_eq!(tg.gateway.config().quota.burst_bytes, Some(1e6));
    let m = tg.gateway.encode_metrics().unwrap();
    assert!(
        m.contains("tollgate_config_reloads_total{result=\"error\"} 1"),
        "{m}"
    );

    // Dry run: the same LIST is served, the would-be rejection counted.
    std::fs::write(&path, file(&up.url, "dryRun", "2000")).unwrap();
    tg.gateway.reload_from(Config::load(&flags));
    assert_eq!(tg.gateway.config().mode, Mode::DryRun);
    assert_eq!(list(&client, &big).await.0, StatusCode::OK);

    // The watch carried on through all of it.
    let event = Bytes::from_static(b"{\"type\":\"MODIFIED\"}\n");
    up.events.send(event.clone()).unwrap();
    let frame = tokio::time::timeout(Duration::from_secs(10), watch.frame())
        .await
        .expect("the watch still streams")
        .unwrap()
        .unwrap();
    assert_eq!(frame.data_ref(), Some(&event));
    drop(watch);
    tg.stop().await;
}
