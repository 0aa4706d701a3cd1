//! The built-in resources of Kubernetes 1.20 and of the current release, from their discovery
//! documents.
//!
//! `../api/discovery-1.20.json` is what a real kube-apiserver v1.20.2 serves at `/version`,
//! `/api`, `/apis` and each group version, `../api/discovery-current.json` what v1.37.2
//! serves, written by
//!
//! ```sh
//! bash scripts/sim-discovery.sh            # 1.20.2
//! bash scripts/sim-discovery.sh current    # 1.37.2 (scripts/kube-current.sh's build)
//! ```
//!
//! (each starts the real kube-apiserver and dumps them). Every non-subresource entry becomes
//! a [`ResourceDef`]: 1.20's first (their slots do not move), then the current release's
//! group versions 1.20 did not have; each release serves and lists only its own
//! ([`KubeVersion`]). A resource in both keeps 1.20's verbs. What discovery does not say
//! (selectable fields, whether the kind tracks `metadata.generation`, which subresources the
//! simulator implements) is added here from the 1.20 sources' registries.

use super::ResourceDef;
use crate::sim::kube_version::KubeVersion;
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::OnceLock;

/// The discovery documents, as served by kube-apiserver 1.20.2.
pub const DISCOVERY_JSON: &str = include_str!("../api/discovery-1.20.json");
/// The discovery documents, as served by kube-apiserver 1.37.2.
pub const DISCOVERY_CURRENT_JSON: &str = include_str!("../api/discovery-current.json");

/// A release's documents, by [`KubeVersion`].
fn document(v: KubeVersion) -> (&'static str, &'static str) {
    match v {
        KubeVersion::V1_20 => ("api/discovery-1.20.json", DISCOVERY_JSON),
        KubeVersion::V1_37 => ("api/discovery-current.json", DISCOVERY_CURRENT_JSON),
    }
}

const RELEASES: [KubeVersion; 2] = [KubeVersion::V1_20, KubeVersion::V1_37];

#[derive(Deserialize)]
struct File<'a> {
    #[serde(borrow)]
    resources: Vec<List<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct List<'a> {
    group_version: &'a str,
    #[serde(borrow)]
    resources: Vec<Entry<'a>>,
}

#[derive(Deserialize)]
struct Entry<'a> {
    name: &'a str,
    namespaced: bool,
    kind: &'a str,
    #[serde(borrow)]
    verbs: Vec<&'a str>,
}

/// Field selectors each kind's registry accepts in 1.20, besides metadata.name/namespace.
const FIELDS: &[(&str, &str, &[&str])] = &[
    ("", "namespaces", &["status.phase"]),
    ("", "nodes", &["spec.unschedulable"]),
    (
        "",
        "pods",
        &[
            "spec.nodeName",
            "status.phase",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.podIP",
        ],
    ),
    (
        "",
        "events",
        &[
            "involvedObject.kind",
            "involvedObject.name",
            "involvedObject.namespace",
            "involvedObject.uid",
            "reason",
            "type",
            "source",
        ],
    ),
    ("", "secrets", &["type"]),
    ("", "replicationcontrollers", &["status.replicas"]),
    ("apps", "replicasets", &["status.replicas"]),
    ("batch", "jobs", &["status.successful"]),
    (
        "certificates.k8s.io",
        "certificatesigningrequests",
        &["spec.signerName"],
    ),
];

/// Kinds whose 1.20 registry sets `metadata.generation` on create and bumps it when the
/// spec changes (the others drop a client-sent one).
const TRACK_GENERATION: &[(&str, &str)] = &[
    ("", "replicationcontrollers"),
    ("apps", "deployments"),
    ("apps", "replicasets"),
    ("apps", "statefulsets"),
    ("apps", "daemonsets"),
    ("batch", "cronjobs"),
    ("networking.k8s.io", "networkpolicies"),
    ("networking.k8s.io", "ingresses"),
    ("networking.k8s.io", "ingressclasses"),
    ("extensions", "ingresses"),
    ("policy", "poddisruptionbudgets"),
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    (
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
    ),
    (
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
    ),
    ("flowcontrol.apiserver.k8s.io", "flowschemas"),
    (
        "flowcontrol.apiserver.k8s.io",
        "prioritylevelconfigurations",
    ),
];

/// What discovery lists for a resource with every verb.
pub const FULL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// Subresources the simulator implements (discovery lists others: proxy, exec, log, …).
const SERVED_SUBRESOURCES: &[&str] = &["status", "scale", "binding"];

