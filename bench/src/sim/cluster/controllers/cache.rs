//! What the controllers know: every workload object (as served), a slim record of every pod
//! and node, and the indexes a reconcile needs (objects by uid, pods and ReplicaSets by their
//! controller's uid). Fed by the informers and by the controllers' own writes (the answer to
//! each write goes in at once, so the next reconcile counts what was just created); an event
//! older than what is held (by resourceVersion) is ignored.

use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The kinds the controllers follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Res {
    Deployment,
    ReplicaSet,
    ReplicationController,
    StatefulSet,
    DaemonSet,
    Job,
    Pod,
    Node,
}

impl Res {
    pub const ALL: [Res; 8] = [
        Res::Deployment,
        Res::ReplicaSet,
        Res::ReplicationController,
        Res::StatefulSet,
        Res::DaemonSet,
        Res::Job,
        Res::Pod,
        Res::Node,
    ];
    /// The owners: the kinds whose objects are reconciled.
    pub const OWNERS: [Res; 6] = [
        Res::Deployment,
        Res::ReplicaSet,
        Res::ReplicationController,
        Res::StatefulSet,
        Res::DaemonSet,
        Res::Job,
    ];

    pub fn kind(self) -> &'static str {
        match self {
            Res::Deployment => "Deployment",
            Res::ReplicaSet => "ReplicaSet",
            Res::ReplicationController => "ReplicationController",
            Res::StatefulSet => "StatefulSet",
            Res::DaemonSet => "DaemonSet",
            Res::Job => "Job",
            Res::Pod => "Pod",
            Res::Node => "Node",
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Res::Deployment | Res::ReplicaSet | Res::StatefulSet | Res::DaemonSet => "apps/v1",
            Res::Job => "batch/v1",
            Res::ReplicationController | Res::Pod | Res::Node => "v1",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Res::Deployment => "deployments",
            Res::ReplicaSet => "replicasets",
            Res::ReplicationController => "replicationcontrollers",
            Res::StatefulSet => "statefulsets",
            Res::DaemonSet => "daemonsets",
            Res::Job => "jobs",
            Res::Pod => "pods",
            Res::Node => "nodes",
        }
    }

    fn prefix(self) -> &'static str {
        match self.api_version() {
            "v1" => "/api/v1",
            "apps/v1" => "/apis/apps/v1",
            _ => "/apis/batch/v1",
        }
    }

    /// The cluster-wide collection the informer lists and watches.
    pub fn collection(self) -> String {
        format!("{}/{}", self.prefix(), self.plural())
    }

    /// The namespaced collection (where objects are created).
    pub fn namespaced(self, ns: &str) -> String {
        format!("{}/namespaces/{ns}/{}", self.prefix(), self.plural())
    }

    /// One object's path.
    pub fn object(self, ns: &str, name: &str) -> String {
        format!("{}/{name}", self.namespaced(ns))
    }

    pub fn of_kind(kind: &str) -> Option<Res> {
        Res::ALL.into_iter().find(|r| r.kind() == kind)
    }
}

/// `namespace/name`.
pub fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

/// The numeric resourceVersion of an object (the simulator's are integers), 0 if none.
pub fn rv(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The uid of the controller owner (`controller: true`) in `ownerReferences`.
pub fn controller_uid(meta: &Value) -> Option<String> {
    meta["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"].as_bool() == Some(true))
        .and_then(|r| r["uid"].as_str())
        .map(String::from)
}

/// What a controller reads of a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub rv: u64,
    pub labels: Map<String, Value>,
    /// Every owner's uid.
    pub owners: Vec<String>,
    pub controller: Option<String>,
    pub phase: String,
    pub ready: bool,
    pub deleting: bool,
    pub node: String,
    /// `creationTimestamp`, for the oldest-first choices.
    pub created: String,
}

