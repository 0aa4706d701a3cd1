//! The operations loadgen issues and the HTTP requests they become:
//! LIST, GET, PATCH (node status heartbeat or pod labels), create and delete.
//!
//! Writes carry the annotation [`WRITTEN_AT`] (loadgen's wall clock, Unix
//! nanoseconds) so watchers can measure event delivery latency.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::Method;

use crate::rate::Rate;

/// Annotation with the Unix-nanosecond time loadgen wrote the object.
pub const WRITTEN_AT: &str = "loadgen.tollgate.dev/written-at";
/// Label on every object loadgen creates.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "loadgen");

/// A Kubernetes resource: `pods`, `nodes`, or `group/version/plural`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub namespaced: bool,
}

const CLUSTER_SCOPED: &[&str] = &[
    "nodes",
    "namespaces",
    "persistentvolumes",
    "clusterroles",
    "clusterrolebindings",
    "customresourcedefinitions",
    "storageclasses",
    "priorityclasses",
    "prioritylevelconfigurations",
    "flowschemas",
    "deviceclasses",
    "resourceslices",
    "volumeattachments",
    "csidrivers",
    "csinodes",
    "ingressclasses",
    "runtimeclasses",
];

impl std::str::FromStr for Resource {
    type Err = String;

    /// `pods`, `v1/pods`, `apps/v1/deployments`.
    fn from_str(s: &str) -> Result<Resource, String> {
        let parts: Vec<&str> = s.split('/').collect();
        let (group, version, plural) = match parts.as_slice() {
            [p] => ("", "v1", *p),
            [v, p] => ("", *v, *p),
            [g, v, p] => (*g, *v, *p),
            _ => {
                return Err(format!(
                "invalid resource `{s}`: expected PLURAL, VERSION/PLURAL or GROUP/VERSION/PLURAL"
            ))
            }
        };
        let ok = |x: &str| {
            !x.is_empty()
                && x.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        };
        if !ok(version) || !ok(plural) || !(group.is_empty() || ok(group)) {
            return Err(format!(
                "invalid resource `{s}`: names may hold only letters, digits, `.` and `-`"
            ));
        }
        Ok(Resource {
            group: group.to_string(),
            version: version.to_string(),
            namespaced: !CLUSTER_SCOPED.contains(&plural),
            plural: plural.to_string(),
        })
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.plural)
    }
}

impl Resource {
    /// `/api/v1/namespaces/ns/pods` or `/apis/g/v/plural`; `ns` is ignored for
    /// cluster-scoped resources, `None` lists across all namespaces.
    pub fn collection_path(&self, ns: Option<&str>) -> String {
        let mut path = String::with_capacity(64);
        self.push_collection_path(&mut path, ns);
        path
    }

    // Built with push_str into one buffer: a GET's path is planned for every
    // request, where nested format! calls cost more than the request's own
    // work (figures in bench/RESULTS.md, "loadgen's driver").
    fn push_collection_path(&self, path: &mut String, ns: Option<&str>) {
        if self.group.is_empty() {
            path.push_str("/api/");
        } else {
            path.push_str("/apis/");
            path.push_str(&self.group);
            path.push('/');
        }
        path.push_str(&self.version);
        if let Some(ns) = ns.filter(|_| self.namespaced) {
            path.push_str("/namespaces/");
            path.push_str(ns);
        }
        path.push('/');
        path.push_str(&self.plural);
    }

    /// The path of one named object.
    pub fn object_path(&self, ns: &str, name: &str) -> String {
        let mut path = String::with_capacity(64 + name.len());
        self.push_collection_path(&mut path, Some(ns));
        path.push('/');
        path.push_str(name);
        path
    }

    /// The path of the `k`-th object loadgen seeds (see [`Resource::object_name`]).
    pub fn seeded_object_path(&self, ns: &str, prefix: &str, k: u64) -> String {
        let mut path = String::with_capacity(96);
        self.push_collection_path(&mut path, Some(ns));
        path.push('/');
        self.push_object_name(&mut path, prefix, k);
        path
    }

