//! ClusterLoader2 configs: the file is a Go template (CL2's helpers, see
//! [`crate::stages::template::cl2`]) over CL2's mapping — `--testoverrides`
//! files (YAML `key: value`, later files win), then `CL2_*` environment
//! variables (numbers and booleans unpacked, as CL2 does), then `--param`;
//! `Nodes`, unless one of them gives it, is the cluster's count.
//! The rendered config is read with CL2's spellings (`namespace.number`,
//! `tuningSets[].qpsLoad.qps`, `steps[].phases[].objectBundle[].objectTemplatePath`,
//! `templateFillMap`, `measurements[].Method`/`Identifier`/`Params`, keys in
//! any case) and checked like any scenario; object templates are Go templates
//! too. What loadgen does not implement — a measurement method, a tuning-set
//! load, a step `module`, an object kind — is refused by name, with the file,
//! the place and what is supported, before anything runs.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};

use super::{invalid, param_value, Checker, Dialect, LoadOptions};
use crate::scenario::file;
use crate::scenario::{Scenario, ScenarioError};

/// Object kinds a CL2 config may create: loadgen knows their plural and scope.
pub const SUPPORTED_KINDS: &[&str] = &[
    "ConfigMap",
    "CronJob",
    "DaemonSet",
    "Deployment",
    "Endpoints",
    "Event",
    "Job",
    "Lease",
    "NetworkPolicy",
    "PersistentVolumeClaim",
    "Pod",
    "PriorityClass",
    "ReplicaSet",
    "Role",
    "RoleBinding",
    "Secret",
    "Service",
    "ServiceAccount",
    "StatefulSet",
];

/// Whether `text` reads as a CL2 config rather than loadgen's own format:
/// CL2's top-level `namespace:` key, a template variable (`{{$x := …}}`) or
/// one of CL2's helpers.
pub fn looks_like_cl2(text: &str) -> bool {
    text.lines().any(|l| {
        l.get(..10)
            .is_some_and(|p| p.eq_ignore_ascii_case("namespace:"))
    }) || text.contains("{{$")
        || [
            "DefaultParam",
            "MultiplyInt",
            "DivideInt",
            "AddInt",
            "SubtractInt",
        ]
        .iter()
        .any(|h| text.contains(h))
}

/// Refuses a kind loadgen cannot address without an `objectType`.
pub fn check_kind(kind: &str) -> Result<(), String> {
    if SUPPORTED_KINDS.contains(&kind) {
        return Ok(());
    }
    Err(format!(
        "object kind `{kind}` is not supported in ClusterLoader2 configs (supported: {})",
        SUPPORTED_KINDS.join(", ")
    ))
}

/// Reads, renders and checks the CL2 config at `path` (its text is `text`).
pub(super) fn load(path: &Path, text: &str, opts: &LoadOptions) -> Result<Scenario, ScenarioError> {
    let mapping = mapping(opts)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let env = crate::stages::template::Env {
        include_dir: Some(dir.to_path_buf()),
        ..Default::default()
    };
    let data = Value::Object(mapping.clone().into_iter().collect());
    let rendered = crate::stages::template::Template::parse(text)
        .map_err(|e| invalid(path, "(template)", e.to_string()))?
        .render(&data, &env)
        .map_err(|e| invalid(path, "(template)", e.to_string()))?;
    let raw: Value = serde_saphyr::from_str(&rendered)
        .map_err(|e| invalid(path, "(rendered config)", e.to_string()))?;
    let Value::Object(top) = raw else {
        return Err(invalid(path, "(top level)", "expected a mapping of fields"));
    };
    let translated = translate(top).map_err(|(p, reason)| invalid(path, &p, reason))?;
    let json = serde_json::to_string(&Value::Object(translated))
        .map_err(|e| invalid(path, "(rendered config)", e.to_string()))?;
    let mut parsed = file::parse(&json).map_err(|(p, reason)| invalid(path, &p, reason))?;
    parsed.params = mapping;
    Checker {
        file: path,
        dir,
        dialect: Dialect::Cl2,
    }
    .check(parsed)
}

