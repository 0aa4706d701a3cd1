//! `as=Table` responses, which `kubectl get` asks for: the columns the real
//! apiserver prints for each served resource, and one row per object.

mod workloads;

use crate::sim::resources::ResourceDef;
use crate::sim::storage::object::Obj;
use serde_json::{json, Value};

struct Col {
    name: &'static str,
    kind: &'static str,
    priority: u8,
}

const fn col(name: &'static str, kind: &'static str, priority: u8) -> Col {
    Col {
        name,
        kind,
        priority,
    }
}

const PODS_COLS: [Col; 9] = [
    col("Name", "string", 0),
    col("Ready", "string", 0),
    col("Status", "string", 0),
    col("Restarts", "string", 0),
    col("Age", "string", 0),
    col("IP", "string", 1),
    col("Node", "string", 1),
    col("Nominated Node", "string", 1),
    col("Readiness Gates", "string", 1),
];

const NODES_COLS: [Col; 10] = [
    col("Name", "string", 0),
    col("Status", "string", 0),
    col("Roles", "string", 0),
    col("Age", "string", 0),
    col("Version", "string", 0),
    col("Internal-IP", "string", 1),
    col("External-IP", "string", 1),
    col("OS-Image", "string", 1),
    col("Kernel-Version", "string", 1),
    col("Container-Runtime", "string", 1),
];

const NAMESPACES_COLS: [Col; 3] = [
    col("Name", "string", 0),
    col("Status", "string", 0),
    col("Age", "string", 0),
];

const CONFIGMAPS_COLS: [Col; 3] = [
    col("Name", "string", 0),
    col("Data", "integer", 0),
    col("Age", "string", 0),
];

const EVENTS_COLS: [Col; 5] = [
    col("Last Seen", "string", 0),
    col("Type", "string", 0),
    col("Reason", "string", 0),
    col("Object", "string", 0),
    col("Message", "string", 0),
];

const LEASES_COLS: [Col; 3] = [
    col("Name", "string", 0),
    col("Holder", "string", 0),
    col("Age", "string", 0),
];

const DEPLOYMENTS_COLS: [Col; 8] = [
    col("Name", "string", 0),
    col("Ready", "string", 0),
    col("Up-to-date", "string", 0),
    col("Available", "string", 0),
    col("Age", "string", 0),
    col("Containers", "string", 1),
    col("Images", "string", 1),
    col("Selector", "string", 1),
];

const SERVICES_COLS: [Col; 7] = [
    col("Name", "string", 0),
    col("Type", "string", 0),
    col("Cluster-IP", "string", 0),
    col("External-IP", "string", 0),
    col("Port(s)", "string", 0),
    col("Age", "string", 0),
    col("Selector", "string", 1),
];

const SERVICEACCOUNTS_COLS: [Col; 3] = [
    col("Name", "string", 0),
    col("Secrets", "string", 0),
    col("Age", "string", 0),
];

const JOBS_COLS: [Col; 7] = [
    col("Name", "string", 0),
    col("Completions", "string", 0),
    col("Duration", "string", 0),
    col("Age", "string", 0),
    col("Containers", "string", 1),
    col("Images", "string", 1),
    col("Selector", "string", 1),
];

const SECRETS_COLS: [Col; 4] = [
    col("Name", "string", 0),
    col("Type", "string", 0),
    col("Data", "string", 0),
    col("Age", "string", 0),
];

/// What 1.20's default table convertor prints for kinds without a printer (and RBAC's
/// Role and ClusterRole printers print the same).
const CREATED_AT_COLS: [Col; 2] = [col("Name", "string", 0), col("Created At", "date", 0)];

/// A custom resource without `additionalPrinterColumns`.
const CUSTOM_COLS: [Col; 2] = [col("Name", "string", 0), col("Age", "date", 0)];

fn cols(def: &ResourceDef) -> &'static [Col] {
    if def.index >= crate::sim::resources::builtins().len() {
        return &CUSTOM_COLS;
    }
    match (def.group, def.name) {
        ("", "pods") => &PODS_COLS,
        ("", "nodes") => &NODES_COLS,
        ("", "namespaces") => &NAMESPACES_COLS,
        ("", "configmaps") => &CONFIGMAPS_COLS,
        ("", "events") => &EVENTS_COLS,
        ("coordination.k8s.io", "leases") => &LEASES_COLS,
        ("apps", "deployments") => &DEPLOYMENTS_COLS,
        ("", "services") => &SERVICES_COLS,
        ("", "serviceaccounts") => &SERVICEACCOUNTS_COLS,
        ("batch", "jobs") => &JOBS_COLS,
        ("", "secrets") => &SECRETS_COLS,
        _ => &CREATED_AT_COLS,
    }
}

/// The `columnDefinitions` of a resource's table.
pub fn columns(def: &ResourceDef) -> Value {
    Value::Array(
        cols(def)
            .iter()
            .map(|c| {
                json!({"name": c.name, "type": c.kind, "format": if c.name == "Name" { "name" } else { "" },
                       "description": c.name, "priority": c.priority})
            })
            .collect(),
    )
}

/// A whole table for one object (GET, and each watch event).
pub fn single(def: &ResourceDef, o: &Obj, rv: u64, version: &str, now: i64) -> Value {
    json!({"kind": "Table", "apiVersion": format!("meta.k8s.io/{version}"),
           "metadata": {"resourceVersion": rv.to_string()},
           "columnDefinitions": columns(def), "rows": [row(def, o, now)]})
}

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_str().unwrap_or("")
}

