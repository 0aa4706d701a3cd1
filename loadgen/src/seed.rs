//! `loadgen seed` and `loadgen cleanup`: fake nodes and pods created fast
//! (bounded concurrency, progress bar), each labelled
//! `app.kubernetes.io/managed-by=loadgen`, so cleanup removes exactly them.
//!
//! Names match what runs address: nodes `{prefix}node-K`, pods `{prefix}pod-K`
//! (in `--namespace`, or spread over `--namespaces N` created as `{prefix}ns-K`),
//! each pod bound to node `K mod nodes` like kubemark/kwok pods.

use std::io::IsTerminal;

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http::Method;
use http_body_util::BodyExt;
use indicatif::{ProgressBar, ProgressDrawTarget};
use serde_json::json;

use crate::ops::{encode, MANAGED_BY};
use crate::target::{ApiClient, TargetOptions};

/// What `loadgen seed` creates.
#[derive(Debug, Clone)]
pub struct SeedConfig {
    pub target: TargetOptions,
    /// Fake nodes ({prefix}node-K).
    pub nodes: u64,
    /// Pods ({prefix}pod-K), bound to the fake nodes.
    pub pods: u64,
    /// Padding per pod, in bytes, in an annotation.
    pub pod_bytes: usize,
    /// Namespaces to create and spread pods over ({prefix}ns-K); 0 puts pods in `namespace`.
    pub namespaces: u64,
    pub namespace: String,
    pub object_prefix: String,
    /// Requests in flight at once.
    pub concurrency: usize,
}

/// What `loadgen cleanup` needs.
#[derive(Debug, Clone)]
pub struct CleanupConfig {
    pub target: TargetOptions,
    /// Requests in flight at once.
    pub concurrency: usize,
}

/// What seeding or cleanup did.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Tally {
    /// Created (seed) or deleted (cleanup).
    pub done: u64,
    /// Already there (seed, 409) or already gone (cleanup, 404).
    pub unchanged: u64,
    pub failed: u64,
}

/// Why seeding or cleanup stopped.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error(transparent)]
    Target(#[from] crate::target::TargetError),
    #[error("listing {path}: {reason}")]
    List { path: String, reason: String },
}

fn labels() -> serde_json::Value {
    json!({MANAGED_BY.0: MANAGED_BY.1})
}

struct Job {
    method: Method,
    path: String,
    body: Option<serde_json::Value>,
}

async fn call(
    client: &ApiClient,
    method: Method,
    path: &str,
    body: Option<Bytes>,
) -> Result<(u16, Bytes), String> {
    let req = client
        .request(method, path, body.map(|b| ("application/json", b)))
        .map_err(|e| e.to_string())?;
    let resp = client.send(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    if status == 401 {
        client.unauthorized();
    }
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, body))
}

