//! The scenario file as written: YAML or JSON, keys matched case-insensitively
//! (as ClusterLoader2 does, so `tuningSets` and `TuningSets` both work),
//! unknown fields refused with their path. [`super::validate`] turns it into
//! a checked [`super::Scenario`].

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// The top level.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScenarioFile {
    /// Names the run and its results [default: the file's stem].
    #[serde(default)]
    pub name: Option<String>,
    /// Parameters for templates and phase flags (`{{.Param}}`); `--param K=V` overrides.
    #[serde(default)]
    pub params: BTreeMap<String, Value>,
    /// Namespaces managed by the run: `3` or `{count: 3, basename: web}`.
    #[serde(default)]
    pub namespaces: Option<NamespacesFile>,
    #[serde(default)]
    pub tuning_sets: Vec<TuningSetFile>,
    pub steps: Vec<StepFile>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NamespacesFile {
    pub count: u32,
    #[serde(default)]
    pub basename: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TuningSetFile {
    pub name: String,
    #[serde(default)]
    pub initial_delay: Option<DurationText>,
    #[serde(default)]
    pub qps_load: Option<QpsFile>,
    #[serde(default)]
    pub randomized_load: Option<AverageQpsFile>,
    #[serde(default)]
    pub stepped_load: Option<SteppedFile>,
    #[serde(default)]
    pub poisson_load: Option<PoissonFile>,
    /// CL2: every unit spread evenly over `timeLimit`.
    #[serde(default)]
    pub time_limited_load: Option<TimeLimitFile>,
    /// CL2: every unit at a uniformly random moment in `[0, timeLimit)`.
    #[serde(default)]
    pub randomized_time_limited_load: Option<TimeLimitFile>,
    /// CL2: all units at once, at most `parallelismLimit` running.
    #[serde(default)]
    pub parallelism_limited_load: Option<ParallelismFile>,
    /// CL2: one token bucket (`qps`, `burst`) shared by every phase using the set.
    #[serde(default, rename = "globalQPSLoad")]
    pub global_qps_load: Option<GlobalQpsFile>,
}

/// `poissonLoad`: loadgen's `averageQps` or CL2's `expectedActionsPerSecond`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoissonFile {
    #[serde(default)]
    pub average_qps: Option<f64>,
    #[serde(default)]
    pub expected_actions_per_second: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TimeLimitFile {
    pub time_limit: DurationText,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ParallelismFile {
    pub parallelism_limit: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GlobalQpsFile {
    pub qps: f64,
    #[serde(default)]
    pub burst: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct QpsFile {
    pub qps: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AverageQpsFile {
    pub average_qps: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SteppedFile {
    pub burst_size: u32,
    pub step_delay: DurationText,
}

/// `500ms`, `30s`, `5m`, `1h`, or a number of seconds.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum DurationText {
    Seconds(f64),
    Text(String),
}

impl DurationText {
    pub fn parse(&self) -> Result<std::time::Duration, String> {
        match self {
            DurationText::Seconds(s) => std::time::Duration::try_from_secs_f64(*s).map_err(|_| {
                format!("invalid duration {s}: must be a non-negative number of seconds")
            }),
            DurationText::Text(t) => {
                crate::cli::parse_duration(t).or_else(|e| go_duration(t).ok_or(e))
            }
        }
    }
}

/// Go's `time.ParseDuration` form, as CL2 writes durations: `1h30m`, `2m30s`,
/// `1.5s`, `300ms`, `0`.
pub fn go_duration(s: &str) -> Option<std::time::Duration> {
    let mut rest = s.trim();
    if rest == "0" {
        return Some(std::time::Duration::ZERO);
    }
    let mut secs = 0.0;
    while !rest.is_empty() {
        let n_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let n: f64 = rest[..n_end].parse().ok()?;
        rest = &rest[n_end..];
        let u_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..u_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        secs += n * unit;
        rest = &rest[u_end..];
    }
    std::time::Duration::try_from_secs_f64(secs).ok()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StepFile {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub phases: Vec<PhaseFile>,
    #[serde(default)]
    pub measurements: Vec<MeasurementFile>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PhaseFile {
    #[serde(default)]
    pub name: Option<String>,
    // --- objects ---
    #[serde(default)]
    pub namespace_range: Option<NamespaceRangeFile>,
    /// CL2: the namespaces by name (`""` is cluster scope).
    #[serde(default)]
    pub namespace_list: Option<Vec<String>>,
    #[serde(default)]
    pub replicas_per_namespace: Option<u32>,
    #[serde(default)]
    pub tuning_set: Option<String>,
    #[serde(default)]
    pub object_bundle: Vec<ObjectFile>,
    // --- traffic ---
    /// loadgen run flags, e.g. `--lists 250/min --list-rv consistent`.
    #[serde(default)]
    pub loadgen: Option<String>,
    /// `loadgen etcd` flags, e.g. `--ranges 5/s --range-prefix /registry/pods/`.
    #[serde(default)]
    pub etcd: Option<String>,
    /// How long a `loadgen` or `etcd` phase runs.
    #[serde(default)]
    pub duration: Option<DurationText>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NamespaceRangeFile {
    pub min: u32,
    pub max: u32,
    #[serde(default)]
    pub basename: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ObjectFile {
    pub basename: String,
    pub object_template_path: String,
    #[serde(default)]
    pub object_type: Option<ObjectTypeFile>,
    /// ClusterLoader2's per-object template parameters (CL2 configs only).
    #[serde(default)]
    pub template_fill_map: Option<BTreeMap<String, Value>>,
    /// CL2's selector for listing objects of a type it cannot list by name;
    /// accepted (loadgen tracks what it created itself).
    #[serde(default)]
    pub list_unknown_object_options: Option<Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ObjectTypeFile {
    #[serde(default)]
    pub api_group: Option<String>,
    #[serde(default)]
    pub api_version: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    /// The plural in the URL, when it is not the kind's lower-case plural.
    #[serde(default)]
    pub resource: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MeasurementFile {
    pub method: String,
    #[serde(default)]
    pub identifier: Option<String>,
    /// `start` or `gather` (also accepted inside `params`, as ClusterLoader2 writes it).
    #[serde(default)]
    pub action: Option<String>,
    /// Kept as written: each method reads its own (see [`MeasurementParamsFile`]
    /// for loadgen's); ClusterLoader2's methods read theirs by exact name.
    #[serde(default)]
    pub params: serde_json::Map<String, Value>,
    /// CL2: one method run as several measurements, each its identifier and params.
    #[serde(default)]
    pub instances: Vec<InstanceFile>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InstanceFile {
    pub identifier: String,
    #[serde(default)]
    pub params: serde_json::Map<String, Value>,
}

/// The params of loadgen's own measurements (APIResponsiveness, ResourceUsage,
/// WatchLatency) as loadgen's format writes them: an unknown one is refused.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MeasurementParamsFile {
    #[serde(default)]
    pub action: Option<String>,
    /// WatchLatency: the resource watched [default: pods].
    #[serde(default)]
    pub resource: Option<String>,
    /// WatchLatency: concurrent watches [default: 1].
    #[serde(default)]
    pub count: Option<u64>,
    /// ResourceUsage: `/metrics` URLs [default: `loadgen run --server-metrics`].
    #[serde(default)]
    pub urls: Vec<String>,
    /// ResourceUsage: scrape interval [default: 5s].
    #[serde(default)]
    pub interval: Option<DurationText>,
    /// SLO thresholds; APIResponsiveness checks the Kubernetes API call SLOs by default.
    #[serde(default)]
    pub thresholds: Option<ThresholdsFile>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ThresholdsFile {
    /// p99 of mutating calls on single objects [default: 1s].
    #[serde(default)]
    pub mutating: Option<DurationText>,
    /// p99 of GETs of single objects [default: 1s].
    #[serde(default)]
    pub read_single: Option<DurationText>,
    /// p99 of namespace-scoped LISTs [default: 30s].
    #[serde(default)]
    pub read_namespace: Option<DurationText>,
    /// p99 of cluster-scoped LISTs [default: 30s].
    #[serde(default)]
    pub read_cluster: Option<DurationText>,
    /// Highest share of calls answered 429 [default: no limit].
    #[serde(default, rename = "max429Rate")]
    pub max_429_rate: Option<f64>,
    /// WatchLatency: p99 of watch event delivery [default: no limit].
    #[serde(default)]
    pub watch_p99: Option<DurationText>,
}

/// Every field name the file may use, as written canonically.
const FIELDS: &[&str] = &[
    "name",
    "params",
    "namespaces",
    "count",
    "basename",
    "tuningSets",
    "initialDelay",
    "qpsLoad",
    "qps",
    "randomizedLoad",
    "averageQps",
    "steppedLoad",
    "burstSize",
    "stepDelay",
    "poissonLoad",
    "expectedActionsPerSecond",
    "timeLimitedLoad",
    "randomizedTimeLimitedLoad",
    "timeLimit",
    "parallelismLimitedLoad",
    "parallelismLimit",
    "globalQPSLoad",
    "burst",
    "namespaceList",
    "listUnknownObjectOptions",
    "instances",
    "steps",
    "phases",
    "measurements",
    "namespaceRange",
    "min",
    "max",
    "replicasPerNamespace",
    "tuningSet",
    "objectBundle",
    "objectTemplatePath",
    "templateFillMap",
    "objectType",
    "apiGroup",
    "apiVersion",
    "kind",
    "resource",
    "loadgen",
    "etcd",
    "duration",
    "method",
    "identifier",
    "action",
    "urls",
    "interval",
    "thresholds",
    "mutating",
    "readSingle",
    "readNamespace",
    "readCluster",
    "max429Rate",
    "watchP99",
];

/// Rewrites every key to its canonical spelling when it matches a known field
/// case-insensitively (unknown keys stay, for serde to refuse with their path).
/// The top-level `params` map, measurement `params` (read by exact name, as
/// CL2 reads them) and `templateFillMap` hold their own names and are kept as written;
/// `namespaces: N` becomes `namespaces: {count: N}`.
pub fn canonicalize(v: Value) -> Value {
    walk(v, true)
}

fn canon(key: &str) -> String {
    FIELDS
        .iter()
        .find(|f| f.eq_ignore_ascii_case(key))
        .map(|f| f.to_string())
        .unwrap_or_else(|| key.to_string())
}
fn walk(v: Value, top: bool) -> Value {
    match v {
        Value::Object(map) => {
            let mut out = serde_json::Map::new();
            for (k, v) in map {
                let key = canon(&k);
                // User-named maps keep their keys as written.
                let v = if key == "params"
                    || key == "templateFillMap"
                    || key == "listUnknownObjectOptions"
                {
                    v
                } else if top && key == "namespaces" && v.is_number() {
                    serde_json::json!({ "count": v })
                } else {
                    walk(v, false)
                };
                out.insert(key, v);
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.into_iter().map(|i| walk(i, false)).collect()),
        other => other,
    }
}

/// A measurement's params with loadgen's field names canonicalized (their
/// case as written does not matter), for its typed params.
pub fn canonicalize_params(v: Value) -> Value {
    walk(v, false)
}

/// Parses YAML or JSON text (JSON is YAML) into a [`ScenarioFile`]; the error
/// is the path of the offending field (`steps[1].phases[0]`) and the reason.
pub fn parse(text: &str) -> Result<ScenarioFile, (String, String)> {
    let raw: Value =
        serde_saphyr::from_str(text).map_err(|e| ("(syntax)".to_string(), e.to_string()))?;
    if !raw.is_object() {
        return Err(("(top level)".into(), "expected a mapping of fields".into()));
    }
    let canon = canonicalize(raw);
    serde_path_to_error::deserialize(canon).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." {
            "(top level)".to_string()
        } else {
            path
        };
        (path, e.into_inner().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_case_insensitively_but_params_keep_their_case() {
        let f = parse(
            "Name: x\nParams: {MyImage: nginx}\nNamespaces: 2\nTuningSets:\n- Name: u\n  QPSLoad: {QPS: 5}\nSteps:\n- Phases:\n  - NamespaceRange: {Min: 1, Max: 2}\n    ReplicasPerNamespace: 1\n    TuningSet: u\n    ObjectBundle:\n    - {Basename: a, ObjectTemplatePath: a.yaml}\n",
        )
        .expect("parses");
        assert_eq!(f.name.as_deref(), Some("x"));
        assert!(f.params.contains_key("MyImage"));
        assert_eq!(f.namespaces.map(|n| n.count), Some(2));
        assert_eq!(f.tuning_sets[0].qps_load.as_ref().map(|q| q.qps), Some(5.0));
        assert_eq!(f.steps[0].phases[0].object_bundle[0].basename, "a");
    }

    #[test]
    fn go_durations() {
        use std::time::Duration;
        assert_eq!(go_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(go_duration("2m30s"), Some(Duration::from_secs(150)));
        assert_eq!(go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(go_duration("0"), Some(Duration::ZERO));
        assert_eq!(go_duration("5x"), None);
        assert_eq!(
            DurationText::Text("1m30s".into()).parse(),
            Ok(Duration::from_secs(90))
        );
    }

    #[test]
    fn unknown_fields_are_refused_with_their_path() {
        let (path, reason) =
            parse("steps:\n- phases:\n  - loadgen: --lists 1/s\n    durration: 5s\n")
                .expect_err("typo");
        assert_eq!(path, "steps[0].phases[0].durration");
        assert!(reason.contains("unknown field `durration`"), "{reason}");
        let (path, _) = parse("steps: 3").expect_err("not a list");
        assert_eq!(path, "steps");
        let (path, _) = parse("steps: [\n").expect_err("syntax");
        assert_eq!(path, "(syntax)");
    }
}
