//! A scenario run's results: the top-level `summary.json`
//! (`loadgen.scenario/v1`), `perfdata.json` and one perfdash-named PerfData
//! file per measurement (`{Method}_{Identifier}_{name}_{time}.json`) in the
//! output dir, and per step
//! `step-NN-<name>/summary.json` + `perfdata.json` (plus, for a loadgen or
//! etcd phase, that run's own files in `phase-MM-<name>/`); and the end table.
//!
//! Top-level schema: `{schema, name, file, target, started_at_unix_ms,
//! duration_s, interrupted, namespaces, steps: [{index, name, dir, duration_s,
//! error}], measurements: [{method, identifier, started_in_step,
//! gathered_in_step, duration_s, calls: [{verb, resource, scope, requests, ok,
//! errors, error_rate, rejected_429, rate_429, latency_ms, status_codes}],
//! server_metrics, watch, slos}], slos: [{measurement, subject, threshold,
//! observed, unit, met}], verdict: "pass"|"fail"|"none", error, cleanup:
//! {namespaces_deleted, objects_deleted, errors}}`.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::measure::{perf_items, CallSummary, MeasurementResult, SloCheck};
use super::reconcile::ObjectTally;
use super::validate::Scenario;

/// The schema name and version of the top-level `summary.json`.
pub const SCHEMA: &str = "loadgen.scenario/v1";

/// Pass when SLOs were checked and all were met; fail when one was missed or
/// the run failed; none when nothing was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Fail,
    None,
}

