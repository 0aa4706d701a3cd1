//! The execution file of `tollgate-bench capacity` (YAML or JSON): what is under test, the
//! load it gets, the two dimensions searched, the SLOs and the search.
//!
//! ```yaml
//! name: list-storm
//! sut:
//!   sim: {args: [--nodes, "1000", --pods, "30000", --cost-model, modeled]}
//!   tollgate: {args: [--mode, enforce, --quota-mode, static, --quota-bytes-per-second, "{resource}"]}
//! loadgen:
//!   seed: []                         # `loadgen seed` arguments run once per experiment, if any
//!   args: [--patches, 100/s, --patch-target, node-status, --lists, "{load}/min", -A]
//! duration: 60s
//! load: {name: LIST calls/min, values: [60, 120, 250, 500, 1000]}
//! resource: {name: quota bytes/s, values: [10000000, 20000000, 40000000]}
//! slos:
//!   - {operation: patch, measure: p99Ms, max: 1000}
//!   - {operation: list, measure: okPerMinute, min: 30}
//! search: {metric: capacity, strategy: binary, lowerBound: true}
//! repetitions: 1
//! ```
//! `{load}` and `{resource}` are replaced in every argument by the experiment's values.
//!
//! An optional `clusterSize` repeats the whole search for each cluster size, each with sim
//! arguments of its own (appended to `sut.sim.args`, which must not repeat them), and the report
//! fits the resource each size needs against the size (the sizing recommendation):
//!
//! ```yaml
//! clusterSize:
//!   unit: nodes                      # or containers (KEP-5546's two proportional modes)
//!   targetLoad: 120                  # the load to size for (default: the highest load value)
//!   sizes:
//!     - {size: 500, simArgs: [--nodes, "500", --pods, "15000"]}
//!     - {size: 1000, simArgs: [--nodes, "1000", --pods, "30000"]}
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::search::Search;
use super::slo::Slo;

