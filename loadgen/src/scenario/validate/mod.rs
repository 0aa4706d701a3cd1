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

mod cl2;
mod flags;
mod model;
mod objects;
mod sets;

pub use cl2::{looks_like_cl2, SUPPORTED_KINDS};
pub use model::*;

/// Which template language a scenario's files are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// loadgen's own scenario files (`{{N}}`, `{{RAND%3}}`, `{{.Param}}`).
    Loadgen,
    /// ClusterLoader2 configs: Go templates with CL2's helpers.
    Cl2,
}

/// How to read a scenario file (`loadgen run`'s flags).
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// `--param K=V`: the file's params (loadgen) or template values (CL2).
    pub params: Vec<(String, String)>,
    /// `--testoverrides FILE`: CL2's overrides (YAML `key: value`), merged in order.
    pub overrides: Vec<PathBuf>,
    /// `None`: CL2 if overrides are given or the file looks like a CL2 config.
    pub dialect: Option<Dialect>,
    /// CL2's `.Nodes` when neither the overrides nor `--param` give it: the
    /// cluster's schedulable nodes ([`crate::scenario::cluster_size`]).
    pub nodes: Option<u64>,
}

/// The format `opts` ask for, or the one `text` is written in.
pub fn dialect_of(text: &str, opts: &LoadOptions) -> Dialect {
    opts.dialect
        .unwrap_or(if !opts.overrides.is_empty() || looks_like_cl2(text) {
            Dialect::Cl2
        } else {
            Dialect::Loadgen
        })
}

/// Reads, parses and checks `path` as `opts` say (loadgen's format or CL2's).
pub fn load_with(path: &Path, opts: &LoadOptions) -> Result<Scenario, ScenarioError> {
    let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
        file: path.to_path_buf(),
        source,
    })?;
    let dialect = dialect_of(&text, opts);
    match dialect {
        Dialect::Loadgen if !opts.overrides.is_empty() => Err(invalid(
            path,
            "(flags)",
            "--testoverrides is for ClusterLoader2 configs; use --param with loadgen's format",
        )),
        Dialect::Loadgen => load(path, &opts.params),
        Dialect::Cl2 => cl2::load(path, &text, opts),
    }
}

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
        dialect: Dialect::Loadgen,
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
    if k == "endpoints" {
        return k;
    }
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

struct Checker<'a> {
    file: &'a Path,
    dir: &'a Path,
    dialect: Dialect,
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
        let mut skipped = Vec::new();
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
                        for m in self.measurements(&path, m)? {
                            self.pair(&path, &m, &mut started)?;
                            if m.method == Method::Skipped {
                                skipped.push(format!(
                                    "measurement {} `{}` at {path}",
                                    m.method_as_written, m.identifier
                                ));
                            }
                            if m.method == Method::TestMetrics && m.action == Action::Start {
                                let parts: Vec<&str> = crate::scenario::test_metrics::TEST_METRICS_SKIPPED
                                    .iter()
                                    .map(|(part, _)| *part)
                                    .collect();
                                skipped.push(format!(
                                    "measurement {} `{}` at {path}: its parts {} (not measurable from outside; ResourceUsageSummary runs, and EtcdMetrics and SchedulingMetrics where etcd's and kube-scheduler's /metrics are sampled)",
                                    m.method_as_written,
                                    m.identifier,
                                    parts.join(", ")
                                ));
                            }
                            ms.push(m);
                        }
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
        // CL2 lets a measurement end with the test (its results are
        // gathered then); loadgen's format asks for the gather.
        if let Some(((method, id), at)) = started
            .into_iter()
            .find(|_| self.dialect == Dialect::Loadgen)
        {
            return Err(self.err(
                &at,
                format!("{method:?} `{id}` is started but never gathered"),
            ));
        }
        Ok(Scenario {
            name,
            skipped,
            file: self.file.to_path_buf(),
            params,
            namespaces,
            steps,
        })
    }

    /// Checks a start has no running twin and a gather has a start before it.
    /// CL2 gathers WaitForControlledPodsRunning again after every phase that
    /// changes the controllers: its gather leaves it started.
    fn pair(
        &self,
        path: &str,
        m: &MeasurementAction,
        started: &mut BTreeMap<(Method, String), String>,
    ) -> Result<(), ScenarioError> {
        let key = (m.method, m.identifier.clone());
        match m.action {
            Action::Run => {}
            // CL2: starting a running WaitForControlledPodsRunning does nothing.
            Action::Start if m.method == Method::WaitForControlledPodsRunning => {
                started.entry(key).or_insert_with(|| path.to_string());
            }
            Action::Start => {
                if let Some(at) = started.insert(key, path.to_string()) {
                    return Err(self.err(
                        path,
                        format!(
                            "{} `{}` is already started at {at}",
                            m.method_as_written, m.identifier
                        ),
                    ));
                }
            }
            Action::Gather if m.method == Method::WaitForControlledPodsRunning => {
                if !started.contains_key(&key) {
                    return Err(self.err(
                        path,
                        format!(
                            "{} `{}` is gathered but was not started in an earlier step",
                            m.method_as_written, m.identifier
                        ),
                    ));
                }
            }
            Action::Gather => {
                if started.remove(&key).is_none() {
                    return Err(self.err(
                        path,
                        format!(
                            "{} `{}` is gathered but was not started in an earlier step",
                            m.method_as_written, m.identifier
                        ),
                    ));
                }
            }
        }
        let needs = |what: &str| {
            Err(self.err(path, format!("{} needs params.{what}", m.method_as_written)))
        };
        match (m.method, m.action) {
            (Method::WaitForControlledPodsRunning, Action::Start) if m.cl2.kind.is_none() => {
                needs("kind")
            }
            (Method::WaitForRunningPods, _) if m.cl2.desired_pod_count.is_none() => {
                needs("desiredPodCount")
            }
            (Method::Sleep, _) if m.cl2.duration.is_none() => needs("duration"),
            _ => Ok(()),
        }
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
        assert_eq!(plural("Endpoints"), "endpoints");
        assert_eq!(default_basename("Tess.IO lists"), "loadgen-tess-io-lists");
    }

    const USAGE_CONFIG: &str = r#"name: usage