fn or_none(x: &str) -> String {
    if x.is_empty() {
        "<none>".into()
    } else {
        x.to_string()
    }
}

/// One row: the cells and the object's metadata (`includeObject=Metadata`, the default).
pub fn row(def: &ResourceDef, o: &Obj, now: i64) -> Value {
    let v = o.value();
    let age = age(s(&v, &["metadata", "creationTimestamp"]), now);
    let name = Value::String(o.name.clone());
    let created = s(&v, &["metadata", "creationTimestamp"]).to_string();
    let cols = cols(def);
    let cells: Vec<Value> = if std::ptr::eq(cols, &CREATED_AT_COLS[..]) {
        vec![name, created.into()]
    } else if std::ptr::eq(cols, &CUSTOM_COLS[..]) {
        vec![name, age.into()]
    } else {
        match def.name {
            "pods" => pod_cells(o, &v, name, age),
            "nodes" => node_cells(o, &v, name, age),
            "namespaces" => vec![name, s(&v, &["status", "phase"]).into(), age.into()],
            "configmaps" => {
                let n = v["data"].as_object().map_or(0, |m| m.len())
                    + v["binaryData"].as_object().map_or(0, |m| m.len());
                vec![name, n.into(), age.into()]
            }
            "events" => event_cells(&v, now),
            "leases" => vec![
                name,
                or_none(s(&v, &["spec", "holderIdentity"])).into(),
                age.into(),
            ],
            "deployments" => workloads::deployment(&v, name, age),
            "services" => workloads::service(&v, name, age),
            "serviceaccounts" => {
                let n = v["secrets"].as_array().map_or(0, Vec::len);
                vec![name, n.into(), age.into()]
            }
            "jobs" => workloads::job(&v, name, age, now),
            "secrets" => {
                let n = v["data"].as_object().map_or(0, |m| m.len());
                vec![name, s(&v, &["type"]).into(), n.into(), age.into()]
            }
            _ => vec![name, age.into()],
        }
    };
    let mut meta = v["metadata"].clone();
    if let Some(m) = meta.as_object_mut() {
        m.remove("managedFields");
    }
    json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}})
}

/// `kubectl get pods`: NAME READY STATUS RESTARTS AGE IP NODE NOMINATED-NODE READINESS-GATES.
fn pod_cells(o: &Obj, v: &Value, name: Value, age: String) -> Vec<Value> {
    let statuses = v["status"]["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let total = v["spec"]["containers"].as_array().map_or(0, Vec::len);
    let ready = statuses
        .iter()
        .filter(|c| c["ready"].as_bool() == Some(true))
        .count();
    let restarts: i64 = statuses
        .iter()
        .filter_map(|c| c["restartCount"].as_i64())
        .sum();
    let phase = if o.deleting {
        "Terminating"
    } else {
        s(v, &["status", "phase"])
    };
    vec![
        name,
        format!("{ready}/{total}").into(),
        phase.into(),
        restarts.to_string().into(),
        age.into(),
        or_none(s(v, &["status", "podIP"])).into(),
        or_none(s(v, &["spec", "nodeName"])).into(),
        "<none>".into(),
        "<none>".into(),
    ]
}

/// `kubectl get nodes`: NAME STATUS ROLES AGE VERSION INTERNAL-IP EXTERNAL-IP OS-IMAGE
/// KERNEL-VERSION CONTAINER-RUNTIME.
fn node_cells(o: &Obj, v: &Value, name: Value, age: String) -> Vec<Value> {
    let ready = v["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .map(|c| {
            if c["status"] == "True" {
                "Ready"
            } else {
                "NotReady"
            }
        })
        .unwrap_or("Unknown");
    let status = if v["spec"]["unschedulable"].as_bool() == Some(true) {
        format!("{ready},SchedulingDisabled")
    } else {
        ready.to_string()
    };
    let roles: Vec<&str> = o
        .labels
        .keys()
        .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
        .collect();
    let addr = |t: &str| {
        v["status"]["addresses"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["type"] == t))
            .and_then(|x| x["address"].as_str())
            .unwrap_or("<none>")
            .to_string()
    };
    vec![
        name,
        status.into(),
        or_none(&roles.join(",")).into(),
        age.into(),
        s(v, &["status", "nodeInfo", "kubeletVersion"]).into(),
        addr("InternalIP").into(),
        addr("ExternalIP").into(),
        s(v, &["status", "nodeInfo", "osImage"]).into(),
        s(v, &["status", "nodeInfo", "kernelVersion"]).into(),
        s(v, &["status", "nodeInfo", "containerRuntimeVersion"]).into(),
    ]
}

/// `kubectl get events`: LAST SEEN TYPE REASON OBJECT MESSAGE.
fn event_cells(v: &Value, now: i64) -> Vec<Value> {
    let last = [
        s(v, &["lastTimestamp"]),
        s(v, &["eventTime"]),
        s(v, &["metadata", "creationTimestamp"]),
    ]
    .into_iter()
    .find(|t| !t.is_empty())
    .unwrap_or("");
    let object = format!(
        "{}/{}",
        s(v, &["involvedObject", "kind"]).to_lowercase(),
        s(v, &["involvedObject", "name"])
    );
    vec![
        crate::sim::clock::human_age(last, now).into(),
        s(v, &["type"]).into(),
        s(v, &["reason"]).into(),
        object.into(),
        s(v, &["message"]).into(),
    ]
}

fn age(created: &str, now: i64) -> String {
    crate::sim::clock::human_age(created, now)
}
