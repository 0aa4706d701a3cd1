//! Tuning sets and measurements, checked.

use std::time::Duration;

use super::{Action, Checker, MeasurementAction, Method, Thresholds};
use crate::ops::Resource;
use crate::scenario::file::{self, DurationText, MeasurementFile};
use crate::scenario::tuning::{LoadShape, TuningSet};
use crate::scenario::ScenarioError;

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
            shapes.push(LoadShape::Poisson {
                average_qps: positive(&format!("{path}.poissonLoad.averageQps"), q.average_qps)?,
            });
        }
        if shapes.len() != 1 {
            return Err(self.err(path, format!(
                "tuning set `{}` needs exactly one of qpsLoad, randomizedLoad, steppedLoad, poissonLoad (has {})",
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

    pub(super) fn measurement(
        &self,
        path: &str,
        m: &MeasurementFile,
    ) -> Result<MeasurementAction, ScenarioError> {
        let lower = m.method.to_ascii_lowercase();
        let method = if lower.starts_with("apiresponsiveness") {
            Method::ApiResponsiveness
        } else if lower.starts_with("resourceusage") {
            Method::ResourceUsage
        } else if lower == "watchlatency" {
            Method::WatchLatency
        } else {
            return Err(self.err(&format!("{path}.method"), format!("unknown measurement `{}` (known: APIResponsiveness, ResourceUsage, WatchLatency)", m.method)));
        };
        let action = match (&m.action, &m.params.action) {
            (Some(a), None) | (None, Some(a)) => a.to_ascii_lowercase(),
            (Some(_), Some(_)) => {
                return Err(self.err(path, "`action` is given twice (top level and params)"))
            }
            (None, None) => {
                return Err(self.err(
                    path,
                    "a measurement needs `action: start` or `action: gather`",
                ))
            }
        };
        let action = match action.as_str() {
            "start" => Action::Start,
            "gather" | "stop" => Action::Gather,
            other => {
                return Err(self.err(
                    &format!("{path}.action"),
                    format!("unknown action `{other}` (start or gather)"),
                ))
            }
        };
        let resource: Resource = m
            .params
            .resource
            .as_deref()
            .unwrap_or("pods")
            .parse()
            .map_err(|e: String| self.err(&format!("{path}.params.resource"), e))?;
        let thresholds = match &m.params.thresholds {
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
        Ok(MeasurementAction {
            method,
            method_as_written: m.method.clone(),
            identifier: m.identifier.clone().unwrap_or_default(),
            action,
            resource,
            watches: m.params.count.unwrap_or(1).max(1),
            urls: m.params.urls.clone(),
            interval: match &m.params.interval {
                Some(d) => self.duration(&format!("{path}.params.interval"), d)?,
                None => Duration::from_secs(5),
            },
            thresholds,
        })
    }
}
