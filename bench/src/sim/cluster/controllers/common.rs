//! What every controller writes: the requests ([`Action`]), pods made from a template with
//! their owner reference, and status patches that leave out what has not changed (so a
//! controller's own status write does not wake it into another).

use super::cache::{key, Res};
use crate::sim::clock;
use serde_json::{json, Map, Value};

/// One request a reconcile asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// POST `body` to `res`'s collection in `ns`.
    Create { res: Res, ns: String, body: Value },
    /// DELETE one object (background propagation).
    Delete { res: Res, ns: String, name: String },
    /// A JSON merge patch of one object (`status`: of its status subresource).
    Patch {
        res: Res,
        ns: String,
        name: String,
        status: bool,
        body: Value,
    },
    /// Drop the owner reference naming `uid` (the collector orphaning a dependent).
    Unown {
        res: Res,
        ns: String,
        name: String,
        uid: String,
    },
}

/// `metadata.namespace`, `.name`, `.uid` of an object.
pub fn meta(v: &Value) -> (&str, &str, &str) {
    let m = &v["metadata"];
    (
        m["namespace"].as_str().unwrap_or(""),
        m["name"].as_str().unwrap_or(""),
        m["uid"].as_str().unwrap_or(""),
    )
}

pub fn generation(v: &Value) -> i64 {
    v["metadata"]["generation"].as_i64().unwrap_or(1)
}

pub fn replicas(v: &Value) -> i64 {
    v["spec"]["replicas"].as_i64().unwrap_or(1).max(0)
}

/// The controller owner reference to `owner`.
pub fn owner_ref(res: Res, owner: &Value) -> Value {
    let (_, name, uid) = meta(owner);
    json!({"apiVersion": res.api_version(), "kind": res.kind(), "name": name, "uid": uid,
           "controller": true, "blockOwnerDeletion": true})
}

/// A pod of `owner`'s `spec.template`: named `name`, or generated from the owner's name;
/// `labels` added to the template's.
pub fn pod_from_template(
    res: Res,
    owner: &Value,
    name: Option<&str>,
    labels: &[(&str, String)],
) -> Value {
    let (ns, owner_name, _) = meta(owner);
    let t = &owner["spec"]["template"];
    let mut m = Map::new();
    match name {
        Some(n) => m.insert("name".into(), n.into()),
        None => m.insert("generateName".into(), format!("{owner_name}-").into()),
    };
    m.insert("namespace".into(), ns.into());
    let mut l = t["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for (k, v) in labels {
        l.insert(k.to_string(), v.clone().into());
    }
    if !l.is_empty() {
        m.insert("labels".into(), Value::Object(l));
    }
    if let Some(a) = t["metadata"]["annotations"].as_object() {
        m.insert("annotations".into(), Value::Object(a.clone()));
    }
    m.insert("ownerReferences".into(), json!([owner_ref(res, owner)]));
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": m, "spec": t["spec"].clone()})
}

/// A short, stable hash of a value (FNV-1a over its JSON, which keeps keys sorted), written
/// with the alphabet Kubernetes' `rand.SafeEncodeString` uses (no vowels, no look-alikes).
pub fn hash(v: &Value) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in v.to_string().bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n = h;
    let mut out = String::new();
    while n > 0 || out.is_empty() {
        out.push(ALPHABET[(n % ALPHABET.len() as u32) as usize] as char);
        n /= ALPHABET.len() as u32;
    }
    out
}

/// The template a hash is taken of: without the label the controller adds itself.
pub fn template_hash(template: &Value, own_label: &str) -> String {
    let mut t = template.clone();
    if let Some(l) = t["metadata"]["labels"].as_object_mut() {
        l.remove(own_label);
    }
    if let Some(m) = t["metadata"].as_object_mut() {
        m.remove("creationTimestamp");
    }
    hash(&t)
}

/// An int-or-percent (`maxSurge: 25%`) of `total`, rounded up or down.
pub fn int_or_percent(v: &Value, total: i64, round_up: bool, default: i64) -> i64 {
    if let Some(n) = v.as_i64() {
        return n.max(0);
    }
    let Some(p) = v
        .as_str()
        .and_then(|s| s.strip_suffix('%')?.parse::<i64>().ok())
    else {
        return default;
    };
    let x = p * total;
    if round_up {
        (x + 99) / 100
    } else {
        x / 100
    }
}