/// One release's documents, as JSON values.
struct Documents {
    /// `/version` (absent from a file written before it was captured).
    version: Value,
    /// Each group version's resource list.
    lists: HashMap<String, Value>,
    /// `/apis`.
    apis: Value,
}

struct Builtins {
    defs: Vec<ResourceDef>,
    by_gvr: HashMap<(&'static str, &'static str, &'static str), usize>,
    by_name: HashMap<&'static str, usize>,
    by_dir: HashMap<&'static str, usize>,
    /// By release (the index of [`RELEASES`]).
    documents: [Documents; 2],
}

fn slot(v: KubeVersion) -> usize {
    match v {
        KubeVersion::V1_20 => 0,
        KubeVersion::V1_37 => 1,
    }
}

fn split_gv(gv: &str) -> (&str, &str) {
    gv.split_once('/').unwrap_or(("", gv))
}

fn load() -> Builtins {
    let mut defs: Vec<ResourceDef> = Vec::new();
    let mut documents = Vec::new();
    for v in RELEASES {
        let (name, json) = document(v);
        // The files are part of the source: a broken one fails every test at once.
        let file: File<'static> = match serde_json::from_str(json) {
            Ok(f) => f,
            Err(e) => panic!("{name} does not parse: {e}"),
        };
        for list in &file.resources {
            let (group, version) = split_gv(list.group_version);
            for e in list.resources.iter().filter(|e| !e.name.contains('/')) {
                if defs
                    .iter()
                    .any(|d| (d.group, d.version, d.name) == (group, version, e.name))
                {
                    continue;
                }
                defs.push(define(list, e, &defs));
            }
        }
        let raw: Value = serde_json::from_str(json).unwrap_or(Value::Null);
        let mut lists = HashMap::new();
        for l in raw["resources"].as_array().into_iter().flatten() {
            if let Some(gv) = l["groupVersion"].as_str() {
                lists.insert(gv.to_string(), l.clone());
            }
        }
        documents.push(Documents {
            version: raw["version"].clone(),
            lists,
            apis: raw["apis"].clone(),
        });
    }
    let mut by_gvr = HashMap::new();
    let mut by_name = HashMap::new();
    let mut by_dir = HashMap::new();
    for d in &defs {
        by_gvr.insert((d.group, d.version, d.name), d.index);
        by_name.entry(d.name).or_insert(d.index);
        by_dir.insert(d.etcd_dir, d.index);
    }
    let [old, current]: [Documents; 2] = match documents.try_into() {
        Ok(d) => d,
        Err(_) => unreachable!("one set of documents per release"),
    };
    Builtins {
        defs,
        by_gvr,
        by_name,
        by_dir,
        documents: [old, current],
    }
}

/// The resource a discovery entry names, in the next slot.
fn define(list: &List<'static>, e: &Entry<'static>, defs: &[ResourceDef]) -> ResourceDef {
    let (group, version) = split_gv(list.group_version);
    let subresources = SERVED_SUBRESOURCES
        .iter()
        .copied()
        .filter(|s| {
            let full = format!("{}/{s}", e.name);
            list.resources.iter().any(|x| x.name == full)
        })
        .collect();
    let fields = FIELDS
        .iter()
        .find(|(g, n, _)| *g == group && *n == e.name)
        .map(|(_, _, f)| f.to_vec())
        .unwrap_or_default();
    // kube-apiserver's directory for the first (core or preferred) version; the
    // simulator keeps other versions apart (see tests/CONFORMANCE.md), under their own.
    let etcd_dir = match e.name {
        "nodes" => "minions",
        n if defs.iter().all(|d| d.name != n) => n,
        n => super::custom::leak_str(&format!("{n}.{version}.{group}")),
    };
    ResourceDef {
        name: e.name,
        kind: e.kind,
        group,
        version,
        namespaced: e.namespaced,
        verbs: e.verbs.clone(),
        subresources,
        fields,
        generation: TRACK_GENERATION.contains(&(group, e.name)),
        index: defs.len(),
        etcd_dir,
    }
}

fn get() -> &'static Builtins {
    static B: OnceLock<Builtins> = OnceLock::new();
    B.get_or_init(load)
}

pub(super) fn all() -> &'static [ResourceDef] {
    &get().defs
}

/// The built-in resource at `group`/`version`/`name`, whichever release serves it.
pub(super) fn lookup(group: &str, version: &str, name: &str) -> Option<&'static ResourceDef> {
    let b = get();
    b.by_gvr.get(&(group, version, name)).map(|i| &b.defs[*i])
}

