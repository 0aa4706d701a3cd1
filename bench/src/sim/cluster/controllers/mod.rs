//! `--controllers`: what kube-controller-manager runs for the workloads Cluster Loader 2's
//! configs create, as a client of the simulator like the kubelet and the scheduler: the
//! Deployment, ReplicaSet, ReplicationController, Job, StatefulSet and DaemonSet
//! controllers, and the garbage collector for what they own.
//!
//! One informer per kind (list, then watch, over the simulator's listener) feeds one loop
//! that holds the [`cache::Cache`] and reconciles one owner at a time: what it should have
//! is compared with what the cache holds, the difference is sent as creates, deletes and
//! merge patches ([`common::Action`]), each answer going into the cache at once (so the next
//! reconcile counts what was just made, as kube-controller-manager's expectations do).
//! Reconciling starts once every informer has listed.
//!
//! Garbage collection: when an owner is deleted, the pods and ReplicaSets naming it in
//! `ownerReferences` are deleted (background propagation). An owner deleted with
//! `propagationPolicy: Foreground` stays (`foregroundDeletion` finalizer) until its
//! dependents are gone; with `Orphan` (`orphan` finalizer) its dependents lose their
//! reference to it and are kept. Only the kinds above are collected, and only for owners
//! seen to go: objects whose owners never existed (the seeded pods name ReplicaSets that are
//! not stored) are left alone.
//!
//! Left out, as no config of Cluster Loader 2's needs it: adopting or releasing pods by
//! label (pods count by their controller reference only), `revisionHistoryLimit`,
//! `minReadySeconds`, `progressDeadlineSeconds`, pausing and rollback of Deployments,
//! StatefulSet volume claims, DaemonSet scheduling through node affinity (its pods are bound
//! to their node at creation, as before 1.12), Job pod failure backoff delays, and collecting
//! kinds other than pods and ReplicaSets. The informers hold a slim record of every pod:
//! memory grows with the pods stored, as kube-controller-manager's does.
//!
//! The parts: [`cache`] (the view and its indexes), [`replicas`] (ReplicaSets,
//! ReplicationControllers and Jobs), [`deployment`] (Deployments), [`stateful`]
//! (StatefulSets and DaemonSets), [`common`] (pods from templates, owner references, status
//! patches).

pub mod cache;
pub mod common;
pub mod deployment;
pub mod replicas;
pub mod stateful;

use bytes::Bytes;
use cache::{Cache, Changed, Res};
use common::{meta, Action};
use futures_util::StreamExt;
use http::Method;
use http_body_util::BodyExt;
use loadgen::target::ApiClient;
use loadgen::watch::informer::{self, AfterFailure, BackoffPolicy, EventType, Handler, ListWatch};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashSet};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Bound of the channel from the informers.
const SEEN_QUEUE: usize = 16_384;
/// Requests of one reconcile sent at once.
const CONCURRENCY: usize = 16;
/// After a request the server did not take (429, 5xx, no answer), the owner is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(1);
const BACKOFF: BackoffPolicy = BackoffPolicy {
    initial: Duration::from_millis(200),
    cap: Duration::from_secs(10),
    jitter: 0.0,
    reset_after: Duration::MAX,
};
const WATCH_TIMEOUT: Duration = Duration::from_secs(300);
const FOREGROUND: &str = "foregroundDeletion";
const ORPHAN: &str = "orphan";

enum Seen {
    Listed(Res, Vec<Value>),
    Event(Res, bool, Value),
}

struct Feed {
    res: Res,
    timeout: Duration,
    tx: mpsc::Sender<Seen>,
}

impl Handler for Feed {
    async fn list(&mut self, lw: &ListWatch, path: String) -> Option<String> {
        let client = &lw.client;
        let fetch = async {
            let req = client.request(Method::GET, &path, None).ok()?;
            let resp = client.send(req).await.ok()?;
            if !resp.status().is_success() {
                return None;
            }
            let body = resp.into_body().collect().await.ok()?.to_bytes();
            serde_json::from_slice::<Value>(&body).ok()
        };
        let mut list = tokio::time::timeout(self.timeout, fetch)
            .await
            .ok()
            .flatten()?;
        let rv = list["metadata"]["resourceVersion"].as_str()?.to_string();
        let items = match list.get_mut("items").map(Value::take) {
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        };
        self.tx.send(Seen::Listed(self.res, items)).await.ok()?;
        Some(rv)
    }

    async fn event(&mut self, kind: EventType, object: Value, _line_bytes: usize) -> bool {
        let seen = Seen::Event(self.res, kind == EventType::Deleted, object);
        self.tx.send(seen).await.is_ok()
    }
}

