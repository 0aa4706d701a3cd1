//! The writes: create, update (PUT) and patch, with the apiserver's metadata rules (uid,
//! creationTimestamp, resourceVersion preconditions → 409); deletes are in [`super::delete`].

use super::patch::{self, PatchError, PatchType};
use super::Api;
use super::{crd, defaults, validate};
use crate::sim::clock;
use crate::sim::resources::{self, ResourceDef};
use crate::sim::storage::object::{key, Obj};
use crate::sim::storage::store::{StoreError, Write};
use apimodel::{RequestInfo, Status};
use rand::Rng;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Tries of an update that lost a race with another writer before giving up with 409.
/// Attempts of a read-modify-write against conflicting writers.
pub(super) const UPDATE_RETRIES: usize = 8;

pub(super) fn store_status(e: StoreError, def: &ResourceDef, name: &str) -> Status {
    match e {
        StoreError::NotFound => Status::not_found(def.group, def.name, name),
        StoreError::AlreadyExists => Status::already_exists(def.group, def.name, name),
        StoreError::Conflict => Status::conflict(def.group, def.name, name),
        StoreError::Compacted { .. } => Status::expired(e.to_string()),
        StoreError::CacheTimeout(_) | StoreError::TooNew(_) => Status::timeout(e.to_string()),
        StoreError::Storage(_) => Status::internal(e.to_string()),
    }
}

pub(super) fn parse_object(body: &[u8]) -> Result<Map<String, Value>, Status> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Status::bad_request(
            "the body of the request must be a JSON object",
        )),
        Err(e) => Err(Status::bad_request(format!(
            "error decoding the request body as JSON: {e}"
        ))),
    }
}

fn meta_str<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get("metadata")
        .and_then(|m| m.get(k))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn check_kind(def: &ResourceDef, obj: &Map<String, Value>) -> Result<(), Status> {
    if let Some(k) = obj.get("kind").and_then(Value::as_str) {
        if k != def.kind {
            return Err(Status::bad_request(format!(
                "the kind {k:?} of the body does not match the resource's kind {:?}",
                def.kind
            )));
        }
    }
    if let Some(v) = obj.get("apiVersion").and_then(Value::as_str) {
        if v != def.api_version() {
            return Err(Status::bad_request(format!(
                "the API version {v:?} of the body does not match {:?}",
                def.api_version()
            )));
        }
    }
    Ok(())
}

fn validate_name(def: &ResourceDef, name: &str) -> Result<(), Status> {
    let r = if def.name == "namespaces" {
        validate::label(name)
    } else {
        validate::subdomain(name)
    };
    r.map_err(|e| {
        let mut status = Status::invalid(
            def.group,
            def.kind,
            name,
            format!("{} {name:?} is invalid: metadata.name: {e}", def.kind),
        );
        // kube-apiserver lists each field error as a cause (clients show them per field).
        if let Some(details) = status.details.as_mut() {
            details.causes.push(apimodel::status::StatusCause {
                reason: "FieldValueInvalid".into(),
                message: e,
                field: "metadata.name".into(),
            });
        }
        status
    })
}

/// Namespaced writes need a namespace that exists and is not terminating.
fn check_namespace(api: &Api, def: &ResourceDef, ns: &str) -> Result<(), Status> {
    if !def.namespaced {
        return Ok(());
    }
    let ns_def =
        resources::by_name("namespaces").ok_or_else(|| Status::internal("no namespaces"))?;
    let Some(n) = api.store.get(resources::index_of(ns_def), ns) else {
        return Err(Status::not_found("", "namespaces", ns));
    };
    if n.deleting {
        return Err(Status::failure(403, "Forbidden", format!("{} \"\" is forbidden: unable to create new content in namespace {ns} because it is being terminated", def.name)));
    }
    Ok(())
}

fn generated_name(prefix: &str) -> String {
    const ALNUM: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    let tail: String = (0..5)
        .map(|_| ALNUM[rng.random_range(0..ALNUM.len())] as char)
        .collect();
    // At most 58 characters of the prefix, as the apiserver truncates it (by
    // characters: the prefix is the client's and may hold any UTF-8).
    let head: String = prefix.chars().take(58).collect();
    format!("{head}{tail}")
}

