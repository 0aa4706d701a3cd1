//! Tuning sets and measurements, checked.
//!
//! Measurements: loadgen's own (APIResponsiveness, ResourceUsage,
//! WatchLatency) read typed params, an unknown one refused in loadgen's
//! format; ClusterLoader2's are read by CL2's exact names, and a param loadgen
//! does not read is never an error (CL2 ignores them too). A method loadgen
//! does not implement is accepted as [`Method::Skipped`].

use std::time::Duration;

use serde_json::{Map, Value};

use super::{Action, Checker, Cl2Params, Dialect, MeasurementAction, Method, Thresholds};
use crate::ops::Resource;
use crate::scenario::file::{self, DurationText, MeasurementFile, MeasurementParamsFile};
use crate::scenario::tuning::{LoadShape, SharedBucket, TuningSet};
use crate::scenario::ScenarioError;

/// The params each implemented CL2 method reads (the rest are ignored, and named).
fn reads(method: Method) -> &'static [&'static str] {
    match method {
        Method::ApiResponsiveness => &[
            "action",
            "summaryName",
            "enableViolations",
            "allowedSlowCalls",
            "useSimpleLatencyQuery",
            "thresholds",
        ],
        Method::ResourceUsage => &["action", "urls", "interval"],
        Method::WatchLatency => &["action", "resource", "count", "thresholds"],
        Method::WaitForControlledPodsRunning => &[
            "action",
            "apiVersion",
            "kind",
            "labelSelector",
            "operationTimeout",
        ],
        Method::WaitForRunningPods => &[
            "action",
            "desiredPodCount",
            "labelSelector",
            "namespace",
            "timeout",
        ],
        Method::PodStartupLatency => &["action", "labelSelector", "threshold"],
        Method::SchedulingThroughput => &["action", "labelSelector"],
        // CL2's `namespace`, `host` (and the provider, from its flags) choose
        // the kubelets it reads; loadgen reads /metrics: they are named as not read.
        Method::ResourceUsageSummary | Method::TestMetrics => &["action", "resourceConstraints"],
        Method::Sleep => &["action", "duration"],
        Method::Skipped => &[],
    }
}

/// A method as written → what loadgen runs.
fn method_of(written: &str) -> Method {
    let lower = written.to_ascii_lowercase();
    match lower.as_str() {
        l if l.starts_with("apiresponsiveness") => Method::ApiResponsiveness,
        // loadgen's ResourceUsage: the servers' CPU and memory, average and peak.
        "resourceusage" => Method::ResourceUsage,
        // CL2's measures system pods through the kubelets; loadgen the servers'
        // own /metrics, in CL2's file (see crate::scenario::resource_usage).
        "resourceusagesummary" => Method::ResourceUsageSummary,
        "testmetrics" => Method::TestMetrics,
        "watchlatency" => Method::WatchLatency,
        "waitforcontrolledpodsrunning" => Method::WaitForControlledPodsRunning,
        "waitforrunningpods" => Method::WaitForRunningPods,
        "podstartuplatency" => Method::PodStartupLatency,
        "schedulingthroughput" => Method::SchedulingThroughput,
        "sleep" => Method::Sleep,
        _ => Method::Skipped,
    }
}

