//! Discovery and other non-resource paths: `/api`, `/apis`, the groups'
//! resource lists, `/version`, and minimal OpenAPI documents for kubectl.

use crate::sim::resources::{self, ResourceDef, RESOURCES};
use serde_json::{json, Value};

/// The Kubernetes version the simulator reports.
pub const MAJOR: &str = "1";
pub const MINOR: &str = "34";

pub fn version() -> Value {
    json!({"major": MAJOR, "minor": MINOR, "gitVersion": format!("v{MAJOR}.{MINOR}.0-tollgate-sim"),
           "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
           "buildDate": "2026-11-01T00:00:00Z", "goVersion": "go1.24.0", "compiler": "gc", "platform": "linux/amd64"})
}

/// The groups served besides the core group, with their versions.
const GROUPS: &[(&str, &str)] = &[
    ("coordination.k8s.io", "v1"),
    ("authentication.k8s.io", "v1"),
];

fn api_resource(r: &ResourceDef) -> Vec<Value> {
    let mut out = vec![
        json!({"name": r.name, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
        "verbs": resources::verbs(), "shortNames": r.short_names}),
    ];
    for sub in r.subresources {
        out.push(json!({"name": format!("{}/{sub}", r.name), "singularName": "", "namespaced": r.namespaced,
            "kind": r.kind, "verbs": ["get", "patch", "update"]}));
    }
    out
}

/// `APIResourceList` for a group version; `None` when not served.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let mut items: Vec<Value> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .flat_map(api_resource)
        .collect();
    if group == "authentication.k8s.io" && version == "v1" {
        items.push(json!({"name": "selfsubjectreviews", "singularName": "selfsubjectreview", "namespaced": false,
            "kind": "SelfSubjectReview", "verbs": ["create"]}));
    }
    if items.is_empty() {
        return None;
    }
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": items}),
    )
}

pub fn api_versions(server_address: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
           "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]})
}

fn group(name: &str, version: &str) -> Value {
    let gv = json!({"groupVersion": format!("{name}/{version}"), "version": version});
    json!({"name": name, "versions": [gv.clone()], "preferredVersion": gv})
}

pub fn group_list() -> Value {
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": GROUPS.iter().map(|(g, v)| group(g, v)).collect::<Vec<_>>()})
}

pub fn api_group(name: &str) -> Option<Value> {
    GROUPS.iter().find(|(g, _)| *g == name).map(|(g, v)| {
        let mut x = group(g, v);
        x["kind"] = "APIGroup".into();
        x["apiVersion"] = "v1".into();
        x
    })
}

/// `/openapi/v3`: where each group version's document is.
pub fn openapi_v3_root() -> Value {
    let mut paths = serde_json::Map::new();
    paths.insert(
        "api/v1".into(),
        json!({"serverRelativeURL": "/openapi/v3/api/v1?hash=sim"}),
    );
    for (g, v) in GROUPS {
        paths.insert(
            format!("apis/{g}/{v}"),
            json!({"serverRelativeURL": format!("/openapi/v3/apis/{g}/{v}?hash=sim")}),
        );
    }
    json!({"paths": paths})
}

/// A minimal OpenAPI v3 document for a group version: one schema per kind,
/// open to any fields, carrying the group-version-kind kubectl looks up.
pub fn openapi_v3(group: &str, version: &str) -> Option<Value> {
    let defs: Vec<&ResourceDef> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if defs.is_empty() {
        return None;
    }
    let mut schemas = serde_json::Map::new();
    let mut paths = serde_json::Map::new();
    let param = |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}});
    for r in defs {
        let prefix = if group.is_empty() {
            "io.k8s.api.core".to_string()
        } else {
            format!("io.k8s.api.{}", group.split('.').next().unwrap_or(group))
        };
        let schema_name = format!("{prefix}.{version}.{}", r.kind);
        let gvk = json!({"group": group, "version": version, "kind": r.kind});
        schemas.insert(
            schema_name.clone(),
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                   "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                  "metadata": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                   "x-kubernetes-group-version-kind": [gvk.clone()]}),
        );
        // What kubectl reads from the paths: which operations exist for a kind
        // and that writes take `fieldValidation` (so it validates server-side).
        let body = json!({"content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema_name}")}}}});
        let op = |action: &str, params: Vec<Value>| {
            json!({"x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk.clone(), "parameters": params,
                   "responses": {"200": body.clone()}})
        };
        let write_params = || {
            vec![
                param("dryRun"),
                param("fieldManager"),
                param("fieldValidation"),
            ]
        };
        let base = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let coll = if r.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", r.name)
        } else {
            format!("{base}/{}", r.name)
        };
        let mut post = op("post", write_params());
        post["requestBody"] = body.clone();
        paths.insert(coll.clone(), json!({"get": op("list", vec![param("labelSelector"), param("fieldSelector")]), "post": post}));
        let mut put = op("put", write_params());
        put["requestBody"] = body.clone();
        let mut patch = op("patch", write_params());
        patch["requestBody"] =
            json!({"content": {"application/merge-patch+json": {"schema": {"type": "object"}}}});
        paths.insert(format!("{coll}/{{name}}"), json!({"get": op("get", vec![]), "put": put, "patch": patch, "delete": op("delete", vec![param("dryRun")])}));
    }
    Some(
        json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": format!("v{MAJOR}.{MINOR}.0")},
                "paths": paths, "components": {"schemas": schemas}}),
    )
}
