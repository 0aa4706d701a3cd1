//! `--scheduler`: binds each pod that has no `spec.nodeName` to a node, through the
//! `pods/NAME/binding` subresource as kube-scheduler binds. The choice is round robin over
//! the nodes that fit, in name order; a node fits when its `Ready` condition is `True`, it
//! is not `spec.unschedulable`, and its labels match the pod's `spec.nodeSelector`. Nothing
//! else is considered (no resources, taints, affinity, priorities or preemption). A pod no
//! node fits waits until a node changes.
//!
//! [`Scheduler`] is the pure part (what it knows and what it chooses); [`start`] feeds it
//! from two informers (every node; pods with `spec.nodeName=` empty, as kube-scheduler's
//! own field selector) and sends the bindings one at a time.

use bytes::Bytes;
use http::Method;
use http_body_util::BodyExt;
use loadgen::stages::feed::{self, SeenObject};
use loadgen::stages::Kind;
use loadgen::target::ApiClient;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Bound of the channel from the informers (objects seen).
const SEEN_QUEUE: usize = 16_384;
/// Pods waiting for a node, at most; more are taken when the informer relists.
pub const MAX_PENDING: usize = 100_000;
/// After a binding the server did not take (429, 5xx, no answer), binding pauses this long.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// What a node offers a pod.
#[derive(Debug, Clone, PartialEq)]
struct NodeFit {
    ready: bool,
    unschedulable: bool,
    labels: Map<String, Value>,
}

impl NodeFit {
    fn of(node: &Value) -> NodeFit {
        let ready = node["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        NodeFit {
            ready,
            unschedulable: node["spec"]["unschedulable"].as_bool().unwrap_or(false),
            labels: node["metadata"]["labels"]
                .as_object()
                .cloned()
                .unwrap_or_default(),
        }
    }

    fn fits(&self, selector: &Map<String, Value>) -> bool {
        self.ready
            && !self.unschedulable
            && selector.iter().all(|(k, v)| self.labels.get(k) == Some(v))
    }
}

/// A pod to bind: where it is and what it asks of a node.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    pub namespace: String,
    pub name: String,
    node_selector: Map<String, Value>,
}

/// A decision: bind this pod to this node.
#[derive(Debug, Clone, PartialEq)]
pub struct Binding {
    pub pod: Pending,
    pub node: String,
}

/// The scheduler's view and choices; no I/O.
#[derive(Debug, Default)]
pub struct Scheduler {
    nodes: BTreeMap<String, NodeFit>,
    /// Unbound pods by `namespace/name`.
    pending: HashMap<String, Pending>,
    /// Keys of `pending` in the order seen (a key no longer pending is skipped).
    queue: VecDeque<String>,
    /// Pending pods no node fitted when last tried: queued again when a node changes.
    parked: Vec<String>,
    /// Round robin position.
    turn: usize,
}

fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

impl Scheduler {
    /// A node listed, changed or deleted.
    pub fn on_node(&mut self, node: &Value, deleted: bool) {
        let Some(name) = node["metadata"]["name"].as_str() else {
            return;
        };
        let before = self.nodes.get(name).cloned();
        if deleted {
            self.nodes.remove(name);
        } else {
            self.nodes.insert(name.to_string(), NodeFit::of(node));
        }
        if self.nodes.get(name) != before.as_ref() {
            self.queue.extend(self.parked.drain(..));
        }
    }

