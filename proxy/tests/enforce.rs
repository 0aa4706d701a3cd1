//! Enforcement end to end, with the simulated apiserver (`tollgate-bench
//! sim`, a child process) as the upstream: over TLS, client certificates
//! verified by tollgate and forwarded with the front-proxy certificate,
//! token clients known by their hash.
//!
//! - enforce: a client flooding consistent LIST-all-pods gets 429s with
//!   Status bodies and Retry-After, a second client's occasional LIST (from
//!   another address: unverified tokens are a flow per address) still
//!   succeeds, node PATCHes (system:nodes certificate) never get a 429;
//! - dryRun: the same flood is never refused, but the metrics count what
//!   would have been.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tollgate::config::Mode;

// === the simulated apiserver ===

/// `tollgate-bench sim` as a child process, killed (by its own handle) on drop.
struct Sim {
    child: Child,
    url: String,
    ca_pem: String,
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The workspace's `tollgate-bench` binary, next to this test's (built with
/// `cargo build -p bench` if it is not there yet).
fn sim_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let found = exe
        .ancestors()
        .skip(1)
        .take(3)
        .map(|d| d.join("tollgate-bench"))
        .find(|p| p.is_file());
    if let Some(p) = found {
        return p;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", "bench", "--bin", "tollgate-bench"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("running cargo build -p bench");
    assert!(status.success(), "cargo build -p bench failed");
    exe.ancestors()
        .skip(1)
        .take(3)
        .map(|d| d.join("tollgate-bench"))
        .find(|p| p.is_file())
        .expect("tollgate-bench built next to the test binary")
}

impl Sim {
    fn start(pki: &Pki, pods: u32) -> Sim {
        let dir = pki.dir.path().join("sim");
        std::fs::create_dir_all(&dir).unwrap();
        let tokens = dir.join("tokens.csv");
        std::fs::write(
            &tokens,
            "flood-token,flooder,u1,\"dev\"\nquiet-token,quiet,u2,\"dev\"\n",
        )
        .unwrap();
        let client_ca = pki.write("sim-client-ca.crt", &pki.client_ca.pem);
        let front_ca = pki.write("sim-front-ca.crt", &pki.front_ca.pem);
        let mut child = Command::new(sim_binary())
            .args([
                "sim",
                "--exit-with-stdin",
                "--listen",
                "127.0.0.1:0",
                "--tls",
            ])
            .arg("--cert-dir")
            .arg(dir.join("pki"))
            .args(["--nodes", "10", "--pods", &pods.to_string()])
            .arg("--client-ca-file")
            .arg(&client_ca)
            .arg("--requestheader-client-ca-file")
            .arg(&front_ca)
            .args(["--requestheader-allowed-names", "front-proxy-client"])
            .arg("--token-auth-file")
            .arg(&tokens)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting tollgate-bench sim");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        // Keeps draining stdout so the simulator never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        let url = loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = rx.recv_timeout(left).expect("the sim prints its URL");
            if let Some((_, url)) = line.split_once("serving the Kubernetes API at ") {
                break url.trim().to_string();
            }
        };
        let ca_pem = std::fs::read_to_string(dir.join("pki").join("ca.crt")).unwrap();
        Sim { child, url, ca_pem }
    }
}

// === the setup ===

struct Setup {
    pki: Pki,
    _sim: Sim,
    tg: Running,
}

async fn setup(configure: impl FnOnce(&mut tollgate::Config)) -> Setup {
    tollgate::install_crypto_provider();
    let pki = Pki::new();
    let sim = Sim::start(&pki, 1000);
    let (tg_cert, tg_key) = pki.leaf(&pki.serving_ca, "tollgate", "tollgate", None, true);
    let (fp_cert, fp_key) = pki.leaf(
        &pki.front_ca,
        "front-proxy",
        "front-proxy-client",
        None,
        false,
    );
    let mut c = config(&[&sim.url]);
    c.tls.cert_file = Some(tg_cert);
    c.tls.key_file = Some(tg_key);
    c.tls.client_ca_file = Some(pki.write("client-ca.crt", &pki.client_ca.pem));
    c.upstream.ca_file = Some(pki.write("sim-ca.crt", &sim.ca_pem));
    c.upstream.front_proxy_cert_file = Some(fp_cert);
    c.upstream.front_proxy_key_file = Some(fp_key);
    // A small static pool: a LIST of all 1,000 pods (about 2 MB, charged 6 MB
    // as a consistent read from etcd) takes most of a second of refill. (This
    // test is about fair queuing from a fixed pool; the adaptive budget's
    // cold start has tests of its own.)
    c.quota.mode = tollgate::budget::settings::QuotaMode::Static;
    c.quota.bytes_per_second = Some(8e6);
    c.quota.burst_bytes = Some(8e6);
    c.quota.max_wait_seconds = 10.0;
    c.quota.queue.per_flow_depth = 4;
    c.quota.per_client.requests_per_second = 20.0;
    c.quota.per_client.burst = 20;
    // Health-check hiccups on a busy machine must not shrink the pool here;
    // the guard has its own tests.
    c.relist_guard.enabled = false;
    configure(&mut c);
    let tg = start(c).await;
    Setup { pki, _sim: sim, tg }
}

struct Answer {
    status: StatusCode,
    lane: String,
    retry_after: Option<String>,
    body: Bytes,
}

async fn call(client: &TlsClient, req: Request<TestBody>) -> Answer {
    let resp = client.request(req).await.unwrap();
    let status = resp.status();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let lane = header("x-tollgate-lane").unwrap_or_default();
    let retry_after = header("retry-after");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        lane,
        retry_after,
        body,
    }
}

