//! What a simulated kubelet sends: registration (its Node, its Lease in
//! `kube-node-lease`, optionally its pods), node status heartbeats and lease
//! renewals, and the thread that paces all nodes' heartbeats.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http::Method;
use http_body_util::BodyExt;
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::beats::{self, Beat, BeatKind, Beats, Sequence};
use super::{NodeSimSpec, NodesError};
use crate::conn::Conns;
use crate::ops::{encode, rfc3339, unix_nanos, Planned, MANAGED_BY, WRITTEN_AT};
use crate::record::OpRecorder;
use crate::send::{self, SendOptions};
use crate::target::ApiClient;

/// Label on every node loadgen simulates (besides `app.kubernetes.io/managed-by`).
pub const SIMULATED_NODE: (&str, &str) = ("loadgen.tollgate.dev/simulated-node", "true");
/// Where kubelets keep their leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// Registration requests in flight at once (as `loadgen seed`).
const REGISTER_CONCURRENCY: usize = 64;

/// `PATCH nodes/NAME/status`, strategic merge as the kubelet sends it: the
/// Ready condition (merged by `type`) with a new `lastHeartbeatTime`, and
/// loadgen's `written-at` stamp so node watchers can time its delivery.
pub fn status_patch(node: &str, now_unix_nanos: u128) -> Planned {
    let body = json!({
        "metadata": {"annotations": {WRITTEN_AT: now_unix_nanos.to_string()}},
        "status": {"conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": rfc3339(now_unix_nanos),
        }]}
    });
    Planned {
        method: Method::PATCH,
        path: format!("/api/v1/nodes/{node}/status"),
        body: Some((
            "application/strategic-merge-patch+json",
            Bytes::from(body.to_string()),
        )),
    }
}

/// Lease renewal: a merge PATCH of `spec.renewTime` (a MicroTime). The
/// kubelet PUTs its whole cached Lease instead; the write the server does
/// (and the event watchers get) is the same, without keeping every lease's
/// resourceVersion here.
pub fn lease_patch(node: &str, now_unix_nanos: u128) -> Planned {
    let body = json!({"spec": {"holderIdentity": node, "renewTime": micro_time(now_unix_nanos)}});
    Planned {
        method: Method::PATCH,
        path: lease_path(node),
        body: Some((
            "application/merge-patch+json",
            Bytes::from(body.to_string()),
        )),
    }
}

fn lease_path(node: &str) -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{node}")
}

/// `metav1.MicroTime`: RFC 3339 with exactly six fractional digits (the
/// apiserver refuses a renewTime without them).
pub fn micro_time(unix_nanos: u128) -> String {
    let secs = rfc3339(unix_nanos);
    let micros = (unix_nanos / 1_000) % 1_000_000;
    format!("{}.{micros:06}Z", secs.trim_end_matches('Z'))
}

fn node_json(name: &str) -> serde_json::Value {
    let resources = json!({"cpu":"32","memory":"256Gi","pods":"110"});
    json!({"apiVersion":"v1","kind":"Node",
        "metadata":{"name":name,"labels":{
            MANAGED_BY.0: MANAGED_BY.1, SIMULATED_NODE.0: SIMULATED_NODE.1,
            "kubernetes.io/hostname": name, "type":"kwok"}},
        // As kwok's nodes: only pods that tolerate it (or are bound directly) land here.
        "spec":{"taints":[{"key":"kwok.x-k8s.io/node","value":"fake","effect":"NoSchedule"}]},
        "status":{"capacity":resources,"allocatable":resources,
                  "conditions":[{"type":"Ready","status":"True","reason":"KubeletReady"}]}})
}

fn lease_json(node: &str) -> serde_json::Value {
    json!({"apiVersion":"coordination.k8s.io/v1","kind":"Lease",
        "metadata":{"name":node,"namespace":LEASE_NAMESPACE,"labels":{MANAGED_BY.0: MANAGED_BY.1}},
        "spec":{"holderIdentity":node,"leaseDurationSeconds":40,"renewTime":micro_time(unix_nanos())}})
}