/// CL2's template values: overrides files, then `CL2_*` variables, then `--param`.
fn mapping(opts: &LoadOptions) -> Result<BTreeMap<String, Value>, ScenarioError> {
    let mut m = BTreeMap::new();
    for file in &opts.overrides {
        let text = std::fs::read_to_string(file).map_err(|source| ScenarioError::Read {
            file: file.clone(),
            source,
        })?;
        let v: Value = serde_saphyr::from_str(&text)
            .map_err(|e| invalid(file, "(overrides)", e.to_string()))?;
        match v {
            Value::Object(o) => m.extend(o),
            Value::Null => {}
            _ => return Err(invalid(file, "(overrides)", "expected `key: value` lines")),
        }
    }
    for (k, v) in std::env::vars().filter(|(k, _)| k.starts_with("CL2_")) {
        m.entry(k).or_insert_with(|| unpack(&v));
    }
    for (k, v) in &opts.params {
        m.insert(k.clone(), param_value(v));
    }
    if let Some(n) = opts.nodes {
        m.entry("Nodes".to_string()).or_insert(Value::from(n));
    }
    Ok(m)
}

/// CL2's `unpackStringValue`: an integer, a float, a bool, else the string.
fn unpack(v: &str) -> Value {
    match v {
        "true" | "True" | "TRUE" => Value::Bool(true),
        "false" | "False" | "FALSE" => Value::Bool(false),
        _ => param_value(v),
    }
}

/// CL2's top level into loadgen's: `namespace: {number, prefix, …}` becomes
/// `namespaces: {count, basename}`; the rest is spelled alike.
fn translate(top: Map<String, Value>) -> Result<Map<String, Value>, (String, String)> {
    let mut out = Map::new();
    for (k, v) in top {
        if !k.eq_ignore_ascii_case("namespace") {
            out.insert(k, v);
            continue;
        }
        let Value::Object(ns) = v else {
            return Err(("namespace".into(), "expected {number, prefix}".into()));
        };
        let mut count = Value::from(0);
        let mut basename = None;
        for (nk, nv) in ns {
            let place = format!("namespace.{nk}");
            match nk.to_ascii_lowercase().as_str() {
                "number" => count = nv,
                "prefix" => basename = Some(nv),
                // loadgen always deletes what it created, and never deletes what it did not.
                "deleteautomanagednamespaces" | "deletestalenamespaces" if nv != Value::Bool(false) => {}
                "deleteautomanagednamespaces" => {
                    return Err((place, "false is not supported: loadgen always deletes the namespaces it created".into()))
                }
                "deletestalenamespaces" => {}
                "enableexistingnamespaces" if nv != Value::Bool(true) => {}
                _ => {
                    return Err((
                        place,
                        format!("`{nk}` is not supported (supported: number, prefix, deleteAutomanagedNamespaces, deleteStaleNamespaces, enableExistingNamespaces: false)"),
                    ))
                }
            }
        }
        let mut n = Map::new();
        n.insert("count".into(), count);
        if let Some(b) = basename {
            n.insert("basename".into(), b);
        }
        out.insert("namespaces".into(), Value::Object(n));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cl2_configs_are_recognised() {
        assert!(looks_like_cl2("name: x\nnamespace:\n  number: 3\n"));
        assert!(looks_like_cl2("{{$n := 3}}\nname: x\n"));
        assert!(!looks_like_cl2(
            "name: x\nnamespaces: 3\nparams: {Qps: 2}\n"
        ));
    }

    #[test]
    fn the_namespace_block_translates_and_unknown_settings_are_named() {
        let top: Map<String, Value> =
            serde_json::from_str(r#"{"name":"t","Namespace":{"Number":2,"Prefix":"cl2"}}"#)
                .expect("json");
        let out = translate(top).expect("translate");
        assert_eq!(
            out["namespaces"],
            serde_json::json!({"count": 2, "basename": "cl2"})
        );
        let top: Map<String, Value> =
            serde_json::from_str(r#"{"namespace":{"number":2,"sizeGB":1}}"#).expect("json");
        let (place, reason) = translate(top).expect_err("unknown");
        assert_eq!(place, "namespace.sizeGB");
        assert!(reason.contains("supported: number, prefix"), "{reason}");
        assert!(check_kind("Deployment").is_ok());
        let err = check_kind("VolumeSnapshot").expect_err("unknown kind");
        assert!(
            err.contains("`VolumeSnapshot` is not supported") && err.contains("Pod"),
            "{err}"
        );
    }
}