#[derive(Debug, thiserror::Error)]
pub enum ExecutionError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {field}: {message}")]
    Invalid {
        path: PathBuf,
        field: String,
        message: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Execution {
    pub name: String,
    pub sut: Sut,
    pub loadgen: LoadgenSpec,
    /// Length of each experiment's load, as loadgen's `--duration` takes it.
    #[serde(default = "default_duration")]
    pub duration: String,
    pub load: Dimension,
    pub resource: Dimension,
    pub slos: Vec<Slo>,
    pub search: Search,
    #[serde(default = "one")]
    pub repetitions: u32,
    /// Cluster sizes to search each (the sizing recommendation). Left out of the canonical
    /// form when unset, so executions without it keep their fingerprints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_size: Option<ClusterSize>,
}

/// The cluster-size dimension: the search runs once per size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSize {
    /// What a size counts.
    #[serde(default)]
    pub unit: SizeUnit,
    /// The load the recommendation sizes for; default: the highest load value.
    #[serde(default)]
    pub target_load: Option<f64>,
    pub sizes: Vec<ClusterSizeValue>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SizeUnit {
    #[default]
    Nodes,
    Containers,
}

impl SizeUnit {
    pub fn name(self) -> &'static str {
        match self {
            SizeUnit::Nodes => "nodes",
            SizeUnit::Containers => "containers",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSizeValue {
    pub size: f64,
    /// Appended to `sut.sim.args` for this size.
    #[serde(default)]
    pub sim_args: Vec<String>,
}

fn default_duration() -> String {
    "60s".into()
}
fn one() -> u32 {
    1
}

/// The system under test: the simulated control plane (started fresh for every experiment)
/// or an existing cluster, with or without tollgate in front.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Sut {
    #[serde(default)]
    pub sim: Option<Args>,
    /// An existing cluster: loadgen (and tollgate's upstream) use this kubeconfig.
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    #[serde(default)]
    pub tollgate: Option<Args>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Args {
    #[serde(default)]
    pub args: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadgenSpec {
    #[serde(default)]
    pub seed: Vec<String>,
    pub args: Vec<String>,
}

/// A dimension: a name and its values, ascending.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Dimension {
    pub name: String,
    pub values: Vec<f64>,
}

impl Execution {
    pub fn load(path: &Path) -> Result<Execution, ExecutionError> {
        let text = std::fs::read_to_string(path).map_err(|source| ExecutionError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Execution, ExecutionError> {
        let exec: Execution = serde_saphyr::from_str(text).map_err(|e| ExecutionError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        exec.validate(path)?;
        Ok(exec)
    }

    fn validate(&self, path: &Path) -> Result<(), ExecutionError> {
        let invalid = |field: &str, message: &str| ExecutionError::Invalid {
            path: path.to_owned(),
            field: field.to_owned(),
            message: message.to_owned(),
        };
        match (&self.sut.sim, &self.sut.kubeconfig) {
            (Some(_), Some(_)) => return Err(invalid("sut", "give sim or kubeconfig, not both")),
            (None, None) => return Err(invalid("sut", "give sim or kubeconfig")),
            _ => {}
        }
        for (field, d) in [("load", &self.load), ("resource", &self.resource)] {
            if d.values.is_empty() {
                return Err(invalid(&format!("{field}.values"), "is empty"));
            }
            if d.values.iter().any(|v| !v.is_finite()) {
                return Err(invalid(&format!("{field}.values"), "holds a non-number"));
            }
            if d.values.windows(2).any(|w| w[0] >= w[1]) {
                return Err(invalid(
                    &format!("{field}.values"),
                    "must be strictly ascending (the search assumes monotone SLOs along it)",
                ));
            }
            let placeholder = format!("{{{field}}}");
            if !self.all_args().any(|a| a.contains(&placeholder)) {
                return Err(invalid(
                    field,
                    &format!("no argument uses {placeholder}, so its values would change nothing"),
                ));
            }
        }
        for own in ["--duration", "--output", "--server", "--kubeconfig"] {
            if self
                .loadgen
                .args
                .iter()
                .any(|a| a == own || a.starts_with(&format!("{own}=")))
            {
                return Err(invalid(
                    "loadgen.args",
                    &format!("{own} is set by capacity itself (use `duration` and `sut`)"),
                ));
            }
        }
        if self.repetitions == 0 {
            return Err(invalid("repetitions", "must be at least 1"));
        }
        if self.slos.is_empty() {
            return Err(invalid("slos", "is empty: nothing could fail"));
        }
        super::slo::Slo::validate(&self.slos).map_err(|e| invalid("slos", &e.to_string()))?;
        if self.name.trim().is_empty() {
            return Err(invalid("name", "is empty"));
        }
        if let Some(cs) = &self.cluster_size {
            if cs.sizes.is_empty() {
                return Err(invalid("clusterSize.sizes", "is empty"));
            }
            if cs
                .sizes
                .windows(2)
                .any(|w| w[0].size >= w[1].size || !w[1].size.is_finite())
                || !cs.sizes[0].size.is_finite()
                || cs.sizes[0].size <= 0.0
            {
                return Err(invalid(
                    "clusterSize.sizes",
                    "sizes must be positive and strictly ascending",
                ));
            }
            if self.sut.sim.is_none() && cs.sizes.iter().any(|z| !z.sim_args.is_empty()) {
                return Err(invalid(
                    "clusterSize.sizes",
                    "simArgs need `sut.sim` (an existing cluster has the size it has)",
                ));
            }
            if let Some(t) = cs.target_load {
                if !self.load.values.iter().any(|v| (v - t).abs() < 1e-9) {
                    return Err(invalid(
                        "clusterSize.targetLoad",
                        "must be one of load.values",
                    ));
                }
            }
        }
        Ok(())
    }

    /// What the execution probably did not mean, to say before it runs: a hand-set
    /// `--quota-bytes-per-second` without `--quota-mode` is only the ceiling of tollgate's
    /// adaptive budget (its default), not a fixed pool.
    pub fn warnings(&self) -> Vec<String> {
        let Some(tg) = &self.sut.tollgate else {
            return Vec::new();
        };
        let has = |flag: &str| {
            tg.args
                .iter()
                .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
        };
        if has("--quota-bytes-per-second") && !has("--quota-mode") && !has("--config") {
            vec![
                "sut.tollgate sets --quota-bytes-per-second without --quota-mode: tollgate's \
                 default adaptive budget takes it as a ceiling; add `--quota-mode, static` to \
                 search a fixed pool"
                    .into(),
            ]
        } else {
            Vec::new()
        }
    }

    /// The execution of one cluster size: its sim arguments appended, no cluster sizes.
    pub fn for_size(&self, size: &ClusterSizeValue) -> Execution {
        let mut e = self.clone();
        e.cluster_size = None;
        if let Some(sim) = &mut e.sut.sim {
            sim.args.extend(size.sim_args.iter().cloned());
        }
        e
    }

    fn all_args(&self) -> impl Iterator<Item = &String> {
        let sim = self.sut.sim.iter().flat_map(|a| a.args.iter());
        let tg = self.sut.tollgate.iter().flat_map(|a| a.args.iter());
        sim.chain(tg)
            .chain(self.loadgen.args.iter())
            .chain(self.loadgen.seed.iter())
    }

    /// A stable fingerprint of everything that decides an experiment's outcome (FNV-1a over
    /// the canonical JSON): a results file records it, and results of another execution are
    /// never replayed.
    pub fn fingerprint(&self) -> String {
        let canonical = serde_json::to_string(self).unwrap_or_default();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in canonical.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{h:016x}")
    }
}

/// `{load}` and `{resource}` replaced in each argument. Whole numbers are written without a
/// fraction, so `{load}/min` becomes `120/min`, not `120.0/min`.
pub fn substitute(args: &[String], load: f64, resource: f64) -> Vec<String> {
    args.iter()
        .map(|a| {
            a.replace("{load}", &number(load))
                .replace("{resource}", &number(resource))
        })
        .collect()
}

pub fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name: storm
sut:
  sim: {args: [--nodes, "100", --max-requests-inflight, "{resource}"]}
loadgen:
  args: [--lists, "{load}/min"]
duration: 10s
load: {name: LIST calls/min, values: [60, 120]}
resource: {name: in-flight, values: [10, 400]}
slos:
  - {operation: list, measure: p99Ms, max: 1000}
search: {metric: capacity, strategy: binary, lowerBound: true}
"#;

    fn parse(text: &str) -> Result<Execution, ExecutionError> {
        Execution::parse(Path::new("exec.yaml"), text)
    }

    #[test]
    fn a_good_file_parses_and_substitutes() {
        let e = parse(GOOD).unwrap();
        assert_eq!(e.repetitions, 1);
        assert_eq!(
            substitute(&e.loadgen.args, 120.0, 10.0),
            vec!["--lists", "120/min"]
        );
        assert_eq!(number(0.5), "0.5");
        assert_eq!(e.fingerprint(), parse(GOOD).unwrap().fingerprint());
        let other = parse(&GOOD.replace("10s", "20s")).unwrap();
        assert_ne!(e.fingerprint(), other.fingerprint());
    }

    #[test]
    fn cluster_sizes_give_one_execution_each_and_keep_old_fingerprints() {
        let plain = parse(GOOD).unwrap();
        let sized = parse(&format!(
            "{GOOD}clusterSize:\n  unit: containers\n  targetLoad: 120\n  sizes:\n    \
             - {{size: 5, simArgs: [--pods, \"5\"]}}\n    - {{size: 9, simArgs: [--pods, \"9\"]}}\n"
        ))
        .unwrap();
        let cs = sized.cluster_size.clone().unwrap();
        assert_eq!(cs.unit, SizeUnit::Containers);
        let five = sized.for_size(&cs.sizes[0]);
        assert_eq!(five.cluster_size, None);
        assert_eq!(five.sut.sim.as_ref().unwrap().args.last().unwrap(), "5");
        assert!(serde_json::to_string(&plain)
            .unwrap()
            .find("clusterSize")
            .is_none());
        assert_ne!(
            five.fingerprint(),
            sized.for_size(&cs.sizes[1]).fingerprint()
        );
        let bad = GOOD.to_owned() + "clusterSize:\n  targetLoad: 7\n  sizes: [{size: 1}]\n";
        let err = parse(&bad).unwrap_err().to_string();
        assert!(err.contains("clusterSize.targetLoad"), "{err}");
        let bad = GOOD.to_owned() + "clusterSize:\n  sizes: [{size: 2}, {size: 1}]\n";
        assert!(parse(&bad).unwrap_err().to_string().contains("ascending"));
    }

    #[test]
    fn a_hand_set_pool_without_a_quota_mode_is_warned_about() {
        let with = |args: &str| {
            parse(&GOOD.replace(
                "loadgen:",
                &format!("  tollgate: {{args: [{args}]}}\nloadgen:"),
            ))
            .unwrap()
            .warnings()
        };
        let w = with("--mode, enforce, --quota-bytes-per-second, \"{resource}\"");
        assert!(w.len() == 1 && w[0].contains("--quota-mode"), "{w:?}");
        assert!(with("--quota-mode, static, --quota-bytes-per-second, \"5\"").is_empty());
        assert!(with("--mode, enforce").is_empty());
        assert!(parse(GOOD).unwrap().warnings().is_empty());
    }

    #[test]
    fn mistakes_are_refused_with_the_field() {
        for (edit, want) in [
            (GOOD.replace("[60, 120]", "[120, 60]"), "load.values"),
            (
                GOOD.replace("\"{resource}\"", "\"5\""),
                "resource: no argument",
            ),
            (GOOD.replace("duration: 10s", "duraton: 10s"), "duraton"),
            (GOOD.replace("max: 1000", "limit: 1000"), "limit"),
            (
                GOOD.replace("args: [--lists", "args: [--duration, 5s, --lists"),
                "loadgen.args: --duration is set by capacity",
            ),
            (
                GOOD.replace("strategy: binary", "strategy: random"),
                "random",
            ),
            (
                GOOD.replace("sut:\n", "sut:\n  kubeconfig: /k\n"),
                "sut: give sim or kubeconfig, not both",
            ),
        ] {
            let err = parse(&edit).unwrap_err().to_string();
            assert!(err.starts_with("exec.yaml"), "{err}");
            assert!(err.contains(want), "wanted {want:?} in {err}");
        }
    }
}