impl Verdict {
    pub fn of(r: &ScenarioReport) -> Verdict {
        if r.error.is_some() || r.slos.iter().any(|s| !s.met && s.enforced) {
            Verdict::Fail
        } else if r.slos.is_empty() {
            Verdict::None
        } else {
            Verdict::Pass
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CleanupReport {
    pub namespaces_deleted: Vec<String>,
    pub objects_deleted: u64,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepOutline {
    pub index: usize,
    pub name: String,
    pub dir: String,
    pub duration_s: f64,
    pub error: Option<String>,
}

/// A step's `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepReport {
    pub index: usize,
    pub name: String,
    pub dir: String,
    pub started_offset_s: f64,
    pub duration_s: f64,
    pub error: Option<String>,
    pub phases: Vec<PhaseReport>,
    pub measurements_started: Vec<String>,
    pub gathered: Vec<MeasurementResult>,
    /// Measurements loadgen does not implement, met in this step and skipped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

impl StepReport {
    pub fn outline(&self) -> StepOutline {
        StepOutline {
            index: self.index,
            name: self.name.clone(),
            dir: self.dir.clone(),
            duration_s: self.duration_s,
            error: self.error.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseReport {
    pub name: String,
    /// `objects`, `loadgen` or `etcd`.
    pub kind: String,
    pub duration_s: f64,
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects: Option<ObjectTally>,
    pub calls: Vec<CallSummary>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioReport {
    pub schema: String,
    pub name: String,
    pub file: String,
    pub target: String,
    pub started_at_unix_ms: u64,
    pub duration_s: f64,
    pub interrupted: bool,
    pub namespaces: Vec<String>,
    pub steps: Vec<StepOutline>,
    pub measurements: Vec<MeasurementResult>,
    pub slos: Vec<SloCheck>,
    pub verdict: Verdict,
    pub error: Option<String>,
    pub cleanup: CleanupReport,
    /// What the file asks for that loadgen accepted but did not run
    /// (unimplemented measurements, CL2 dependencies, chaosMonkey, …).
    #[serde(default)]
    pub skipped: Vec<String>,
}

impl ScenarioReport {
    pub fn new(s: &Scenario, target: &str, started_at_unix_nanos: u128) -> ScenarioReport {
        ScenarioReport {
            schema: SCHEMA.into(),
            name: s.name.clone(),
            file: s.file.display().to_string(),
            target: target.into(),
            started_at_unix_ms: u64::try_from(started_at_unix_nanos / 1_000_000).unwrap_or(0),
            duration_s: 0.0,
            interrupted: false,
            namespaces: s.namespaces.clone(),
            steps: Vec::new(),
            measurements: Vec::new(),
            slos: Vec::new(),
            verdict: Verdict::None,
            error: None,
            cleanup: CleanupReport::default(),
            skipped: s.skipped.clone(),
        }
    }

    /// The end table: steps, each measurement's calls, the SLOs and the verdict.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "scenario {} against {} ({:.1}s)",
            self.name, self.target, self.duration_s
        );
        for s in &self.steps {
            let _ = writeln!(
                out,
                "  step {:>2} {:<28} {:>8.1}s  {}",
                s.index,
                s.name,
                s.duration_s,
                s.error
                    .as_deref()
                    .map(|e| format!("FAILED: {e}"))
                    .unwrap_or_else(|| "ok".into())
            );
        }
        for m in &self.measurements {
            measurement_rows(&mut out, m);
        }
        for s in &self.slos {
            let _ = writeln!(
                out,
                "SLO {} {}: {} {:.3} {} (limit {:.3})",
                if s.met { "met   " } else { "MISSED" },
                s.measurement,
                s.subject,
                s.observed,
                s.unit,
                s.threshold
            );
        }
        if let Some(e) = &self.error {
            let _ = writeln!(out, "error: {e}");
        }
        for e in &self.cleanup.errors {
            let _ = writeln!(out, "cleanup: {e}");
        }
        let _ = writeln!(
            out,
            "verdict: {}",
            match self.verdict {
                Verdict::Pass => "pass",
                Verdict::Fail => "fail",
                Verdict::None => "none (no SLO checked)",
            }
        );
        out
    }
}

/// One measurement's lines of the end table: its calls, servers and watches.
fn measurement_rows(out: &mut String, m: &MeasurementResult) {
    let _ = writeln!(
        out,
        "{}/{} (steps {}..{}):",
        m.method,
        m.identifier,
        m.started_in_step,
        m.gathered_in_step
            .map(|s| s.to_string())
            .unwrap_or_else(|| "end".into())
    );
    if !m.calls.is_empty() {
        let _ = writeln!(
            out,
            "  {:<12} {:<16} {:<10} {:>8} {:>9} {:>9} {:>9} {:>7} {:>7}",
            "verb", "resource", "scope", "calls", "p50 ms", "p90 ms", "p99 ms", "errors", "429"
        );
        for c in &m.calls {
            let _ = writeln!(
                out,
                "  {:<12} {:<16} {:<10} {:>8} {:>9.2} {:>9.2} {:>9.2} {:>6.2}% {:>6.2}%",
                c.verb,
                c.resource,
                c.scope,
                c.requests,
                c.latency_ms.p50,
                c.latency_ms.p90,
                c.latency_ms.p99,
                c.error_rate * 100.0,
                c.rate_429 * 100.0
            );
        }
    }
    for s in &m.server_metrics {
        let _ = writeln!(
            out,
            "  {}: cpu avg {} cores, peak {}; memory avg {} MiB, peak {}",
            s.url,
            opt(s.cpu_cores_avg, 1.0),
            opt(s.cpu_cores_peak, 1.0),
            opt(s.memory_bytes_avg, 1048576.0),
            opt(s.memory_bytes_peak, 1048576.0)
        );
    }
    if let Some(w) = &m.watch {
        let _ = writeln!(
            out,
            "  watch {} × {}: {} timed events, p50 {:.2} ms, p99 {:.2} ms",
            w.watchers, w.resource, w.timed_events, w.latency_ms.p50, w.latency_ms.p99
        );
    }
}

fn opt(v: Option<f64>, div: f64) -> String {
    v.map(|x| format!("{:.2}", x / div))
        .unwrap_or_else(|| "-".into())
}

fn write_json(path: &Path, v: &impl Serialize) -> io::Result<()> {
    fs::write(
        path,
        serde_json::to_vec_pretty(v).map_err(io::Error::other)?,
    )
}

fn measurement_items(ms: &[MeasurementResult]) -> Vec<serde_json::Value> {
    ms.iter()
        .flat_map(|m| {
            let mut items = perf_items(&m.calls, &[("Metric", &m.method), ("Identifier", &m.identifier)]);
            if let Some(w) = &m.watch {
                items.push(serde_json::json!({
                    "data": {"Perc50": w.latency_ms.p50, "Perc90": w.latency_ms.p90, "Perc99": w.latency_ms.p99},
                    "unit": "ms",
                    "labels": {"Metric": m.method, "Identifier": m.identifier, "Resource": w.resource},
                }));
            }
            items
        })
        .collect()
}

/// `DIR/summary.json` and `DIR/perfdata.json` (every gathered measurement),
/// and each measurement's files as ClusterLoader2 names and fills them, so
/// perfdash finds them (see [`perfdash_name`]).
pub fn write_top(dir: &Path, r: &ScenarioReport) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    write_json(&dir.join("summary.json"), r)?;
    let at = crate::ops::rfc3339(crate::ops::unix_nanos());
    for m in &r.measurements {
        if m.summaries.is_empty() && matches!(m.method.as_str(), "WatchLatency" | "ResourceUsage") {
            // loadgen's own measurements: their PerfData (CL2's write their own
            // files; WaitForControlledPodsRunning writes none, as CL2's).
            let perf = serde_json::json!({
                "version": "v1",
                "dataItems": measurement_items(std::slice::from_ref(m)),
            });
            let name = if m.method_as_written.is_empty() {
                &m.method
            } else {
                &m.method_as_written
            };
            write_json(&dir.join(perfdash_name(name, &r.name, &at)), &perf)?;
        }
        for s in &m.summaries {
            write_json(&dir.join(perfdash_name(&s.name, &r.name, &at)), &s.content)?;
        }
    }
    let perf = serde_json::json!({
        "version": "v1",
        "dataItems": measurement_items(&r.measurements),
        "interrupted": r.interrupted,
    });
    write_json(&dir.join("perfdata.json"), &perf)
}

/// CL2's summary file name (`simple_test_executor.go`):
/// `{summary name}_{test name}_{RFC 3339 time}.json`, the parts joined by `_`.
/// The summary name is the measurement's `summaryName` or the name CL2 gives
/// it (`APIResponsivenessPrometheus`, `PodStartupLatency_<identifier>`, …);
/// perfdash's `OutputFilePrefix` matches `{summary name}_{test name}`.
pub fn perfdash_name(summary: &str, test: &str, at: &str) -> String {
    let part = crate::output::file_name;
    format!("{}_{}_{at}.json", part(summary), part(test))
}

/// A step's dir: `summary.json`, `perfdata.json` (its phases' calls and the
/// measurements it gathered) and each loadgen/etcd phase's own output.
pub fn write_step(
    dir: &Path,
    s: &StepReport,
    phases: &[(PhaseReport, Option<crate::Report>)],
) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    write_json(&dir.join("summary.json"), s)?;
    let mut items = measurement_items(&s.gathered);
    for (p, _) in phases {
        items.extend(perf_items(
            &p.calls,
            &[("Metric", "PhaseCalls"), ("Phase", &p.name)],
        ));
    }
    write_json(
        &dir.join("perfdata.json"),
        &serde_json::json!({"version": "v1", "dataItems": items}),
    )?;
    for (m, (p, full)) in phases.iter().enumerate() {
        if let Some(report) = full {
            let sub = dir.join(format!(
                "phase-{m:02}-{}",
                crate::output::file_name(&p.name)
            ));
            crate::output::write_all(&sub, report)?;
        }
    }
    Ok(())
}