    /// Name of the `k`-th object loadgen seeds for this resource: `{prefix}pod-7`.
    pub fn object_name(&self, prefix: &str, k: u64) -> String {
        let mut name = String::with_capacity(prefix.len() + self.plural.len() + 20);
        self.push_object_name(&mut name, prefix, k);
        name
    }

    fn push_object_name(&self, out: &mut String, prefix: &str, k: u64) {
        use std::fmt::Write as _;
        let singular = self.plural.strip_suffix('s').unwrap_or(&self.plural);
        out.push_str(prefix);
        out.push_str(singular);
        out.push('-');
        let _ = write!(out, "{k}");
    }
}

/// Which store a LIST asks for (see apimodel's consistency classes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ListRv {
    /// `resourceVersion` unset: the latest state (quorum read before 1.31).
    #[default]
    Consistent,
    /// `resourceVersion=0`: any recent state, from the watch cache.
    Cache,
    /// `resourceVersionMatch=Exact` at the last revision seen.
    Exact,
}

/// What a `--patches` request changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PatchTarget {
    /// `nodes/NAME/status`: the kubelet's Ready-condition heartbeat.
    #[default]
    NodeStatus,
    /// `pods/NAME`: a label and the written-at annotation.
    PodLabels,
}

/// The patch content type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PatchType {
    /// `application/strategic-merge-patch+json` (what the kubelet sends).
    #[default]
    Strategic,
    /// `application/merge-patch+json`.
    Merge,
}

/// The verb of an operation.
#[derive(Debug, Clone, PartialEq)]
pub enum OpKind {
    List {
        label_selector: Option<String>,
        field_selector: Option<String>,
        rv: ListRv,
        limit: Option<u32>,
        all_namespaces: bool,
    },
    Get,
    Patch {
        target: PatchTarget,
        patch_type: PatchType,
    },
    Create,
    Delete,
}

/// One operation of the run, with its own rate.
#[derive(Debug, Clone)]
pub struct OpSpec {
    /// Short name used in tables and file names: `list`, `get`, `patch`, …
    pub name: String,
    pub kind: OpKind,
    pub rate: Rate,
    pub resource: Resource,
    pub namespace: String,
    /// GET/PATCH address `{prefix}{kind}-{i % objects}`.
    pub object_prefix: String,
    pub objects: u64,
    /// Identifies this run's created objects (label `loadgen.tollgate.dev/run`).
    pub run_id: String,
}

/// A request ready to send.
#[derive(Debug, Clone)]
pub struct Planned {
    pub method: Method,
    pub path: String,
    pub body: Option<(&'static str, Bytes)>,
}

/// Pods this run created and may delete, oldest first.
#[derive(Debug, Default)]
pub struct CreatedPods(Mutex<VecDeque<String>>);

impl CreatedPods {
    /// Remembers a created pod.
    pub fn push(&self, name: String) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(name);
    }
    /// Takes the oldest created pod, if any.
    pub fn pop(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).pop_front()
    }
}

/// Unix nanoseconds by loadgen's wall clock.
pub fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

impl OpSpec {
    /// The name of the pod the `seq`-th create of this run makes.
    pub fn created_name(&self, seq: u64) -> String {
        format!("{}{}-{seq}", self.object_prefix, self.run_id)
    }

    /// The `i`-th request of this operation. `exact_rv` is the last list
    /// revision seen (for `--list-rv exact`); `delete_name` the pod to delete.
    pub fn plan(
        &self,
        i: u64,
        exact_rv: Option<&str>,
        delete_name: Option<&str>,
    ) -> Option<Planned> {
        let ns = self.namespace.as_str();
        let k = i % self.objects.max(1);
        let planned = match &self.kind {
            OpKind::List {
                label_selector,
                field_selector,
                rv,
                limit,
                all_namespaces,
            } => {
                let scope = (!*all_namespaces).then_some(ns);
                let query = list_query(
                    label_selector.as_deref(),
                    field_selector.as_deref(),
                    rv,
                    exact_rv,
                    *limit,
                );
                Planned {
                    method: Method::GET,
                    path: with_query(self.resource.collection_path(scope), &query),
                    body: None,
                }
            }
            OpKind::Get => Planned {
                method: Method::GET,
                path: self.resource.seeded_object_path(ns, &self.object_prefix, k),
                body: None,
            },
            OpKind::Patch { target, patch_type } => self.plan_patch(i, k, target, patch_type),
            OpKind::Create => {
                let name = self.created_name(i);
                Planned {
                    method: Method::POST,
                    path: self.resource.collection_path(Some(ns)),
                    body: Some((
                        "application/json",
                        Bytes::from(pod_json(&name, ns, &self.run_id)),
                    )),
                }
            }
            OpKind::Delete => Planned {
                method: Method::DELETE,
                path: self.resource.object_path(ns, delete_name?),
                body: None,
            },
        };
        Some(planned)
    }

