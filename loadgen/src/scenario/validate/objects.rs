//! `objectBundle` phases: namespaces, tuning set, each object's template and type, and the
//! replicas and template each set has after the phase (one of the two changes per phase).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use serde_json::Value;

use super::{is_dns_label, plural, Checker, Dialect, ObjectPhase, ObjectSet, SetKey};
use crate::ops::Resource;
use crate::scenario::file::{self, PhaseFile};
use crate::scenario::template::{Context, ObjectTemplate, Template};
use crate::scenario::tuning::TuningSet;
use crate::scenario::ScenarioError;

impl Checker<'_> {
    pub(super) fn object_phase(
        &self,
        path: &str,
        p: &PhaseFile,
        params: &BTreeMap<String, Value>,
        namespaces: &[String],
        basename: &str,
        tuning: &BTreeMap<String, TuningSet>,
    ) -> Result<ObjectPhase, ScenarioError> {
        let Some(replicas) = p.replicas_per_namespace else {
            return Err(self.err(path, "an objectBundle phase needs `replicasPerNamespace`"));
        };
        let tuning = match &p.tuning_set {
            None => None,
            Some(t) => Some(tuning.get(t).cloned().ok_or_else(|| {
                let known: Vec<&str> = tuning.keys().map(String::as_str).collect();
                self.err(
                    &format!("{path}.tuningSet"),
                    format!(
                        "no tuning set named `{t}` (defined: {})",
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                )
            })?),
        };
        let ns = match (&p.namespace_range, &p.namespace_list) {
            (Some(_), Some(_)) => {
                return Err(self.err(
                    path,
                    "a phase has `namespaceRange` or `namespaceList`, not both",
                ))
            }
            // CL2: `[""]` is cluster scope; names are taken as written.
            (None, Some(list)) if list.iter().all(String::is_empty) => None,
            (None, Some(list)) => {
                for n in list {
                    if !is_dns_label(n) {
                        return Err(self.err(
                            &format!("{path}.namespaceList"),
                            format!("`{n}` is not a valid namespace name"),
                        ));
                    }
                }
                Some(list.clone())
            }
            (None, None) => None,
            (Some(r), None) => {
                let rpath = format!("{path}.namespaceRange");
                // Managed namespaces are numbered from 1; a named range (CL2's
                // `basename`) may start at 0.
                let lowest = u32::from(r.basename.is_none());
                if r.min < lowest || r.min > r.max {
                    return Err(self.err(
                        &rpath,
                        format!(
                            "needs {lowest} <= min <= max (min {}, max {})",
                            r.min, r.max
                        ),
                    ));
                }
                let base = r.basename.clone().unwrap_or_else(|| basename.to_string());
                if r.basename.is_none() && r.max as usize > namespaces.len() {
                    return Err(self.err(
                        &rpath,
                        format!(
                            "max {} is beyond the {} managed namespaces (`namespaces`)",
                            r.max,
                            namespaces.len()
                        ),
                    ));
                }
                Some(
                    (r.min..=r.max)
                        .map(|i| format!("{base}-{i}"))
                        .collect::<Vec<_>>(),
                )
            }
        };
        let mut bundle = Vec::new();
        for (k, o) in p.object_bundle.iter().enumerate() {
            let opath = format!("{path}.objectBundle[{k}]");
            bundle.push(self.object_set(&opath, o, params, ns.as_deref(), replicas)?);
        }
        Ok(ObjectPhase {
            namespaces: ns,
            replicas,
            tuning,
            bundle,
        })
    }

    fn object_set(
        &self,
        path: &str,
        o: &file::ObjectFile,
        params: &BTreeMap<String, Value>,
        ns: Option<&[String]>,
        replicas: u32,
    ) -> Result<ObjectSet, ScenarioError> {
        let tpath = format!("{path}.objectTemplatePath");
        if !is_dns_label(&format!("{}-0", o.basename)) {
            return Err(self.err(
                &format!("{path}.basename"),
                format!("`{}-N` is not a valid object name", o.basename),
            ));
        }
        // CL2 writes paths from the config's directory as `/modules/…`.
        let file = match self.dialect {
            Dialect::Cl2 => self
                .dir
                .join(o.object_template_path.trim_start_matches('/')),
            Dialect::Loadgen => self.dir.join(&o.object_template_path),
        };
        let text = std::fs::read_to_string(&file)
            .map_err(|e| self.err(&tpath, format!("{}: {e}", file.display())))?;
        let template = match self.dialect {
            Dialect::Loadgen => ObjectTemplate::Loadgen(
                Template::parse(&text, params)
                    .map_err(|e| self.err(&tpath, format!("{}: {e}", file.display())))?,
            ),
            Dialect::Cl2 => ObjectTemplate::Go {
                template: crate::stages::template::Template::parse(&text)
                    .map_err(|e| self.err(&tpath, format!("{}: {e}", file.display())))?,
                fill: o.template_fill_map.clone().unwrap_or_default(),
                basename: o.basename.clone(),
                dir: self.dir.to_path_buf(),
            },
        };
        if self.dialect == Dialect::Loadgen && o.template_fill_map.is_some() {
            return Err(self.err(
                &format!("{path}.templateFillMap"),
                "templateFillMap is for ClusterLoader2 configs; loadgen's templates read `params`",
            ));
        }
        let name = format!("{}-0", o.basename);
        let sample_ns = ns.and_then(|n| n.first()).map(String::as_str).unwrap_or("");
        // CL2 deletes (replicas 0) without rendering the template: it reads
        // the type from the raw text with every `{{ }}` removed, and so does this.
        let sample = if self.dialect == Dialect::Cl2 && replicas == 0 {
            Ok(strip_actions(&text))
        } else {
            template.render(
                &Context {
                    name: &name,
                    namespace: sample_ns,
                    n: 0,
                    params,
                },
                &mut rand::rng(),
            )
        }
        .map_err(|e| {
            self.err(
                &tpath,
                format!("{} (rendered for {name}): {e}", file.display()),
            )
        })?;
        let obj: Value = serde_saphyr::from_str(&sample).map_err(|e| {
            self.err(
                &tpath,
                format!(
                    "{} (rendered for {name}): not YAML or JSON: {e}",
                    file.display()
                ),
            )
        })?;
        if !obj.is_object() {
            return Err(self.err(
                &tpath,
                format!("{}: the object must be a mapping", file.display()),
            ));
        }
        let ty = o.object_type.clone().unwrap_or_default();
        let api_version = match (&ty.api_group, &ty.api_version) {
            (Some(g), Some(v)) if !g.is_empty() => format!("{g}/{v}"),
            (_, Some(v)) => v.clone(),
            _ => obj["apiVersion"].as_str().unwrap_or_default().to_string(),
        };
        let kind = ty
            .kind
            .clone()
            .or_else(|| obj["kind"].as_str().map(str::to_string))
            .unwrap_or_default();
        if api_version.is_empty() || kind.is_empty() {
            return Err(self.err(path, format!("the object's type is unknown: give objectType {{apiVersion, kind}} or write apiVersion and kind in {}", file.display())));
        }
        // A CL2 config cannot name a kind's URL (no objectType): only kinds
        // whose plural and scope loadgen knows are accepted.
        if self.dialect == Dialect::Cl2 && o.object_type.is_none() {
            super::cl2::check_kind(&kind)
                .map_err(|reason| self.err(&tpath, format!("{}: {reason}", file.display())))?;
        }
        let plural = ty.resource.clone().unwrap_or_else(|| plural(&kind));
        let resource: Resource = format!("{api_version}/{plural}")
            .parse()
            .map_err(|e: String| self.err(&format!("{path}.objectType"), e))?;
        match (ns.is_some(), resource.namespaced) {
            (false, true) => {
                return Err(self.err(
                    path,
                    format!("{plural} are namespaced: the phase needs a namespaceRange"),
                ))
            }
            (true, false) => {
                return Err(self.err(
                    path,
                    format!("{plural} are cluster-scoped: drop the phase's namespaceRange"),
                ))
            }
            _ => {}
        }
        Ok(ObjectSet {
            basename: o.basename.clone(),
            template_path: file,
            template,
            resource,
            api_version,
            kind,
        })
    }

    /// The replicas and template each set will have after this phase; refuses a
    /// phase that changes both, or two parallel phases on one set.
    pub(super) fn track(
        &self,
        path: &str,
        o: &ObjectPhase,
        sets: &mut HashMap<SetKey, (u32, PathBuf)>,
        touched: &mut BTreeSet<SetKey>,
    ) -> Result<(), ScenarioError> {
        let namespaces: Vec<String> = match &o.namespaces {
            Some(n) => n.clone(),
            None => vec![String::new()],
        };
        for ns in &namespaces {
            for set in &o.bundle {
                let key = (ns.clone(), set.key());
                if !touched.insert(key.clone()) {
                    return Err(self.err(path, format!("`{}` in {} is reconciled by two phases of one step (they run in parallel)", set.basename, shown_ns(ns))));
                }
                if let Some((before, tpl)) = sets.get(&key) {
                    if *before != o.replicas && *tpl != set.template_path {
                        return Err(self.err(path, format!(
                            "changes replicasPerNamespace ({before} → {}) and objectTemplatePath ({} → {}) of `{}` at once; change one per phase",
                            o.replicas,
                            tpl.display(),
                            set.template_path.display(),
                            set.basename
                        )));
                    }
                }
                if o.replicas == 0 {
                    sets.remove(&key);
                } else {
                    sets.insert(key, (o.replicas, set.template_path.clone()));
                }
            }
        }
        Ok(())
    }
}

fn shown_ns(ns: &str) -> String {
    if ns.is_empty() {
        "the cluster scope".into()
    } else {
        format!("namespace {ns}")
    }
}

/// The type of a template as CL2's `RawToObjects` reads it (every `{{ … }}` on
/// a line removed): its top-level `apiVersion` and `kind` lines only, since
/// both branches of an `if` are left in (a `containers:` twice, say).
fn strip_actions(text: &str) -> String {
    text.lines()
        .map(|l| match (l.find("{{"), l.rfind("}}")) {
            (Some(a), Some(b)) if b > a => format!("{}{}", &l[..a], &l[b + 2..]),
            _ => l.to_string(),
        })
        .filter(|l| l.starts_with("apiVersion:") || l.starts_with("kind:"))
        .collect::<Vec<_>>()
        .join("\n")
}
