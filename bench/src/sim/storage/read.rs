//! What a LIST or WATCH asks storage for: the revision it reads at ([`ReadAt`]), the page
//! ([`ListPlan`]), the selectors ([`Filter`]); and the snapshot a plan reads, with
//! kube-apiserver's 410s for a compacted revision. The API layer builds plans from a request's
//! options (`api::list`); the watch cache and etcd serve them.

use apimodel::{FieldSelector, LabelSelector, ListOptions, Status};
use base64::Engine;

use super::object::Obj;
use super::store::{ObjMap, Store, StoreError};
use crate::sim::resources::ResourceDef;

/// The selectors of a LIST or WATCH, checked against what the resource supports.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// The namespace of the request path (`/api/v1/namespaces/NS/pods`); empty: all namespaces.
    pub namespace: String,
}

impl Filter {
    pub fn parse(def: &ResourceDef, o: &ListOptions) -> Result<Filter, Status> {
        let labels = LabelSelector::parse(o.label_selector.as_deref().unwrap_or(""))
            .map_err(|e| Status::bad_request(e.to_string()))?;
        let fields = FieldSelector::parse(o.field_selector.as_deref().unwrap_or(""))
            .map_err(|e| Status::bad_request(e.to_string()))?;
        for r in &fields.requirements {
            if !def.supports_field(&r.field) {
                return Err(Status::bad_request(format!(
                    "\"{}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\"{}",
                    r.field,
                    def.fields.iter().map(|f| format!(", \"{f}\"")).collect::<String>()
                )));
            }
        }
        Ok(Filter {
            labels,
            fields,
            namespace: String::new(),
        })
    }

    /// Restricts the filter to the objects of `namespace` (empty: all namespaces).
    pub fn in_namespace(mut self, namespace: &str) -> Self {
        self.namespace = namespace.to_string();
        self
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty() && self.namespace.is_empty()
    }

    pub fn matches(&self, def: &ResourceDef, o: &Obj) -> bool {
        (self.namespace.is_empty() || o.namespace == self.namespace)
            && self.labels.matches(&o.labels)
            && self.fields.matches(&|f| o.field(def, f))
    }
}

/// The revision a LIST reads at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadAt {
    /// The latest state (consistent read, or `resourceVersion=0`).
    Latest,
    /// Any state at least this new.
    NotOlderThan(u64),
    /// Exactly this revision.
    Exact(u64),
}

/// A LIST request, validated.
#[derive(Debug, Clone)]
pub struct ListPlan {
    pub read_at: ReadAt,
    pub limit: Option<u64>,
    /// Keys from here on (inclusive), from a continue token.
    pub start: Option<String>,
    pub filter: Filter,
    /// True when served from the watch cache (what the metrics' `storage` label reports).
    pub from_cache: bool,
    /// A consistent read from the watch cache (`--kube-version 1.37`): with etcd behind it, it
    /// first asks etcd for its current revision and waits until the cache has seen it.
    pub fresh: bool,
}

/// The message the apiserver sends with a 410 for a continue token older than compaction.
pub const EXPIRED_CONTINUE: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// kube-apiserver's 410 message for an exact LIST at a compacted revision.
pub const EXPIRED_LIST: &str = "The resourceVersion for the provided list is too old.";

/// The 410 for a continue token at a compacted revision, with `metadata.continue`: the same
/// `start` key at revision `now`.
pub fn expired_continue(now: u64, start: &str) -> Status {
    let mut status = Status::expired(EXPIRED_CONTINUE);
    let v = serde_json::json!({"v": "meta.k8s.io/v1", "rv": now, "start": start});
    status.metadata.insert(
        "continue".into(),
        base64::engine::general_purpose::STANDARD
            .encode(v.to_string())
            .into(),
    );
    status
}

/// The snapshot a plan reads, and its revision.
pub fn snapshot(store: &Store, resource: usize, plan: &ListPlan) -> Result<(u64, ObjMap), Status> {
    match plan.read_at {
        ReadAt::Latest | ReadAt::NotOlderThan(_) => {
            // The cacher's index: a node's pods only, not every pod filtered.
            let node = plan
                .from_cache
                .then(|| plan.filter.fields.exact("spec.nodeName"))
                .flatten()
                // `spec.nodeName=` (unscheduled pods) is not in the index.
                .filter(|n| !n.is_empty());
            Ok(node
                .and_then(|n| store.snapshot_on_node(resource, n))
                .unwrap_or_else(|| store.snapshot(resource)))
        }
        ReadAt::Exact(at) => match store.snapshot_at(resource, at) {
            Ok(m) => Ok((at, m)),
            Err(StoreError::Compacted { .. }) => Err(match &plan.start {
                // As kube-apiserver: a token for the same place at the current revision,
                // for a client willing to continue with an inconsistent list.
                Some(start) => {
                    let (now, _) = store.snapshot(resource);
                    expired_continue(now, start)
                }
                None => Status::expired(EXPIRED_LIST),
            }),
            Err(e) => Err(Status::internal(e.to_string())),
        },
    }
}