/// The name of pod `j` of `node`, created with `--pods-per-node`.
pub fn pod_name(node: &str, j: u64) -> String {
    format!("{node}-pod-{j}")
}

async fn call(
    client: &ApiClient,
    method: Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> Result<(u16, Bytes), String> {
    let body = body.map(|b| ("application/json", Bytes::from(b.to_string())));
    let req = client
        .request(method, path, body)
        .map_err(|e| e.to_string())?;
    let resp = client.send(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    if status == 401 {
        client.unauthorized();
    }
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, bytes))
}

/// The nodes to simulate: created as `{prefix}node-K` (an existing one is
/// adopted), or with `--adopt-nodes SELECTOR` the existing nodes it matches;
/// then a Lease per node and `--pods-per-node` pods bound to each.
pub async fn register(client: &ApiClient, spec: &NodeSimSpec) -> Result<Vec<String>, NodesError> {
    let names = match &spec.adopt_selector {
        Some(selector) => adopt(client, selector, spec.count).await?,
        None => {
            let names: Vec<String> = spec
                .indices()
                .map(|k| format!("{}node-{k}", spec.object_prefix))
                .collect();
            let count = names.len() as u64;
            // With node Stages the node starts as kwok's do, without status: they fill it in.
            let bare = spec
                .stages
                .loaded
                .as_ref()
                .is_some_and(|s| s.has(crate::stages::Kind::Node));
            let node = |i: u64| {
                let mut n = node_json(&names[i as usize]);
                if bare {
                    if let Some(m) = n.as_object_mut() {
                        m.remove("status");
                    }
                }
                n
            };
            create_all(client, "node", "/api/v1/nodes", count, node).await?;
            names
        }
    };
    let count = names.len() as u64;
    if !spec.lease_renew.is_zero() {
        let path = format!("/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases");
        let lease = |i: u64| lease_json(&names[i as usize]);
        create_all(client, "lease", &path, count, lease).await?;
    }
    let per_node = spec.pods_per_node;
    if per_node > 0 {
        let ns = &spec.namespace;
        // Pod `i` is pod `i mod per_node` of node `i / per_node`: built as
        // they are sent, so 150k pods are never all in memory at once.
        let pod = |i: u64| {
            let node = &names[(i / per_node) as usize];
            json!({"apiVersion":"v1","kind":"Pod",
                "metadata":{"name":pod_name(node, i % per_node),"namespace":ns,"labels":{MANAGED_BY.0: MANAGED_BY.1}},
                "spec":{"nodeName":node,"containers":[{"name":"pause","image":"registry.k8s.io/pause:3.10"}]}})
        };
        let path = format!("/api/v1/namespaces/{ns}/pods");
        create_all(client, "pod", &path, count * per_node, pod).await?;
    }
    Ok(names)
}

/// POSTs `make(0..count)` to `path`; 409 (already there) is fine, anything
/// else fails registration with the first failure's reason.
async fn create_all(
    client: &ApiClient,
    what: &'static str,
    path: &str,
    count: u64,
    make: impl Fn(u64) -> serde_json::Value + Sync,
) -> Result<(), NodesError> {
    let make = &make;
    let mut results = stream::iter(0..count)
        .map(|i| async move {
            match call(client, Method::POST, path, Some(make(i))).await {
                Ok((200..=299 | 409, _)) => None,
                Ok((status, body)) => Some(format!(
                    "HTTP {status}: {}",
                    String::from_utf8_lossy(&body).trim()
                )),
                Err(e) => Some(e),
            }
        })
        .buffer_unordered(REGISTER_CONCURRENCY);
    while let Some(result) = results.next().await {
        if let Some(reason) = result {
            return Err(NodesError::Register {
                what,
                path: path.to_string(),
                reason,
            });
        }
    }
    Ok(())
}

