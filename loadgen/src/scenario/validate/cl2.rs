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
    "ClusterRole",
    "ClusterRoleBinding",
    "ConfigMap",
    "CronJob",
    "DaemonSet",
    "Deployment",
    "Endpoints",
    "Event",
    "HorizontalPodAutoscaler",
    "Ingress",
    "Job",
    "Lease",
    "Namespace",
    "NetworkPolicy",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "Pod",
    "PodDisruptionBudget",
    "PriorityClass",
    "ReplicaSet",
    "ReplicationController",
    "ResourceClaim",
    "ResourceClaimTemplate",
    "Role",
    "RoleBinding",
    "Secret",
    "Service",
    "ServiceAccount",
    "StatefulSet",
    "StorageClass",
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
    let raw = render_yaml(path, text, dir, &mapping)?;
    let Value::Object(mut top) = raw else {
        return Err(invalid(path, "(top level)", "expected a mapping of fields"));
    };
    // Module steps, spliced in where they stand (CL2's flattenModuleSteps).
    if let Some((key, steps)) = take_key(&mut top, "steps") {
        let steps = flatten_modules(path, dir, &mapping, steps, "steps", 0)?;
        top.insert(key, steps);
    }
    let (translated, skipped) = translate(top).map_err(|(p, reason)| invalid(path, &p, reason))?;
    let json = serde_json::to_string(&Value::Object(translated))
        .map_err(|e| invalid(path, "(rendered config)", e.to_string()))?;
    let mut parsed = file::parse(&json).map_err(|(p, reason)| invalid(path, &p, reason))?;
    parsed.params = mapping;
    let mut scenario = Checker {
        file: path,
        dir,
        dialect: Dialect::Cl2,
    }
    .check(parsed)?;
    let mut all = skipped;
    all.append(&mut scenario.skipped);
    scenario.skipped = all;
    Ok(scenario)
}

/// `text` rendered as a Go template over `mapping`, read as YAML.
fn render_yaml(
    file: &Path,
    text: &str,
    dir: &Path,
    mapping: &BTreeMap<String, Value>,
) -> Result<Value, ScenarioError> {
    let env = crate::stages::template::Env {
        include_dir: Some(dir.to_path_buf()),
        ..Default::default()
    };
    let data = Value::Object(mapping.clone().into_iter().collect());
    let rendered = crate::stages::template::Template::parse(text)
        .map_err(|e| invalid(file, "(template)", e.to_string()))?
        .render(&data, &env)
        .map_err(|e| invalid(file, "(template)", e.to_string()))?;
    serde_saphyr::from_str(&rendered).map_err(|e| invalid(file, "(rendered config)", e.to_string()))
}

/// Removes `name` (any case) from `m`: the key as written and its value.
fn take_key(m: &mut Map<String, Value>, name: &str) -> Option<(String, Value)> {
    let key = m.keys().find(|k| k.eq_ignore_ascii_case(name))?.clone();
    m.remove(&key).map(|v| (key, v))
}

/// CL2 nests modules at most this deep; a module that includes itself stops here.
const MAX_MODULE_DEPTH: usize = 16;

