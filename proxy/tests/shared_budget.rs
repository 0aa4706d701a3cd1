//! The shared etcd-read budget when etcd cannot be reached (the three-master bed with a real
//! etcd is in tests/tests/shared_budget.rs): the tollgate spends its fallback share, `reserve /
//! N`, never unlimited; heavy LISTs past it get 429 with reason `sharedBudget`; light requests
//! never pass the shared budget and are served at once; `/debug/budget` and the metrics say so.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use http::StatusCode;
use tollgate::budget::settings::QuotaMode;
use tollgate::config::Mode;

const BUDGET: f64 = 20_000_000.0;
const LIST_BYTES: usize = 1_500_000;

#[tokio::test]
async fn without_etcd_the_fallback_share_holds_heavy_lists_and_nothing_else() {
    let up = Upstream::start(None).await;
    // A port nothing listens on: etcd out of reach from the start.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let etcd = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let mut c = config(&[&up.url]);
    c.mode = Mode::Enforce;
    c.quota.max_wait_seconds = 0.3;
    c.quota.per_client.requests_per_second = 0.0;
    c.relist_guard.enabled = false;
    // The local pool (static, 256 MiB/s) never the one that refuses here.
    c.quota.mode = QuotaMode::Static;
    c.quota.global.etcd_bytes_per_second = BUDGET;
    c.quota.global.etcd_servers = vec![etcd];
    let fallback = c.quota.global.fallback(1);
    assert_eq!(fallback, 0.1 * BUDGET, "reserve / N, N = 1");
    let t = start(c).await;
    let client = h1_client();

    // The renewal failed: no grant, the fallback in force, the error shown.
    let budget = || async {
        let (s, body) = get_text(&client, &t.admin_url("/debug/budget")).await;
        assert_eq!(s, StatusCode::OK);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["shared"].clone()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let shared = loop {
        let s = budget().await;
        if !s["error"].is_null() {
            break s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no renewal error: {s}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(shared["gate"]["granted"], false, "{shared}");
    assert_eq!(shared["gate"]["bytesPerSecond"], fallback, "{shared}");
    assert_eq!(shared["role"], "member", "{shared}");

    // Consistent LISTs of all pods (read from etcd), 1.5 MB each, eight at once for 2 s:
    // the fallback's 2 MB/s (and one second of burst) lets few through.
    let list = t.url("http", &format!("/api/v1/pods?size={LIST_BYTES}"));
    let started = tokio::time::Instant::now();
    let (mut ok, mut refused) = (0, 0);
    while started.elapsed() < Duration::from_secs(2) {
        let batch: Vec<_> = (0..8)
            .map(|_| {
                let (client, list) = (client.clone(), list.clone());
                tokio::spawn(async move { get_text(&client, &list).await })
            })
            .collect();
        // Meanwhile a light request is served at once: it never passes the shared budget.
        let (s, _) = get_text(
            &client,
            &t.url("http", "/api/v1/namespaces/default/pods/p1"),
        )
        .await;
        assert_eq!(s, StatusCode::OK);
        for b in batch {
            let (s, body) = b.await.unwrap();
            match s {
                StatusCode::OK => ok += 1,
                // While the first LIST (its pattern not learned yet) is in flight, the
                // others wait for its turn, up to maxWait (slow on a busy machine).
                StatusCode::TOO_MANY_REQUESTS if body.contains("not learned yet") => {}
                StatusCode::TOO_MANY_REQUESTS => {
                    refused += 1;
                    assert!(body.contains("shared by all masters"), "{body}");
                }
                other => panic!("{other}: {body}"),
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    assert!(refused > 0, "nothing refused: {ok} served");
    assert!(ok > 0, "nothing served");
    // What was read never passed the fallback's rate over the run plus its burst (one second
    // of it) and one LIST. (What was let through at its predicted cost counts the first LIST at
    // its unlearned prior, far above 1.5 MB: it passed alone into debt and was settled at what
    // it read.)
    let view = budget().await;
    let read = view["gate"]["readBytes"].as_f64().unwrap();
    let bound = fallback * (elapsed + 1.0) + LIST_BYTES as f64;
    assert!(
        read <= bound,
        "read {read} > {bound} in {elapsed:.1} s: {view}"
    );
    let served = up
        .seen()
        .iter()
        .filter(|s| s.path.starts_with("/api/v1/pods"))
        .count();
    assert_eq!(
        served, ok,
        "every LIST the apiserver served passed the shared budget"
    );
    let (_, metrics) = get_text(&client, &t.admin_url("/metrics")).await;
    assert!(
        metrics.contains("reason=\"sharedBudget\""),
        "no sharedBudget decisions:\n{metrics}"
    );
    assert_eq!(metric(&metrics, "tollgate_shared_budget_fallback"), 1.0);
    assert_eq!(
        metric(&metrics, "tollgate_shared_budget_rejected_total"),
        refused as f64
    );
    t.stop().await;
}
