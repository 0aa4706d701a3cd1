//! `POST pods/NAME/binding`: how a scheduler assigns a pod to a node, as kube-apiserver's
//! `BindingREST` does it: the pod's `spec.nodeName` is set once (a pod already assigned or
//! being deleted is a 409), the Binding's annotations are added, `PodScheduled` becomes
//! `True`, and the answer is a `Status` `Success` with code 201.

use super::write::{parse_object, read_for_update, store_status, UPDATE_RETRIES};
use super::Api;
use crate::sim::clock;
use crate::sim::resources::ResourceDef;
use crate::sim::storage::object::key;
use crate::sim::storage::store::{StoreError, Write};
use apimodel::{RequestInfo, Status};
use serde_json::{json, Value};

/// 409 naming `pods/binding`, as the registry words it.
fn conflict(name: &str, why: String) -> Status {
    Status::failure(
        409,
        "Conflict",
        format!("Operation cannot be fulfilled on pods/binding \"{name}\": {why}"),
    )
    .with_details("", "pods/binding", name)
}

/// The node a Binding body names; its annotations.
fn parse(info: &RequestInfo, body: &[u8]) -> Result<(String, Value), Status> {
    let b = Value::Object(parse_object(body)?);
    if let Some(n) = b["metadata"]["name"].as_str() {
        if n != info.name {
            return Err(Status::bad_request(
                "name in URL does not match name in Binding object",
            ));
        }
    }
    let node = b["target"]["name"].as_str().unwrap_or_default();
    if node.is_empty() {
        return Err(Status::invalid(
            "",
            "bindings",
            &info.name,
            format!(
                "Binding.core \"{}\" is invalid: target.name: Required value",
                info.name
            ),
        ));
    }
    Ok((node.to_string(), b["metadata"]["annotations"].clone()))
}

/// The pod as bound to `node`, or why it cannot be.
fn bound(mut pod: Value, name: &str, node: &str, annotations: &Value) -> Result<Value, Status> {
    if !pod["metadata"]["deletionTimestamp"].is_null() {
        return Err(conflict(
            name,
            format!("pod {name} is being deleted, cannot be assigned to a host"),
        ));
    }
    if let Some(on) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
        return Err(conflict(
            name,
            format!("pod {name} is already assigned to node \"{on}\""),
        ));
    }
    pod["spec"]["nodeName"] = node.into();
    if let Some(a) = annotations.as_object().filter(|a| !a.is_empty()) {
        let m = &mut pod["metadata"]["annotations"];
        if !m.is_object() {
            *m = json!({});
        }
        for (k, v) in a {
            m[k] = v.clone();
        }
    }
    let scheduled = json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null,
        "lastTransitionTime": clock::rfc3339(clock::now_unix())});
    if !pod["status"].is_object() {
        pod["status"] = json!({});
    }
    let conditions = &mut pod["status"]["conditions"];
    match conditions.as_array_mut() {
        Some(list) => match list.iter_mut().find(|c| c["type"] == "PodScheduled") {
            Some(c) => *c = scheduled,
            None => list.push(scheduled),
        },
        None => *conditions = json!([scheduled]),
    }
    if let Some(m) = pod["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    Ok(pod)
}

/// `POST pods/NAME/binding`: the `Status` to answer with.
pub async fn create(
    api: &Api,
    def: &'static ResourceDef,
    info: &RequestInfo,
    body: &[u8],
    dry_run: bool,
) -> Result<Status, Status> {
    let (node, annotations) = parse(info, body)?;
    let k = key(&info.namespace, &info.name);
    for attempt in 0..UPDATE_RETRIES {
        let cur = read_for_update(api, def, &k, &info.name, attempt).await?;
        let pod = bound(cur.value(), &info.name, &node, &annotations)?;
        if dry_run {
            break;
        }
        match api
            .storage
            .write(def, &k, Some(cur.rv), Write::Put(pod))
            .await
        {
            Ok(_) => break,
            Err(StoreError::Conflict) if attempt + 1 < UPDATE_RETRIES => continue,
            Err(e) => return Err(store_status(e, def, &info.name)),
        }
    }
    let mut ok = Status::success();
    ok.code = 201;
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_once_and_marks_the_pod_scheduled() {
        let pod = json!({"metadata": {"name": "p", "resourceVersion": "7"}, "spec": {"containers": []},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]}});
        let out = bound(pod, "p", "node-1", &json!({"a": "b"})).unwrap();
        assert_eq!(out["spec"]["nodeName"], "node-1");
        assert_eq!(out["metadata"]["annotations"]["a"], "b");
        assert!(out["metadata"].get("resourceVersion").is_none());
        let c = out["status"]["conditions"].as_array().unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0]["status"], "True");

        let again = bound(out, "p", "node-2", &Value::Null).unwrap_err();
        assert_eq!(again.code, 409);
        assert_eq!(
            again.message,
            "Operation cannot be fulfilled on pods/binding \"p\": pod p is already assigned to node \"node-1\""
        );
    }

    #[test]
    fn a_deleting_pod_is_not_bound() {
        let pod = json!({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {}});
        assert_eq!(bound(pod, "p", "n", &Value::Null).unwrap_err().code, 409);
    }
}
