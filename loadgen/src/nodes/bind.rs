//! `--bind`: a trivial scheduler. Every `--bind-interval` it lists the
//! unscheduled pods of the run's namespace (`spec.nodeName=` empty, from the
//! watch cache) and binds each to the next simulated node, round robin, so
//! the pods land where the simulated daemons watch.
//!
//! Binding is `POST pods/NAME/binding`, as kube-scheduler does. A server
//! without that subresource (the simulated apiserver: 404) gets a merge PATCH
//! of `spec.nodeName` instead, decided once on the first such answer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use http_body_util::BodyExt;
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::ops::{encode, unix_nanos, Planned, WRITTEN_AT};
use crate::record::OpRecorder;
use crate::send::{self, SendOptions};
use crate::target::ApiClient;

/// The binder of one run.
pub struct Binder {
    pub client: ApiClient,
    pub namespace: String,
    pub nodes: Arc<Vec<String>>,
    pub interval: Duration,
    pub send: SendOptions,
    /// Each bind (binding POST or PATCH), timed.
    pub rec: Arc<OpRecorder>,
    /// Pods bound so far.
    pub bound: Arc<AtomicU64>,
    /// The server has no `binding` subresource: PATCH `spec.nodeName`.
    patch_instead: AtomicBool,
    next_node: AtomicU64,
}

impl Binder {
    pub fn new(
        client: ApiClient,
        namespace: String,
        nodes: Arc<Vec<String>>,
        interval: Duration,
        send: SendOptions,
        rec: Arc<OpRecorder>,
    ) -> Binder {
        Binder {
            client,
            namespace,
            nodes,
            interval,
            send,
            rec,
            bound: Arc::default(),
            patch_instead: AtomicBool::new(false),
            next_node: AtomicU64::new(0),
        }
    }

    /// Binds pending pods until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        if self.nodes.is_empty() {
            return;
        }
        let mut tick = tokio::time::interval(self.interval.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let pending = tokio::select! {
                _ = stop.cancelled() => return,
                p = self.pending() => p,
            };
            for pod in pending {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = self.bind(&pod) => {}
                }
            }
        }
    }

    /// Names of the namespace's pods with no node yet.
    async fn pending(&self) -> Vec<String> {
        let path = format!(
            "/api/v1/namespaces/{}/pods?fieldSelector={}&resourceVersion=0",
            self.namespace,
            encode("spec.nodeName=")
        );
        let list = async {
            let req = self.client.request(Method::GET, &path, None).ok()?;
            let resp = self.client.send(req).await.ok()?;
            if !resp.status().is_success() {
                return None;
            }
            let body = resp.into_body().collect().await.ok()?.to_bytes();
            serde_json::from_slice::<serde_json::Value>(&body).ok()
        };
        let Some(list) = tokio::time::timeout(self.send.timeout, list)
            .await
            .ok()
            .flatten()
        else {
            tracing::warn!(path, "--bind: listing pending pods failed");
            return Vec::new();
        };
        list["items"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            // Re-checked: a server that ignores the field selector must not get pods rebound.
            .filter(|p| p["spec"]["nodeName"].as_str().unwrap_or("").is_empty())
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
            .collect()
    }

    async fn bind(&self, pod: &str) {
        let k = self.next_node.fetch_add(1, Ordering::Relaxed) % self.nodes.len() as u64;
        let node = &self.nodes[usize::try_from(k).unwrap_or(0)];
        let started = Instant::now();
        let mut sent = if self.patch_instead.load(Ordering::Relaxed) {
            None
        } else {
            let s = send::send(
                &self.client,
                &binding(&self.namespace, pod, node),
                &self.send,
                false,
            )
            .await;
            if matches!(s.outcome.status, Some(404 | 405)) {
                tracing::info!(
                    "--bind: no pods/binding subresource; binding by PATCH of spec.nodeName"
                );
                self.patch_instead.store(true, Ordering::Relaxed);
                None
            } else {
                Some(s)
            }
        };
        if sent.is_none() {
            let patch = node_name_patch(&self.namespace, pod, node);
            sent = Some(send::send(&self.client, &patch, &self.send, false).await);
        }
        if let Some(sent) = sent {
            if sent.outcome.is_success() {
                self.bound.fetch_add(1, Ordering::Relaxed);
            }
            self.rec.record(
                &sent.outcome,
                started.elapsed(),
                self.send.honor_retry_after,
            );
        }
    }
}

/// `POST pods/NAME/binding` with a `Binding` to `node`, stamped with `written-at` so the
/// node's daemons time its delivery (`daemon-event`): kube-apiserver copies a Binding's
/// annotations onto the pod it binds.
pub fn binding(ns: &str, pod: &str, node: &str) -> Planned {
    let body = json!({"apiVersion":"v1","kind":"Binding",
        "metadata":{"name":pod,"namespace":ns,"annotations":{WRITTEN_AT: unix_nanos().to_string()}},
        "target":{"apiVersion":"v1","kind":"Node","name":node}});
    Planned {
        method: Method::POST,
        path: format!("/api/v1/namespaces/{ns}/pods/{pod}/binding"),
        body: Some(("application/json", Bytes::from(body.to_string()))),
    }
}

/// A merge PATCH setting `spec.nodeName` (for servers without `binding`),
/// stamped with `written-at` as [`binding`] is.
pub fn node_name_patch(ns: &str, pod: &str, node: &str) -> Planned {
    let body = json!({
        "metadata": {"annotations": {WRITTEN_AT: unix_nanos().to_string()}},
        "spec": {"nodeName": node},
    });
    Planned {
        method: Method::PATCH,
        path: format!("/api/v1/namespaces/{ns}/pods/{pod}"),
        body: Some((
            "application/merge-patch+json",
            Bytes::from(body.to_string()),
        )),
    }
}
