//! The scenario at reduced scale, with the modeled cost: 1,000 nodes'
//! heartbeat PATCHes (100/s) plus 120 LIST-all-pods per minute over 30,000
//! pods (~3.3 KB, the calibration's: a LIST of all pods is ~100 MB). Consistent LISTs (etcd) raise PATCH p99 at least 10x over the run
//! without LISTs, or crash the simulated apiserver; the same LISTs from the
//! watch cache (resourceVersion=0) hurt far less; without LISTs PATCH latency
//! returns to its baseline; and the simulator process itself stays under one
//! core of real CPU throughout (the model waits on timers, it burns nothing).
//!
//! One test, ~50 s of load (plus seeding): the simulator runs as its own process so its CPU
//! is measured alone; an open-loop driver in the test sends the load and
//! measures latency from each request's intended start.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

const NODES: u32 = 1_000;
const PODS: u32 = 30_000;
const PATCHES_PER_S: f64 = 100.0;
const LISTS_PER_MIN: f64 = 120.0;

/// The simulator as a child process, killed on drop.
struct SimProcess {
    child: Child,
    url: String,
}

impl SimProcess {
    fn start(flags: &[&str]) -> SimProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate-bench"))
            .args(["sim", "--listen", "127.0.0.1:0", "--exit-with-stdin"])
            .args(flags)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("tollgate-bench starts");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let url = loop {
            // The simulator prints its URL once seeded (the read ends if it dies).
            let line = lines
                .next()
                .expect("the sim exited before serving")
                .unwrap();
            if let Some((_, u)) = line.split_once("serving the Kubernetes API at ") {
                break u.trim().to_string();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        SimProcess { child, url }
    }

    /// User + system CPU seconds of the simulator process.
    fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let rest: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        let ticks: f64 = rest[11].parse::<f64>().unwrap() + rest[12].parse::<f64>().unwrap();
        ticks / 100.0
    }
}

impl Drop for SimProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

type Http = Client<HttpConnector, Full<Bytes>>;

/// Latencies (s) of the successful requests of one stream, and its failures.
#[derive(Default)]
struct Results {
    ok: Vec<f64>,
    failed: usize,
}

