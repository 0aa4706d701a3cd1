//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), and
//! strategic merge patch: maps merged key by key, lists merged as Kubernetes 1.20's OpenAPI
//! says for the field's own type (`x-kubernetes-patch-merge-key`: a Service's `ports` by
//! `port`, a container's by `containerPort`; `x-kubernetes-patch-strategy: merge` without a
//! key: a set, as `finalizers`; neither: replaced whole), and the `$patch`,
//! `$setElementOrder`, `$retainKeys` and `$deleteFromPrimitiveList` directives. The metadata
//! is generated ([`schema_1_20`], by `bench/scripts/gen-patch-schema.py`); a kind it does not
//! know (a custom resource) has every list replaced, as kube-apiserver's JSON merge would.

mod schema_1_20;

use serde_json::{Map, Value};

/// The patch types the apiserver accepts, by Content-Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Strategic,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<PatchType> {
        match ct.split(';').next().unwrap_or("").trim() {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            _ => None,
        }
    }
}

/// Why a patch could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The body is not a patch of its type (400).
    #[error("{0}")]
    Malformed(String),
    /// The patch does not apply to the object (422).
    #[error("{0}")]
    Failed(String),
}

/// The OpenAPI type of a served kind, if its type has patch metadata.
pub fn root_type(group: &str, version: &str, kind: &str) -> Option<&'static str> {
    let roots = schema_1_20::ROOTS;
    (roots
        .iter()
        .find(|r| r.0 == group && r.1 == version && r.2 == kind))
    .or_else(|| roots.iter().find(|r| r.0 == group && r.2 == kind))
    .map(|r| r.3)
}

/// What a field of `ty` says of itself: (its type, merge key, strategy), `""` for none.
fn field(ty: Option<&str>, name: &str) -> (Option<&'static str>, &'static str, &'static str) {
    use std::collections::HashMap;
    use std::sync::OnceLock;
    type Fields = HashMap<(&'static str, &'static str), (&'static str, &'static str, &'static str)>;
    static INDEX: OnceLock<Fields> = OnceLock::new();
    let index = INDEX.get_or_init(|| {
        (schema_1_20::FIELDS.iter())
            .map(|&(t, f, c, k, s)| ((t, f), (c, k, s)))
            .collect()
    });
    match ty.and_then(|t| index.get(&(t, name))) {
        Some(&(c, k, s)) => ((!c.is_empty()).then_some(c), k, s),
        None => (None, "", ""),
    }
}

/// Applies `patch` of type `kind` to `doc`, an object of OpenAPI type `ty`
/// ([`root_type`]; `None`: no patch metadata).
pub fn apply(
    kind: PatchType,
    doc: &mut Value,
    patch: &[u8],
    ty: Option<&'static str>,
) -> Result<(), PatchError> {
    let p: Value = serde_json::from_slice(patch)
        .map_err(|e| PatchError::Malformed(format!("invalid JSON in patch body: {e}")))?;
    match kind {
        PatchType::Merge => {
            if !p.is_object() {
                return Err(PatchError::Malformed(
                    "a merge patch must be a JSON object".into(),
                ));
            }
            json_patch::merge(doc, &p);
            Ok(())
        }
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(p)
                .map_err(|e| PatchError::Malformed(format!("invalid JSON patch: {e}")))?;
            json_patch::patch(doc, &ops).map_err(|e| {
                PatchError::Failed(format!(
                    "the server rejected our request due to an error in our request: {e}"
                ))
            })
        }
        PatchType::Strategic => {
            let Value::Object(p) = p else {
                return Err(PatchError::Malformed(
                    "a strategic merge patch must be a JSON object".into(),
                ));
            };
            strategic(doc, p, ty)
        }
    }
}

fn strategic(
    doc: &mut Value,
    patch: Map<String, Value>,
    ty: Option<&'static str>,
) -> Result<(), PatchError> {
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut p = patch;
        p.remove("$patch");
        *doc = Value::Object(p);
        return Ok(());
    }
    let Some(target) = doc.as_object_mut() else {
        return Ok(());
    };
    let retain: Option<Vec<String>> = patch.get("$retainKeys").and_then(Value::as_array).map(|a| {
        a.iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect()
    });
    for (k, v) in patch {
        if k.starts_with("$setElementOrder/") || k == "$retainKeys" || k == "$patch" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let remove: Vec<Value> = v.as_array().cloned().unwrap_or_default();
            if let Some(Value::Array(list)) = target.get_mut(field) {
                list.retain(|x| !remove.contains(x));
            }
            continue;
        }
        let (child, merge_key, strategy) = field(ty, &k);
        match v {
            Value::Null => {
                target.remove(&k);
            }
            Value::Object(pm) => {
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    target.remove(&k);
                } else {
                    strategic(target.entry(k).or_insert(Value::Null), pm, child)?;
                }
            }
            Value::Array(items) => {
                let list = ListField {
                    name: &k,
                    item: child,
                    merge_key,
                    set: strategy.split(',').any(|s| s == "merge") && merge_key.is_empty(),
                };
                let merged = merge_list(target.remove(&k), items, &list)?;
                target.insert(k, merged);
            }
            scalar => {
                target.insert(k, scalar);
            }
        }
    }
    if let Some(keep) = retain {
        target.retain(|k, _| keep.contains(k));
    }
    Ok(())
}

/// A list field and how 1.20 merges it.
struct ListField<'a> {
    name: &'a str,
    item: Option<&'static str>,
    merge_key: &'static str,
    /// `patchStrategy: merge` without a key: scalars merged as a set.
    set: bool,
}

fn merge_list(
    current: Option<Value>,
    items: Vec<Value>,
    list: &ListField<'_>,
) -> Result<Value, PatchError> {
    let path = list.name;
    let current = match current {
        Some(Value::Array(a)) => a,
        _ => Vec::new(),
    };
    if list.set {
        let mut out = current;
        for i in items {
            if !out.contains(&i) {
                out.push(i);
            }
        }
        return Ok(Value::Array(out));
    }
    let key = list.merge_key;
    if key.is_empty() {
        // Lists without a merge key are replaced whole.
        return Ok(Value::Array(
            items
                .into_iter()
                .filter(|i| i.get("$patch").is_none())
                .collect(),
        ));
    }
    if items
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return Ok(Value::Array(
            items
                .into_iter()
                .filter(|i| i.get("$patch").is_none())
                .collect(),
        ));
    }
    let mut out = current;
    for item in items {
        let Value::Object(mut pm) = item else {
            return Err(PatchError::Malformed(format!(
                "{path}: elements of a list merged by {key:?} must be objects"
            )));
        };
        let Some(id) = pm.get(key).cloned() else {
            return Err(PatchError::Malformed(format!(
                "{path}: map in list must contain the merge key {key:?}"
            )));
        };
        let pos = out.iter().position(|e| e.get(key) == Some(&id));
        if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(p) = pos {
                out.remove(p);
            }
            continue;
        }
        pm.remove("$patch");
        match pos {
            Some(p) => strategic(&mut out[p], pm, list.item)?,
            None => {
                let mut fresh = Value::Object(Map::new());
                strategic(&mut fresh, pm, list.item)?;
                out.push(fresh);
            }
        }
    }
    Ok(Value::Array(out))
}

#[cfg(test)]
mod tests;
