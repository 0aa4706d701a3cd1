//! CustomResourceDefinitions: what the registry adds to a created CRD, and what custom
//! objects are checked against (the version's structural schema).
//!
//! Validated as kube-apiserver 1.20 does, with its wording: `type` (object, array, string,
//! integer, number, boolean; `nullable`; `x-kubernetes-int-or-string`), `required`, and
//! pruning of fields the schema does not name (unless `x-kubernetes-preserve-unknown-fields`).
//! **Not validated** (stored as sent): formats, enums, patterns, minimum/maximum, lengths and
//! item counts, `oneOf`/`anyOf`/`allOf`/`not`, defaults (`default:` is not applied),
//! `x-kubernetes-list-type`/`map-keys`, and metadata beyond name and namespace; nor is the
//! CRD's own schema checked for being structural.

use serde_json::{json, Map, Value};

/// The registry's defaults on a created (or updated) CRD, and its status before the
/// establishing controller has run: names not yet accepted, stored version recorded.
pub fn prepare(crd: &mut Value) {
    let Some(spec) = crd.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    spec.entry("conversion")
        .or_insert_with(|| json!({"strategy": "None"}));
    if let Some(names) = spec.get_mut("names").and_then(Value::as_object_mut) {
        let kind = names
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        names
            .entry("listKind")
            .or_insert_with(|| format!("{kind}List").into());
        names
            .entry("singular")
            .or_insert_with(|| kind.to_lowercase().into());
    }
    let storage: Vec<Value> = spec
        .get("versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v["storage"].as_bool() == Some(true))
        .map(|v| v["name"].clone())
        .collect();
    if crd["status"].is_null() || crd["status"]["storedVersions"].is_null() {
        crd["status"] = json!({"acceptedNames": {"kind": "", "plural": ""}, "conditions": null,
                               "storedVersions": storage});
    }
}

/// The status the establishing controller writes once the names are accepted.
pub fn established(crd: &mut Value, now: &str) {
    let names = crd["spec"]["names"].clone();
    let cond = |t: &str, reason: &str, message: &str| json!({"lastTransitionTime": now, "message": message, "reason": reason, "status": "True", "type": t});
    crd["status"]["acceptedNames"] = names;
    crd["status"]["conditions"] = json!([
        cond("NamesAccepted", "NoConflicts", "no conflicts found"),
        cond(
            "Established",
            "InitialNamesAccepted",
            "the initial names have been accepted"
        ),
    ]);
}

/// One failed check: the field's path and the message without it.
#[derive(Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub reason: &'static str,
    pub message: String,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_ok(want: &str, v: &Value) -> bool {
    match (want, type_name(v)) {
        ("number", "integer") => true,
        (w, got) => w == got,
    }
}

/// Checks `v` against `schema` and prunes unknown fields; returns the errors, in path order.
pub fn validate(schema: &Value, v: &mut Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    walk(schema, v, "", true, &mut errors);
    errors
}

fn join(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

fn walk(schema: &Value, v: &mut Value, path: &str, root: bool, errors: &mut Vec<FieldError>) {
    if v.is_null() && schema["nullable"].as_bool() == Some(true) {
        return;
    }
    let int_or_string = schema["x-kubernetes-int-or-string"].as_bool() == Some(true);
    if let Some(want) = schema["type"].as_str() {
        let ok = if int_or_string {
            matches!(type_name(v), "integer" | "string")
        } else {
            type_ok(want, v)
        };
        if !ok {
            let got = type_name(v);
            errors.push(FieldError {
                field: path.to_string(),
                reason: "FieldValueInvalid",
                message: format!(
                    "Invalid value: \"{got}\": {path} in body must be of type {want}: \"{got}\""
                ),
            });
            return;
        }
    }
    match v {
        Value::Object(m) => object(schema, m, path, root, errors),
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(s, item, &format!("{path}[{i}]"), false, errors);
                }
            }
        }
        _ => {}
    }
}