    /// A pod listed, changed or deleted (or gone from the unbound pods' watch).
    pub fn on_pod(&mut self, pod: &Value, deleted: bool) {
        let m = &pod["metadata"];
        let (Some(ns), Some(name)) = (m["namespace"].as_str(), m["name"].as_str()) else {
            return;
        };
        let k = key(ns, name);
        let phase = pod["status"]["phase"].as_str().unwrap_or("");
        let unbound = !deleted
            && pod["spec"]["nodeName"].as_str().unwrap_or("").is_empty()
            && m["deletionTimestamp"].is_null()
            && !matches!(phase, "Succeeded" | "Failed");
        if !unbound {
            self.pending.remove(&k);
            return;
        }
        if self.pending.contains_key(&k) || self.pending.len() >= MAX_PENDING {
            return;
        }
        let node_selector = pod["spec"]["nodeSelector"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        self.pending.insert(
            k.clone(),
            Pending {
                namespace: ns.to_string(),
                name: name.to_string(),
                node_selector,
            },
        );
        self.queue.push_back(k);
    }

    /// The next pod to bind and its node, if some pending pod fits a node. The pod is
    /// taken out of the pending pods: [`Scheduler::retry`] puts it back if binding fails.
    pub fn next_binding(&mut self) -> Option<Binding> {
        while let Some(k) = self.queue.pop_front() {
            let Some(pod) = self.pending.get(&k) else {
                continue;
            };
            let fitting: Vec<&String> = (self.nodes.iter())
                .filter(|(_, n)| n.fits(&pod.node_selector))
                .map(|(name, _)| name)
                .collect();
            if fitting.is_empty() {
                if self.parked.len() >= MAX_PENDING {
                    self.parked.retain(|k| self.pending.contains_key(k));
                }
                self.parked.push(k);
                continue;
            }
            let node = fitting[self.turn % fitting.len()].clone();
            self.turn = self.turn.wrapping_add(1);
            let pod = self.pending.remove(&k)?;
            return Some(Binding { pod, node });
        }
        None
    }

    /// A binding the server did not take: the pod is pending again, first in line.
    pub fn retry(&mut self, b: Binding) {
        let k = key(&b.pod.namespace, &b.pod.name);
        self.pending.insert(k.clone(), b.pod);
        self.queue.push_front(k);
    }

    /// Pods waiting for a node.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// What became of a binding request.
enum Sent {
    Bound,
    /// 404 or 409: the pod is gone or someone else bound it; nothing to retry.
    Moot,
    /// Refused for now (429, 5xx) or unanswered.
    Retry,
}

async fn bind(client: &ApiClient, b: &Binding, timeout: Duration) -> Sent {
    let (ns, pod) = (&b.pod.namespace, &b.pod.name);
    let body = serde_json::json!({"apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": pod, "namespace": ns},
        "target": {"apiVersion": "v1", "kind": "Node", "name": b.node}});
    let path = format!("/api/v1/namespaces/{ns}/pods/{pod}/binding");
    let send = async {
        let req = client
            .request(
                Method::POST,
                &path,
                Some(("application/json", Bytes::from(body.to_string()))),
            )
            .ok()?;
        let resp = client.send(req).await.ok()?;
        let status = resp.status().as_u16();
        resp.into_body().collect().await.ok()?;
        Some(status)
    };
    match tokio::time::timeout(timeout, send).await {
        Ok(Some(200..=299)) => Sent::Bound,
        Ok(Some(404 | 409)) => Sent::Moot,
        Ok(Some(status)) if status < 500 && status != 429 => {
            tracing::warn!(%path, status, "scheduler: binding refused");
            Sent::Moot
        }
        _ => Sent::Retry,
    }
}

/// Starts the informers and the binding loop on `tracker` until `stop`.
pub fn start(
    client: ApiClient,
    timeout: Duration,
    tracker: &TaskTracker,
    stop: &CancellationToken,
) {
    let (tx, rx) = mpsc::channel(SEEN_QUEUE);
    let unbound = format!("fieldSelector={}", loadgen::ops::encode("spec.nodeName="));
    for (kind, filters) in [(Kind::Node, vec![]), (Kind::Pod, vec![unbound])] {
        tracker.spawn(feed::run(
            client.clone(),
            kind,
            filters,
            timeout,
            tx.clone(),
            stop.clone(),
        ));
    }
    tracker.spawn(run(client, timeout, rx, stop.clone()));
}

async fn run(
    client: ApiClient,
    timeout: Duration,
    mut rx: mpsc::Receiver<SeenObject>,
    stop: CancellationToken,
) {
    let mut s = Scheduler::default();
    let mut bound = 0u64;
    loop {
        // Everything already seen first: a burst of pods is bound against fresh nodes.
        while let Ok(seen) = rx.try_recv() {
            on_seen(&mut s, &seen);
        }
        if let Some(b) = s.next_binding() {
            let sent = tokio::select! {
                sent = bind(&client, &b, timeout) => sent,
                _ = stop.cancelled() => break,
            };
            match sent {
                Sent::Bound => bound += 1,
                Sent::Moot => {}
                Sent::Retry => {
                    s.retry(b);
                    tokio::select! {
                        _ = tokio::time::sleep(RETRY_AFTER) => {}
                        _ = stop.cancelled() => break,
                    }
                }
            }
            continue;
        }
        tokio::select! {
            seen = rx.recv() => match seen {
                Some(seen) => on_seen(&mut s, &seen),
                None => break,
            },
            _ = stop.cancelled() => break,
        }
    }
    tracing::info!(bound, pending = s.pending(), "scheduler stopped");
}

fn on_seen(s: &mut Scheduler, seen: &SeenObject) {
    match seen.kind {
        Kind::Node => s.on_node(&seen.object, seen.deleted),
        Kind::Pod => s.on_pod(&seen.object, seen.deleted),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, ready: bool, labels: Value) -> Value {
        json!({"metadata": {"name": name, "labels": labels},
            "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}})
    }

    fn pod(name: &str, node_name: &str, selector: Value) -> Value {
        json!({"metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node_name, "nodeSelector": selector, "containers": []},
            "status": {"phase": "Pending"}})
    }

    fn drain(s: &mut Scheduler) -> Vec<(String, String)> {
        std::iter::from_fn(|| s.next_binding())
            .map(|b| (b.pod.name, b.node))
            .collect()
    }

    #[test]
    fn round_robin_over_ready_schedulable_nodes_in_name_order() {
        let mut s = Scheduler::default();
        s.on_node(&node("c", true, json!({})), false);
        s.on_node(&node("a", true, json!({})), false);
        s.on_node(&node("b", false, json!({})), false);
        let mut cordoned = node("d", true, json!({}));
        cordoned["spec"] = json!({"unschedulable": true});
        s.on_node(&cordoned, false);
        s.on_node(&json!({"metadata": {"name": "e"}}), false); // no status yet: not Ready
        for p in ["p1", "p2", "p3"] {
            s.on_pod(&pod(p, "", Value::Null), false);
        }
        s.on_pod(&pod("bound", "a", Value::Null), false);
        assert_eq!(
            drain(&mut s),
            [("p1", "a"), ("p2", "c"), ("p3", "a")].map(|(p, n)| (p.to_string(), n.to_string()))
        );
        assert_eq!(s.pending(), 0);
    }

    #[test]
    fn node_selector_narrows_the_choice_and_a_pod_waits_for_a_fitting_node() {
        let mut s = Scheduler::default();
        s.on_node(&node("a", true, json!({"disk": "hdd"})), false);
        s.on_pod(&pod("ssd", "", json!({"disk": "ssd"})), false);
        s.on_pod(&pod("any", "", Value::Null), false);
        assert_eq!(drain(&mut s), [("any".to_string(), "a".to_string())]);
        assert_eq!(s.pending(), 1);
        // A node that fits arrives: the waiting pod goes there.
        s.on_node(&node("b", true, json!({"disk": "ssd"})), false);
        assert_eq!(drain(&mut s), [("ssd".to_string(), "b".to_string())]);
    }

    #[test]
    fn no_ready_node_no_binding_until_one_is_ready() {
        let mut s = Scheduler::default();
        s.on_pod(&pod("p", "", Value::Null), false);
        assert_eq!(s.next_binding(), None);
        s.on_node(&node("n", false, json!({})), false);
        assert_eq!(s.next_binding(), None);
        s.on_node(&node("n", true, json!({})), false);
        assert_eq!(drain(&mut s), [("p".to_string(), "n".to_string())]);
    }

    #[test]
    fn bound_deleted_and_finished_pods_are_not_scheduled_and_a_failed_bind_is_retried() {
        let mut s = Scheduler::default();
        s.on_node(&node("n", true, json!({})), false);
        for p in ["gone", "later-bound", "done", "kept"] {
            s.on_pod(&pod(p, "", Value::Null), false);
        }
        s.on_pod(&pod("gone", "", Value::Null), true);
        s.on_pod(&pod("later-bound", "n", Value::Null), false);
        let mut done = pod("done", "", Value::Null);
        done["status"]["phase"] = "Succeeded".into();
        s.on_pod(&done, false);
        let b = s.next_binding().expect("kept is pending");
        assert_eq!(b.pod.name, "kept");
        assert_eq!(s.next_binding(), None);
        s.retry(b);
        assert_eq!(drain(&mut s), [("kept".to_string(), "n".to_string())]);
    }
}
