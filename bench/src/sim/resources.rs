//! The resources the simulated apiserver serves, with what discovery, field
//! selectors and `kubectl get` need to know about each.

/// One served resource.
#[derive(Debug)]
pub struct ResourceDef {
    /// Plural name in the path: `pods`.
    pub name: &'static str,
    pub kind: &'static str,
    pub singular: &'static str,
    /// `""` for the core group.
    pub group: &'static str,
    pub version: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    /// Subresources served (`status`).
    pub subresources: &'static [&'static str],
    /// Fields a field selector may name, besides metadata.name and metadata.namespace.
    pub fields: &'static [&'static str],
}

impl ResourceDef {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// Reads a field a selector names; `None` when the resource does not support it.
    pub fn supports_field(&self, field: &str) -> bool {
        matches!(field, "metadata.name" | "metadata.namespace") || self.fields.contains(&field)
    }
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// Verbs every served resource supports, in discovery's order.
pub fn verbs() -> &'static [&'static str] {
    VERBS
}

pub static RESOURCES: &[ResourceDef] = &[
    ResourceDef {
        name: "namespaces",
        kind: "Namespace",
        singular: "namespace",
        group: "",
        version: "v1",
        namespaced: false,
        short_names: &["ns"],
        subresources: &["status"],
        fields: &["status.phase"],
    },
    ResourceDef {
        name: "nodes",
        kind: "Node",
        singular: "node",
        group: "",
        version: "v1",
        namespaced: false,
        short_names: &["no"],
        subresources: &["status"],
        fields: &["spec.unschedulable"],
    },
    ResourceDef {
        name: "pods",
        kind: "Pod",
        singular: "pod",
        group: "",
        version: "v1",
        namespaced: true,
        short_names: &["po"],
        subresources: &["status"],
        fields: &[
            "spec.nodeName",
            "status.phase",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.podIP",
        ],
    },
    ResourceDef {
        name: "configmaps",
        kind: "ConfigMap",
        singular: "configmap",
        group: "",
        version: "v1",
        namespaced: true,
        short_names: &["cm"],
        subresources: &[],
        fields: &[],
    },
    ResourceDef {
        name: "events",
        kind: "Event",
        singular: "event",
        group: "",
        version: "v1",
        namespaced: true,
        short_names: &["ev"],
        subresources: &[],
        fields: &[
            "involvedObject.kind",
            "involvedObject.name",
            "involvedObject.namespace",
            "involvedObject.uid",
            "reason",
            "type",
            "source",
        ],
    },
    ResourceDef {
        name: "leases",
        kind: "Lease",
        singular: "lease",
        group: "coordination.k8s.io",
        version: "v1",
        namespaced: true,
        short_names: &[],
        subresources: &[],
        fields: &[],
    },
];

/// The resource a request names, by group, version and plural.
pub fn lookup(group: &str, version: &str, name: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.name == name)
}

/// Whether any served resource lives in `group`/`version` (kube-apiserver's mux has a
/// handler installed for that path).
pub fn serves_group_version(group: &str, version: &str) -> bool {
    RESOURCES
        .iter()
        .any(|r| r.group == group && r.version == version)
}

/// Index of a resource in [`RESOURCES`], used as a compact key in the store.
pub fn index_of(def: &ResourceDef) -> usize {
    RESOURCES
        .iter()
        .position(|r| std::ptr::eq(r, def))
        .unwrap_or(0)
}

pub fn by_index(i: usize) -> &'static ResourceDef {
    &RESOURCES[i.min(RESOURCES.len() - 1)]
}

pub fn by_name(name: &str) -> Option<&'static ResourceDef> {
    RESOURCES.iter().find(|r| r.name == name)
}