impl PodInfo {
    pub fn of(v: &Value) -> Option<PodInfo> {
        let m = &v["metadata"];
        Some(PodInfo {
            namespace: m["namespace"].as_str()?.to_string(),
            name: m["name"].as_str()?.to_string(),
            uid: m["uid"].as_str().unwrap_or("").to_string(),
            rv: rv(v),
            labels: m["labels"].as_object().cloned().unwrap_or_default(),
            owners: (m["ownerReferences"].as_array().into_iter().flatten())
                .filter_map(|r| r["uid"].as_str().map(String::from))
                .collect(),
            controller: controller_uid(m),
            phase: v["status"]["phase"].as_str().unwrap_or("").to_string(),
            ready: (v["status"]["conditions"].as_array().into_iter().flatten())
                .any(|c| c["type"] == "Ready" && c["status"] == "True"),
            deleting: !m["deletionTimestamp"].is_null(),
            node: v["spec"]["nodeName"].as_str().unwrap_or("").to_string(),
            created: m["creationTimestamp"].as_str().unwrap_or("").to_string(),
        })
    }

    /// Counted as one of its controller's replicas: not finished, not being deleted.
    pub fn active(&self) -> bool {
        !self.deleting && !matches!(self.phase.as_str(), "Succeeded" | "Failed")
    }

    pub fn running_ready(&self) -> bool {
        self.active() && self.phase == "Running" && self.ready
    }
}

/// What a controller reads of a node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    pub labels: Map<String, Value>,
}

/// The controllers' view.
#[derive(Debug, Default)]
pub struct Cache {
    /// Owner objects by kind, then `ns/name`.
    objects: HashMap<Res, BTreeMap<String, Value>>,
    pods: HashMap<String, PodInfo>,
    pub nodes: BTreeMap<String, NodeInfo>,
    /// An owner's uid → its kind and key.
    by_uid: HashMap<String, (Res, String)>,
    /// Pods by each owner uid they name.
    pods_by_owner: HashMap<String, BTreeSet<String>>,
}

/// What changed, for the caller to queue reconciles.
#[derive(Debug, Default, PartialEq)]
pub struct Changed {
    /// Owners to reconcile.
    pub dirty: Vec<(Res, String)>,
    /// An owner deleted: its uid (its dependents are collected).
    pub gone: Option<String>,
    /// A node came, went or changed: every DaemonSet is reconciled.
    pub nodes: bool,
}

impl Cache {
    pub fn get(&self, res: Res, key: &str) -> Option<&Value> {
        self.objects.get(&res)?.get(key)
    }

    pub fn objects(&self, res: Res) -> impl Iterator<Item = (&String, &Value)> {
        self.objects.get(&res).into_iter().flatten()
    }

    pub fn pod(&self, key: &str) -> Option<&PodInfo> {
        self.pods.get(key)
    }

    /// The pods whose controller is `uid`.
    pub fn pods_of(&self, uid: &str) -> Vec<&PodInfo> {
        (self.pods_by_owner.get(uid).into_iter().flatten())
            .filter_map(|k| self.pods.get(k))
            .filter(|p| p.controller.as_deref() == Some(uid))
            .collect()
    }

    /// Pods naming `uid` as an owner (controller or not).
    pub fn dependent_pods(&self, uid: &str) -> Vec<&PodInfo> {
        (self.pods_by_owner.get(uid).into_iter().flatten())
            .filter_map(|k| self.pods.get(k))
            .collect()
    }

    /// Owner objects of kind `res` naming `uid` as an owner.
    pub fn dependents(&self, res: Res, uid: &str) -> Vec<&Value> {
        self.objects(res)
            .map(|(_, v)| v)
            .filter(|v| {
                (v["metadata"]["ownerReferences"]
                    .as_array()
                    .into_iter()
                    .flatten())
                .any(|r| r["uid"] == uid)
            })
            .collect()
    }

    pub fn owner_of(&self, uid: &str) -> Option<(Res, &String)> {
        self.by_uid.get(uid).map(|(r, k)| (*r, k))
    }

