//! The resources CustomResourceDefinitions add (`apiextensions.k8s.io`): a created CRD takes
//! one of [`MAX_CUSTOM`] store slots and serves its resource at each served version; a
//! deleted one gives the slot back (its objects are deleted first, by the API layer).
//!
//! Per server: two simulators in one process do not see each other's CRDs. The
//! [`ResourceDef`]s themselves are interned process-wide (they are `&'static`, as the
//! built-ins are), at most [`MAX_DEFS`] distinct ones; a CRD created and deleted again with
//! the same names reuses its definitions.

use super::ResourceDef;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex, RwLock};

/// Store slots reserved for custom resources: CRDs beyond it are refused (507).
pub const MAX_CUSTOM: usize = 64;
/// Distinct custom resource definitions a process interns.
const MAX_DEFS: usize = 4096;

/// One served version of a custom resource.
#[derive(Debug)]
pub struct CustomVersion {
    pub def: &'static ResourceDef,
    /// `schema.openAPIV3Schema`, if the version has one.
    pub schema: Option<Value>,
}

/// What one CRD serves.
#[derive(Debug)]
pub struct CustomResource {
    /// The CRD's name (`<plural>.<group>`).
    pub crd: String,
    pub group: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub versions: Vec<CustomVersion>,
    /// The version clients should use (the first served one).
    pub preferred: String,
    /// The version objects are stored at (`storage: true`).
    pub storage_version: String,
}

/// kube-apiserver's `storageVersionHash`: the first 8 bytes of SHA-256 of
/// `group/version/kind` (the storage version), base64.
fn storage_version_hash(group: &str, version: &str, kind: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    let sum = sha2::Sha256::digest(format!("{group}/{version}/{kind}").as_bytes());
    base64::engine::general_purpose::STANDARD.encode(&sum[..8])
}

impl CustomResource {
    /// The version's entries in its group version's `APIResourceList`.
    pub fn discovery(&self, version: &str) -> Vec<Value> {
        let Some(v) = self.versions.iter().find(|v| v.def.version == version) else {
            return Vec::new();
        };
        let d = v.def;
        // In the order kube-apiserver 1.20 lists a custom resource's verbs.
        let verbs = [
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "create",
            "update",
            "watch",
        ];
        let mut out = vec![
            json!({"name": d.name, "singularName": self.singular, "namespaced": d.namespaced,
            "kind": d.kind, "verbs": verbs, "shortNames": self.short_names, "categories": self.categories,
            "storageVersionHash": storage_version_hash(d.group, &self.storage_version, d.kind)}),
        ];
        for sub in &d.subresources {
            out.push(json!({"name": format!("{}/{sub}", d.name), "singularName": "", "namespaced": d.namespaced,
                "kind": d.kind, "verbs": ["get", "patch", "update"]}));
        }
        if let Some(e) = out[0].as_object_mut() {
            for k in ["shortNames", "categories"] {
                if e[k].as_array().is_some_and(|a| a.is_empty()) {
                    e.remove(k);
                }
            }
        }
        out
    }
}

/// Why a CRD cannot be served.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CustomError {
    #[error("spec.{0}: Required value")]
    Missing(&'static str),
    #[error("metadata.name: Invalid value: {0:?}: must be spec.names.plural+\".\"+spec.group")]
    Name(String),
    #[error("the simulator serves at most {MAX_CUSTOM} custom resources")]
    Full,
    #[error("the simulator interned {MAX_DEFS} custom resource definitions already")]
    TooManyDefinitions,
}

fn intern(def: ResourceDef) -> Result<&'static ResourceDef, CustomError> {
    static DEFS: Mutex<Vec<&'static ResourceDef>> = Mutex::new(Vec::new());
    let mut defs = DEFS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = defs.iter().find(|d| ***d == def) {
        return Ok(d);
    }
    if defs.len() >= MAX_DEFS {
        return Err(CustomError::TooManyDefinitions);
    }
    // Bounded by MAX_DEFS: these live as long as the process, as the built-ins do.
    let d: &'static ResourceDef = Box::leak(Box::new(def));
    defs.push(d);
    Ok(d)
}

pub(super) fn leak_str(s: &str) -> &'static str {
    static STRS: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut strs = STRS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(x) = strs.iter().find(|x| **x == s) {
        return x;
    }
    // Bounded with the definitions that use them (MAX_DEFS × a few names).
    let x: &'static str = Box::leak(s.to_string().into_boxed_str());
    strs.push(x);
    x
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(String::from))
        .collect()
}

/// The CRDs a server serves, by slot.
pub struct Registry {
    /// Index of the first custom slot in the store.
    first_slot: usize,
    slots: RwLock<Vec<Option<Arc<CustomResource>>>>,
}