/// POST: a new object.
pub async fn create(
    api: &Api,
    def: &'static ResourceDef,
    info: &RequestInfo,
    body: &[u8],
    dry_run: bool,
) -> Result<Arc<Obj>, Status> {
    let mut obj = parse_object(body)?;
    check_kind(def, &obj)?;
    let meta = obj.entry("metadata").or_insert_with(|| json!({}));
    let Some(meta) = meta.as_object_mut() else {
        return Err(Status::bad_request("metadata must be an object"));
    };
    if meta
        .get("resourceVersion")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        return Err(Status::bad_request(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    let name = new_object_name(def, meta)?;
    validate_name(def, &name)?;
    let ns = new_object_namespace(def, info, meta)?;
    check_namespace(api, def, &ns)?;
    meta.insert("name".into(), name.clone().into());
    if def.namespaced {
        meta.insert("namespace".into(), ns.clone().into());
    } else {
        meta.remove("namespace");
    }
    let uid = uuid::Uuid::new_v4().to_string();
    meta.insert("uid".into(), uid.clone().into());
    meta.insert(
        "creationTimestamp".into(),
        clock::rfc3339(clock::now_unix()).into(),
    );
    // Kinds that track `generation` start at 1; the others drop a client-sent one, as the
    // registry does (pods track it only from 1.33).
    if def.generation {
        meta.insert("generation".into(), 1.into());
    } else {
        meta.remove("generation");
    }
    meta.remove("deletionTimestamp");
    meta.remove("deletionGracePeriodSeconds");
    if def.name == "namespaces" {
        let labels = meta.entry("labels").or_insert_with(|| json!({}));
        if let Some(l) = labels.as_object_mut() {
            l.insert("kubernetes.io/metadata.name".into(), name.clone().into());
        }
    }
    let mut v = Value::Object(obj);
    if def.name == "nodes" {
        default_node(&mut v);
    }
    v["apiVersion"] = def.api_version().into();
    v["kind"] = def.kind.into();
    apply_defaults(def, &mut v);
    defaults::workload(def, &mut v, &uid, api.config.kube_version);
    check_custom(api, def, &name, &mut v)?;
    let k = key(&ns, &name);
    let is_crd = is_crd(def);
    if is_crd {
        crd::prepare(&mut v);
        if api.store.get(def.index, &k).is_some() {
            return Err(Status::already_exists(def.group, def.name, &name));
        }
    }
    let ip = if is_service(def) {
        defaults::service(&mut v, &api.cluster_ips).map_err(|e| {
            Status::invalid(
                def.group,
                def.kind,
                &name,
                format!("{} {name:?} is invalid: {e}", def.kind),
            )
        })?;
        defaults::service_ip(&v).map(String::from)
    } else {
        None
    };
    let release = || {
        if let Some(ip) = &ip {
            api.cluster_ips.release(ip);
        }
    };
    if dry_run {
        release();
        return Ok(Arc::new(Obj::new(def, v, api.store.revision())));
    }
    if is_crd {
        if let Err(e) = api.store.custom().install(&v) {
            return Err(crd_refused(def, &name, e));
        }
    }
    let created = match api.storage.write(def, &k, Some(0), Write::Put(v)).await {
        Ok(o) => o,
        Err(e) => {
            release();
            if is_crd {
                api.store.custom().remove(&name);
            }
            return Err(store_status(e, def, &name));
        }
    };
    if is_crd {
        establish(api, def, &created).await;
    }
    if def.group.is_empty() && def.name == "namespaces" {
        default_service_account(api, &name).await;
    }
    Ok(created)
}

fn is_crd(def: &ResourceDef) -> bool {
    def.group == "apiextensions.k8s.io" && def.name == "customresourcedefinitions"
}

fn is_service(def: &ResourceDef) -> bool {
    def.group.is_empty() && def.name == "services"
}

fn crd_refused(
    def: &ResourceDef,
    name: &str,
    e: crate::sim::resources::custom::CustomError,
) -> Status {
    use crate::sim::resources::custom::CustomError;
    match e {
        CustomError::Full | CustomError::TooManyDefinitions => {
            Status::failure(507, "InsufficientStorage", e.to_string())
        }
        _ => Status::invalid(
            def.group,
            def.kind,
            name,
            format!("{}.{} {name:?} is invalid: {e}", def.kind, def.group),
        ),
    }
}

/// The establishing controller's write: names accepted, the resource served.
async fn establish(api: &Api, def: &'static ResourceDef, created: &Obj) {
    let mut v = created.value();
    crd::established(&mut v, &clock::rfc3339(clock::now_unix()));
    if let Some(m) = v["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    let k = created.key();
    if let Err(e) = api
        .storage
        .write(def, &k, Some(created.rv), Write::Put(v))
        .await
    {
        tracing::debug!(error = %e, crd = %k, "establishing the CRD lost a race; its status stays");
    }
}

/// The ServiceAccounts controller's `default` account in a new namespace (kube-apiserver
/// leaves it to kube-controller-manager, a moment later; the simulator has no controllers).
async fn default_service_account(api: &Api, ns: &str) {
    let Some(def) = resources::by_name("serviceaccounts") else {
        return;
    };
    let v = json!({"kind": "ServiceAccount", "apiVersion": "v1",
                   "metadata": {"name": "default", "namespace": ns, "uid": uuid::Uuid::new_v4().to_string(),
                                "creationTimestamp": clock::rfc3339(clock::now_unix())}});
    if let Err(e) = api
        .storage
        .write(def, &key(ns, "default"), Some(0), Write::Put(v))
        .await
    {
        tracing::debug!(error = %e, namespace = %ns, "no default ServiceAccount");
    }
}

/// A custom object is checked against (and pruned to) its version's schema.
fn check_custom(api: &Api, def: &ResourceDef, name: &str, v: &mut Value) -> Result<(), Status> {
    let Some(c) = api.store.custom().by_index(def.index) else {
        return Ok(());
    };
    let Some(schema) = c
        .versions
        .iter()
        .find(|x| x.def.version == def.version)
        .and_then(|x| x.schema.as_ref())
    else {
        return Ok(());
    };
    let errors = crd::validate(schema, v);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(crd::invalid(def.group, def.kind, name, &errors))
    }
}

/// The name of an object to create: its own, or one generated from `generateName`.
fn new_object_name(def: &ResourceDef, meta: &Map<String, Value>) -> Result<String, Status> {
    Ok(
        match meta
            .get("name")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        {
            Some(n) => n.to_string(),
            None => match meta
                .get("generateName")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
            {
                Some(p) => generated_name(p),
                None => {
                    return Err(Status::invalid(
                        def.group,
                        def.kind,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ))
                }
            },
        },
    )
}

/// The namespace of an object to create: the request's, which the body may repeat but not
/// contradict; empty for cluster-scoped resources.
fn new_object_namespace(
    def: &ResourceDef,
    info: &RequestInfo,
    meta: &Map<String, Value>,
) -> Result<String, Status> {
    Ok(if def.namespaced {
        let body_ns = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
        if !body_ns.is_empty() && !info.namespace.is_empty() && body_ns != info.namespace {
            return Err(Status::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
        }
        let ns = if info.namespace.is_empty() {
            body_ns
        } else {
            &info.namespace
        };
        if ns.is_empty() {
            return Err(Status::bad_request(
                "the namespace of the object is required",
            ));
        }
        ns.to_string()
    } else {
        String::new()
    })
}

fn apply_defaults(def: &ResourceDef, v: &mut Value) {
    match def.name {
        "pods" => {
            if v["status"]["phase"].is_null() {
                v["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
            }
            super::serialized::pod_status(v);
            if let Some(spec) = v.get_mut("spec").and_then(Value::as_object_mut) {
                spec.entry("restartPolicy").or_insert("Always".into());
                spec.entry("terminationGracePeriodSeconds")
                    .or_insert(30.into());
                spec.entry("schedulerName")
                    .or_insert("default-scheduler".into());
                spec.entry("dnsPolicy").or_insert("ClusterFirst".into());
            }
        }
        "namespaces" => {
            v["spec"] = json!({"finalizers": ["kubernetes"]});
            v["status"] = json!({"phase": "Active"});
        }
        _ => {}
    }
}

/// Builds the stored form of an update from the current object and what the client sent.
fn merge_update(
    def: &ResourceDef,
    cur: &Value,
    mut new: Value,
    subresource: &str,
) -> Result<Value, Status> {
    let name = meta_str(cur, "name").unwrap_or("");
    if let Some(n) = meta_str(&new, "name") {
        if n != name {
            return Err(Status::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
    }
    if subresource == "status" {
        let mut out = cur.clone();
        out["status"] = new.get("status").cloned().unwrap_or(Value::Null);
        if let (Some(om), Some(nm)) = (out["metadata"].as_object_mut(), new["metadata"].as_object())
        {
            // Status updates may still carry label and annotation changes the kubelet makes.
            for k in ["labels", "annotations"] {
                if let Some(x) = nm.get(k) {
                    om.insert(k.into(), x.clone());
                }
            }
        }
        return Ok(out);
    }
    if !new.is_object() {
        return Err(Status::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    if def.subresources.contains(&"status") {
        new["status"] = cur.get("status").cloned().unwrap_or(Value::Null);
        if new["status"].is_null() {
            if let Some(m) = new.as_object_mut() {
                m.remove("status");
            }
        }
    }
    let keep = [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ];
    let nm = new.get_mut("metadata").and_then(Value::as_object_mut);
    let Some(nm) = nm else {
        return Err(Status::bad_request("metadata must be an object"));
    };
    for k in keep {
        match cur["metadata"].get(k) {
            Some(x) => nm.insert(k.into(), x.clone()),
            None => nm.remove(k),
        };
    }
    new["apiVersion"] = def.api_version().into();
    new["kind"] = def.kind.into();
    Ok(new)
}

/// Where an update's new state comes from.
pub enum Change<'a> {
    Replace(&'a [u8]),
    Patch(PatchType, &'a [u8]),
}

/// PUT or PATCH, retried against concurrent writers unless the client pinned a resourceVersion.
pub async fn update(
    api: &Api,
    def: &'static ResourceDef,
    info: &RequestInfo,
    change: Change<'_>,
    dry_run: bool,
) -> Result<Arc<Obj>, Status> {
    let k = key(&info.namespace, &info.name);
    for attempt in 0..UPDATE_RETRIES {
        let cur = read_for_update(api, def, &k, &info.name, attempt).await?;
        let cur_v = cur.value();
        let new = match &change {
            Change::Replace(body) => {
                let obj = parse_object(body)?;
                check_kind(def, &obj)?;
                Value::Object(obj)
            }
            Change::Patch(kind, body) => {
                let mut doc = cur_v.clone();
                patch::apply(
                    *kind,
                    &mut doc,
                    body,
                    patch::root_type(def.group, def.version, def.kind),
                )
                .map_err(|e| match e {
                    PatchError::Malformed(m) => Status::bad_request(m),
                    // kube-apiserver 1.20 says only this, with empty details, for a patch
                    // that cannot be applied (e.g. a failed JSON-patch `test`); the cause is logged.
                    PatchError::Failed(m) => {
                        tracing::debug!(reason = %m, "patch not applied");
                        let mut status = Status::failure(
                            422,
                            "Invalid",
                            "the server rejected our request due to an error in our request",
                        );
                        status.details = Some(Default::default());
                        status
                    }
                })?;
                doc
            }
        };
        let pinned = match meta_str(&new, "resourceVersion") {
            Some(s) => Some(
                s.parse::<u64>()
                    .map_err(|_| Status::bad_request(format!("invalid resourceVersion {s:?}")))?,
            ),
            None => None,
        };
        if pinned.is_some_and(|p| p != cur.rv) {
            return Err(Status::conflict(def.group, def.name, &info.name));
        }
        let mut merged = merge_update(def, &cur_v, new, &info.subresource)?;
        if def.group.is_empty() && def.name == "pods" {
            super::serialized::pod_status(&mut merged);
        }
        next_generation(def, &cur_v, &mut merged);
        if info.subresource.is_empty() {
            check_custom(api, def, &info.name, &mut merged)?;
            if def.group.is_empty() && def.name == "secrets" {
                defaults::secret(&mut merged);
            }
            if is_service(def) {
                // The allocated address stays unless the client names it (an apply omits it).
                for k in ["clusterIP", "clusterIPs"] {
                    if merged["spec"].get(k).is_none() && !cur_v["spec"][k].is_null() {
                        merged["spec"][k] = cur_v["spec"][k].clone();
                    }
                }
            }
            if is_crd(def) {
                crd::prepare(&mut merged);
                if let Err(e) = api.store.custom().install(&merged) {
                    return Err(crd_refused(def, &info.name, e));
                }
            }
        }
        if dry_run {
            return Ok(Arc::new(Obj::new(def, merged, cur.rv)));
        }
        // A deleting object whose last finalizer is gone is removed (pods wait for their kubelet).
        let finalized = cur.deleting
            && merged["metadata"]["finalizers"]
                .as_array()
                .is_none_or(|a| a.is_empty())
            && !(def.name == "pods"
                && !merged["spec"]["nodeName"].as_str().unwrap_or("").is_empty()
                && grace_pending(&merged));
        let write = if finalized {
            Write::Delete
        } else {
            if let Some(m) = merged["metadata"].as_object_mut() {
                m.remove("resourceVersion");
            }
            Write::Put(merged.take())
        };
        match api.storage.write(def, &k, Some(cur.rv), write).await {
            Ok(o) => return Ok(o),
            Err(StoreError::Conflict) if pinned.is_none() => continue,
            Err(e) => return Err(store_status(e, def, &info.name)),
        }
    }
    Err(Status::conflict(def.group, def.name, &info.name))
}

/// `metadata.generation` after an update: bumped when the spec changes (for custom
/// resources, anything but metadata and status), else kept; absent for kinds without it.
fn next_generation(def: &ResourceDef, cur: &Value, new: &mut Value) {
    let Some(m) = new["metadata"].as_object_mut() else {
        return;
    };
    if !def.generation {
        m.remove("generation");
        return;
    }
    let g = cur["metadata"]["generation"].as_i64().unwrap_or(1);
    let changed = if def.index >= resources::builtins().len() {
        let body = |v: &Value| {
            v.as_object().map(|o| {
                o.iter()
                    .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "status"))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<Map<String, Value>>()
            })
        };
        body(cur) != body(new)
    } else {
        cur.get("spec") != new.get("spec")
    };
    if let Some(m) = new["metadata"].as_object_mut() {
        m.insert(
            "generation".into(),
            (if changed { g + 1 } else { g }).into(),
        );
    }
}

fn grace_pending(v: &Value) -> bool {
    v["metadata"]["deletionTimestamp"]
        .as_str()
        .and_then(clock::parse_rfc3339)
        .is_some_and(|t| t > clock::now_unix())
}

/// What kube-apiserver adds to a created Node: the not-ready taint (TaintNodesByCondition
/// admission; the node lifecycle controller lifts it) and the zero values Go serializes for
/// the non-pointer `status.daemonEndpoints` and `status.nodeInfo`. Sent values are kept.
fn default_node(node: &mut Value) {
    const NOT_READY: &str = "node.kubernetes.io/not-ready";
    let Some(obj) = node.as_object_mut() else {
        return;
    };
    let spec = obj.entry("spec").or_insert_with(|| json!({}));
    if let Some(spec) = spec.as_object_mut() {
        let taints = spec.entry("taints").or_insert_with(|| json!([]));
        if let Some(taints) = taints.as_array_mut() {
            if !taints.iter().any(|t| t["key"] == NOT_READY) {
                taints.push(json!({"key": NOT_READY, "effect": "NoSchedule"}));
            }
        }
    }
    let status = obj.entry("status").or_insert_with(|| json!({}));
    if let Some(status) = status.as_object_mut() {
        status
            .entry("daemonEndpoints")
            .or_insert_with(|| json!({"kubeletEndpoint": {"Port": 0}}));
        let info = status.entry("nodeInfo").or_insert_with(|| json!({}));
        if let Some(info) = info.as_object_mut() {
            for k in [
                "machineID",
                "systemUUID",
                "bootID",
                "kernelVersion",
                "osImage",
                "containerRuntimeVersion",
                "kubeletVersion",
                "kubeProxyVersion",
                "operatingSystem",
                "architecture",
            ] {
                info.entry(k).or_insert_with(|| json!(""));
            }
        }
    }
}

/// The object a read-modify-write starts from: the cache first, as the apiserver's
/// GuaranteedUpdate; after a conflict (`attempt` > 0) the stored object (with etcd, the cache may
/// lag). 404 when it is gone.
pub(super) async fn read_for_update(
    api: &Api,
    def: &'static ResourceDef,
    k: &str,
    name: &str,
    attempt: usize,
) -> Result<Arc<Obj>, Status> {
    let cur = if attempt == 0 {
        api.store.get(resources::index_of(def), k)
    } else {
        api.storage
            .get(def, k, true)
            .await
            .map_err(|e| store_status(e, def, name))?
    };
    cur.ok_or_else(|| Status::not_found(def.group, def.name, name))
}