impl Results {
    fn p99(&self) -> f64 {
        let mut v = self.ok.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return f64::INFINITY;
        }
        v[((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1]
    }
}

async fn send(client: &Http, req: Request<Full<Bytes>>, timeout: Duration) -> bool {
    let fut = async {
        let resp = client.request(req).await.ok()?;
        let ok = resp.status().is_success();
        resp.into_body().collect().await.ok()?;
        Some(ok)
    };
    matches!(tokio::time::timeout(timeout, fut).await, Ok(Some(true)))
}

/// Open loop: request i leaves at start + i/rate whatever came before, and
/// its latency counts from then. Returns once every request has ended.
async fn open_loop<F>(rate_per_s: f64, seconds: f64, timeout: Duration, make: F) -> Results
where
    F: Fn(u64) -> Request<Full<Bytes>>,
{
    let client: Http = Client::builder(TokioExecutor::new()).build_http();
    let results = Arc::new(Mutex::new(Results::default()));
    let start = Instant::now();
    let n = (rate_per_s * seconds) as u64;
    let mut tasks = Vec::new();
    for i in 0..n {
        let at = start + Duration::from_secs_f64(i as f64 / rate_per_s);
        tokio::time::sleep_until(at).await;
        let (client, results, req) = (client.clone(), results.clone(), make(i));
        tasks.push(tokio::spawn(async move {
            let ok = send(&client, req, timeout).await;
            let mut r = results.lock().unwrap();
            if ok {
                r.ok.push(at.elapsed().as_secs_f64());
            } else {
                r.failed += 1;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    Arc::try_unwrap(results).ok().unwrap().into_inner().unwrap()
}

fn heartbeat(url: &str, i: u64) -> Request<Full<Bytes>> {
    let node = i % u64::from(NODES) + 1;
    let body = serde_json::json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "lastHeartbeatTime": format!("2026-11-22T08:{:02}:{:02}Z", (i / 60) % 60, i % 60)}]}});
    Request::patch(format!("{url}/api/v1/nodes/node-{node}/status"))
        .header("content-type", "application/strategic-merge-patch+json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

fn list_pods(url: &str, query: &str) -> Request<Full<Bytes>> {
    Request::get(format!("{url}/api/v1/pods{query}"))
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// PATCHes for `seconds`, with LISTs (`query`) alongside when given.
async fn phase(url: &str, seconds: f64, lists: Option<&str>) -> (Results, Results) {
    let patches = open_loop(PATCHES_PER_S, seconds, Duration::from_secs(30), |i| {
        heartbeat(url, i)
    });
    match lists {
        None => (patches.await, Results::default()),
        Some(q) => {
            let l = open_loop(
                LISTS_PER_MIN / 60.0,
                seconds,
                Duration::from_secs(120),
                |_| list_pods(url, q),
            );
            tokio::join!(patches, l)
        }
    }
}

async fn restarts(url: &str) -> f64 {
    let client: Http = Client::builder(TokioExecutor::new()).build_http();
    for _ in 0..200 {
        if let Ok(r) = client
            .request(
                Request::get(format!("{url}/metrics"))
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
            .await
        {
            if let Ok(b) = r.into_body().collect().await {
                let text = String::from_utf8_lossy(&b.to_bytes()).to_string();
                return text
                    .lines()
                    .find(|l| l.starts_with("tollgate_sim_restarts_total "))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
                    .unwrap_or(0.0);
            }
        }
        // Restarting: try again shortly.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the sim never answered /metrics");
}

/// PATCH latency buckets of the sim's own `apiserver_request_duration_seconds`
/// (cumulative counts by upper bound): server-side, so the test driver's own
/// delays on a busy machine do not count.
async fn patch_buckets(url: &str) -> Vec<(f64, f64)> {
    let client: Http = Client::builder(TokioExecutor::new()).build_http();
    for _ in 0..200 {
        let req = Request::get(format!("{url}/metrics"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        if let Ok(r) = client.request(req).await {
            if let Ok(b) = r.into_body().collect().await {
                let text = String::from_utf8_lossy(&b.to_bytes()).to_string();
                let mut by_le: std::collections::BTreeMap<String, f64> = Default::default();
                for l in text.lines().filter(|l| {
                    l.starts_with("apiserver_request_duration_seconds_bucket{")
                        && l.contains("verb=\"PATCH\"")
                }) {
                    let le = l.split("le=\"").nth(1).unwrap().split('"').next().unwrap();
                    let v: f64 = l.split_whitespace().last().unwrap().parse().unwrap();
                    *by_le.entry(le.to_string()).or_default() += v;
                }
                let mut v: Vec<(f64, f64)> = by_le
                    .into_iter()
                    .map(|(le, n)| (le.parse().unwrap_or(f64::INFINITY), n))
                    .collect();
                v.sort_by(|a, b| a.0.total_cmp(&b.0));
                return v;
            }
        }
        // Restarting: try again shortly.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the sim never answered /metrics");
}

/// The upper bound of the bucket holding the 99th percentile of the PATCHes between two scrapes.
fn p99_bucket(before: &[(f64, f64)], after: &[(f64, f64)]) -> f64 {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let b = before.iter().find(|(l, _)| l == le).map_or(0.0, |x| x.1);
            (*le, n - b)
        })
        .collect();
    let total = delta.last().map_or(0.0, |x| x.1);
    delta
        .iter()
        .find(|(_, n)| *n >= 0.99 * total)
        .map_or(f64::INFINITY, |x| x.0)
}

// Ignored in the default run: alongside the rest of the suite on a shared
// 2-core machine, the machine's own scheduling delays (tens to hundreds of ms)
// swamp the baseline it is measured against. Run it alone:
// `cargo nextest run -p bench --test sim_model_load --run-ignored all`.
#[ignore = "~70 s load test; run alone (see comment)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_lists_starve_heartbeats_and_cache_lists_do_not() {
    let sim = tokio::task::spawn_blocking(|| {
        SimProcess::start(&[
            "--cost-model",
            "modeled",
            "--nodes",
            &NODES.to_string(),
            "--pods",
            &PODS.to_string(),
            // The calibration's pods (bench/MODEL.md): ~100 MB a LIST of all of them.
            "--pod-bytes",
            "3300",
            "--max-requests-inflight",
            "0",
            "--max-mutating-requests-inflight",
            "0",
        ])
    })
    .await
    .unwrap();
    let url = sim.url.clone();
    let cpu0 = sim.cpu_seconds();
    let wall0 = Instant::now();

    let h0 = patch_buckets(&url).await;
    let (base, _) = phase(&url, 8.0, None).await;
    let h1 = patch_buckets(&url).await;
    let (with_cache, cache_lists) = phase(&url, 12.0, Some("?resourceVersion=0")).await;
    let h2 = patch_buckets(&url).await;
    let restarts_before = restarts(&url).await;
    let (with_etcd, etcd_lists) = phase(&url, 20.0, Some("")).await;
    let h3 = patch_buckets(&url).await;
    let crashed = restarts(&url).await > restarts_before;
    let (after, _) = phase(&url, 8.0, None).await;
    let h4 = patch_buckets(&url).await;
    // Server-side p99s (bucket bounds), as a scraper of /metrics sees them.
    let (s_base, s_cache, s_etcd, s_after) = (
        p99_bucket(&h0, &h1),
        p99_bucket(&h1, &h2),
        p99_bucket(&h2, &h3),
        p99_bucket(&h3, &h4),
    );

    let cpu = (sim.cpu_seconds() - cpu0) / wall0.elapsed().as_secs_f64();
    let report = format!(
        "PATCH p99: baseline {:.1} ms, with cache LISTs {:.1} ms, with consistent LISTs {:.1} ms ({} failed, crashed: {crashed}), after {:.1} ms; \
         LISTs: cache {} ok, etcd {} ok / {} failed; sim CPU {cpu:.2} cores; \
         server-side p99 buckets (s): baseline ≤{s_base}, cache ≤{s_cache}, consistent ≤{s_etcd}, after ≤{s_after}",
        base.p99() * 1e3,
        with_cache.p99() * 1e3,
        with_etcd.p99() * 1e3,
        with_etcd.failed,
        after.p99() * 1e3,
        cache_lists.ok.len(),
        etcd_lists.ok.len(),
        etcd_lists.failed,
    );
    eprintln!("{report}");
    assert!(base.failed == 0 && with_cache.failed == 0, "{report}");
    // Client-side p99s carry the (debug-built) driver's own delays while it
    // reads 100 MB LISTs on a shared machine; the server's histogram does not,
    // so the ratios are checked on either.
    assert!(
        crashed || with_etcd.p99() >= 10.0 * base.p99() || s_etcd >= 10.0 * s_base,
        "consistent LISTs did not hurt: {report}"
    );
    assert!(
        crashed || with_cache.p99() * 2.0 <= with_etcd.p99() || s_cache * 2.0 <= s_etcd,
        "cache LISTs hurt about as much as consistent ones: {report}"
    );
    assert!(
        after.p99() <= (5.0 * base.p99()).max(0.05) && after.p99() * 3.0 <= with_etcd.p99(),
        "PATCH latency did not return to its baseline: {report}"
    );
    assert!(cpu < 1.0, "the simulator burned real CPU: {report}");
}