impl Checker<'_> {
    pub(super) fn tuning_set(
        &self,
        path: &str,
        t: &file::TuningSetFile,
    ) -> Result<TuningSet, ScenarioError> {
        let positive = |p: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(self.err(p, format!("must be a positive number, not {v}")))
            }
        };
        let mut shapes = Vec::new();
        if let Some(q) = &t.qps_load {
            shapes.push(LoadShape::Qps {
                qps: positive(&format!("{path}.qpsLoad.qps"), q.qps)?,
            });
        }
        if let Some(q) = &t.randomized_load {
            shapes.push(LoadShape::Randomized {
                average_qps: positive(&format!("{path}.randomizedLoad.averageQps"), q.average_qps)?,
            });
        }
        if let Some(s) = &t.stepped_load {
            if s.burst_size == 0 {
                return Err(self.err(
                    &format!("{path}.steppedLoad.burstSize"),
                    "must be at least 1",
                ));
            }
            shapes.push(LoadShape::Stepped {
                burst_size: s.burst_size,
                step_delay: self
                    .duration(&format!("{path}.steppedLoad.stepDelay"), &s.step_delay)?,
            });
        }
        if let Some(q) = &t.poisson_load {
            let p = format!("{path}.poissonLoad");
            let rate = match (q.average_qps, q.expected_actions_per_second) {
                (Some(r), None) | (None, Some(r)) => r,
                _ => {
                    return Err(self.err(
                        &p,
                        "needs one of averageQps or expectedActionsPerSecond (CL2's name)",
                    ))
                }
            };
            shapes.push(LoadShape::Poisson {
                average_qps: positive(&p, rate)?,
            });
        }
        if let Some(l) = &t.time_limited_load {
            shapes.push(LoadShape::TimeLimited {
                time_limit: self
                    .duration(&format!("{path}.timeLimitedLoad.timeLimit"), &l.time_limit)?,
            });
        }
        if let Some(l) = &t.randomized_time_limited_load {
            shapes.push(LoadShape::RandomizedTimeLimited {
                time_limit: self.duration(
                    &format!("{path}.randomizedTimeLimitedLoad.timeLimit"),
                    &l.time_limit,
                )?,
            });
        }
        if let Some(l) = &t.parallelism_limited_load {
            if l.parallelism_limit == 0 {
                return Err(self.err(
                    &format!("{path}.parallelismLimitedLoad.parallelismLimit"),
                    "must be at least 1",
                ));
            }
            shapes.push(LoadShape::ParallelismLimited {
                limit: l.parallelism_limit as usize,
            });
        }
        if let Some(g) = &t.global_qps_load {
            let qps = positive(&format!("{path}.globalQPSLoad.qps"), g.qps)?;
            shapes.push(LoadShape::GlobalQps {
                bucket: SharedBucket::new(qps, g.burst.unwrap_or(1)),
            });
        }
        if shapes.len() != 1 {
            return Err(self.err(path, format!(
                "tuning set `{}` needs exactly one of qpsLoad, randomizedLoad, steppedLoad, poissonLoad, timeLimitedLoad, randomizedTimeLimitedLoad, parallelismLimitedLoad, globalQPSLoad (has {})",
                t.name,
                shapes.len()
            )));
        }
        Ok(TuningSet {
            name: t.name.clone(),
            initial_delay: match &t.initial_delay {
                Some(d) => self.duration(&format!("{path}.initialDelay"), d)?,
                None => Duration::ZERO,
            },
            shape: shapes.remove(0),
        })
    }

    /// One measurement entry: one action, or one per CL2 `instances` entry.
    pub(super) fn measurements(
        &self,
        path: &str,
        m: &MeasurementFile,
    ) -> Result<Vec<MeasurementAction>, ScenarioError> {
        if m.instances.is_empty() {
            return Ok(vec![self.measurement(
                path,
                m,
                m.identifier.clone().unwrap_or_default(),
                &m.params,
            )?]);
        }
        m.instances
            .iter()
            .enumerate()
            .map(|(i, inst)| {
                let mut params = m.params.clone();
                params.extend(inst.params.clone());
                self.measurement(
                    &format!("{path}.instances[{i}]"),
                    m,
                    inst.identifier.clone(),
                    &params,
                )
            })
            .collect()
    }

    fn measurement(
        &self,
        path: &str,
        m: &MeasurementFile,
        identifier: String,
        params: &Map<String, Value>,
    ) -> Result<MeasurementAction, ScenarioError> {
        let method = method_of(&m.method);
        if method == Method::Skipped && self.dialect == Dialect::Loadgen {
            return Err(self.err(&format!("{path}.method"), format!("unknown measurement `{}` (known: APIResponsiveness, ResourceUsage, WatchLatency, ResourceUsageSummary, TestMetrics, WaitForControlledPodsRunning, WaitForRunningPods, PodStartupLatency, SchedulingThroughput, Sleep)", m.method)));
        }
        let in_params = params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("action"))
            .map(|(_, v)| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
        let written = match (&m.action, &in_params) {
            (Some(a), None) | (None, Some(a)) => a.clone(),
            (Some(_), Some(_)) => {
                return Err(self.err(path, "`action` is given twice (top level and params)"))
            }
            (None, None) => String::new(),
        };
        let one_shot = matches!(method, Method::Sleep | Method::WaitForRunningPods);
        let action = match (written.to_ascii_lowercase().as_str(), method) {
            (_, Method::Skipped) => Action::Run,
            // Only SystemPodMetrics reads these, a part loadgen skips.
            ("pausesystempodmetrics" | "unpausesystempodmetrics", Method::TestMetrics) => {
                Action::Run
            }
            (_, _) if one_shot => Action::Run,
            ("start", _) => Action::Start,
            ("gather" | "stop", _) => Action::Gather,
            ("", _) => {
                return Err(self.err(
                    path,
                    "a measurement needs `action: start` or `action: gather`",
                ))
            }
            (other, _) => {
                return Err(self.err(
                    &format!("{path}.action"),
                    format!("unknown action `{other}` (start or gather)"),
                ))
            }
        };
        // loadgen's own methods in loadgen's format: typed, unknown params refused.
        let own = matches!(
            method,
            Method::ApiResponsiveness | Method::ResourceUsage | Method::WatchLatency
        );
        let typed_source: Map<String, Value> = if self.dialect == Dialect::Loadgen {
            params.clone()
        } else {
            params
                .iter()
                .filter(|(k, _)| {
                    ["resource", "count", "urls", "interval", "thresholds"]
                        .iter()
                        .any(|f| f.eq_ignore_ascii_case(k))
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        if self.dialect == Dialect::Loadgen && !own {
            // loadgen's format refuses a typo, in CL2's methods' params too.
            if let Some(k) = params
                .keys()
                .find(|k| !reads(method).iter().any(|r| r == k))
            {
                return Err(self.err(
                    &format!("{path}.params.{k}"),
                    format!(
                        "unknown param `{k}` of {} (known: {})",
                        m.method,
                        reads(method).join(", ")
                    ),
                ));
            }
        }
        let typed: MeasurementParamsFile = if own {
            let canon = file::canonicalize_params(Value::Object(typed_source));
            serde_path_to_error::deserialize(canon).map_err(|e| {
                let inner = e.path().to_string();
                let at = if inner == "." {
                    format!("{path}.params")
                } else {
                    format!("{path}.params.{inner}")
                };
                self.err(&at, e.into_inner().to_string())
            })?
        } else {
            MeasurementParamsFile::default()
        };
        let resource: Resource = typed
            .resource
            .as_deref()
            .unwrap_or("pods")
            .parse()
            .map_err(|e: String| self.err(&format!("{path}.params.resource"), e))?;
        let thresholds = match &typed.thresholds {
            None => None,
            Some(t) => {
                let tp = format!("{path}.params.thresholds");
                let d = Thresholds::default();
                let get = |name: &str, v: &Option<DurationText>, def: Duration| match v {
                    Some(v) => self.duration(&format!("{tp}.{name}"), v),
                    None => Ok(def),
                };
                Some(Thresholds {
                    mutating: get("mutating", &t.mutating, d.mutating)?,
                    read_single: get("readSingle", &t.read_single, d.read_single)?,
                    read_namespace: get("readNamespace", &t.read_namespace, d.read_namespace)?,
                    read_cluster: get("readCluster", &t.read_cluster, d.read_cluster)?,
                    max_429_rate: t.max_429_rate,
                    watch_p99: match &t.watch_p99 {
                        Some(v) => Some(self.duration(&format!("{tp}.watchP99"), v)?),
                        None => None,
                    },
                })
            }
        };
        let cl2 = self.cl2_params(path, method, params)?;
        let read = reads(method);
        let ignored_params = if method == Method::Skipped {
            Vec::new()
        } else {
            params
                .keys()
                .filter(|k| !read.iter().any(|r| r.eq_ignore_ascii_case(k)))
                .cloned()
                .collect()
        };
        Ok(MeasurementAction {
            method,
            method_as_written: m.method.clone(),
            identifier,
            action,
            action_as_written: written,
            resource,
            watches: typed.count.unwrap_or(1).max(1),
            urls: typed.urls.clone(),
            interval: match &typed.interval {
                Some(d) => self.duration(&format!("{path}.params.interval"), d)?,
                None => Duration::from_secs(5),
            },
            thresholds,
            cl2,
            cl2_dialect: self.dialect == Dialect::Cl2,
            ignored_params,
        })
    }

    /// CL2's params that loadgen reads for `method`, by CL2's exact names.
    fn cl2_params(
        &self,
        path: &str,
        method: Method,
        p: &Map<String, Value>,
    ) -> Result<Cl2Params, ScenarioError> {
        let at = |k: &str| format!("{path}.params.{k}");
        let string = |k: &str| -> Result<Option<String>, ScenarioError> {
            match p.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(self.err(&at(k), format!("expected a string, not {other}"))),
            }
        };
        let boolean = |k: &str| -> Result<Option<bool>, ScenarioError> {
            match p.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Bool(b)) => Ok(Some(*b)),
                Some(Value::String(s)) => s
                    .parse()
                    .map(Some)
                    .map_err(|_| self.err(&at(k), format!("expected true or false, not {s:?}"))),
                Some(other) => Err(self.err(&at(k), format!("expected a bool, not {other}"))),
            }
        };
        let count = |k: &str| -> Result<Option<u64>, ScenarioError> {
            match p.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(|| {
                    self.err(&at(k), format!("expected a non-negative integer, not {n}"))
                }),
                Some(Value::String(s)) => s.trim().parse().map(Some).map_err(|_| {
                    self.err(
                        &at(k),
                        format!("expected a non-negative integer, not {s:?}"),
                    )
                }),
                Some(other) => Err(self.err(&at(k), format!("expected an integer, not {other}"))),
            }
        };
        let duration = |k: &str| -> Result<Option<Duration>, ScenarioError> {
            match p.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => self
                    .duration(&at(k), &DurationText::Text(s.clone()))
                    .map(Some),
                Some(Value::Number(n)) => self
                    .duration(&at(k), &DurationText::Seconds(n.as_f64().unwrap_or(-1.0)))
                    .map(Some),
                Some(other) => Err(self.err(&at(k), format!("expected a duration, not {other}"))),
            }
        };
        if method == Method::Skipped {
            return Ok(Cl2Params::default());
        }
        Ok(Cl2Params {
            summary_name: string("summaryName")?,
            enable_violations: boolean("enableViolations")?,
            allowed_slow_calls: count("allowedSlowCalls")?.unwrap_or(0),
            use_simple_latency_query: boolean("useSimpleLatencyQuery")?.unwrap_or(false),
            label_selector: string("labelSelector")?,
            api_version: string("apiVersion")?,
            kind: string("kind")?,
            timeout: match method {
                Method::WaitForControlledPodsRunning => duration("operationTimeout")?,
                _ => duration("timeout")?,
            },
            desired_pod_count: count("desiredPodCount")?,
            namespace: string("namespace")?,
            threshold: duration("threshold")?,
            duration: duration("duration")?,
            resource_constraints: match string("resourceConstraints")? {
                Some(f) if !f.trim().is_empty() => {
                    Some(self.constraints(&at("resourceConstraints"), f.trim())?)
                }
                _ => None,
            },
        })
    }

    /// CL2's `resourceConstraints` file (relative to the config): container
    /// name → `{cpuConstraint, memoryConstraint}`.
    fn constraints(
        &self,
        at: &str,
        file: &str,
    ) -> Result<std::collections::BTreeMap<String, super::Constraint>, ScenarioError> {
        let path = self.dir.join(file);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| self.err(at, format!("{}: {e}", path.display())))?;
        if text.contains("{{") {
            return Err(self.err(
                at,
                format!(
                    "{}: a templated constraints file is not supported (give the numbers)",
                    path.display()
                ),
            ));
        }
        serde_saphyr::from_str(&text).map_err(|e| {
            self.err(
                at,
                format!(
                    "{}: expected container: {{cpuConstraint, memoryConstraint}}: {e}",
                    path.display()
                ),
            )
        })
    }
}