/// Starts the informers and the controllers' loop on `tracker` until `stop`.
pub fn start(
    client: ApiClient,
    timeout: Duration,
    tracker: &TaskTracker,
    stop: &CancellationToken,
) {
    let (tx, rx) = mpsc::channel(SEEN_QUEUE);
    for res in Res::ALL {
        let lw = ListWatch {
            client: client.clone(),
            collection: res.collection(),
            filters: Vec::new(),
            request_timeout: timeout,
            watch_timeout: Some(WATCH_TIMEOUT),
            id: 0,
            backoff: BACKOFF,
            after_failure: AfterFailure::Relist,
            initial: Default::default(),
        };
        let feed = Feed {
            res,
            timeout,
            tx: tx.clone(),
        };
        tracker.spawn(informer::run(lw, feed, stop.clone()));
    }
    tracker.spawn(run(client, timeout, rx, stop.clone()));
}

/// The loop's state besides the cache.
#[derive(Default)]
struct Queue {
    dirty: BTreeSet<(Res, String)>,
    synced: HashSet<Res>,
    /// Owners to try again at the next retry tick.
    retry: BTreeSet<(Res, String)>,
}

async fn run(
    client: ApiClient,
    timeout: Duration,
    mut rx: mpsc::Receiver<Seen>,
    stop: CancellationToken,
) {
    let mut cache = Cache::default();
    let mut q = Queue::default();
    let mut gone: Vec<String> = Vec::new();
    let mut retry_tick = tokio::time::interval(RETRY_AFTER);
    loop {
        while let Ok(seen) = rx.try_recv() {
            on_seen(&mut cache, &mut q, &mut gone, seen);
        }
        if q.synced.len() == Res::ALL.len() {
            // Dependents of owners that went: background propagation.
            if let Some(uid) = gone.pop() {
                let actions = collect_garbage(&cache, &uid);
                execute(
                    &client, timeout, &mut cache, &mut q, &mut gone, None, actions,
                )
                .await;
                continue;
            }
            if let Some((res, k)) = q.dirty.pop_first() {
                let actions = match cache.get(res, &k) {
                    Some(v) => reconcile(&cache, res, v),
                    None => Vec::new(),
                };
                execute(
                    &client,
                    timeout,
                    &mut cache,
                    &mut q,
                    &mut gone,
                    Some((res, k)),
                    actions,
                )
                .await;
                continue;
            }
        }
        tokio::select! {
            seen = rx.recv() => match seen {
                Some(seen) => on_seen(&mut cache, &mut q, &mut gone, seen),
                None => break,
            },
            _ = retry_tick.tick() => {
                let again = std::mem::take(&mut q.retry);
                q.dirty.extend(again);
            }
            _ = stop.cancelled() => break,
        }
    }
    tracing::info!(pods = cache.pod_count(), "controllers stopped");
}

fn on_seen(cache: &mut Cache, q: &mut Queue, gone: &mut Vec<String>, seen: Seen) {
    let changes = match seen {
        Seen::Listed(res, items) => {
            q.synced.insert(res);
            cache.replace(res, items)
        }
        Seen::Event(res, deleted, v) => vec![cache.apply(res, v, deleted)],
    };
    for c in changes {
        take(cache, q, gone, c);
    }
}

fn take(cache: &Cache, q: &mut Queue, gone: &mut Vec<String>, changed: Changed) {
    q.dirty.extend(changed.dirty);
    if changed.nodes {
        q.dirty.extend(
            cache
                .objects(Res::DaemonSet)
                .map(|(k, _)| (Res::DaemonSet, k.clone())),
        );
    }
    gone.extend(changed.gone);
}