/// The built-in resource at `group`/`version`/`name` if release `v` serves it.
pub(super) fn lookup_in(
    v: KubeVersion,
    group: &str,
    version: &str,
    name: &str,
) -> Option<&'static ResourceDef> {
    let d = lookup(group, version, name)?;
    let list = resource_list(v, &d.api_version())?;
    list["resources"]
        .as_array()?
        .iter()
        .any(|e| e["name"] == name)
        .then_some(d)
}

pub(super) fn by_name(name: &str) -> Option<&'static ResourceDef> {
    let b = get();
    b.by_name.get(name).map(|i| &b.defs[*i])
}

/// The built-in resource kept under `/registry/<dir>/`.
pub fn by_etcd_dir(dir: &str) -> Option<&'static ResourceDef> {
    let b = get();
    b.by_dir.get(dir).map(|i| &b.defs[*i])
}

pub(super) fn serves_group_version(v: KubeVersion, group: &str, version: &str) -> bool {
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    get().documents[slot(v)].lists.contains_key(&gv)
}

/// Release `v`'s `APIResourceList` for a group version (`v1`, `apps/v1`), as served.
pub fn resource_list(v: KubeVersion, group_version: &str) -> Option<&'static Value> {
    get().documents[slot(v)].lists.get(group_version)
}

/// Release `v`'s `APIGroupList`, as served at `/apis`.
pub fn group_list(v: KubeVersion) -> &'static Value {
    &get().documents[slot(v)].apis
}

/// Release `v`'s `/version`, as served (`null` if its file has none).
pub fn version_info(v: KubeVersion) -> &'static Value {
    &get().documents[slot(v)].version
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_1_20_resource_is_defined_with_what_discovery_says() {
        let d = lookup("apps", "v1", "deployments").expect("deployments");
        assert_eq!(d.kind, "Deployment");
        assert!(d.namespaced);
        assert_eq!(d.subresources, vec!["status", "scale"]);
        assert!(d.generation);
        let svc = lookup("", "v1", "services").expect("services");
        assert!(!svc.supports_verb("deletecollection"));
        assert_eq!(svc.subresources, vec!["status"]);
        assert!(!lookup("", "v1", "namespaces").is_some_and(|n| n.namespaced));
        assert_eq!(by_name("events").map(|e| e.group), Some(""));
        assert!(lookup("batch", "v1", "jobs").is_some_and(|j| !j.generation));
        assert!(lookup("rbac.authorization.k8s.io", "v1", "roles").is_some());
        // Every slot is its index, and (group, version, plural) names one resource.
        for (i, d) in all().iter().enumerate() {
            assert_eq!(d.index, i);
            assert_eq!(lookup(d.group, d.version, d.name).map(|x| x.index), Some(i));
        }
        assert!(all().len() > 80, "{} resources", all().len());
    }

    #[test]
    fn each_release_serves_its_own_resources() {
        use KubeVersion::*;
        // In both, and 1.20's slot first.
        let jobs = lookup("batch", "v1", "jobs").expect("jobs");
        assert!(lookup_in(V1_20, "batch", "v1", "jobs").is_some());
        assert_eq!(lookup_in(V1_37, "batch", "v1", "jobs"), Some(jobs));
        // Removed in 1.25: served by 1.20 only.
        assert!(lookup_in(V1_20, "policy", "v1beta1", "podsecuritypolicies").is_some());
        assert!(lookup_in(V1_37, "policy", "v1beta1", "podsecuritypolicies").is_none());
        assert!(!serves_group_version(V1_37, "policy", "v1beta1"));
        // Added since (batch/v1 cronjobs in 1.21, discovery.k8s.io/v1 in 1.21): current only.
        assert!(lookup_in(V1_20, "batch", "v1", "cronjobs").is_none());
        assert!(lookup_in(V1_37, "batch", "v1", "cronjobs").is_some());
        assert!(lookup_in(V1_37, "discovery.k8s.io", "v1", "endpointslices").is_some());
        assert!(serves_group_version(V1_37, "discovery.k8s.io", "v1"));
        assert!(!serves_group_version(V1_20, "discovery.k8s.io", "v1"));
        // The documents are the releases' own.
        assert_eq!(version_info(V1_37)["gitVersion"], "v1.37.2");
        let groups = |v| {
            group_list(v)["groups"]
                .as_array()
                .map(|g| g.len())
                .unwrap_or(0)
        };
        assert!(groups(V1_20) > 10 && groups(V1_37) > 10);
        assert_ne!(group_list(V1_20), group_list(V1_37));
    }
}
