//! The admin listener and configuration handling: /healthz, /readyz,
//! /metrics, /debug/patterns after a mixed load, reloads that keep the old
//! configuration on error.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use http::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patterns_name_the_heavy_lists_with_their_learned_bytes() {
    let up = Upstream::start(None).await;
    let mut c = config(&[&up.url]);
    // The configured store (etcd for consistent reads), not a learned one.
    c.upstream.metrics_scrape.enabled = false;
    let tg = start(c).await;
    let client = h1_client();
    // A mixed load: full consistent LISTs of pods (200 kB), LISTs by node
    // (1 kB each, but a consistent read of every pod), gets, cached LISTs.
    for i in 0..3 {
        let (code, _) = get_text(&client, &tg.url("http", "/api/v1/pods?size=200000")).await;
        assert_eq!(code, StatusCode::OK, "{i}");
    }
    for i in 0..5 {
        let url = format!("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-{i}&size=1000");
        get_text(&client, &tg.url("http", &url)).await;
        get_text(
            &client,
            &tg.url("http", &format!("/api/v1/namespaces/a/pods/p{i}?size=500")),
        )
        .await;
        get_text(
            &client,
            &tg.url("http", "/api/v1/configmaps?resourceVersion=0&size=20000"),
        )
        .await;
    }
    let g = tg.gateway.clone();
    eventually("all observed", std::time::Duration::from_secs(5), || {
        g.patterns().iter().map(|p| p.count).sum::<u64>() == 18
    })
    .await;

    let (code, text) = get_text(&client, &tg.admin_url("/debug/patterns")).await;
    assert_eq!(code, StatusCode::OK);
    let patterns: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(patterns.len(), 4);
    let costs: Vec<f64> = patterns
        .iter()
        .map(|p| p["predictedCostBytes"].as_f64().unwrap())
        .collect();
    assert!(
        costs.windows(2).all(|w| w[0] >= w[1]),
        "heaviest first: {costs:?}"
    );

    let find = |pattern: &str| {
        patterns
            .iter()
            .find(|p| p["pattern"] == pattern)
            .unwrap_or_else(|| panic!("{pattern} in {text}"))
    };
    let full = find("list pods cluster consistent anonymous json");
    assert_eq!(full["count"], 3);
    let avg = full["bytesAvg"].as_f64().unwrap();
    assert!((avg - 200_000.0).abs() <= 20_000.0, "within 10%: {avg}");
    assert_eq!(full["consistency"], "consistent");
    assert_eq!(full["topClients"][0], "anonymous");

    let by_node = find("list pods cluster field:spec.nodeName= consistent anonymous json");
    let small = by_node["bytesAvg"].as_f64().unwrap();
    assert!((small - 1000.0).abs() < 1e-6, "{small}");
    assert!(
        by_node["predictedCostBytes"].as_f64().unwrap() >= 200_000.0,
        "a small response, a heavy read: {by_node}"
    );
    for field in [
        "verb",
        "resource",
        "scope",
        "rate",
        "bytesP95",
        "latencyP99Ms",
        "rejected",
        "wouldReject",
        "predictedResponseBytes",
        "predictedEtcdReadBytes",
    ] {
        assert!(by_node.get(field).is_some(), "{field}");
    }

    let (code, metrics) = get_text(&client, &tg.admin_url("/metrics")).await;
    assert_eq!(code, StatusCode::OK);
    for name in [
        "tollgate_requests_total",
        "tollgate_patterns",
        "tollgate_predicted_bytes_total",
        "tollgate_actual_bytes_total",
    ] {
        assert!(metrics.contains(name), "{name} missing");
    }
    // tollgate's own names, and the process collector's under client_golang's names.
    let process = [
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "process_max_fds ",
        "process_start_time_seconds ",
    ];
    for l in metrics.lines().filter(|l| !l.starts_with('#')) {
        assert!(
            l.starts_with("tollgate_") || process.iter().any(|p| l.starts_with(p)) || l.is_empty(),
            "{l}"
        );
    }
    for p in process {
        assert!(metrics.lines().any(|l| l.starts_with(p)), "{p}missing");
    }
    assert_eq!(
        get_text(&client, &tg.admin_url("/healthz")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        get_text(&client, &tg.admin_url("/nope")).await.0,
        StatusCode::NOT_FOUND
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_upstream_health() {
    let dead = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let tg = start(config(&[&dead])).await;
    let client = h1_client();
    let admin = tg.admin_url("/readyz");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if get_text(&client, &admin).await.0 == StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "readyz never failed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tg.stop().await;
}

#[tokio::test]
async fn a_bad_reload_keeps_the_running_config() {
    let up = Upstream::start(None).await;
    let mut c = config(&[&up.url]);
    c.patterns.capacity = 77;
    let tg = start(c.clone()).await;
    let mut bad = c.clone();
    bad.upstream.urls.clear();
    assert!(tg.gateway.reload(bad).is_err());
    assert_eq!(tg.gateway.config().patterns.capacity, 77);
    let mut good = c;
    good.patterns.capacity = 88;
    tg.gateway.reload(good).unwrap();
    assert_eq!(tg.gateway.config().patterns.capacity, 88);
    let m = tg.gateway.encode_metrics().unwrap();
    assert!(
        m.contains("tollgate_config_reloads_total{result=\"error\"} 1"),
        "{m}"
    );
    tg.stop().await;
}

#[test]
fn a_bad_file_is_refused_with_field_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(
        &path,
        "listen: 127.0.0.1:0\nupstream:\n  urls: [\"http://a:1\"]\n  healthChek: {}\n",
    )
    .unwrap();
    let flags = tollgate::Flags {
        config: Some(path.clone()),
        ..Default::default()
    };
    let err = tollgate::Config::load(&flags).unwrap_err().to_string();
    assert!(
        err.contains("healthChek") && err.contains("tollgate.yaml"),
        "{err}"
    );

    std::fs::write(&path, "upstream:\n  urls: [\"http://a:1\"]\n").unwrap();
    let flags = tollgate::Flags {
        config: Some(path),
        listen: Some("127.0.0.1:1".into()),
        ..Default::default()
    };
    let c = tollgate::Config::load(&flags).unwrap();
    assert_eq!(c.listen, "127.0.0.1:1", "flags override the file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_counts_are_scraped_from_the_upstream() {
    let up = Upstream::start(None).await;
    let tg = start(config(&[&up.url])).await;
    let g = tg.gateway.clone();
    eventually("scraped", std::time::Duration::from_secs(10), || {
        let m = g.encode_metrics().unwrap();
        m.contains("tollgate_resource_objects{resource=\"pods\"} 5000")
            && m.contains("tollgate_resource_objects{resource=\"apps/deployments\"} 7")
    })
    .await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_lists_the_apiserver_did_not_serve_from_etcd_are_learned_as_cached() {
    let up = Upstream::start(None).await;
    let tg = start(config(&[&up.url])).await;
    let client = h1_client();
    // The upstream says it served no LIST of configmaps from etcd, ever.
    let g = tg.gateway.clone();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        for i in 0..5 {
            let url = format!("/api/v1/configmaps?fieldSelector=metadata.name%3Dc{i}&size=300");
            assert_eq!(
                get_text(&client, &tg.url("http", &url)).await.0,
                StatusCode::OK
            );
        }
        let learned = g.patterns().iter().any(|p| {
            p.resource == "configmaps" && p.store == Some(tollgate::config::Store::WatchCache)
        });
        if learned {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "store never learned"
        );
    }
    let p = g
        .patterns()
        .into_iter()
        .find(|p| p.resource == "configmaps")
        .unwrap();
    assert!(
        (p.predicted_cost_bytes - 300.0).abs() < 1e-6,
        "served from the cache, costs what it returns: {p:?}"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serves_until_shutdown() {
    let up = Upstream::start(None).await;
    let mut c = config(&[&up.url]);
    c.admin_listen = Some("127.0.0.1:0".into());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(tollgate::run(c, listener, async move {
        let _ = rx.await;
    }));
    let (code, body) = get_text(&h1_client(), &format!("http://{addr}/version")).await;
    assert_eq!((code, body.as_str()), (StatusCode::OK, "ok"));
    tx.send(()).unwrap();
    let result = tokio::time::timeout(std::time::Duration::from_secs(10), task).await;
    assert!(matches!(result, Ok(Ok(Ok(())))), "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_fails_while_draining() {
    let up = Upstream::start(None).await;
    let mut c = config(&[&up.url]);
    c.drain.window_seconds = 3.0;
    let tg = start(c).await;
    // Two client connections, the second with a watch in flight: it is closed ~1.9 s into
    // the window (an idle one would be closed at once, and the drain end at once).
    let (a, b) = (h1_client(), h1_client());
    assert_eq!(
        get_text(&a, &tg.url("http", "/version")).await.0,
        StatusCode::OK
    );
    let watch = http::Request::get(tg.url("http", "/api/v1/pods?watch=1"))
        .body(body(bytes::Bytes::new()))
        .unwrap();
    let watching = b.request(watch).await.unwrap();
    assert_eq!(watching.status(), StatusCode::OK);
    let admin = tg.admin_url("/readyz");
    let stopping = tokio::spawn(tg.stop());
    let probe = h1_client();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        if get_text(&probe, &admin).await.0 == StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "readyz stayed ready while draining"
        );
    }
    stopping.await.unwrap();
    drop(watching);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_reviews_name_token_clients_in_the_background() {
    let up = Upstream::start(None).await;
    let mut c = config(&[&up.url]);
    c.token_review.enabled = true;
    let tg = start(c).await;
    let client = h1_client();
    let g = tg.gateway.clone();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let req = http::Request::get(tg.url("http", "/api/v1/nodes/n1"))
            .header("authorization", "Bearer node-token")
            .body(body(bytes::Bytes::new()))
            .unwrap();
        assert_eq!(client.request(req).await.unwrap().status(), StatusCode::OK);
        let patterns = g.patterns();
        if let Some(p) = patterns
            .iter()
            .find(|p| p.pattern == "get nodes cluster node json")
        {
            assert!(
                p.top_clients[0].starts_with("system:node:n1 (token "),
                "{p:?}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never reviewed: {patterns:?}"
        );
    }
    let text = serde_json::to_string(&g.patterns()).unwrap() + &g.encode_metrics().unwrap();
    assert!(!text.contains("node-token"));
    assert_eq!(
        up.seen()
            .iter()
            .filter(|s| s.path.contains("tokenreviews"))
            .count(),
        1,
        "one review per token"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_version_is_counted_and_consistent_lists_stay_priced_as_etcd() {
    // The stub answers `/version` with `ok`: no Kubernetes release in it.
    let up = Upstream::start(None).await;
    let tg = start(config(&[&up.url])).await;
    let g = tg.gateway.clone();
    eventually(
        "the /version read",
        std::time::Duration::from_secs(10),
        || {
            let m = g.encode_metrics().unwrap();
            metric(
                &m,
                "tollgate_upstream_version_reads_total{result=\"unparsable\"}",
            ) >= 1.0
        },
    )
    .await;
    let m = g.encode_metrics().unwrap();
    assert_eq!(metric(&m, "tollgate_upstream_minor_version"), 0.0, "{m}");
    assert_eq!(
        metric(&m, "tollgate_upstream_version_reads_total{result=\"ok\"}"),
        0.0
    );
    let client = h1_client();
    let url = tg.url("http", "/api/v1/pods?size=3000");
    assert_eq!(get_text(&client, &url).await.0, StatusCode::OK);
    let p = g
        .patterns()
        .into_iter()
        .find(|p| p.resource == "pods" && p.consistency.as_deref() == Some("consistent"))
        .expect("the consistent LIST of pods");
    assert_eq!(p.store, Some(tollgate::config::Store::Etcd), "{p:?}");
    assert_eq!(
        p.store_reason,
        Some(tollgate::predict::StoreReason::UnknownVersion),
        "{p:?}"
    );
    assert!(p.predicted_etcd_read_bytes > 0.0, "{p:?}");
    tg.stop().await;
}