/// Runs `jobs` with bounded concurrency; `unchanged` is the status that means "nothing to do".
async fn run_jobs(client: &ApiClient, jobs: Vec<Job>, concurrency: usize, unchanged: u16) -> Tally {
    let bar = ProgressBar::new(jobs.len() as u64);
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    let results: Vec<Result<u16, String>> = stream::iter(jobs)
        .map(|job| {
            let bar = bar.clone();
            async move {
                let body = job.body.map(|b| Bytes::from(b.to_string()));
                let r = call(client, job.method, &job.path, body)
                    .await
                    .map(|(s, _)| s);
                bar.inc(1);
                r
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    bar.finish_and_clear();
    let mut tally = Tally::default();
    for r in results {
        match r {
            Ok(200..=299) => tally.done += 1,
            Ok(s) if s == unchanged => tally.unchanged += 1,
            Ok(s) => {
                tracing::warn!(status = s, "request failed");
                tally.failed += 1;
            }
            Err(e) => {
                tracing::warn!(error = %e, "request failed");
                tally.failed += 1;
            }
        }
    }
    tally
}

/// Creates the namespaces, nodes and pods `args` asks for.
pub async fn seed(args: &SeedConfig) -> Result<Tally, SeedError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = ApiClient::new(&args.target.resolve()?);
    let p = &args.object_prefix;
    let ns_name = |k: u64| format!("{p}ns-{k}");
    let mut tally = Tally::default();
    let mut add = |t: Tally| {
        tally.done += t.done;
        tally.unchanged += t.unchanged;
        tally.failed += t.failed;
    };
    let namespaces: Vec<Job> = (0..args.namespaces)
        .map(|k| Job {
            method: Method::POST,
            path: "/api/v1/namespaces".into(),
            body: Some(json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":ns_name(k),"labels":labels()}})),
        })
        .collect();
    add(run_jobs(&client, namespaces, args.concurrency, 409).await);
    let nodes: Vec<Job> = (0..args.nodes)
        .map(|k| {
            let name = format!("{p}node-{k}");
            let resources = json!({"cpu":"32","memory":"256Gi","pods":"110"});
            Job {
                method: Method::POST,
                path: "/api/v1/nodes".into(),
                body: Some(json!({"apiVersion":"v1","kind":"Node",
                    "metadata":{"name":name,"labels":{MANAGED_BY.0: MANAGED_BY.1, "kubernetes.io/hostname": name, "type":"kwok"}},
                    "spec":{"taints":[{"key":"kwok.x-k8s.io/node","value":"fake","effect":"NoSchedule"}]},
                    "status":{"capacity":resources,"allocatable":resources,
                              "conditions":[{"type":"Ready","status":"True","reason":"KubeletReady"}]}})),
            }
        })
        .collect();
    add(run_jobs(&client, nodes, args.concurrency, 409).await);
    let padding = "x".repeat(args.pod_bytes);
    let pods: Vec<Job> = (0..args.pods)
        .map(|k| {
            let ns = if args.namespaces > 0 {
                ns_name(k % args.namespaces)
            } else {
                args.namespace.clone()
            };
            let mut spec =
                json!({"containers":[{"name":"pause","image":"registry.k8s.io/pause:3.10"}]});
            if args.nodes > 0 {
                spec["nodeName"] = json!(format!("{p}node-{}", k % args.nodes));
            }
            let mut meta = json!({"name":format!("{p}pod-{k}"),"namespace":ns,"labels":labels()});
            if !padding.is_empty() {
                meta["annotations"] = json!({"loadgen.tollgate.dev/padding": padding});
            }
            Job {
                method: Method::POST,
                path: format!("/api/v1/namespaces/{ns}/pods"),
                body: Some(json!({"apiVersion":"v1","kind":"Pod","metadata":meta,"spec":spec})),
            }
        })
        .collect();
    add(run_jobs(&client, pods, args.concurrency, 409).await);
    Ok(tally)
}

/// Deletes every pod, node lease, node and namespace labelled as loadgen's,
/// and nothing else (leases are made by `--nodes` runs).
pub async fn cleanup(args: &CleanupConfig) -> Result<Tally, SeedError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = ApiClient::new(&args.target.resolve()?);
    let mut tally = Tally::default();
    for collection in [
        "/api/v1/pods",
        "/apis/coordination.k8s.io/v1/leases",
        "/api/v1/nodes",
        "/api/v1/namespaces",
    ] {
        let objects = list_managed(&client, collection).await?;
        let jobs = objects
            .into_iter()
            .map(|(ns, name)| Job {
                method: Method::DELETE,
                path: match (collection.rsplit_once('/'), ns) {
                    (Some((root, plural)), Some(ns)) => {
                        format!("{root}/namespaces/{ns}/{plural}/{name}")
                    }
                    _ => format!("{collection}/{name}"),
                },
                body: None,
            })
            .collect();
        let t = run_jobs(&client, jobs, args.concurrency, 404).await;
        tally.done += t.done;
        tally.unchanged += t.unchanged;
        tally.failed += t.failed;
    }
    Ok(tally)
}

/// `(namespace, name)` of every object in `collection` with loadgen's label, paged.
async fn list_managed(
    client: &ApiClient,
    collection: &str,
) -> Result<Vec<(Option<String>, String)>, SeedError> {
    let selector = encode(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1));
    let mut out = Vec::new();
    let mut cont = String::new();
    loop {
        let mut path = format!("{collection}?labelSelector={selector}&limit=500");
        if !cont.is_empty() {
            path.push_str(&format!("&continue={}", encode(&cont)));
        }
        let fail = |reason: String| SeedError::List {
            path: path.clone(),
            reason,
        };
        let (status, body) = call(client, Method::GET, &path, None).await.map_err(fail)?;
        if !(200..300).contains(&status) {
            return Err(fail(format!("HTTP {status}")));
        }
        let v: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| fail(e.to_string()))?;
        for item in v["items"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let meta = &item["metadata"];
            // Re-check the label: a server that ignores selectors must not make us delete others' objects.
            if meta["labels"][MANAGED_BY.0].as_str() != Some(MANAGED_BY.1) {
                continue;
            }
            if let Some(name) = meta["name"].as_str() {
                out.push((
                    meta["namespace"].as_str().map(str::to_string),
                    name.to_string(),
                ));
            }
        }
        cont = v["metadata"]["continue"].as_str().unwrap_or("").to_string();
        if cont.is_empty() {
            return Ok(out);
        }
    }
}
