//! The `scale` subresource (autoscaling/v1 `Scale`) of Deployments, ReplicaSets,
//! StatefulSets and ReplicationControllers: reads and writes the object's `spec.replicas`.

use super::patch::{self, PatchType};
use super::write::{parse_object, store_status};
use super::Api;
use crate::sim::resources::ResourceDef;
use crate::sim::storage::object::{key, Obj};
use crate::sim::storage::store::Write;
use apimodel::{RequestInfo, Status};
use serde_json::{json, Value};

/// The label selector a Scale reports: `k=v,…` from `matchLabels` (or an RC's map).
fn selector(def: &ResourceDef, v: &Value) -> String {
    let labels = if def.name == "replicationcontrollers" {
        &v["spec"]["selector"]
    } else {
        &v["spec"]["selector"]["matchLabels"]
    };
    let mut parts: Vec<String> = labels
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, x)| format!("{k}={}", x.as_str().unwrap_or_default()))
        .collect();
    parts.sort();
    parts.join(",")
}

/// The object's `Scale`.
pub fn view(def: &ResourceDef, o: &Obj) -> Value {
    let v = o.value();
    let m = &v["metadata"];
    json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
           "metadata": {"name": m["name"], "namespace": m["namespace"], "uid": m["uid"],
                        "resourceVersion": m["resourceVersion"], "creationTimestamp": m["creationTimestamp"]},
           "spec": {"replicas": v["spec"]["replicas"].as_i64().unwrap_or(0)},
           "status": {"replicas": v["status"]["replicas"].as_i64().unwrap_or(0), "selector": selector(def, &v)}})
}

fn current(
    api: &Api,
    def: &ResourceDef,
    info: &RequestInfo,
) -> Result<std::sync::Arc<Obj>, Status> {
    api.store
        .get(def.index, &key(&info.namespace, &info.name))
        .ok_or_else(|| Status::not_found(def.group, def.name, &info.name))
}

/// GET …/scale.
pub fn get(api: &Api, def: &ResourceDef, info: &RequestInfo) -> Result<Value, Status> {
    current(api, def, info).map(|o| view(def, &o))
}

/// PUT or PATCH …/scale: the new `spec.replicas` written into the object (its generation
/// bumped), answered with the new Scale.
pub async fn update(
    api: &Api,
    def: &'static ResourceDef,
    info: &RequestInfo,
    content_type: &str,
    body: &[u8],
    dry_run: bool,
) -> Result<Value, Status> {
    let cur = current(api, def, info)?;
    let mut scale = view(def, &cur);
    match info.verb {
        apimodel::Verb::Update => scale = Value::Object(parse_object(body)?),
        apimodel::Verb::Patch => {
            let kind = PatchType::from_content_type(content_type)
                .ok_or_else(Status::unsupported_media_type)?;
            patch::apply(kind, &mut scale, body, None)
                .map_err(|e| Status::bad_request(e.to_string()))?;
        }
        _ => {
            return Err(Status::method_not_allowed(
                "the server does not allow this method on the requested resource",
            ))
        }
    }
    if let Some(rv) = scale["metadata"]["resourceVersion"].as_str() {
        if !rv.is_empty() && rv != cur.rv.to_string() {
            return Err(Status::conflict(def.group, def.name, &info.name));
        }
    }
    let replicas = match &scale["spec"]["replicas"] {
        Value::Null => 0,
        r => r.as_i64().filter(|r| *r >= 0).ok_or_else(|| {
            Status::invalid(
                "autoscaling",
                "Scale",
                &info.name,
                format!("Scale.autoscaling {:?} is invalid: spec.replicas: Invalid value: {r}: must be greater than or equal to 0", info.name),
            )
        })?,
    };
    let mut v = cur.value();
    if v["spec"]["replicas"].as_i64() != Some(replicas) {
        v["spec"]["replicas"] = replicas.into();
        let g = v["metadata"]["generation"].as_i64().unwrap_or(1);
        v["metadata"]["generation"] = (g + 1).into();
    }
    if dry_run {
        return Ok(view(def, &Obj::new(def, v, cur.rv)));
    }
    if let Some(m) = v["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    let o = api
        .storage
        .write(def, &cur.key(), Some(cur.rv), Write::Put(v))
        .await
        .map_err(|e| store_status(e, def, &info.name))?;
    Ok(view(def, &o))
}