    /// A PATCH of the `k`-th object: a node's Ready heartbeat or a pod's labels.
    fn plan_patch(&self, i: u64, k: u64, target: &PatchTarget, patch_type: &PatchType) -> Planned {
        let ns = self.namespace.as_str();
        let content_type = match patch_type {
            PatchType::Strategic => "application/strategic-merge-patch+json",
            PatchType::Merge => "application/merge-patch+json",
        };
        let now = unix_nanos();
        let (path, body) = match target {
            PatchTarget::NodeStatus => {
                let nodes: Resource = Resource {
                    group: String::new(),
                    version: "v1".into(),
                    plural: "nodes".into(),
                    namespaced: false,
                };
                let name = nodes.object_name(&self.object_prefix, k);
                let heartbeat = rfc3339(now);
                let body = serde_json::json!({
                    "metadata": {"annotations": {WRITTEN_AT: now.to_string()}},
                    "status": {"conditions": [{
                        "type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": heartbeat,
                    }]}
                });
                (format!("{}/status", nodes.object_path(ns, &name)), body)
            }
            PatchTarget::PodLabels => {
                let name = self.resource.object_name(&self.object_prefix, k);
                let body = serde_json::json!({
                    "metadata": {
                        "labels": {"loadgen.tollgate.dev/tick": (i % 1000).to_string()},
                        "annotations": {WRITTEN_AT: now.to_string()},
                    }
                });
                (self.resource.object_path(ns, &name), body)
            }
        };
        Planned {
            method: Method::PATCH,
            path,
            body: Some((content_type, Bytes::from(body.to_string()))),
        }
    }
}

/// A LIST's query: selectors, the revision its consistency class asks for, the page size.
fn list_query(
    label_selector: Option<&str>,
    field_selector: Option<&str>,
    rv: &ListRv,
    exact_rv: Option<&str>,
    limit: Option<u32>,
) -> Vec<String> {
    let mut query = Vec::new();
    if let Some(s) = label_selector {
        query.push(format!("labelSelector={}", encode(s)));
    }
    if let Some(s) = field_selector {
        query.push(format!("fieldSelector={}", encode(s)));
    }
    match (rv, exact_rv) {
        (ListRv::Consistent, _) => {}
        (ListRv::Cache, _) => query.push("resourceVersion=0".into()),
        (ListRv::Exact, Some(v)) => {
            query.push(format!("resourceVersion={}", encode(v)));
            query.push("resourceVersionMatch=Exact".into());
        }
        // No revision seen yet: a consistent list learns one.
        (ListRv::Exact, None) => {}
    }
    if let Some(l) = limit {
        query.push(format!("limit={l}"));
    }
    query
}

/// A minimal pod loadgen creates: labelled as loadgen's, stamped with [`WRITTEN_AT`].
pub fn pod_json(name: &str, ns: &str, run_id: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {MANAGED_BY.0: MANAGED_BY.1, "loadgen.tollgate.dev/run": run_id},
            "annotations": {WRITTEN_AT: unix_nanos().to_string()},
        },
        "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]}
    })
    .to_string()
}

fn with_query(path: String, query: &[String]) -> String {
    if query.is_empty() {
        path
    } else {
        format!("{path}?{}", query.join("&"))
    }
}