/// `steps` with every `module: {path, params}` step replaced by the module's
/// own steps, rendered over the config's mapping plus the module's params
/// (paths from the config's directory, as CL2 reads them).
fn flatten_modules(
    file: &Path,
    dir: &Path,
    mapping: &BTreeMap<String, Value>,
    steps: Value,
    at: &str,
    depth: usize,
) -> Result<Value, ScenarioError> {
    let Value::Array(steps) = steps else {
        return Ok(steps);
    };
    let mut out = Vec::new();
    for (i, step) in steps.into_iter().enumerate() {
        let place = format!("{at}[{i}]");
        let Value::Object(mut step) = step else {
            out.push(step);
            continue;
        };
        let Some((_, module)) = take_key(&mut step, "module") else {
            out.push(Value::Object(step));
            continue;
        };
        let Value::Object(mut module) = module else {
            return Err(invalid(
                file,
                &format!("{place}.module"),
                "expected {path, params}",
            ));
        };
        let mpath = match take_key(&mut module, "path") {
            Some((_, Value::String(p))) => p,
            _ => {
                return Err(invalid(
                    file,
                    &format!("{place}.module.path"),
                    "a module needs `path`",
                ))
            }
        };
        if depth >= MAX_MODULE_DEPTH {
            return Err(invalid(file, &format!("{place}.module"), format!("modules nested deeper than {MAX_MODULE_DEPTH} (does `{mpath}` include itself?)")));
        }
        let mut m = mapping.clone();
        if let Some((_, Value::Object(params))) = take_key(&mut module, "params") {
            m.extend(params);
        }
        let mfile = dir.join(mpath.trim_start_matches('/'));
        let text = std::fs::read_to_string(&mfile).map_err(|e| {
            invalid(
                file,
                &format!("{place}.module.path"),
                format!("{}: {e}", mfile.display()),
            )
        })?;
        let mut body = match render_yaml(&mfile, &text, dir, &m)? {
            Value::Object(body) => body,
            // A module whose steps are all behind a false `if` renders to nothing.
            Value::Null => continue,
            _ => {
                return Err(invalid(
                    &mfile,
                    "(top level)",
                    "a module is a mapping with `steps`",
                ))
            }
        };
        let Some((_, msteps)) = take_key(&mut body, "steps") else {
            continue;
        };
        let flat = flatten_modules(&mfile, dir, &m, msteps, "steps", depth + 1)?;
        if let Value::Array(v) = flat {
            out.extend(v);
        }
    }
    Ok(Value::Array(out))
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
    // As CL2's MergeMappings: a CL2_* variable that an overrides file also
    // sets must agree with it.
    for (k, v) in std::env::vars().filter(|(k, _)| k.starts_with("CL2_")) {
        let v = unpack(&v);
        match m.get(&k) {
            Some(old) if *old != v => {
                return Err(invalid(
                    Path::new(&k),
                    "(environment)",
                    format!(
                        "merge conflict: the overrides set {k} to {old}, the environment to {v}"
                    ),
                ))
            }
            _ => {
                m.insert(k, v);
            }
        }
    }
    for (k, v) in &opts.params {
        m.insert(k.clone(), param_value(v));
    }
    if let Some(n) = opts.nodes {
        m.entry("Nodes".to_string()).or_insert(Value::from(n));
    }
    // CL2's own value (its --registry-k8s-repo flag, env REGISTRY_K8S_REPO).
    m.entry("ImageRegistry".to_string()).or_insert_with(|| {
        Value::String(
            std::env::var("REGISTRY_K8S_REPO").unwrap_or_else(|_| "registry.k8s.io".into()),
        )
    });
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
/// `namespaces: {count, basename}` (CL2's default: one namespace); the parts
/// loadgen accepts without running them (`dependencies`, a `chaosMonkey`
/// that fails nodes, namespace options it has no use for) are returned as
/// skipped, named.
#[allow(clippy::type_complexity)]
fn translate(
    top: Map<String, Value>,
) -> Result<(Map<String, Value>, Vec<String>), (String, String)> {
    let mut out = Map::new();
    let mut skipped = Vec::new();
    let mut count = Value::from(1);
    let mut basename = None;
    let mut automanaged = None;
    for (k, v) in top {
        match k.to_ascii_lowercase().as_str() {
            "namespace" => {
                let Value::Object(ns) = v else {
                    return Err(("namespace".into(), "expected {number, prefix, …}".into()));
                };
                for (nk, nv) in ns {
                    let place = format!("namespace.{nk}");
                    match nk.to_ascii_lowercase().as_str() {
                        "number" => count = nv,
                        "prefix" => basename = Some(nv),
                        // loadgen always deletes the namespaces it created and
                        // never deletes ones it did not: these change nothing.
                        "deleteautomanagednamespaces" | "deletestalenamespaces" | "enableexistingnamespaces" | "deletenamespacetimeout" => {
                            if nk.eq_ignore_ascii_case("deleteAutomanagedNamespaces") && nv == Value::Bool(false) {
                                skipped.push(format!("{place}: false (loadgen deletes the namespaces it created)"));
                            } else if nk.eq_ignore_ascii_case("deleteStaleNamespaces") && nv == Value::Bool(true) {
                                skipped.push(format!("{place}: true (loadgen deletes only namespaces of its own run)"));
                            } else if nk.eq_ignore_ascii_case("enableExistingNamespaces") && nv == Value::Bool(true) {
                                skipped.push(format!("{place}: true (loadgen adopts an existing namespace only if it carries loadgen's label)"));
                            } else if nk.eq_ignore_ascii_case("deleteNamespaceTimeout") {
                                skipped.push(format!("{place}: {nv} (loadgen does not wait for namespace deletion to finish)"));
                            }
                        }
                        _ => {
                            return Err((
                                place,
                                format!("`{nk}` is not a ClusterLoader2 namespace setting (number, prefix, deleteStaleNamespaces, deleteAutomanagedNamespaces, enableExistingNamespaces, deleteNamespaceTimeout)"),
                            ))
                        }
                    }
                }
            }
            "automanagednamespaces" => automanaged = Some(v),
            "dependencies" => {
                for d in v.as_array().into_iter().flatten() {
                    let field = |n: &str| {
                        d.as_object()
                            .and_then(|o| o.iter().find(|(k, _)| k.eq_ignore_ascii_case(n)))
                            .and_then(|(_, v)| v.as_str())
                            .unwrap_or("")
                            .to_string()
                    };
                    skipped.push(format!(
                        "dependency {} `{}`",
                        field("method"),
                        field("name")
                    ));
                }
            }
            "chaosmonkey" => {
                let failing = v
                    .as_object()
                    .and_then(|o| {
                        o.iter()
                            .find(|(k, _)| k.eq_ignore_ascii_case("nodeFailure"))
                    })
                    .is_some_and(|(_, f)| !f.is_null());
                if failing {
                    skipped.push("chaosMonkey.nodeFailure (loadgen fails no nodes)".into());
                }
            }
            _ => {
                out.insert(k, v);
            }
        }
    }
    // CL2's SetDefaults: the old `automanagedNamespaces` wins over a default `number: 1`.
    if let Some(a) = automanaged.filter(|a| a.as_u64().unwrap_or(0) > 1) {
        if count.as_u64() == Some(1) {
            count = a;
        }
    }
    if count.as_u64() == Some(0) {
        count = Value::from(1);
    }
    let mut n = Map::new();
    n.insert("count".into(), count);
    if let Some(b) = basename {
        n.insert("basename".into(), b);
    }
    out.insert("namespaces".into(), Value::Object(n));
    Ok((out, skipped))
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
        let (out, skipped) = translate(top).expect("translate");
        assert_eq!(
            out["namespaces"],
            serde_json::json!({"count": 2, "basename": "cl2"})
        );
        assert!(skipped.is_empty());
        let top: Map<String, Value> =
            serde_json::from_str(r#"{"namespace":{"number":2,"sizeGB":1}}"#).expect("json");
        let (place, reason) = translate(top).expect_err("unknown");
        assert_eq!(place, "namespace.sizeGB");
        assert!(reason.contains("(number, prefix"), "{reason}");
        let top: Map<String, Value> = serde_json::from_str(
            r#"{"namespace":{"deleteNamespaceTimeout":"20m"},"dependencies":[{"name":"d","Method":"DRATestDriver"}],"chaosMonkey":{"nodeFailure":{"failureRate":0.1}}}"#,
        )
        .expect("json");
        let (out, skipped) = translate(top).expect("accepted");
        assert_eq!(
            out["namespaces"],
            serde_json::json!({"count": 1}),
            "CL2's default"
        );
        assert_eq!(skipped.len(), 3, "{skipped:?}");
        assert!(
            skipped[1].contains("DRATestDriver `d`")
                || skipped.iter().any(|s| s.contains("DRATestDriver `d`")),
            "{skipped:?}"
        );
        assert!(check_kind("Deployment").is_ok());
        let err = check_kind("VolumeSnapshot").expect_err("unknown kind");
        assert!(
            err.contains("`VolumeSnapshot` is not supported") && err.contains("Pod"),
            "{err}"
        );
    }
}