/// What an owner needs: its deletion's finalizers first, else its controller.
fn reconcile(cache: &Cache, res: Res, v: &Value) -> Vec<Action> {
    let finalizers: Vec<&str> = (v["metadata"]["finalizers"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    if !v["metadata"]["deletionTimestamp"].is_null() {
        if finalizers.contains(&ORPHAN) {
            return orphan(cache, res, v);
        }
        if finalizers.contains(&FOREGROUND) {
            return foreground(cache, res, v);
        }
    }
    match res {
        Res::Deployment => deployment::reconcile(cache, v),
        Res::ReplicaSet | Res::ReplicationController => replicas::reconcile_replicas(cache, res, v),
        Res::Job => replicas::reconcile_job(cache, v),
        Res::StatefulSet => stateful::reconcile_statefulset(cache, v),
        Res::DaemonSet => stateful::reconcile_daemonset(cache, v),
        Res::Pod | Res::Node => Vec::new(),
    }
}

/// The dependents the collector deletes for an owner: pods and ReplicaSets naming it.
fn dependents(cache: &Cache, uid: &str) -> Vec<(Res, String, String, bool)> {
    let pods = cache
        .dependent_pods(uid)
        .into_iter()
        .map(|p| (Res::Pod, p.namespace.clone(), p.name.clone(), p.deleting));
    let sets = cache
        .dependents(Res::ReplicaSet, uid)
        .into_iter()
        .map(|rs| {
            let (ns, name, _) = meta(rs);
            let deleting = !rs["metadata"]["deletionTimestamp"].is_null();
            (Res::ReplicaSet, ns.to_string(), name.to_string(), deleting)
        });
    pods.chain(sets).collect()
}

fn collect_garbage(cache: &Cache, uid: &str) -> Vec<Action> {
    dependents(cache, uid)
        .into_iter()
        .filter(|d| !d.3)
        .map(|(res, ns, name, _)| Action::Delete { res, ns, name })
        .collect()
}

fn without_finalizer(res: Res, v: &Value, f: &str) -> Action {
    let (ns, name, _) = meta(v);
    let rest: Vec<&Value> = (v["metadata"]["finalizers"].as_array().into_iter().flatten())
        .filter(|x| *x != f)
        .collect();
    Action::Patch {
        res,
        ns: ns.into(),
        name: name.into(),
        status: false,
        body: json!({"metadata": {"finalizers": rest}}),
    }
}

/// Foreground deletion: the dependents go first; the owner's finalizer once none is left.
fn foreground(cache: &Cache, res: Res, v: &Value) -> Vec<Action> {
    let uid = meta(v).2;
    let left = dependents(cache, uid);
    if left.is_empty() {
        return vec![without_finalizer(res, v, FOREGROUND)];
    }
    collect_garbage(cache, uid)
}

/// Orphaning: each dependent's reference to the owner is removed, then the finalizer.
fn orphan(cache: &Cache, res: Res, v: &Value) -> Vec<Action> {
    let uid = meta(v).2;
    let mut actions = Vec::new();
    for p in cache.dependent_pods(uid) {
        actions.push(unowned(Res::Pod, &p.namespace, &p.name, uid));
    }
    for rs in cache.dependents(Res::ReplicaSet, uid) {
        let (ns, name, _) = meta(rs);
        actions.push(unowned(Res::ReplicaSet, ns, name, uid));
    }
    if actions.is_empty() {
        actions.push(without_finalizer(res, v, ORPHAN));
    }
    actions
}

/// Drops one owner reference, as the collector does: a strategic merge patch deleting the
/// list item whose merge key (`uid`) is the owner's.
fn unowned(res: Res, ns: &str, name: &str, gone: &str) -> Action {
    Action::Unown {
        res,
        ns: ns.into(),
        name: name.into(),
        uid: gone.into(),
    }
}

/// What became of one request.
enum Outcome {
    /// The object as the server answered.
    Done(Res, Value, bool),
    /// Nothing to do again (404, 409, another refusal that would not change).
    Moot,
    Retry,
}

async fn execute(
    client: &ApiClient,
    timeout: Duration,
    cache: &mut Cache,
    q: &mut Queue,
    gone: &mut Vec<String>,
    owner: Option<(Res, String)>,
    actions: Vec<Action>,
) {
    if actions.is_empty() {
        return;
    }
    let outcomes: Vec<Outcome> = futures_util::stream::iter(actions)
        .map(|a| send(client, timeout, a))
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let mut retry = false;
    for o in outcomes {
        match o {
            Outcome::Done(res, v, deleted) => {
                let c = cache.apply(res, v, deleted);
                take(cache, q, gone, c);
            }
            Outcome::Moot => {}
            Outcome::Retry => retry = true,
        }
    }
    if retry {
        q.retry.extend(owner);
    }
}

async fn send(client: &ApiClient, timeout: Duration, a: Action) -> Outcome {
    let (method, path, body, res) = match &a {
        Action::Create { res, ns, body } => (
            Method::POST,
            res.namespaced(ns),
            Some(("application/json", body.to_string())),
            *res,
        ),
        Action::Delete { res, ns, name } => (
            Method::DELETE,
            res.object(ns, name),
            Some((
                "application/json",
                json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"})
                    .to_string(),
            )),
            *res,
        ),
        Action::Patch {
            res,
            ns,
            name,
            status,
            body,
        } => {
            let path = res.object(ns, name);
            let path = if *status { format!("{path}/status") } else { path };
            (
                Method::PATCH,
                path,
                Some(("application/merge-patch+json", body.to_string())),
                *res,
            )
        }
        Action::Unown { res, ns, name, uid } => (
            Method::PATCH,
            res.object(ns, name),
            Some((
                "application/strategic-merge-patch+json",
                json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": uid}]}})
                    .to_string(),
            )),
            *res,
        ),
    };
    let req = async {
        let req = client
            .request(
                method.clone(),
                &path,
                body.map(|(t, b)| (t, Bytes::from(b))),
            )
            .ok()?;
        let resp = client.send(req).await.ok()?;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.ok()?.to_bytes();
        Some((status, bytes))
    };
    match tokio::time::timeout(timeout, req).await {
        Ok(Some((200..=299, bytes))) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) if v["kind"] == res.kind() => {
                // A DELETE answers the object as it was removed, or marked (a pod on a node
                // waits for its kubelet; an owner waits for its finalizers).
                let gone = method == Method::DELETE && v["metadata"]["deletionTimestamp"].is_null();
                Outcome::Done(res, v, gone)
            }
            _ => Outcome::Moot,
        },
        Ok(Some((404 | 409 | 422, _))) => Outcome::Moot,
        Ok(Some((status, bytes))) if status < 500 && status != 429 => {
            tracing::warn!(%path, status, body = %String::from_utf8_lossy(&bytes), "controllers: request refused");
            Outcome::Moot
        }
        _ => Outcome::Retry,
    }
}
