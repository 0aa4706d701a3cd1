//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), and
//! strategic merge patch for what kubectl and kubelets send: maps merged
//! key by key, lists of known kinds merged by their merge key (conditions by
//! `type`, containers by `name`, …), and the `$patch`, `$setElementOrder`,
//! `$retainKeys` and `$deleteFromPrimitiveList` directives.

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

/// Applies `patch` of type `kind` to `doc`.
pub fn apply(kind: PatchType, doc: &mut Value, patch: &[u8]) -> Result<(), PatchError> {
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
            strategic(doc, p, "")
        }
    }
}

/// The merge key of a list field, by its path: the lists kubectl and kubelets patch.
fn merge_key(path: &str) -> Option<&'static str> {
    Some(match path {
        "status.conditions" | "status.addresses" => "type",
        "spec.containers"
        | "spec.initContainers"
        | "spec.ephemeralContainers"
        | "spec.volumes"
        | "status.containerStatuses"
        | "status.initContainerStatuses"
        | "status.ephemeralContainerStatuses"
        | "spec.imagePullSecrets" => "name",
        "metadata.ownerReferences" => "uid",
        "spec.tolerations" => "key",
        "status.images" => "names",
        _ if path.ends_with(".env") => "name",
        _ if path.ends_with(".ports") => "containerPort",
        _ if path.ends_with(".volumeMounts") => "mountPath",
        _ => return None,
    })
}

/// Lists of scalars merged as sets.
fn is_set_list(path: &str) -> bool {
    matches!(path, "metadata.finalizers")
}

fn strategic(doc: &mut Value, patch: Map<String, Value>, path: &str) -> Result<(), PatchError> {
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
        let child = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        match v {
            Value::Null => {
                target.remove(&k);
            }
            Value::Object(pm) => {
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    target.remove(&k);
                } else {
                    strategic(target.entry(k).or_insert(Value::Null), pm, &child)?;
                }
            }
            Value::Array(items) => {
                let merged = merge_list(target.remove(&k), items, &child)?;
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

fn merge_list(current: Option<Value>, items: Vec<Value>, path: &str) -> Result<Value, PatchError> {
    let current = match current {
        Some(Value::Array(a)) => a,
        _ => Vec::new(),
    };
    if is_set_list(path) {
        let mut out = current;
        for i in items {
            if !out.contains(&i) {
                out.push(i);
            }
        }
        return Ok(Value::Array(out));
    }
    let Some(key) = merge_key(path) else {
        // Lists without a merge key are replaced whole.
        return Ok(Value::Array(
            items
                .into_iter()
                .filter(|i| i.get("$patch").is_none())
                .collect(),
        ));
    };
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
            Some(p) => strategic(&mut out[p], pm, path)?,
            None => {
                let mut fresh = Value::Object(Map::new());
                strategic(&mut fresh, pm, path)?;
                out.push(fresh);
            }
        }
    }
    Ok(Value::Array(out))
}

#[cfg(test)]
mod tests;