    /// An object seen (listed, changed, or answered to a write), or deleted.
    pub fn apply(&mut self, res: Res, v: Value, deleted: bool) -> Changed {
        let mut changed = Changed::default();
        let m = &v["metadata"];
        let name = m["name"].as_str().unwrap_or("").to_string();
        match res {
            Res::Node => {
                let info = NodeInfo {
                    labels: m["labels"].as_object().cloned().unwrap_or_default(),
                };
                let before = if deleted {
                    self.nodes.remove(&name)
                } else {
                    self.nodes.insert(name, info.clone())
                };
                changed.nodes = deleted || before.as_ref() != Some(&info);
            }
            Res::Pod => {
                let Some(info) = PodInfo::of(&v) else {
                    return changed;
                };
                let k = key(&info.namespace, &info.name);
                if let Some(cur) = self.pods.get(&k) {
                    if info.rv < cur.rv && cur.uid == info.uid {
                        return changed;
                    }
                }
                if let Some(old) = self.pods.remove(&k) {
                    self.unindex_pod(&k, &old);
                    changed.dirty.extend(self.owner_keys(&old.owners));
                }
                changed.dirty.extend(self.owner_keys(&info.owners));
                if !deleted {
                    for o in &info.owners {
                        self.pods_by_owner
                            .entry(o.clone())
                            .or_default()
                            .insert(k.clone());
                    }
                    self.pods.insert(k, info);
                }
            }
            _ => {
                let ns = m["namespace"].as_str().unwrap_or("");
                let k = key(ns, &name);
                let uid = m["uid"].as_str().unwrap_or("").to_string();
                let map = self.objects.entry(res).or_default();
                if let Some(cur) = map.get(&k) {
                    if rv(&v) < rv(cur) && cur["metadata"]["uid"] == uid.as_str() {
                        return changed;
                    }
                    if let Some(old_uid) = cur["metadata"]["uid"].as_str() {
                        if old_uid != uid {
                            self.by_uid.remove(old_uid);
                        }
                    }
                }
                // An owner (a Deployment of a ReplicaSet) hears of its dependents' changes.
                let owners: Vec<String> = (m["ownerReferences"].as_array().into_iter().flatten())
                    .filter_map(|r| r["uid"].as_str().map(String::from))
                    .collect();
                changed.dirty.extend(self.owner_keys(&owners));
                let map = self.objects.entry(res).or_default();
                if deleted {
                    map.remove(&k);
                    self.by_uid.remove(&uid);
                    changed.gone = Some(uid);
                } else {
                    map.insert(k.clone(), v);
                    self.by_uid.insert(uid, (res, k.clone()));
                    changed.dirty.push((res, k));
                }
            }
        }
        changed
    }

    /// A LIST's items replace what is held of `res`; everything held is reconciled again.
    pub fn replace(&mut self, res: Res, items: Vec<Value>) -> Vec<Changed> {
        let stale: Vec<Value> = match res {
            Res::Pod => self
                .pods
                .values()
                .map(|p| serde_json::json!({"metadata": {"namespace": p.namespace, "name": p.name, "uid": p.uid}}))
                .collect(),
            Res::Node => (self.nodes.keys())
                .map(|n| serde_json::json!({"metadata": {"name": n}}))
                .collect(),
            _ => self.objects(res).map(|(_, v)| v.clone()).collect(),
        };
        let listed: BTreeSet<(String, String)> = items.iter().map(ns_name).collect();
        let mut out: Vec<Changed> = stale
            .into_iter()
            .filter(|v| !listed.contains(&ns_name(v)))
            .map(|v| self.apply(res, v, true))
            .collect();
        out.extend(items.into_iter().map(|v| self.apply(res, v, false)));
        out
    }

    fn unindex_pod(&mut self, k: &str, p: &PodInfo) {
        for o in &p.owners {
            if let Some(set) = self.pods_by_owner.get_mut(o) {
                set.remove(k);
                if set.is_empty() {
                    self.pods_by_owner.remove(o);
                }
            }
        }
    }

    fn owner_keys(&self, uids: &[String]) -> Vec<(Res, String)> {
        uids.iter()
            .filter_map(|u| self.by_uid.get(u).cloned())
            .collect()
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }
}

fn ns_name(v: &Value) -> (String, String) {
    let m = &v["metadata"];
    (
        m["namespace"].as_str().unwrap_or("").to_string(),
        m["name"].as_str().unwrap_or("").to_string(),
    )
}
