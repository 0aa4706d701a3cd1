//! Everything checked before anything runs: the file's fields, tuning sets
//! that exist, templates that parse, phases that change replicas *or* a
//! template (never both), measurements started once and gathered, phase flags
//! that parse. Each refusal names the file, the path and the reason.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::file::{self, DurationText, PhaseFile, ScenarioFile};
use super::template::{Context, Template};
use super::tuning::TuningSet;
use super::ScenarioError;
use crate::ops::Resource;

mod model;
mod sets;

pub use model::*;

/// Reads, parses and checks `path`; `overrides` (`--param K=V`) replace the file's params.
pub fn load(path: &Path, overrides: &[(String, String)]) -> Result<Scenario, ScenarioError> {
    let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
        file: path.to_path_buf(),
        source,
    })?;
    // The file is itself a template over its params (as ClusterLoader2's
    // configs are): read the params from a skeleton with every `{{ }}` blanked,
    // apply the overrides, then render the file and read it for real.
    let skeleton =
        file::parse(&blank_expressions(&text)).map_err(|(p, reason)| invalid(path, &p, reason))?;
    let mut params = skeleton.params;
    for (k, v) in overrides {
        params.insert(k.clone(), param_value(v));
    }
    let rendered = Template::parse(&text, &params)
        .map_err(|e| invalid(path, "(template)", e.to_string()))?
        .render(
            &Context {
                name: "",
                namespace: "",
                n: 0,
                params: &params,
            },
            &mut rand::rng(),
        );
    let mut parsed = file::parse(&rendered).map_err(|(p, reason)| invalid(path, &p, reason))?;
    parsed.params = params;
    Checker {
        file: path,
        dir: path.parent().unwrap_or(Path::new(".")),
    }
    .check(parsed)
}

