//! `--server-metrics`, `--shard i/N` + `loadgen merge`, `loadgen seed` / `cleanup`.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::{body_bytes, config, full, json, serve};
use hyper::{Method, Response};
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_metrics_report_cpu_and_memory_naming_the_source() {
    let scrapes = Arc::new(AtomicU64::new(0));
    let s = scrapes.clone();
    let server = serve(move |req| {
        let s = s.clone();
        async move {
            if req.uri().path() == "/metrics" {
                // Virtual CPU grows by 0.5 s per scrape; memory alternates.
                let n = s.fetch_add(1, Ordering::SeqCst) as f64;
                let text = format!(
                    "process_cpu_seconds_total 1\nprocess_resident_memory_bytes 5\n\
                     tollgate_sim_virtual_cpu_seconds_total {}\ntollgate_sim_virtual_memory_bytes {}\n",
                    n * 0.5,
                    if (n as u64).is_multiple_of(2) { 100.0 } else { 300.0 }
                );
                return Response::new(full(text));
            }
            Response::new(full("{}"))
        }
    })
    .await;
    let metrics_url = format!("{}/metrics", server.url());
    let cfg = config(
        &server.url(),
        &[
            "--gets",
            "10/s",
            "--duration",
            "1s",
            "--server-metrics",
            &metrics_url,
            "--server-metrics-interval",
            "200ms",
        ],
    );
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("run");
    let m = report.server_metrics.first().expect("one source");
    assert!(m.samples >= 4, "{} samples", m.samples);
    assert_eq!(
        m.cpu_source.as_deref(),
        Some("tollgate_sim_virtual_cpu_seconds_total")
    );
    assert_eq!(
        m.memory_source.as_deref(),
        Some("tollgate_sim_virtual_memory_bytes")
    );
    assert_eq!(m.memory_bytes_peak, Some(300.0));
    assert!(m.cpu_cores_avg.expect("cpu") > 0.0);
    assert!(report
        .table()
        .contains("tollgate_sim_virtual_cpu_seconds_total"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_merge_to_the_unsharded_totals() {
    let server = serve(|_req| async move { Response::new(full("{}")) }).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| dir.path().join(name).to_str().expect("utf8").to_string();
    let (all, s0, s1) = (path("all"), path("s0"), path("s1"));
    let args = |out: &str, shard: Option<&str>| {
        let mut a = vec![
            "--gets",
            "40/s",
            "--lists",
            "20/s",
            "--duration",
            "1s",
            "--output",
        ];
        a.push(out);
        if let Some(s) = shard {
            a.extend_from_slice(&["--shard", s]);
        }
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let url = server.url();
    let run = |a: Vec<String>| {
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        loadgen::run(config(&url, &refs), CancellationToken::new())
    };
    let (whole, r0, r1) = tokio::join!(
        run(args(&all, None)),
        run(args(&s0, Some("0/2"))),
        run(args(&s1, Some("1/2")))
    );
    let (whole, _, _) = (
        whole.expect("whole"),
        r0.expect("shard 0"),
        r1.expect("shard 1"),
    );
    let out = dir.path().join("merged");
    let merged = loadgen::merge::merge_dirs(&[s0.into(), s1.into()], &out).expect("merge");
    for name in ["get", "list"] {
        let (m, w) = (
            merged.operation(name).expect("m"),
            whole.operation(name).expect("w"),
        );
        assert_eq!(m.requests, w.requests, "{name}");
        assert_eq!(m.status_codes, w.status_codes, "{name}");
        assert_eq!(
            merged.histograms[name].len(),
            whole.histograms[name].len(),
            "{name}"
        );
        assert!(
            (m.target_rate_per_s.expect("rate") - w.target_rate_per_s.expect("rate")).abs() < 1e-9
        );
    }
    let reloaded = loadgen::merge::load(&out).expect("load merged");
    assert_eq!(reloaded.histograms["get"].len(), 40);
    let csv_total: u64 = reloaded
        .series
        .iter()
        .filter(|(n, _)| n == "get")
        .map(|(_, r)| r.completed)
        .sum();
    assert_eq!(csv_total, 40);
}

/// A tiny object store: POST creates, GET lists (ignoring selectors, as a
/// careless server might), DELETE removes.
async fn store() -> (
    common::TestServer,
    Arc<Mutex<BTreeMap<String, serde_json::Value>>>,
) {
    let objects: Arc<Mutex<BTreeMap<String, serde_json::Value>>> = Arc::default();
    let o = objects.clone();
    let server = serve(move |req| {
        let o = o.clone();
        async move {
            let path = req.uri().path().to_string();
            match *req.method() {
                Method::POST => {
                    let v: serde_json::Value =
                        serde_json::from_slice(&body_bytes(req).await).unwrap_or_default();
                    let key = format!("{path}/{}", v["metadata"]["name"].as_str().unwrap_or(""));
                    let mut m = o.lock().expect("lock");
                    if m.contains_key(&key) {
                        return json(409, json!({"kind":"Status","code":409}));
                    }
                    m.insert(key, v.clone());
                    json(201, v)
                }
                Method::DELETE => match o.lock().expect("lock").remove(&path) {
                    Some(v) => json(200, v),
                    None => json(404, json!({"kind":"Status","code":404})),
                },
                _ if path == "/version" => Response::new(full("{}")),
                _ => {
                    // /api/v1/pods lists pods of every namespace.
                    let m = o.lock().expect("lock");
                    let kind = path.rsplit('/').next().unwrap_or("").to_string();
                    let items: Vec<_> = m
                        .iter()
                        .filter(|(k, _)| k.rsplit('/').nth(1) == Some(kind.as_str()))
                        .map(|(_, v)| v.clone())
                        .collect();
                    json(
                        200,
                        json!({"kind":"List","metadata":{"resourceVersion":"1"},"items":items}),
                    )
                }
            }
        }
    })
    .await;
    (server, objects)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_then_cleanup_removes_exactly_loadgens_objects() {
    let (server, objects) = store().await;
    objects.lock().expect("lock").insert(
        "/api/v1/namespaces/default/pods/someone-elses".into(),
        json!({"metadata":{"name":"someone-elses","namespace":"default","labels":{"app":"web"}}}),
    );
    let url = server.url();
    let seed = <loadgen::cli::Cli as clap::Parser>::try_parse_from([
        "loadgen",
        "seed",
        "--server",
        &url,
        "--nodes",
        "3",
        "--pods",
        "10",
        "--namespaces",
        "2",
        "--pod-bytes",
        "100",
    ])
    .expect("flags");
    let Some(loadgen::cli::Command::Seed(args)) = seed.command else {
        panic!("not seed")
    };
    let args = args.into_config();
    let tally = loadgen::seed::seed(&args).await.expect("seed");
    assert_eq!((tally.done, tally.failed), (2 + 3 + 10, 0));
    {
        let m = objects.lock().expect("lock");
        let pod = &m["/api/v1/namespaces/loadgen-ns-1/pods/loadgen-pod-1"];
        assert_eq!(pod["spec"]["nodeName"], "loadgen-node-1");
        assert_eq!(
            pod["metadata"]["annotations"]["loadgen.tollgate.dev/padding"]
                .as_str()
                .map(str::len),
            Some(100)
        );
    }
    let again = loadgen::seed::seed(&args).await.expect("seed again");
    assert_eq!((again.done, again.unchanged), (0, 15));

    let cleanup = <loadgen::cli::Cli as clap::Parser>::try_parse_from([
        "loadgen", "cleanup", "--server", &url,
    ])
    .expect("flags");
    let Some(loadgen::cli::Command::Cleanup(args)) = cleanup.command else {
        panic!("not cleanup")
    };
    let args = args.into_config();
    let tally = loadgen::seed::cleanup(&args).await.expect("cleanup");
    assert_eq!((tally.done, tally.failed), (15, 0));
    let left: Vec<String> = objects.lock().expect("lock").keys().cloned().collect();
    assert_eq!(
        left,
        vec!["/api/v1/namespaces/default/pods/someone-elses".to_string()]
    );
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut tcp) = tokio::net::TcpStream::connect(addr).await else {
        return String::new();
    };
    let req = format!("GET {path} HTTP/1.1\r\nHost: loadgen\r\nConnection: close\r\n\r\n");
    if tcp.write_all(req.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut out = Vec::new();
    let _ = tcp.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_listen_serves_live_loadgen_metrics() {
    let server = serve(|_req| async move { Response::new(full("{}")) }).await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut cfg = config(&server.url(), &["--gets", "50/s", "--duration", "10m"]);
    cfg.metrics_listen = Some(loadgen::MetricsListen::Listener(Arc::new(listener)));
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(loadgen::run(cfg, shutdown.clone()));
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while tokio::time::Instant::now() < deadline {
        text = http_get(addr, "/metrics").await;
        if text.contains("loadgen_requests_total{operation=\"get\",code=\"200\"}") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    let report = run.await.expect("join").expect("run");
    assert!(report.interrupted);
    assert!(
        text.contains("loadgen_requests_total{operation=\"get\",code=\"200\"}"),
        "{text}"
    );
    assert!(
        text.contains("loadgen_request_duration_seconds_bucket{le=\"0.005\",operation=\"get\"}")
            || text.contains(
                "loadgen_request_duration_seconds_bucket{operation=\"get\",le=\"0.005\"}"
            ),
        "{text}"
    );
    assert!(
        text.contains("loadgen_dropped_total{operation=\"get\"} 0"),
        "{text}"
    );
    assert!(text.contains("loadgen_watches_active 0"), "{text}");
}