namespace:
  number: 1
steps:
- name: start
  measurements:
  - Identifier: TestMetrics
    Method: TestMetrics
    Params:
      action: start
      resourceConstraints: CONSTRAINTS
      systemPodMetricsEnabled: true
  - Identifier: Usage
    Method: ResourceUsageSummary
    Params:
      action: start
      namespace: kube-system
- name: pause
  measurements:
  - Identifier: TestMetrics
    Method: TestMetrics
    Params:
      action: pauseSystemPodMetrics
- name: gather
  measurements:
  - Identifier: TestMetrics
    Method: TestMetrics
    Params:
      action: gather
  - Identifier: Usage
    Method: ResourceUsageSummary
    Params:
      action: gather
"#;

    /// TestMetrics and ResourceUsageSummary are measurements of their own (not
    /// skipped): CL2's actions and params are read, `resourceConstraints` from the
    /// file beside the config, the params loadgen cannot use named, and TestMetrics'
    /// parts that cannot be measured from outside listed as skipped.
    #[test]
    fn test_metrics_and_resource_usage_summary_are_read_with_cl2s_params() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |constraints: &str| {
            std::fs::write(
                dir.path().join("config.yaml"),
                USAGE_CONFIG.replace("CONSTRAINTS", constraints),
            )
            .expect("config");
        };
        std::fs::write(
            dir.path().join("limits.yaml"),
            "kube-apiserver:\n  cpuConstraint: 2.5\n  memoryConstraint: 1048576\netcd:\n  cpuConstraint: 1\n",
        )
        .expect("limits");
        write("limits.yaml");
        let opts = LoadOptions {
            dialect: Some(Dialect::Cl2),
            nodes: Some(1),
            ..LoadOptions::default()
        };
        let s = load_with(&dir.path().join("config.yaml"), &opts).expect("valid");
        let ms: Vec<&MeasurementAction> = s
            .steps
            .iter()
            .flat_map(|st| match &st.body {
                StepBody::Measurements(ms) => ms.iter().collect(),
                StepBody::Phases(_) => Vec::new(),
            })
            .collect();
        let tm = ms[0];
        assert_eq!((tm.method, tm.action), (Method::TestMetrics, Action::Start));
        let c = tm
            .cl2
            .resource_constraints
            .as_ref()
            .expect("constraints read");
        assert_eq!(c["kube-apiserver"].cpu_constraint, 2.5);
        assert_eq!(c["kube-apiserver"].memory_constraint, 1 << 20);
        assert_eq!(c["etcd"].memory_constraint, 0);
        assert_eq!(tm.ignored_params, ["systemPodMetricsEnabled"]);
        assert_eq!(ms[1].method, Method::ResourceUsageSummary);
        assert_eq!(ms[1].ignored_params, ["namespace"]);
        assert_eq!(
            (ms[2].method, ms[2].action),
            (Method::TestMetrics, Action::Run)
        );
        assert_eq!(ms[3].action, Action::Gather);
        let skipped = s.skipped.join("\n");
        assert!(skipped.contains("SchedulingMetrics"), "{skipped}");
        assert!(
            !skipped.contains("ResourceUsageSummary `Usage`"),
            "{skipped}"
        );
        // A constraints file that cannot be read is refused, naming it.
        write("absent.yaml");
        let e = load_with(&dir.path().join("config.yaml"), &opts).expect_err("refused");
        assert!(e.to_string().contains("absent.yaml"), "{e}");
    }
}
