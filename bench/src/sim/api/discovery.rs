//! Discovery and other non-resource paths: `/api`, `/apis`, the groups'
//! resource lists, `/version` (each the release's own, `--kube-version`), and minimal
//! OpenAPI documents for kubectl (generated from what is served: the real ones are
//! megabytes).

use crate::sim::kube_version::KubeVersion;
use crate::sim::resources::custom::Registry;
use crate::sim::resources::{self, builtin, ResourceDef};
use serde_json::{json, Value};

/// The release the simulator reports under `--kube-version 1.20`: the one it models there, so a
/// client that prices or behaves by `/version` (tollgate's `consistentStore: auto`) reads the
/// rules it meets (consistent LISTs from etcd).
pub const MAJOR: &str = "1";
pub const MINOR: &str = "20";

/// `/version`: on 1.37, 1.37.2's own (captured with its discovery documents); on 1.20, the
/// sim's.
pub fn version(kube: KubeVersion) -> Value {
    let captured = builtin::version_info(kube);
    if kube == KubeVersion::V1_37 && captured.is_object() {
        return captured.clone();
    }
    json!({"major": MAJOR, "minor": MINOR, "gitVersion": format!("v{MAJOR}.{MINOR}.2-tollgate-sim"),
           "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
           "buildDate": "2026-11-01T00:00:00Z", "goVersion": "go1.24.0", "compiler": "gc", "platform": "linux/amd64"})
}

/// `APIResourceList` for a group version: the release's as served (`resources::builtin`),
/// the simulator's own extra (`selfsubjectreviews`, which 1.20 did not list), and what CRDs
/// add; `None` when not served.
pub fn resource_list(
    kube: KubeVersion,
    custom: &Registry,
    group: &str,
    version: &str,
) -> Option<Value> {
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let mut list = builtin::resource_list(kube, &gv).cloned().unwrap_or_else(
        || json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": []}),
    );
    let mut items: Vec<Value> = Vec::new();
    if group == "authentication.k8s.io" && version == "v1" {
        items.push(json!({"name": "selfsubjectreviews", "singularName": "selfsubjectreview", "namespaced": false,
            "kind": "SelfSubjectReview", "verbs": ["create"]}));
    }
    for c in custom.served().iter().filter(|c| c.group == group) {
        items.extend(c.discovery(version));
    }
    let resources = list["resources"].as_array_mut()?;
    for item in items {
        if !resources.iter().any(|r| r["name"] == item["name"]) {
            resources.push(item);
        }
    }
    if resources.is_empty() {
        return None;
    }
    Some(list)
}

pub fn api_versions(server_address: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
           "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]})
}

/// `/apis`: the release's groups, then the CRDs' (one entry per group, its versions in the
/// order the CRDs list them).
pub fn group_list(kube: KubeVersion, custom: &Registry) -> Value {
    let mut list = builtin::group_list(kube).clone();
    let Some(groups) = list["groups"].as_array_mut() else {
        return list;
    };
    for c in custom.served() {
        let versions: Vec<Value> = c
            .versions
            .iter()
            .map(|v| json!({"groupVersion": format!("{}/{}", c.group, v.def.version), "version": v.def.version}))
            .collect();
        match groups.iter_mut().find(|g| g["name"] == c.group.as_str()) {
            Some(g) => {
                if let Some(vs) = g["versions"].as_array_mut() {
                    for v in versions {
                        if !vs.contains(&v) {
                            vs.push(v);
                        }
                    }
                }
            }
            None => {
                let preferred = json!({"groupVersion": format!("{}/{}", c.group, c.preferred), "version": c.preferred});
                groups.push(
                    json!({"name": c.group, "versions": versions, "preferredVersion": preferred}),
                );
            }
        }
    }
    list
}

pub fn api_group(kube: KubeVersion, custom: &Registry, name: &str) -> Option<Value> {
    let list = group_list(kube, custom);
    let mut g = list["groups"]
        .as_array()?
        .iter()
        .find(|g| g["name"] == name)?
        .clone();
    let m = g.as_object_mut()?;
    let mut out = serde_json::Map::new();
    out.insert("kind".into(), "APIGroup".into());
    out.insert("apiVersion".into(), "v1".into());
    out.append(m);
    Some(Value::Object(out))
}

/// Every group version served, for the OpenAPI root.
fn group_versions(kube: KubeVersion, custom: &Registry) -> Vec<(String, String)> {
    let list = group_list(kube, custom);
    let mut out = Vec::new();
    for g in list["groups"].as_array().into_iter().flatten() {
        for v in g["versions"].as_array().into_iter().flatten() {
            if let (Some(n), Some(v)) = (g["name"].as_str(), v["version"].as_str()) {
                out.push((n.to_string(), v.to_string()));
            }
        }
    }
    out
}

/// The resources served in a group version: built-ins, then custom ones.
fn defs_in(
    kube: KubeVersion,
    custom: &Registry,
    group: &str,
    version: &str,
) -> Vec<&'static ResourceDef> {
    let mut defs: Vec<&'static ResourceDef> = resources::builtins()
        .iter()
        .filter(|r| r.group == group && r.version == version && r.supports_verb("get"))
        .filter(|r| resources::lookup_in(kube, r.group, r.version, r.name).is_some())
        .collect();
    for c in custom.served() {
        defs.extend(
            c.versions
                .iter()
                .filter(|v| v.def.group == group && v.def.version == version)
                .map(|v| v.def),
        );
    }
    defs
}

/// `/openapi/v3`: where each group version's document is.
pub fn openapi_v3_root(kube: KubeVersion, custom: &Registry) -> Value {
    let mut paths = serde_json::Map::new();
    paths.insert(
        "api/v1".into(),
        json!({"serverRelativeURL": "/openapi/v3/api/v1?hash=sim"}),
    );
    for (g, v) in group_versions(kube, custom) {
        paths.insert(
            format!("apis/{g}/{v}"),
            json!({"serverRelativeURL": format!("/openapi/v3/apis/{g}/{v}?hash=sim")}),
        );
    }
    json!({"paths": paths})
}

/// A minimal OpenAPI v3 document for a group version: one schema per kind,
/// open to any fields, carrying the group-version-kind kubectl looks up.
pub fn openapi_v3(
    kube: KubeVersion,
    custom: &Registry,
    group: &str,
    version: &str,
) -> Option<Value> {
    let defs = defs_in(kube, custom, group, version);
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