/// A condition as the controllers write it: its transition time kept from `current` when
/// its status has not changed.
pub fn condition(current: &Value, kind: &str, status: bool, reason: &str, message: &str) -> Value {
    let status = if status { "True" } else { "False" };
    let now = clock::rfc3339(clock::now_unix());
    let old = (current["conditions"].as_array().into_iter().flatten()).find(|c| c["type"] == kind);
    let same = |f: &str| {
        old.is_some_and(|c| {
            c[f] == json!(match f {
                "status" => status,
                "reason" => reason,
                _ => message,
            })
        })
    };
    let transition = match old {
        Some(c) if same("status") => c["lastTransitionTime"].clone(),
        _ => now.clone().into(),
    };
    let update = match old {
        Some(c) if same("status") && same("reason") && same("message") => {
            c["lastUpdateTime"].clone()
        }
        _ => now.into(),
    };
    json!({"type": kind, "status": status, "lastUpdateTime": update,
           "lastTransitionTime": transition, "reason": reason, "message": message})
}

/// A status patch of `owner` setting `fields`, or nothing if each already holds. A field
/// Go leaves out when zero (`omitempty`) is removed rather than written as 0.
pub fn status_patch(res: Res, owner: &Value, fields: &[(&str, Value, bool)]) -> Option<Action> {
    let cur = &owner["status"];
    let mut patch = Map::new();
    for (k, v, omitempty) in fields {
        let empty = *omitempty
            && (v.is_null() || *v == json!(0) || v.as_array().is_some_and(Vec::is_empty));
        let want = if empty { Value::Null } else { v.clone() };
        if cur.get(*k).cloned().unwrap_or(Value::Null) != want {
            patch.insert(k.to_string(), want);
        }
    }
    if patch.is_empty() {
        return None;
    }
    let (ns, name, _) = meta(owner);
    Some(Action::Patch {
        res,
        ns: ns.into(),
        name: name.into(),
        status: true,
        body: json!({"status": patch}),
    })
}

/// `spec.replicas` of `v` set to `n`, unless it is already.
pub fn scale(res: Res, v: &Value, n: i64) -> Option<Action> {
    if v["spec"]["replicas"].as_i64() == Some(n) {
        return None;
    }
    let (ns, name, _) = meta(v);
    Some(Action::Patch {
        res,
        ns: ns.into(),
        name: name.into(),
        status: false,
        body: json!({"spec": {"replicas": n}}),
    })
}

pub fn delete_pod(ns: &str, name: &str) -> Action {
    Action::Delete {
        res: Res::Pod,
        ns: ns.into(),
        name: name.into(),
    }
}

/// Whether `labels` match a LabelSelector (`matchLabels`, `matchExpressions`) or, for a
/// ReplicationController, a plain map.
pub fn selects(selector: &Value, labels: &Map<String, Value>) -> bool {
    let Some(sel) = selector.as_object() else {
        return false;
    };
    let plain = !sel.contains_key("matchLabels") && !sel.contains_key("matchExpressions");
    let match_labels = if plain {
        Some(sel)
    } else {
        sel.get("matchLabels").and_then(Value::as_object)
    };
    let labels_ok = match_labels
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = (sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten())
    .all(|e| {
        let k = e["key"].as_str().unwrap_or("");
        let values: Vec<&Value> = e["values"].as_array().into_iter().flatten().collect();
        let has = labels.get(k);
        match e["operator"].as_str().unwrap_or("") {
            "In" => has.is_some_and(|v| values.contains(&v)),
            "NotIn" => !has.is_some_and(|v| values.contains(&v)),
            "Exists" => has.is_some(),
            "DoesNotExist" => has.is_none(),
            _ => false,
        }
    });
    labels_ok && exprs_ok && !(plain && sel.is_empty())
}

/// `ns/name` of an object.
pub fn object_key(v: &Value) -> String {
    let (ns, name, _) = meta(v);
    key(ns, name)
}