fn object(
    schema: &Value,
    m: &mut Map<String, Value>,
    path: &str,
    root: bool,
    errors: &mut Vec<FieldError>,
) {
    for r in schema["required"].as_array().into_iter().flatten() {
        if let Some(r) = r.as_str() {
            if !m.contains_key(r) {
                errors.push(FieldError {
                    field: join(path, r),
                    reason: "FieldValueRequired",
                    message: "Required value".into(),
                });
            }
        }
    }
    let props = schema["properties"].as_object();
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    let preserve = schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true);
    let keys: Vec<String> = m.keys().cloned().collect();
    for k in keys {
        if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        let sub = props.and_then(|p| p.get(&k)).or(additional);
        match sub {
            Some(s) => {
                if let Some(x) = m.get_mut(&k) {
                    walk(s, x, &join(path, &k), false, errors);
                }
            }
            None if preserve => {}
            // Pruned: the schema does not name it.
            None => {
                m.remove(&k);
            }
        }
    }
}

/// kube-apiserver's 422 for a custom object that fails its schema.
pub fn invalid(group: &str, kind: &str, name: &str, errors: &[FieldError]) -> apimodel::Status {
    let listed: Vec<String> = errors
        .iter()
        .map(|e| format!("{}: {}", e.field, e.message))
        .collect();
    let what = if listed.len() == 1 {
        listed[0].clone()
    } else {
        format!("[{}]", listed.join(", "))
    };
    let mut s = apimodel::Status::invalid(
        group,
        kind,
        name,
        format!("{kind}.{group} {name:?} is invalid: {what}"),
    );
    if let Some(d) = s.details.as_mut() {
        for e in errors {
            d.causes.push(apimodel::status::StatusCause {
                reason: e.reason.into(),
                message: e.message.clone(),
                field: e.field.clone(),
            });
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object", "required": ["size"],
            "properties": {"size": {"type": "integer"}, "color": {"type": "string"},
                           "tags": {"type": "array", "items": {"type": "string"}},
                           "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}})
    }

    #[test]
    fn types_and_required_fields_are_checked_with_the_apiservers_words() {
        let mut v = json!({"spec": {"size": "big"}});
        let e = validate(&schema(), &mut v);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].field, "spec.size");
        assert_eq!(
            e[0].message,
            "Invalid value: \"string\": spec.size in body must be of type integer: \"string\""
        );
        let mut v = json!({"spec": {"color": "red", "tags": ["a", 1]}});
        let e = validate(&schema(), &mut v);
        let fields: Vec<&str> = e.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["spec.size", "spec.tags[1]"]);
        assert_eq!(e[0].reason, "FieldValueRequired");
    }

    #[test]
    fn unknown_fields_are_pruned_unless_preserved() {
        let mut v = json!({"apiVersion": "x/v1", "kind": "W", "metadata": {"name": "a"}, "top": 1,
                           "spec": {"size": 3, "extra": 1, "free": {"any": {"thing": 1}}}});
        assert!(validate(&schema(), &mut v).is_empty());
        assert_eq!(
            v,
            json!({"apiVersion": "x/v1", "kind": "W", "metadata": {"name": "a"},
                   "spec": {"size": 3, "free": {"any": {"thing": 1}}}})
        );
    }

    #[test]
    fn a_created_crd_gets_the_registrys_defaults() {
        let mut c = json!({"spec": {"names": {"kind": "Widget", "plural": "widgets"},
                                    "versions": [{"name": "v1", "storage": true}]}});
        prepare(&mut c);
        assert_eq!(c["spec"]["names"]["listKind"], "WidgetList");
        assert_eq!(c["spec"]["names"]["singular"], "widget");
        assert_eq!(c["spec"]["conversion"]["strategy"], "None");
        assert_eq!(c["status"]["storedVersions"], json!(["v1"]));
        established(&mut c, "2026-01-01T00:00:00Z");
        assert_eq!(c["status"]["conditions"][1]["type"], "Established");
    }
}