/// The names of up to `count` existing nodes matching `selector`, sorted.
async fn adopt(client: &ApiClient, selector: &str, count: u64) -> Result<Vec<String>, NodesError> {
    let path = format!("/api/v1/nodes?labelSelector={}", encode(selector));
    let fail = |reason: String| NodesError::Adopt {
        selector: selector.to_string(),
        reason,
    };
    let (status, body) = call(client, Method::GET, &path, None).await.map_err(fail)?;
    if status != 200 {
        return Err(fail(format!("LIST nodes answered HTTP {status}")));
    }
    let list: serde_json::Value = serde_json::from_slice(&body).map_err(|e| fail(e.to_string()))?;
    let mut names: Vec<String> = list["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names.truncate(usize::try_from(count).unwrap_or(usize::MAX));
    if names.is_empty() {
        return Err(fail("no node matches".into()));
    }
    Ok(names)
}

/// The heartbeat driver's recorders.
pub struct BeatRecorders {
    pub status: Arc<OpRecorder>,
    pub lease: Arc<OpRecorder>,
}

/// Everything the heartbeat thread owns.
pub struct Heartbeats {
    pub nodes: Arc<Vec<String>>,
    pub conns: Conns,
    pub send: SendOptions,
    pub recorders: BeatRecorders,
    pub start: Instant,
    /// Beats are scheduled until then.
    pub duration: Duration,
    pub max_in_flight: usize,
    pub abort: CancellationToken,
}

/// Starts the thread that sends every node's heartbeats until `duration`
/// (then waits for the outstanding ones) or `abort`. Like the operations'
/// drivers it owns its connections on a current-thread runtime: over HTTP/2
/// all heartbeats share one connection.
pub fn spawn_heartbeats(
    hb: Heartbeats,
    spec: &NodeSimSpec,
) -> std::io::Result<tokio::sync::oneshot::Receiver<()>> {
    let Heartbeats {
        nodes,
        conns,
        send,
        recorders,
        start,
        duration,
        max_in_flight,
        abort,
    } = hb;
    let n = nodes.len() as u64;
    let beats = Beats::new([
        Sequence {
            kind: BeatKind::Status,
            nodes: n,
            interval: spec.heartbeat,
        },
        Sequence {
            kind: BeatKind::Lease,
            nodes: n,
            interval: spec.lease_renew,
        },
    ]);
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("loadgen-heartbeats".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the heartbeat runtime");
                    return;
                }
            };
            let issue = |beat: Beat, intended: Instant| {
                let (nodes, conns, send, recs) = (&nodes, &conns, &send, &recorders);
                async move {
                    let Some(node) = usize::try_from(beat.node).ok().and_then(|i| nodes.get(i))
                    else {
                        return;
                    };
                    let (planned, rec) = match beat.kind {
                        BeatKind::Status => (status_patch(node, unix_nanos()), &recs.status),
                        BeatKind::Lease => (lease_patch(node, unix_nanos()), &recs.lease),
                    };
                    rec.record_start_lag(intended.elapsed());
                    let sent = send::send(conns, &planned, send, false).await;
                    rec.record(&sent.outcome, intended.elapsed(), send.honor_retry_after);
                }
            };
            let paced = rt.block_on(beats::pace(
                beats,
                start,
                duration,
                max_in_flight,
                &abort,
                issue,
            ));
            for _ in 0..paced.dropped_status {
                recorders.status.drop_one();
            }
            for _ in 0..paced.dropped_lease {
                recorders.lease.drop_one();
            }
            // Which kind an abandoned request was is not kept: counted as status.
            for _ in 0..paced.cancelled {
                recorders.status.cancel_one();
            }
            drop(rt);
            drop(done);
        })?;
    Ok(finished)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_requests() {
        let now = 1_700_000_000_123_456_789u128;
        let p = status_patch("n1", now);
        assert_eq!(
            (p.method, p.path.as_str()),
            (Method::PATCH, "/api/v1/nodes/n1/status")
        );
        let (ct, body) = p.body.expect("body");
        assert_eq!(ct, "application/strategic-merge-patch+json");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(
            v["status"]["conditions"][0]["lastHeartbeatTime"],
            "2023-11-14T22:13:20Z"
        );
        let l = lease_patch("n1", now);
        assert_eq!(
            l.path,
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1"
        );
        let v: serde_json::Value = serde_json::from_slice(&l.body.expect("body").1).expect("json");
        assert_eq!(v["spec"]["renewTime"], "2023-11-14T22:13:20.123456Z");
    }
}
