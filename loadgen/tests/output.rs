//! `--output DIR` files, and Ctrl-C (in-process and SIGINT to the binary)
//! stopping cleanly with results written.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{config, eventually, full, serve};
use hdrhistogram::serialization::Deserializer;
use hyper::Response;
use tokio_util::sync::CancellationToken;

fn counting_server_handler(
    hits: Arc<AtomicU64>,
) -> impl Fn(
    hyper::Request<hyper::body::Incoming>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response<common::Body>> + Send>>
       + Send
       + Sync
       + 'static {
    move |req| {
        let hits = hits.clone();
        Box::pin(async move {
            if req.uri().path() != "/version" {
                hits.fetch_add(1, Ordering::SeqCst);
            }
            Response::new(full(r#"{"metadata":{"resourceVersion":"9"},"items":[]}"#))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_summary_perfdata_timeseries_and_histograms() {
    let hits = Arc::new(AtomicU64::new(0));
    let server = serve(counting_server_handler(hits.clone())).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("run1");
    let out_s = out.to_str().expect("utf8").to_string();
    let cfg = config(
        &server.url(),
        &[
            "--lists",
            "20/s",
            "--patches",
            "10/s",
            "--duration",
            "2s",
            "--output",
            &out_s,
        ],
    );
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("run");
    assert!(!report.interrupted);

    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).expect("summary"))
            .expect("json");
    assert_eq!(summary["schema"], "loadgen.summary/v1");
    let ops = summary["operations"].as_array().expect("operations");
    assert_eq!(ops.len(), 2);
    let list = &ops[0];
    assert_eq!(list["name"], "list");
    assert_eq!(list["requests"], 40);
    for key in ["p50", "p75", "p90", "p95", "p99", "p99.9", "max"] {
        assert!(list["latency_ms"][key].is_number(), "{key}");
    }
    assert_eq!(list["status_codes"]["200"], 40);
    assert!(list["bytes"].as_u64().expect("bytes") > 0);
    assert_eq!(ops[1]["resource"], "nodes/status");

    let perf: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("perfdata.json")).expect("perf"))
            .expect("json");
    assert_eq!(perf["version"], "v1");
    let item = &perf["dataItems"][0];
    assert_eq!(item["unit"], "ms");
    assert!(item["data"]["Perc50"].is_number() && item["data"]["Perc99"].is_number());
    assert_eq!(item["labels"]["Operation"], "list");

    let csv = std::fs::read_to_string(out.join("timeseries.csv")).expect("csv");
    assert!(csv.starts_with("second,operation,completed,"));
    let completed: u64 = csv
        .lines()
        .skip(1)
        .filter(|l| l.split(',').nth(1) == Some("list"))
        .map(|l| {
            l.split(',')
                .nth(2)
                .and_then(|n| n.parse::<u64>().ok())
                .expect("count")
        })
        .sum();
    assert_eq!(completed, 40);

    let bytes = std::fs::read(out.join("histograms").join("list.hdr")).expect("hdr");
    let h: hdrhistogram::Histogram<u64> = Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .expect("v2 histogram");
    assert_eq!(h.len(), 40);
    assert_eq!(hits.load(Ordering::SeqCst), 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interruption_stops_quickly_and_still_writes() {
    let hits = Arc::new(AtomicU64::new(0));
    let server = serve(counting_server_handler(hits.clone())).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let out_s = dir.path().to_str().expect("utf8").to_string();
    let cfg = config(
        &server.url(),
        &["--gets", "50/s", "--duration", "10m", "--output", &out_s],
    );
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(loadgen::run(cfg, shutdown.clone()));
    assert!(
        eventually(Duration::from_secs(10), || hits.load(Ordering::SeqCst)
            >= 10)
        .await
    );
    shutdown.cancel();
    let report = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("stops promptly")
        .expect("join")
        .expect("run");
    assert!(report.interrupted);
    assert!(report.operation("get").expect("get").requests >= 10);
    assert!(dir.path().join("summary.json").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_to_the_binary_writes_results() {
    let hits = Arc::new(AtomicU64::new(0));
    let server = serve(counting_server_handler(hits.clone())).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args([
            "--server",
            &server.url(),
            "--gets",
            "50/s",
            "--duration",
            "10m",
            "--output",
        ])
        .arg(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn loadgen");
    let pid = child.id().expect("pid").to_string();
    assert!(
        eventually(Duration::from_secs(20), || hits.load(Ordering::SeqCst)
            >= 10)
        .await
    );
    let killed = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("exits promptly")
        .expect("wait");
    // 128 + SIGINT: the results are written, but the run is not complete.
    assert_eq!(status.code(), Some(130), "{status:?}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("summary.json")).expect("summary"))
            .expect("json");
    assert_eq!(summary["interrupted"], true);
    assert!(summary["operations"][0]["requests"].as_u64().expect("n") >= 10);
}
