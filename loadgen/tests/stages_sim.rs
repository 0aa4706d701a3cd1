//! Stages end to end: the `loadgen` binary simulating nodes with `--stages`
//! against the simulated apiserver (`tollgate-bench sim`, a child process on
//! 127.0.0.1:0). Registered nodes are initialized, pods on them go Running, a
//! deleted pod goes, and with a heartbeat Stage loaded loadgen's own status
//! heartbeat is off while the Stage heartbeats the nodes.
//!
//! Needs `target/debug/tollgate-bench`: `cargo build -p bench` first.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http::Method;
use http_body_util::BodyExt;
use loadgen::target::{ApiClient, TargetOptions};
use serde_json::Value;

/// A child process killed (by its own pid) and reaped on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn sim_binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    let bin = target.join("debug").join("tollgate-bench");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p bench` first",
        bin.display()
    );
    bin
}

/// Starts the simulator; its URL once it serves.
fn start_sim() -> (Killed, String) {
    let mut child = Command::new(sim_binary())
        // The simulator's own kubelet stand-in would delete pods 1 s into a graceful
        // delete; made slower than the grace period, only the pod-delete Stage can.
        .args(["sim", "--exit-with-stdin", "--listen", "127.0.0.1:0"])
        .args(["--kubelet-delete-delay", "10m"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting tollgate-bench sim");
    let stdout = child.stdout.take().expect("stdout");
    let child = Killed(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .expect("the simulator printed its URL in time");
        if let Some((_, url)) = line.split_once("serving the Kubernetes API at ") {
            return (child, url.trim().to_string());
        }
    }
}

async fn call(client: &ApiClient, method: Method, path: &str) -> (u16, Value) {
    let req = client.request(method, path, None).expect("request");
    let resp = client.send(req).await.expect("the simulator answers");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// Polls `cond` every 100 ms until it holds, for at most `limit`.
async fn eventually<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        let not_yet = cond().await;
        let Some(why) = not_yet else { return };
        assert!(
            Instant::now() < deadline,
            "{what} not within {limit:?}: {why}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ready(obj: &Value) -> bool {
    obj["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stages_drive_nodes_and_pods_through_the_simulator() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (_sim, url) = start_sim();
    let out = tempfile::tempdir().unwrap();
    let run = start_loadgen_nodes(&url, out.path());
    let target = TargetOptions {
        server: Some(url.clone()),
        ..Default::default()
    };
    let client = ApiClient::new(&target.resolve().unwrap());

    nodes_are_initialized(&client).await;
    pods_go_running(&client).await;
    a_deleted_pod_goes(&client).await;
    a_stage_heartbeats(&client).await;
    finishes(run).await;
    the_summary_counts_the_stages(out.path());
}

/// `loadgen nodes` with 2 nodes × 2 pods, the `fast` Stages and kwok's heartbeat Stage (time
/// scaled), writing into `out`.
fn start_loadgen_nodes(url: &str, out: &std::path::Path) -> Killed {
    let heartbeat =
        workspace().join("loadgen/tests/testdata/kwok/node/heartbeat/node-heartbeat.yaml");
    let mut run = Command::new(env!("CARGO_BIN_EXE_loadgen"));
    run.args([
        "nodes",
        "--server",
        url,
        "--count",
        "2",
        "--pods-per-node",
        "2",
    ])
    .args(["--heartbeat", "1s", "--lease-renew", "0", "-n", "default"])
    .args([
        "--namespace-allow",
        "default",
        "--duration",
        "12s",
        "--no-progress",
    ])
    .arg("--stages")
    .arg("fast")
    .arg(&heartbeat)
    // kwok's heartbeat Stage waits 20–25 s: every 1–1.25 s here.
    .args(["--time-scale", "20", "--output"])
    .arg(out)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    Killed(run.spawn().expect("starting loadgen"))
}

/// node-initialize: registered without status, the Stage makes them Ready and Running.
async fn nodes_are_initialized(client: &ApiClient) {
    eventually(Duration::from_secs(30), "nodes initialized", || async {
        let (_, list) = call(
            client,
            Method::GET,
            "/api/v1/nodes?labelSelector=loadgen.tollgate.dev%2Fsimulated-node%3Dtrue",
        )
        .await;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        let done = items
            .iter()
            .filter(|n| n["status"]["phase"] == "Running" && ready(n))
            .count();
        (items.len() != 2 || done != 2).then(|| format!("{done} of {} nodes", items.len()))
    })
    .await;
}

/// pod-ready: the pods created on them go Running with IPs.
async fn pods_go_running(client: &ApiClient) {
    eventually(Duration::from_secs(30), "pods running", || async {
        let (_, list) = call(client, Method::GET, "/api/v1/namespaces/default/pods").await;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        let mine: Vec<&Value> = items
            .iter()
            .filter(|p| {
                p["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.contains("-pod-"))
            })
            .collect();
        let running = mine
            .iter()
            .filter(|p| p["status"]["phase"] == "Running" && p["status"]["podIP"].is_string())
            .count();
        (mine.len() != 4 || running != 4).then(|| format!("{running} of {} running", mine.len()))
    })
    .await;
}

/// A graceful delete (30 s grace on a node): the pod-delete Stage removes it long before.
async fn a_deleted_pod_goes(client: &ApiClient) {
    let (_, list) = call(client, Method::GET, "/api/v1/namespaces/default/pods").await;
    let victim = list["items"]
        .as_array()
        .and_then(|i| {
            i.iter().find(|p| {
                p["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.contains("-pod-"))
            })
        })
        .and_then(|p| p["metadata"]["name"].as_str())
        .expect("a pod")
        .to_string();
    let path = format!("/api/v1/namespaces/default/pods/{victim}");
    let (status, body) = call(client, Method::DELETE, &path).await;
    assert!((200..300).contains(&status), "DELETE {status}: {body}");
    eventually(Duration::from_secs(10), "deleted pod gone", || async {
        let (status, p) = call(client, Method::GET, &path).await;
        (status != 404).then(|| {
            format!(
                "HTTP {status}, deletionTimestamp {}",
                p["metadata"]["deletionTimestamp"]
            )
        })
    })
    .await;
}

/// The heartbeat Stage moves lastHeartbeatTime on.
async fn a_stage_heartbeats(client: &ApiClient) {
    let (_, node) = call(client, Method::GET, "/api/v1/nodes").await;
    let first: Vec<Value> = node["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["status"]["conditions"][0]["lastHeartbeatTime"].clone())
        .collect();
    eventually(Duration::from_secs(10), "a Stage heartbeat", || async {
        let (_, now) = call(client, Method::GET, "/api/v1/nodes").await;
        let later: Vec<Value> = now["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["status"]["conditions"][0]["lastHeartbeatTime"].clone())
            .collect();
        (later == first).then(|| "unchanged".to_string())
    })
    .await;
}

/// loadgen ends by itself, successfully.
async fn finishes(mut run: Killed) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = run.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "loadgen did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut stderr = String::new();
    if let Some(mut e) = run.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    assert!(status.success(), "loadgen failed: {stderr}");
}

/// loadgen's own heartbeat is off; the Stages' writes and applications are counted.
fn the_summary_counts_the_stages(out: &std::path::Path) {
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let ops = summary["operations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let op = |name: &str| ops.iter().find(|o| o["name"] == name).cloned();
    assert!(
        op("node-heartbeat").is_none(),
        "loadgen's own heartbeat is off: {summary:#}"
    );
    let status_ops = op("stage-status").expect("stage-status in the summary");
    // 2 initializations + 4 pods Running + heartbeats (≥ 2 nodes × 5 in 12 s).
    assert!(
        status_ops["requests"].as_u64().unwrap() >= 16,
        "{status_ops:#}"
    );
    let applied = &summary["nodes"]["stages"]["applied"];
    assert_eq!(applied["node-initialize"], 2, "{summary:#}");
    assert!(applied["pod-ready"].as_u64() >= Some(4), "{summary:#}");
    assert!(
        applied["node-heartbeat"].as_u64() >= Some(10),
        "{summary:#}"
    );
    assert_eq!(
        summary["nodes"]["heartbeat_interval_s"], 0.0,
        "own heartbeat off"
    );
    let delete_ops = op("stage-delete").expect("stage-delete in the summary");
    assert!(
        delete_ops["status_codes"]["200"].as_u64().unwrap_or(0) >= 1,
        "{delete_ops:#}"
    );
}
