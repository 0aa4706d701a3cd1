//! DELETE of one object, as the apiserver does it: preconditions (uid, resourceVersion →
//! 409), graceful deletion of pods on a node (the reaper ends it when the simulated kubelet
//! has stopped the pod), deletion deferred by finalizers, and namespace termination.

use super::write::{parse_object, store_status};
use super::Api;
use crate::sim::clock;
use crate::sim::resources::{self, ResourceDef};
use crate::sim::storage::object::{key, Obj};
use crate::sim::storage::store::Write;
use apimodel::Status;
use serde_json::Value;
use std::sync::Arc;

/// What a DELETE may carry, from the query and the body.
#[derive(Debug, Default, Clone)]
pub struct DeleteOptions {
    pub grace_period: Option<i64>,
    pub uid: Option<String>,
    pub resource_version: Option<u64>,
    /// `propagationPolicy` (`Foreground`, `Background`, `Orphan`), as sent.
    pub propagation: Option<String>,
}

impl DeleteOptions {
    pub fn parse(query: Option<&str>, body: &[u8]) -> Result<DeleteOptions, Status> {
        let mut o = DeleteOptions::default();
        if !body.iter().all(u8::is_ascii_whitespace) {
            let v = parse_object(body)?;
            o.grace_period = v.get("gracePeriodSeconds").and_then(Value::as_i64);
            o.propagation = v
                .get("propagationPolicy")
                .and_then(Value::as_str)
                .map(String::from);
            if v.get("orphanDependents").and_then(Value::as_bool) == Some(true) {
                o.propagation.get_or_insert_with(|| "Orphan".into());
            }
            let pre = v.get("preconditions");
            o.uid = pre
                .and_then(|p| p.get("uid"))
                .and_then(Value::as_str)
                .map(String::from);
            o.resource_version = pre
                .and_then(|p| p.get("resourceVersion"))
                .and_then(Value::as_str)
                .and_then(|s| s.parse().ok());
        }
        for (k, v) in apimodel::request::query_pairs(query.unwrap_or("")) {
            if k == "propagationPolicy" {
                o.propagation = Some(v.to_string());
            }
            if k == "gracePeriodSeconds" {
                o.grace_period = Some(v.parse().map_err(|_| {
                    Status::bad_request(format!("invalid gracePeriodSeconds {v:?}"))
                })?);
            }
        }
        Ok(o)
    }
}

/// DELETE of one object: graceful for pods on a node, deferred by finalizers, else at once.
pub async fn delete(
    api: &Api,
    def: &'static ResourceDef,
    ns: &str,
    name: &str,
    opts: &DeleteOptions,
    dry_run: bool,
) -> Result<Arc<Obj>, Status> {
    let idx = resources::index_of(def);
    let k = key(ns, name);
    let Some(cur) = api.store.get(idx, &k) else {
        return Err(Status::not_found(def.group, def.name, name));
    };
    // kube-apiserver's registry words a failed delete precondition so, naming the kind.
    let conflict = |what: String| {
        Status::failure(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {name:?}: {what}",
                def.kind
            ),
        )
        .with_details(def.group, def.kind, name)
    };
    if let Some(uid) = &opts.uid {
        if *uid != cur.uid {
            return Err(conflict(format!("the UID in the precondition ({uid}) does not match the UID in record ({}). The object might have been deleted and then recreated", cur.uid)));
        }
    }
    if let Some(rv) = opts.resource_version {
        if rv != cur.rv {
            return Err(conflict(format!("the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({}). The object might have been modified", cur.rv)));
        }
    }
    if dry_run {
        return Ok(cur);
    }
    if def.name == "namespaces" {
        if crate::sim::storage::seed_objects::SYSTEM_NAMESPACES.contains(&name) {
            return Err(Status::failure(
                403,
                "Forbidden",
                format!("namespaces \"{name}\" is forbidden: this namespace may not be deleted"),
            ));
        }
        return start_namespace_termination(api, def, cur).await;
    }
    if api.config.garbage_collector {
        if let Some(finalizer) = gc_finalizer(def, opts)? {
            return mark_for_collector(api, def, cur, finalizer).await;
        }
    }
    let v = cur.value();
    let on_node = def.name == "pods" && !v["spec"]["nodeName"].as_str().unwrap_or("").is_empty();
    let grace = opts.grace_period.unwrap_or_else(|| {
        v["spec"]["terminationGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(30)
    });
    let finalizers = cur.has_finalizers;
    if (on_node && grace > 0) || finalizers {
        let mut marked = v;
        let now = clock::now_unix();
        let grace = if on_node { grace } else { 0 };
        let new_deadline = now + grace;
        let old_deadline = marked["metadata"]["deletionTimestamp"]
            .as_str()
            .and_then(clock::parse_rfc3339);
        if old_deadline.is_some_and(|d| d <= new_deadline) {
            return Ok(cur);
        }
        marked["metadata"]["deletionTimestamp"] = clock::rfc3339(new_deadline).into();
        marked["metadata"]["deletionGracePeriodSeconds"] = grace.into();
        let o = api
            .storage
            .write(def, &k, Some(cur.rv), Write::Put(marked))
            .await
            .map_err(|e| store_status(e, def, name))?;
        if on_node {
            let delay = api
                .config
                .kubelet_delete_delay
                .min(std::time::Duration::from_secs(grace as u64));
            api.reaper.schedule(delay, idx, k, cur.uid.clone());
        }
        return Ok(o);
    }
    let crd = def.group == "apiextensions.k8s.io" && def.name == "customresourcedefinitions";
    if crd {
        remove_custom_objects(api, name).await;
    }
    let gone = api
        .storage
        .write(def, &k, None, Write::Delete)
        .await
        .map_err(|e| store_status(e, def, name))?;
    api.cluster_ips.release_service(def, &v);
    if crd {
        // kube-apiserver answers the CRD as its finalizer found it: marked for deletion,
        // `Terminating`, not yet gone.
        let mut marked = v;
        let now = clock::rfc3339(clock::now_unix());
        marked["metadata"]["deletionTimestamp"] = now.clone().into();
        marked["metadata"]["finalizers"] =
            serde_json::json!(["customresourcecleanup.apiextensions.k8s.io"]);
        if let Some(c) = marked["status"]["conditions"].as_array_mut() {
            c.push(serde_json::json!({"type": "Terminating", "status": "True", "lastTransitionTime": now,
                "reason": "InstanceDeletionPending",
                "message": "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon"}));
        }
        return Ok(Arc::new(Obj::new(def, marked, gone.rv)));
    }
    Ok(gone)
}