/// Percent-encodes a query value (RFC 3986 unreserved characters kept).
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// RFC 3339 UTC time with second precision, from Unix nanoseconds.
pub fn rfc3339(unix_nanos: u128) -> String {
    let secs = u64::try_from(unix_nanos / 1_000_000_000).unwrap_or(0);
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: OpKind) -> OpSpec {
        OpSpec {
            name: "op".into(),
            kind,
            rate: "1/s".parse().expect("rate"),
            resource: "pods".parse().expect("resource"),
            namespace: "ns1".into(),
            object_prefix: "loadgen-".into(),
            objects: 10,
            run_id: "r1".into(),
        }
    }

    #[test]
    fn resources_and_paths() {
        let pods: Resource = "pods".parse().expect("pods");
        assert_eq!(pods.collection_path(Some("a")), "/api/v1/namespaces/a/pods");
        assert_eq!(pods.collection_path(None), "/api/v1/pods");
        let nodes: Resource = "nodes".parse().expect("nodes");
        assert_eq!(nodes.object_path("a", "n1"), "/api/v1/nodes/n1");
        let deploy: Resource = "apps/v1/deployments".parse().expect("deploy");
        assert_eq!(
            deploy.collection_path(Some("x")),
            "/apis/apps/v1/namespaces/x/deployments"
        );
        assert_eq!(
            deploy.seeded_object_path("x", "lg-", 7),
            "/apis/apps/v1/namespaces/x/deployments/lg-deployment-7"
        );
        assert_eq!(pods.object_name("lg-", 12), "lg-pod-12");
        assert_eq!(
            pods.seeded_object_path("a", "lg-", 12),
            pods.object_path("a", &pods.object_name("lg-", 12))
        );
        assert!("a/b/c/d".parse::<Resource>().is_err());
        assert!("po ds".parse::<Resource>().is_err());
    }

    #[test]
    fn list_queries() {
        let kind = OpKind::List {
            label_selector: Some("app=web,tier!=db".into()),
            field_selector: Some("spec.nodeName=n1".into()),
            rv: ListRv::Exact,
            limit: Some(500),
            all_namespaces: true,
        };
        let p = spec(kind.clone()).plan(0, Some("42"), None).expect("plan");
        assert_eq!(
            p.path,
            "/api/v1/pods?labelSelector=app%3Dweb%2Ctier%21%3Ddb&fieldSelector=spec.nodeName%3Dn1&resourceVersion=42&resourceVersionMatch=Exact&limit=500"
        );
        let cache = OpKind::List {
            label_selector: None,
            field_selector: None,
            rv: ListRv::Cache,
            limit: None,
            all_namespaces: false,
        };
        let p = spec(cache).plan(0, None, None).expect("plan");
        assert_eq!(p.path, "/api/v1/namespaces/ns1/pods?resourceVersion=0");
    }

    #[test]
    fn writes_and_names() {
        let p = spec(OpKind::Get).plan(13, None, None).expect("plan");
        assert_eq!(p.path, "/api/v1/namespaces/ns1/pods/loadgen-pod-3");
        let patch = OpKind::Patch {
            target: PatchTarget::NodeStatus,
            patch_type: PatchType::Strategic,
        };
        let p = spec(patch).plan(4, None, None).expect("plan");
        assert_eq!(p.path, "/api/v1/nodes/loadgen-node-4/status");
        let (ct, body) = p.body.expect("body");
        assert_eq!(ct, "application/strategic-merge-patch+json");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert!(v["metadata"]["annotations"][WRITTEN_AT].is_string());
        assert_eq!(v["status"]["conditions"][0]["type"], "Ready");
        let c = spec(OpKind::Create).plan(7, None, None).expect("plan");
        assert_eq!(
            (c.method, c.path.as_str()),
            (Method::POST, "/api/v1/namespaces/ns1/pods")
        );
        assert!(spec(OpKind::Delete).plan(0, None, None).is_none());
        let d = spec(OpKind::Delete).plan(0, None, Some("x")).expect("plan");
        assert_eq!(d.path, "/api/v1/namespaces/ns1/pods/x");
    }

    #[test]
    fn formats_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(1_700_000_000 * 1_000_000_000),
            "2023-11-14T22:13:20Z"
        );
        assert_eq!(rfc3339(951_782_400 * 1_000_000_000), "2000-02-29T00:00:00Z");
    }
}