impl Registry {
    pub fn new() -> Registry {
        Registry {
            first_slot: super::builtins().len(),
            slots: RwLock::new(vec![None; MAX_CUSTOM]),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Option<Arc<CustomResource>>>> {
        self.slots.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The custom resource a request names, and its schema.
    pub fn lookup(&self, group: &str, version: &str, name: &str) -> Option<Arc<CustomResource>> {
        self.read()
            .iter()
            .flatten()
            .find(|c| {
                c.group == group
                    && c.versions
                        .iter()
                        .any(|v| v.def.version == version && v.def.name == name)
            })
            .cloned()
    }

    /// Whether a CRD serves any resource in `group`/`version`.
    pub fn serves_group_version(&self, group: &str, version: &str) -> bool {
        self.read()
            .iter()
            .flatten()
            .any(|c| c.group == group && c.versions.iter().any(|v| v.def.version == version))
    }

    /// Every served custom resource.
    pub fn served(&self) -> Vec<Arc<CustomResource>> {
        self.read().iter().flatten().cloned().collect()
    }

    /// The custom resource in store slot `index`.
    pub fn by_index(&self, index: usize) -> Option<Arc<CustomResource>> {
        let i = index.checked_sub(self.first_slot)?;
        self.read().get(i).cloned().flatten()
    }

    /// Serves (or re-serves, after an update) what the CRD `crd` defines.
    pub fn install(&self, crd: &Value) -> Result<Arc<CustomResource>, CustomError> {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        let spec = &crd["spec"];
        let group = spec["group"]
            .as_str()
            .ok_or(CustomError::Missing("group"))?;
        let names = &spec["names"];
        let plural = names["plural"]
            .as_str()
            .ok_or(CustomError::Missing("names.plural"))?;
        let kind = names["kind"]
            .as_str()
            .ok_or(CustomError::Missing("names.kind"))?;
        if name != format!("{plural}.{group}") {
            return Err(CustomError::Name(name.to_string()));
        }
        let namespaced = spec["scope"].as_str() != Some("Cluster");
        let served: Vec<&Value> = spec["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v["served"].as_bool().unwrap_or(true))
            .collect();
        if served.is_empty() {
            return Err(CustomError::Missing("versions"));
        }
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        let slot = match slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|c| c.crd == name))
        {
            Some(i) => i,
            None => slots
                .iter()
                .position(Option::is_none)
                .ok_or(CustomError::Full)?,
        };
        let mut versions = Vec::new();
        for v in served {
            let version = v["name"]
                .as_str()
                .ok_or(CustomError::Missing("versions[].name"))?;
            let subresources = if v["subresources"]["status"].is_object() {
                vec!["status"]
            } else {
                Vec::new()
            };
            let def = intern(ResourceDef {
                name: leak_str(plural),
                kind: leak_str(kind),
                group: leak_str(group),
                version: leak_str(version),
                namespaced,
                verbs: super::builtin::FULL_VERBS.to_vec(),
                subresources,
                fields: Vec::new(),
                generation: true,
                index: self.first_slot + slot,
                etcd_dir: leak_str(&format!("{group}/{plural}")),
            })?;
            versions.push(CustomVersion {
                def,
                schema: v["schema"].get("openAPIV3Schema").cloned(),
            });
        }
        let c = Arc::new(CustomResource {
            crd: name.to_string(),
            group: group.to_string(),
            singular: names["singular"]
                .as_str()
                .map_or_else(|| kind.to_lowercase(), String::from),
            short_names: strs(&names["shortNames"]),
            categories: strs(&names["categories"]),
            preferred: versions[0].def.version.to_string(),
            storage_version: spec["versions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["storage"].as_bool() == Some(true))
                .and_then(|v| v["name"].as_str())
                .unwrap_or(versions[0].def.version)
                .to_string(),
            versions,
        });
        slots[slot] = Some(c.clone());
        Ok(c)
    }

    /// Stops serving the CRD `crd_name`; its slot's objects must already be gone.
    pub fn remove(&self, crd_name: &str) -> Option<Arc<CustomResource>> {
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        let s = slots
            .iter_mut()
            .find(|s| s.as_ref().is_some_and(|c| c.crd == crd_name))?;
        s.take()
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(plural: &str) -> Value {
        json!({"metadata": {"name": format!("{plural}.example.com")},
               "spec": {"group": "example.com", "scope": "Namespaced",
                        "names": {"plural": plural, "kind": "Widget", "shortNames": ["wd"]},
                        "versions": [{"name": "v1", "served": true, "storage": true,
                                      "subresources": {"status": {}},
                                      "schema": {"openAPIV3Schema": {"type": "object"}}}]}})
    }

    #[test]
    fn the_storage_version_hash_is_kube_apiservers() {
        // What kube-apiserver 1.20 served for this CRD (api/discovery of example.com/v1).
        assert_eq!(
            storage_version_hash("example.com", "v1", "Widget"),
            "gIwvi5rymmg="
        );
    }

    #[test]
    fn a_crd_takes_a_slot_and_gives_it_back() {
        let r = Registry::new();
        let c = r.install(&crd("widgets")).expect("installed");
        let def = c.versions[0].def;
        assert_eq!(def.index, super::super::builtins().len());
        assert_eq!(def.subresources, vec!["status"]);
        assert!(r.lookup("example.com", "v1", "widgets").is_some());
        assert!(r.serves_group_version("example.com", "v1"));
        // Re-installing (an update) keeps the slot; another CRD takes the next.
        assert_eq!(
            r.install(&crd("widgets")).map(|c| c.versions[0].def.index),
            Ok(def.index)
        );
        let g = r.install(&crd("gadgets")).expect("installed");
        assert_eq!(g.versions[0].def.index, def.index + 1);
        assert!(r.remove("widgets.example.com").is_some());
        assert!(r.lookup("example.com", "v1", "widgets").is_none());
        assert_eq!(
            r.install(&crd("sprockets"))
                .map(|c| c.versions[0].def.index),
            Ok(def.index)
        );
        let mut bad = crd("widgets");
        bad["metadata"]["name"] = "wrong".into();
        assert_eq!(
            r.install(&bad).err(),
            Some(CustomError::Name("wrong".into()))
        );
    }
}