fn list_pods(url: &str, token: &str) -> Request<TestBody> {
    Request::get(format!("{url}/api/v1/pods"))
        .header("authorization", format!("Bearer {token}"))
        .body(body(Bytes::new()))
        .unwrap()
}

/// A node heartbeat: a strategic-merge PATCH of the node's Ready condition.
fn heartbeat(url: &str, n: usize) -> Request<TestBody> {
    let patch = format!(
        r#"{{"status":{{"conditions":[{{"type":"Ready","status":"True","reason":"KubeletReady","message":"beat {n}"}}]}}}}"#
    );
    Request::patch(format!("{url}/api/v1/nodes/node-1/status"))
        .header("content-type", "application/strategic-merge-patch+json")
        .body(body(patch))
        .unwrap()
}

fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Flood LIST-all-pods from `tasks` concurrent loops until `stop`; returns
/// (successes, rejections) counters. Each 429 is checked for its Status body
/// and Retry-After.
fn flood(
    client: &TlsClient,
    url: &str,
    tasks: usize,
    stop: &Arc<AtomicBool>,
) -> (
    Arc<AtomicUsize>,
    Arc<AtomicUsize>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let ok = Arc::new(AtomicUsize::new(0));
    let rejected = Arc::new(AtomicUsize::new(0));
    let handles = (0..tasks)
        .map(|_| {
            let (client, url, stop) = (client.clone(), url.to_string(), stop.clone());
            let (ok, rejected) = (ok.clone(), rejected.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let a = call(&client, list_pods(&url, "flood-token")).await;
                    match a.status {
                        StatusCode::OK => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        StatusCode::TOO_MANY_REQUESTS => {
                            check_rejection(&a);
                            rejected.fetch_add(1, Ordering::Relaxed);
                            // Pacing, not waiting for a condition: a flood
                            // that spins on instant 429s only burns the CPU.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        other => panic!("flood LIST got {other}"),
                    }
                }
            })
        })
        .collect();
    (ok, rejected, handles)
}

fn check_rejection(a: &Answer) {
    assert_eq!(a.lane, "heavy");
    let retry: u64 = a
        .retry_after
        .as_deref()
        .expect("Retry-After")
        .parse()
        .expect("whole seconds");
    assert!(retry >= 1);
    let status: serde_json::Value = serde_json::from_slice(&a.body).expect("a JSON body");
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["apiVersion"], "v1");
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["reason"], "TooManyRequests");
    assert_eq!(status["code"], 429);
    assert_eq!(status["details"]["retryAfterSeconds"], retry);
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains("lane heavy") && message.contains("list pods cluster"),
        "{message}"
    );
    // The cost by its one name, and the limit that bound, in words and as causes.
    let causes = status["details"]["causes"].as_array().expect("causes");
    let cost = causes
        .iter()
        .find(|c| c["reason"] == "PredictedCostBytes")
        .and_then(|c| c["message"].as_str())
        .expect("a PredictedCostBytes cause");
    assert!(cost.parse::<u64>().expect("bytes") > 0, "{cost}");
    assert!(
        message.contains(&format!("predicted cost {cost} bytes")),
        "{message}"
    );
    let bound = causes
        .iter()
        .find(|c| c["reason"] == "BoundBy")
        .and_then(|c| c["message"].as_str())
        .expect("a BoundBy cause");
    assert!(message.contains(&format!("bound by {bound}")), "{message}");
}

