//! Creates, deletes, the burst, and paged / exact LISTs against a tiny pod store.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use common::{body_bytes, config, full, json, serve};
use hyper::{Method, Response};
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Pods {
    names: BTreeSet<String>,
    queries: Vec<String>,
}

async fn pod_store(pods: Arc<Mutex<Pods>>) -> common::TestServer {
    serve(move |req| {
        let pods = pods.clone();
        async move {
            let path = req.uri().path().to_string();
            if path == "/version" {
                return Response::new(full("{}"));
            }
            if let Some(ns) = path.strip_prefix("/api/v1/namespaces/").filter(|r| !r.contains('/')) {
                return match ns {
                    "owned" => json(
                        200,
                        json!({"kind":"Namespace","metadata":{"name":"owned",
                               "labels":{"app.kubernetes.io/managed-by":"loadgen"}}}),
                    ),
                    "theirs" => json(200, json!({"kind":"Namespace","metadata":{"name":"theirs"}})),
                    _ => json(404, json!({"kind":"Status","code":404})),
                };
            }
            match *req.method() {
                Method::POST => {
                    let v: serde_json::Value = serde_json::from_slice(&body_bytes(req).await).unwrap_or_default();
                    let name = v["metadata"]["name"].as_str().unwrap_or("").to_string();
                    let fresh = pods.lock().expect("lock").names.insert(name);
                    json(if fresh { 201 } else { 409 }, v)
                }
                Method::DELETE => {
                    let name = path.rsplit('/').next().unwrap_or("").to_string();
                    let gone = pods.lock().expect("lock").names.remove(&name);
                    json(if gone { 200 } else { 404 }, json!({"kind":"Status","code":200}))
                }
                _ => {
                    let q = req.uri().query().unwrap_or("").to_string();
                    pods.lock().expect("lock").queries.push(q.clone());
                    // Five items in pages of `limit`; `continue` is the next offset.
                    let offset: usize = q
                        .split('&')
                        .find_map(|kv| kv.strip_prefix("continue="))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    let limit: usize = q
                        .split('&')
                        .find_map(|kv| kv.strip_prefix("limit="))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(5);
                    let end = (offset + limit).min(5);
                    let items: Vec<_> = (offset..end).map(|i| json!({"metadata":{"name":format!("p{i}")}})).collect();
                    let cont = if end < 5 { end.to_string() } else { String::new() };
                    json(200, json!({"kind":"PodList","metadata":{"resourceVersion":"77","continue":cont},"items":items}))
                }
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_deletes_and_burst() {
    let pods: Arc<Mutex<Pods>> = Arc::default();
    let server = pod_store(pods.clone()).await;
    let cfg = config(
        &server.url(),
        &[
            "--creates",
            "20/s",
            "--deletes",
            "10/s",
            "--burst",
            "10",
            "--duration",
            "1s",
            "-n",
            "ns1",
            "--namespace-allow",
            "ns1",
        ],
    );
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("run");
    let create = report.operation("create").expect("create");
    assert_eq!((create.requests, create.ok), (20, 20));
    let delete = report.operation("delete").expect("delete");
    assert_eq!(
        delete.ok + delete.skipped,
        10,
        "deletes only pods this run created"
    );
    assert_eq!(delete.requests, delete.ok);
    assert_eq!(report.operation("burst-create").expect("bc").ok, 10);
    assert_eq!(report.operation("burst-delete").expect("bd").ok, 10);
    let left = pods.lock().expect("lock").names.len() as u64;
    assert_eq!(left, 20 - delete.ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paged_and_exact_lists() {
    let pods: Arc<Mutex<Pods>> = Arc::default();
    let server = pod_store(pods.clone()).await;
    let cfg = config(
        &server.url(),
        &[
            "--lists",
            "10/s",
            "--list-limit",
            "2",
            "--list-rv",
            "exact",
            "--duration",
            "1s",
            "-l",
            "app=web",
        ],
    );
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("run");
    let list = report.operation("list").expect("list");
    assert_eq!(
        (list.requests, list.ok),
        (10, 10),
        "a paged LIST counts once"
    );
    let queries = pods.lock().expect("lock").queries.clone();
    assert_eq!(queries.len(), 30, "three pages each");
    assert!(queries
        .iter()
        .all(|q| q.contains("labelSelector=app%3Dweb") && q.contains("limit=2")));
    assert_eq!(
        queries.iter().filter(|q| q.contains("continue=")).count(),
        20
    );
    // The first LIST learns a revision; later ones ask for it exactly.
    assert!(!queries[0].contains("resourceVersionMatch"));
    let firsts: Vec<&String> = queries
        .iter()
        .filter(|q| !q.contains("continue="))
        .collect();
    assert!(firsts
        .last()
        .expect("q")
        .contains("resourceVersion=77&resourceVersionMatch=Exact"));
    // Continuation pages carry `continue` instead of a revision, as client-go's pager does.
    assert!(queries
        .iter()
        .filter(|q| q.contains("continue="))
        .all(|q| !q.contains("resourceVersion")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_only_into_loadgen_or_allowed_namespaces() {
    let pods: Arc<Mutex<Pods>> = Arc::default();
    let server = pod_store(pods.clone()).await;
    for ns in ["theirs", "missing"] {
        let cfg = config(
            &server.url(),
            &["--creates", "10/s", "--duration", "1s", "-n", ns],
        );
        let err = loadgen::run(cfg, CancellationToken::new())
            .await
            .expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains(&format!("namespace `{ns}`")) && text.contains("--namespace-allow"),
            "{text}"
        );
    }
    assert!(
        pods.lock().expect("lock").names.is_empty(),
        "nothing written"
    );
    // Labelled as loadgen's: allowed. Reads need no permission.
    let cfg = config(
        &server.url(),
        &["--creates", "10/s", "--duration", "500ms", "-n", "owned"],
    );
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("owned");
    assert_eq!(report.operation("create").expect("create").ok, 5);
    let cfg = config(
        &server.url(),
        &["--lists", "10/s", "--duration", "200ms", "-n", "theirs"],
    );
    loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("reads are fine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_objects_caps_creates_and_burst() {
    let pods: Arc<Mutex<Pods>> = Arc::default();
    let server = pod_store(pods.clone()).await;
    let cfg = config(
        &server.url(),
        &[
            "--burst",
            "4",
            "--creates",
            "20/s",
            "--duration",
            "1s",
            "--max-objects",
            "10",
            "-n",
            "owned",
        ],
    );
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("run");
    let create = report.operation("create").expect("create");
    let burst = report.operation("burst-create").expect("burst");
    assert_eq!(create.ok + burst.ok, 10);
    assert_eq!(
        create.requests + create.skipped,
        20,
        "every tick is sent or skipped"
    );
    // The burst deletes its pods again; the rate creates stay.
    assert_eq!(pods.lock().expect("lock").names.len() as u64, create.ok);
}

#[test]
fn dry_run_prints_the_plan() {
    let cfg = config(
        "http://127.0.0.1:1",
        &[
            "--lists",
            "500/min",
            "--list-rv",
            "cache",
            "--duration",
            "2m",
            "-A",
        ],
    );
    let plan = loadgen::safety::plan(&cfg);
    assert!(plan.contains("list     8.333/s → 1000 requests"), "{plan}");
    assert!(
        plan.contains("GET /api/v1/pods?resourceVersion=0"),
        "{plan}"
    );
}