/// A deleted CRD stops being served and its objects are deleted (watchers see each go),
/// as kube-apiserver's `customresourcecleanup` finalizer does before the CRD goes. The
/// resource is served until its objects are gone (with etcd, the cache's feed needs it to
/// apply their deletes).
async fn remove_custom_objects(api: &Api, crd_name: &str) {
    let Some(c) = api
        .store
        .custom()
        .served()
        .into_iter()
        .find(|c| c.crd == crd_name)
    else {
        return;
    };
    let Some(def) = c.versions.first().map(|v| v.def) else {
        return;
    };
    let (_, map) = api.store.snapshot(def.index);
    for (k, _) in map.iter() {
        if let Err(e) = api.storage.write(def, k, None, Write::Delete).await {
            tracing::debug!(error = %e, key = %k, "deleting a custom object failed");
        }
    }
    api.store.custom().remove(crd_name);
}

/// The owner kinds the simulated garbage collector follows (`sim::cluster::controllers`).
const COLLECTED_OWNERS: [(&str, &str); 6] = [
    ("apps", "deployments"),
    ("apps", "replicasets"),
    ("apps", "statefulsets"),
    ("apps", "daemonsets"),
    ("batch", "jobs"),
    ("", "replicationcontrollers"),
];

/// The finalizer a delete leaves for the collector: `foregroundDeletion` (dependents first)
/// or `orphan` (dependents kept), or none (background: the owner goes now, dependents after).
/// Without a policy, a Job or a ReplicationController orphans (their v1 APIs' default, kept
/// for compatibility), the apps kinds propagate in the background.
fn gc_finalizer(def: &ResourceDef, opts: &DeleteOptions) -> Result<Option<&'static str>, Status> {
    if !COLLECTED_OWNERS.contains(&(def.group, def.name)) {
        return Ok(None);
    }
    let default_orphan = matches!(def.name, "jobs" | "replicationcontrollers");
    match opts.propagation.as_deref() {
        Some("Foreground") => Ok(Some("foregroundDeletion")),
        Some("Orphan") => Ok(Some("orphan")),
        Some("Background") => Ok(None),
        None if default_orphan => Ok(Some("orphan")),
        None => Ok(None),
        Some(other) => Err(Status::bad_request(format!(
            "propagationPolicy: Unsupported value: {other:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
        ))),
    }
}

/// The owner stays, marked for deletion with `finalizer`, until the collector is done.
async fn mark_for_collector(
    api: &Api,
    def: &'static ResourceDef,
    cur: Arc<Obj>,
    finalizer: &str,
) -> Result<Arc<Obj>, Status> {
    let mut v = cur.value();
    if v["metadata"]["deletionTimestamp"].is_null() {
        v["metadata"]["deletionTimestamp"] = clock::rfc3339(clock::now_unix()).into();
        v["metadata"]["deletionGracePeriodSeconds"] = 0.into();
    }
    let list = v["metadata"]["finalizers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if list.iter().any(|f| f == finalizer)
        && !cur.value()["metadata"]["deletionTimestamp"].is_null()
    {
        return Ok(cur);
    }
    let mut list = list;
    if !list.iter().any(|f| f == finalizer) {
        list.push(finalizer.into());
    }
    v["metadata"]["finalizers"] = Value::Array(list);
    api.storage
        .write(def, &cur.key(), Some(cur.rv), Write::Put(v))
        .await
        .map_err(|e| store_status(e, def, &cur.name))
}

async fn start_namespace_termination(
    api: &Api,
    def: &'static ResourceDef,
    cur: Arc<Obj>,
) -> Result<Arc<Obj>, Status> {
    let mut v = cur.value();
    v["metadata"]["deletionTimestamp"] = clock::rfc3339(clock::now_unix()).into();
    v["status"]["phase"] = "Terminating".into();
    let o = api
        .storage
        .write(def, &cur.key(), Some(cur.rv), Write::Put(v))
        .await
        .map_err(|e| store_status(e, def, &cur.name))?;
    api.reaper.finish_namespace(cur.name.clone());
    Ok(o)
}