async fn wait_until(what: &str, deadline: Duration, mut cond: impl FnMut() -> bool) {
    let end = tokio::time::Instant::now() + deadline;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_flood_is_refused_while_others_and_node_heartbeats_get_through() {
    let s = setup(|c| c.mode = Mode::Enforce).await;
    let url = s.tg.url("https", "");
    let ca = &s.pki.serving_ca.pem;
    let (node_cert, node_key) = s.pki.leaf(
        &s.pki.client_ca,
        "node-1",
        "system:node:node-1",
        Some("system:nodes"),
        false,
    );
    let node = tls_client(ca, Some((&node_cert, &node_key)), true);
    let anyone = tls_client(ca, None, false);
    // Another machine: tokens no TokenReview confirmed are one flow per
    // source address, so from the flood's address it would share its flow.
    let quiet = tls_client_from(ca, None, false, Some("127.0.0.2".parse().unwrap()));

    let stop = Arc::new(AtomicBool::new(false));
    let (flood_ok, flood_rejected, floods) = flood(&anyone, &url, 6, &stop);

    // Node heartbeats all along: never a 429, always the system lane.
    let beats = {
        let (node, url, stop) = (node.clone(), url.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) || n < 10 {
                let a = call(&node, heartbeat(&url, n)).await;
                assert_eq!(a.status, StatusCode::OK, "heartbeat {n}: {:?}", a.body);
                assert_eq!(a.lane, "system");
                n += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            n
        })
    };

    let rejected = flood_rejected.clone();
    wait_until("the flood's first 429s", Duration::from_secs(60), || {
        rejected.load(Ordering::Relaxed) >= 3
    })
    .await;
    // The quiet client's occasional LIST gets through the storm.
    for i in 0..3 {
        let a = call(&quiet, list_pods(&url, "quiet-token")).await;
        assert_eq!(a.status, StatusCode::OK, "quiet LIST {i}: {:?}", a.body);
        assert_eq!(a.lane, "heavy");
        let list: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(list["items"].as_array().map(Vec::len), Some(1000));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for f in floods {
        f.await.unwrap();
    }
    let beats = beats.await.unwrap();
    assert!(beats >= 10, "{beats} heartbeats");
    assert!(
        flood_ok.load(Ordering::Relaxed) >= 1,
        "the flood is throttled, not starved"
    );

    let metrics = s.tg.gateway.encode_metrics().unwrap();
    let rejects = |lane: &str| {
        metric_sum(
            &metrics,
            "tollgate_decisions_total",
            &[
                "mode=\"enforce\"",
                &format!("lane=\"{lane}\""),
                "decision=\"reject\"",
            ],
        )
    };
    assert!(rejects("heavy") >= 3.0, "{metrics}");
    assert_eq!(rejects("system"), 0.0);
    assert!(
        metric_sum(
            &metrics,
            "tollgate_decisions_total",
            &["lane=\"system\"", "decision=\"admit\""]
        ) >= 10.0
    );
    // The heaviest rejected pattern names the flooding client.
    let flooder = format!("token:{}", tollgate::identity::token_hash("flood-token"));
    let patterns = s.tg.gateway.patterns();
    let rejected = patterns
        .iter()
        .find(|p| p.rejected > 0)
        .expect("a rejected pattern");
    assert_eq!(rejected.verb, "list");
    assert_eq!(rejected.resource, "pods");
    assert!(
        rejected
            .rejected_clients
            .iter()
            .any(|c| c.starts_with(&flooder)),
        "{:?}",
        rejected.rejected_clients
    );
    s.tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_refuses_nothing_but_counts_what_it_would_have() {
    let s = setup(|c| {
        c.mode = Mode::DryRun;
        c.quota.max_wait_seconds = 1.0;
    })
    .await;
    let url = s.tg.url("https", "");
    let client = tls_client(&s.pki.serving_ca.pem, None, false);
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, rejected, floods) = flood(&client, &url, 4, &stop);
    let g = s.tg.gateway.clone();
    let would_reject = || {
        let m = g.encode_metrics().unwrap();
        metric_sum(
            &m,
            "tollgate_decisions_total",
            &["mode=\"dryRun\"", "lane=\"heavy\"", "decision=\"reject\""],
        )
    };
    wait_until("would-be rejections", Duration::from_secs(60), || {
        would_reject() >= 3.0
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for f in floods {
        f.await.unwrap();
    }
    assert_eq!(
        rejected.load(Ordering::Relaxed),
        0,
        "dry run refuses nothing"
    );
    assert!(ok.load(Ordering::Relaxed) >= 3);
    // Counted as would-rejects, apart from enforce's rejects.
    let patterns = s.tg.gateway.patterns();
    assert!(patterns
        .iter()
        .any(|p| p.resource == "pods" && p.would_reject > 0));
    assert!(
        patterns.iter().all(|p| p.rejected == 0),
        "nothing was refused: {patterns:?}"
    );
    let m = g.encode_metrics().unwrap();
    assert_eq!(
        metric_sum(
            &m,
            "tollgate_decisions_total",
            &["mode=\"enforce\"", "decision=\"reject\""]
        ),
        0.0
    );
    assert!(
        metric_sum(
            &m,
            "tollgate_predicted_cost_bytes_total",
            &["mode=\"dryRun\"", "decision=\"reject\""]
        ) > 0.0,
        "the would-rejects' predicted cost"
    );
    s.tg.stop().await;
}