/// `text` with every `{{ … }}` replaced by `0`, so its params can be read first.
fn blank_expressions(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        match rest[open..].find("}}") {
            Some(close) => {
                out.push('0');
                rest = &rest[open + close + 2..];
            }
            None => {
                rest = &rest[open..];
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

fn invalid(file: &Path, path: &str, reason: impl Into<String>) -> ScenarioError {
    ScenarioError::Invalid {
        file: file.to_path_buf(),
        path: path.to_string(),
        reason: reason.into(),
    }
}

/// A parameter value from `--param K=V`: a number if it reads as one, else a string.
pub fn param_value(v: &str) -> Value {
    if let Ok(i) = v.parse::<u64>() {
        return Value::from(i);
    }
    if let Ok(f) = v.parse::<f64>() {
        if let Some(n) = serde_json::Number::from_f64(f) {
            return Value::Number(n);
        }
    }
    Value::String(v.to_string())
}

/// The lower-case plural of a kind, as the API names it (`Pod` → `pods`,
/// `Ingress` → `ingresses`, `NetworkPolicy` → `networkpolicies`).
pub fn plural(kind: &str) -> String {
    let k = kind.to_ascii_lowercase();
    if k.ends_with('s') || k.ends_with('x') || k.ends_with("ch") || k.ends_with("sh") {
        format!("{k}es")
    } else if let Some(stem) = k
        .strip_suffix('y')
        .filter(|s| !s.ends_with(['a', 'e', 'i', 'o', 'u']))
    {
        format!("{stem}ies")
    } else {
        format!("{k}s")
    }
}

/// Flags a phase may not set: `loadgen run` and the phase's `duration` own them.
const RESERVED_FLAGS: &[&str] = &[
    "--server",
    "--kubeconfig",
    "--context",
    "--token",
    "--certificate-authority",
    "--client-certificate",
    "--client-key",
    "--insecure-skip-tls-verify",
    "--output",
    "--duration",
    "--dry-run",
    "--shard",
    "--metrics-listen",
];

struct Checker<'a> {
    file: &'a Path,
    dir: &'a Path,
}

/// One replicated set across steps: (namespace or "", basename).
type SetKey = (String, String);

impl Checker<'_> {
    fn err(&self, path: &str, reason: impl Into<String>) -> ScenarioError {
        invalid(self.file, path, reason)
    }

    fn duration(&self, path: &str, d: &DurationText) -> Result<Duration, ScenarioError> {
        d.parse().map_err(|r| self.err(path, r))
    }

    fn check(&self, f: ScenarioFile) -> Result<Scenario, ScenarioError> {
        let name = f.name.clone().unwrap_or_else(|| {
            self.file
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "scenario".into())
        });
        let params = f.params.clone();
        let (count, basename) = match &f.namespaces {
            Some(n) => (n.count, n.basename.clone()),
            None => (0, None),
        };
        let basename = basename.unwrap_or_else(|| default_basename(&name));
        if count > 0 && !is_dns_label(&format!("{basename}-{count}")) {
            return Err(self.err(
                "namespaces.basename",
                format!("`{basename}-N` is not a valid namespace name (lower-case letters, digits and `-`, at most 63 characters)"),
            ));
        }
        let namespaces: Vec<String> = (1..=count).map(|i| format!("{basename}-{i}")).collect();

        let mut tuning = BTreeMap::new();
        for (i, t) in f.tuning_sets.iter().enumerate() {
            let path = format!("tuningSets[{i}]");
            let set = self.tuning_set(&path, t)?;
            if tuning.insert(set.name.clone(), set).is_some() {
                return Err(self.err(&path, format!("tuning set `{}` is defined twice", t.name)));
            }
        }

        if f.steps.is_empty() {
            return Err(self.err("steps", "a scenario needs at least one step"));
        }
        let mut sets: HashMap<SetKey, (u32, PathBuf)> = HashMap::new();
        let mut started: BTreeMap<(Method, String), String> = BTreeMap::new();
        let mut steps = Vec::new();
        for (i, s) in f.steps.iter().enumerate() {
            let path = format!("steps[{i}]");
            let name = s.name.clone().unwrap_or_else(|| format!("step-{i}"));
            let body = match (s.phases.is_empty(), s.measurements.is_empty()) {
                (false, true) => {
                    let mut phases = Vec::new();
                    let mut touched: BTreeSet<SetKey> = BTreeSet::new();
                    for (j, p) in s.phases.iter().enumerate() {
                        let path = format!("{path}.phases[{j}]");
                        let phase = self.phase(&path, j, p, &params, &namespaces, &basename, &tuning)?;
                        if let PhaseKind::Objects(o) = &phase.kind {
                            self.track(&path, o, &mut sets, &mut touched)?;
                        }
                        phases.push(phase);
                    }
                    StepBody::Phases(phases)
                }
                (true, false) => {
                    let mut ms = Vec::new();
                    for (j, m) in s.measurements.iter().enumerate() {
                        let path = format!("{path}.measurements[{j}]");
                        let m = self.measurement(&path, m)?;
                        let key = (m.method, m.identifier.clone());
                        match m.action {
                            Action::Start => {
                                if let Some(at) = started.insert(key, path.clone()) {
                                    return Err(self.err(&path, format!("{:?} `{}` is already started at {at}", m.method, m.identifier)));
                                }
                            }
                            Action::Gather => {
                                if started.remove(&key).is_none() {
                                    return Err(self.err(&path, format!("{:?} `{}` is gathered but was not started in an earlier step", m.method, m.identifier)));
                                }
                            }
                        }
                        ms.push(m);
                    }
                    StepBody::Measurements(ms)
                }
                (true, true) => return Err(self.err(&path, "a step needs `phases` or `measurements`")),
                (false, false) => {
                    return Err(self.err(
                        &path,
                        "a step has either `phases` or `measurements`, not both (measurements are started and gathered in steps of their own, around the phases they measure)",
                    ))
                }
            };
            steps.push(Step { name, body });
        }
        if let Some(((method, id), at)) = started.into_iter().next() {
            return Err(self.err(
                &at,
                format!("{method:?} `{id}` is started but never gathered"),
            ));
        }
        Ok(Scenario {
            name,
            file: self.file.to_path_buf(),
            params,
            namespaces,
            steps,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn phase(
        &self,
        path: &str,
        index: usize,
        p: &PhaseFile,
        params: &BTreeMap<String, Value>,
        namespaces: &[String],
        basename: &str,
        tuning: &BTreeMap<String, TuningSet>,
    ) -> Result<Phase, ScenarioError> {
        let objects = !p.object_bundle.is_empty();
        let kinds =
            usize::from(objects) + usize::from(p.loadgen.is_some()) + usize::from(p.etcd.is_some());
        if kinds != 1 {
            return Err(self.err(
                path,
                "a phase has exactly one of `objectBundle`, `loadgen` or `etcd`",
            ));
        }
        let name = p.name.clone().unwrap_or_else(|| format!("phase-{index}"));
        if objects {
            for field in [("duration", p.duration.is_some())] {
                if field.1 {
                    return Err(self.err(&format!("{path}.{}", field.0), "an objectBundle phase ends when its objects are reconciled; `duration` is for loadgen and etcd phases"));
                }
            }
            let o = self.object_phase(path, p, params, namespaces, basename, tuning)?;
            return Ok(Phase {
                name,
                kind: PhaseKind::Objects(o),
            });
        }
        self.flag_phase(path, p, params, namespaces, name)
    }

    /// A `loadgen:` or `etcd:` phase: its flags rendered, split as a shell
    /// would, and checked as the command would check them.
    fn flag_phase(
        &self,
        path: &str,
        p: &PhaseFile,
        params: &BTreeMap<String, Value>,
        namespaces: &[String],
        name: String,
    ) -> Result<Phase, ScenarioError> {
        for (field, set) in [
            ("namespaceRange", p.namespace_range.is_some()),
            ("replicasPerNamespace", p.replicas_per_namespace.is_some()),
            ("tuningSet", p.tuning_set.is_some()),
        ] {
            if set {
                return Err(self.err(
                    &format!("{path}.{field}"),
                    "only an objectBundle phase takes this",
                ));
            }
        }
        let Some(duration) = &p.duration else {
            return Err(self.err(path, "a loadgen or etcd phase needs `duration`"));
        };
        let duration = self.duration(&format!("{path}.duration"), duration)?;
        let (field, flags) = match (&p.loadgen, &p.etcd) {
            (Some(l), _) => ("loadgen", l),
            (_, Some(e)) => ("etcd", e),
            _ => unreachable!("exactly one kind was checked above"),
        };
        let fpath = format!("{path}.{field}");
        let rendered = Template::parse(flags, params)
            .map_err(|e| self.err(&fpath, e.reason))?
            .render(
                &Context {
                    name: "",
                    namespace: "",
                    n: 0,
                    params,
                },
                &mut rand::rng(),
            );
        let mut args =
            shlex::split(&rendered).ok_or_else(|| self.err(&fpath, "unbalanced quotes"))?;
        if let Some(flag) = args.iter().find(|a| {
            RESERVED_FLAGS
                .iter()
                .any(|r| a.as_str() == *r || a.starts_with(&format!("{r}=")))
        }) {
            return Err(self.err(
                &fpath,
                format!(
                    "{flag} is set by `loadgen run` (target, output) or by the phase's `duration`"
                ),
            ));
        }
        let secs = format!("{}s", duration.as_secs_f64());
        if field == "etcd" {
            args.splice(0..0, ["--duration".to_string(), secs]);
            super::etcd_phase::check(&args).map_err(|r| self.err(&fpath, r))?;
            return Ok(Phase {
                name,
                kind: PhaseKind::Etcd(args),
            });
        }
        let has_ns = args
            .iter()
            .any(|a| a == "-n" || a == "--namespace" || a.starts_with("--namespace="));
        let mut argv = vec![
            "loadgen".to_string(),
            "--no-progress".into(),
            "--duration".into(),
            secs,
        ];
        if !has_ns {
            if let Some(first) = namespaces.first() {
                argv.extend(["--namespace".to_string(), first.clone()]);
            }
        }
        argv.extend(args);
        let cli = <crate::cli::Cli as clap::Parser>::try_parse_from(&argv)
            .map_err(|e| self.err(&fpath, e.render().to_string().trim().to_string()))?;
        if cli.command.is_some() {
            return Err(self.err(&fpath, "run flags only, not a subcommand"));
        }
        let config = cli
            .into_config()
            .map_err(|e| self.err(&fpath, e.to_string()))?;
        Ok(Phase {
            name,
            kind: PhaseKind::Load(Box::new(config)),
        })
    }

    fn object_phase(
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
        let ns = match &p.namespace_range {
            None => None,
            Some(r) => {
                let rpath = format!("{path}.namespaceRange");
                if r.min == 0 || r.min > r.max {
                    return Err(self.err(
                        &rpath,
                        format!("needs 1 <= min <= max (min {}, max {})", r.min, r.max),
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
            bundle.push(self.object_set(&opath, o, params, ns.as_deref())?);
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
    ) -> Result<ObjectSet, ScenarioError> {
        let tpath = format!("{path}.objectTemplatePath");
        if !is_dns_label(&format!("{}-0", o.basename)) {
            return Err(self.err(
                &format!("{path}.basename"),
                format!("`{}-N` is not a valid object name", o.basename),
            ));
        }
        let file = self.dir.join(&o.object_template_path);
        let text = std::fs::read_to_string(&file)
            .map_err(|e| self.err(&tpath, format!("{}: {e}", file.display())))?;
        let template = Template::parse(&text, params)
            .map_err(|e| self.err(&tpath, format!("{}: {e}", file.display())))?;
        let name = format!("{}-0", o.basename);
        let sample_ns = ns.and_then(|n| n.first()).map(String::as_str).unwrap_or("");
        let sample = template.render(
            &Context {
                name: &name,
                namespace: sample_ns,
                n: 0,
                params,
            },
            &mut rand::rng(),
        );
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
    fn track(
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
                let key = (ns.clone(), set.basename.clone());
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

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// `loadgen-<name>`, made a valid namespace prefix.
fn default_basename(name: &str) -> String {
    let mut b: String = format!("loadgen-{name}")
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    b.truncate(50);
    b.trim_end_matches('-').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plurals() {
        assert_eq!(plural("Pod"), "pods");
        assert_eq!(plural("ConfigMap"), "configmaps");
        assert_eq!(plural("Ingress"), "ingresses");
        assert_eq!(plural("NetworkPolicy"), "networkpolicies");
        assert_eq!(plural("Gateway"), "gateways");
        assert_eq!(default_basename("Tess.IO lists"), "loadgen-tess-io-lists");
    }
}
