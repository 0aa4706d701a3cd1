//! A stored object: its JSON as it will be sent, plus the few fields that
//! selectors and indexes read, so a LIST never parses what it streams.

use crate::sim::resources::ResourceDef;
use bytes::Bytes;
use serde_json::Value;
use std::collections::BTreeMap;

/// One version of one object. Immutable: a write makes a new one.
#[derive(Debug)]
pub struct Obj {
    pub rv: u64,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    /// Values of the resource's selectable fields, in the order of `ResourceDef::fields`.
    pub fields: Vec<Option<String>>,
    /// Set once a graceful delete has started.
    pub deleting: bool,
    pub has_finalizers: bool,
    /// The object's JSON, with `metadata.resourceVersion` equal to `rv`.
    pub json: Bytes,
}

/// Where an object lives in its resource's map: sorts like etcd's
/// `/registry/<resource>/<namespace>/<name>` keys, so LISTs come out in the apiserver's order.
pub fn key(namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        name.to_string()
    } else {
        format!("{namespace}/{name}")
    }
}

/// `{"kind":"K","apiVersion":"V",`: how every stored object of `def` starts, so a list
/// item can be sent without its type (see [`Obj::json_without_type_meta`]).
/// Custom resources' lists keep them (kube-apiserver serves those lists unstructured): empty.
pub fn type_meta_prefix(def: &ResourceDef) -> Vec<u8> {
    if def.is_custom() {
        return Vec::new();
    }
    format!(
        "{{\"kind\":{},\"apiVersion\":{},",
        Value::from(def.kind),
        Value::from(def.api_version())
    )
    .into_bytes()
}

impl Obj {
    /// Builds the stored form of `value`, stamping `rv` into its metadata.
    pub fn new(def: &ResourceDef, mut value: Value, rv: u64) -> Obj {
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
        let value = type_meta_first(value);
        let meta = &value["metadata"];
        let labels = meta
            .get("labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let fields = def.fields.iter().map(|f| field_value(&value, f)).collect();
        // Copied into an exactly sized buffer: `to_vec` grows by doubling, and
        // `Bytes::from(Vec)` would keep that capacity (a 2.5 KB pod in a 4 KB
        // allocation) for as long as the object is stored.
        let json = Bytes::copy_from_slice(&serde_json::to_vec(&value).unwrap_or_default());
        Obj {
            rv,
            namespace: str_at(meta, "namespace"),
            name: str_at(meta, "name"),
            uid: str_at(meta, "uid"),
            labels,
            fields,
            deleting: meta.get("deletionTimestamp").is_some_and(|v| !v.is_null()),
            has_finalizers: meta
                .get("finalizers")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty()),
            json,
        }
    }

    /// The object as a JSON value, for writes and tables.
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }

    pub fn key(&self) -> String {
        key(&self.namespace, &self.name)
    }

    /// The JSON as an item of a typed List: without `kind` and `apiVersion` (kube-apiserver
    /// leaves them out of list items; watch events and GETs keep them). `type_prefix` is
    /// `{"kind":"K","apiVersion":"V",`, which every stored object starts with.
    pub fn json_without_type_meta<'a>(&'a self, type_prefix: &[u8]) -> (&'static [u8], &'a [u8]) {
        match self.json.strip_prefix(type_prefix) {
            Some(rest) if !type_prefix.is_empty() => (b"{", rest),
            _ => (b"", &self.json),
        }
    }

    /// A field selector's view of the object.
    pub fn field(&self, def: &ResourceDef, field: &str) -> Option<String> {
        match field {
            "metadata.name" => Some(self.name.clone()),
            "metadata.namespace" => Some(self.namespace.clone()),
            _ => def
                .fields
                .iter()
                .position(|f| *f == field)
                .and_then(|i| self.fields.get(i).cloned().flatten()),
        }
    }
}

/// `kind` and `apiVersion` as the first two keys, as kube-apiserver writes objects: a LIST
/// then sends each item without them by skipping a known prefix
/// ([`Obj::json_without_type_meta`]), as the real apiserver's typed lists do.
fn type_meta_first(value: Value) -> Value {
    let Value::Object(mut map) = value else {
        return value;
    };
    let mut ordered = serde_json::Map::with_capacity(map.len());
    for k in ["kind", "apiVersion"] {
        if let Some(v) = map.remove(k) {
            ordered.insert(k.to_string(), v);
        }
    }
    ordered.extend(map);
    Value::Object(ordered)
}

fn str_at(v: &Value, k: &str) -> String {
    v.get(k)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Reads a dotted path (`spec.nodeName`) as the string a field selector compares.
pub fn field_value(v: &Value, path: &str) -> Option<String> {
    let mut cur = v;
    for part in path.split('.') {
        cur = cur.get(part)?;
    }
    match cur {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}
