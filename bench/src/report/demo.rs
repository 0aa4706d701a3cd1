//! The demo's `summary.json` (schema `tollgate.demo/v1`) and its report: the four runs side
//! by side (baseline heartbeats direct and through tollgate, LIST storm without tollgate, LIST
//! storm through tollgate), each holding loadgen's summary for that run, the headline figures
//! and the headline ratios with their targets.
//!
//! Layout of a demo directory:
//! - `summary.json`, `summary.md`, `report.html`;
//! - `runs/<run>/loadgen/` (loadgen's output), `runs/<run>/memory.csv` (the modeled
//!   apiserver's memory, sampled each second), `runs/<run>/quota.csv` (tollgate's quota pool
//!   level, through-tollgate runs only), and the programs' logs.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::loadgen::{chart, operations_table, opt, read_samples, LoadgenRun};
use super::svg::Series;
use super::{fmt, Block, Document, ReportError, Table};

pub const SCHEMA: &str = "tollgate.demo/v1";

/// The demo's `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DemoSummary {
    pub schema: String,
    pub quick: bool,
    pub setup: Setup,
    pub runs: Vec<RunSummary>,
    pub headline: Vec<Headline>,
    /// The two headline ratios; absent in summaries written before there were four runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratios: Option<Ratios>,
}

/// The protected run must stay within this multiple of the baseline through tollgate.
pub const PROTECTED_TARGET: f64 = 1.5;
/// The unprotected run must be at least this multiple of the direct baseline (or crash).
pub const UNPROTECTED_TARGET: f64 = 10.0;

/// The demo's two claims as heartbeat PATCH p99 ratios, each against the baseline that takes
/// the same path: tollgate's own cost is not charged to the storm, nor hidden from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ratios {
    /// protected p99 / baseline-through-tollgate p99.
    pub protected_vs_tollgate_baseline: Option<f64>,
    pub protected_target: f64,
    /// `protected_vs_tollgate_baseline <= protected_target` (None: a p99 is missing).
    pub protected_met: Option<bool>,
    /// unprotected p99 / direct baseline p99.
    pub unprotected_vs_direct_baseline: Option<f64>,
    pub unprotected_target: f64,
    /// The unprotected run's apiserver crashed (the target is met either way then).
    pub unprotected_crashed: bool,
    pub unprotected_met: Option<bool>,
    /// baseline-through-tollgate p99 / direct baseline p99: what tollgate alone adds.
    pub tollgate_baseline_vs_direct: Option<f64>,
}

impl Ratios {
    pub fn of(h: &[Headline]) -> Ratios {
        let get = |n: &str| h.iter().find(|x| x.run == n);
        let p99 = |n: &str| get(n).and_then(|x| x.patch_p99_ms);
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        let protected = ratio(p99("protected"), p99("baseline-tollgate"));
        let unprotected = ratio(p99("unprotected"), p99("baseline"));
        let crashed = get("unprotected").is_some_and(|u| u.sim_crashes > 0);
        Ratios {
            protected_vs_tollgate_baseline: protected,
            protected_target: PROTECTED_TARGET,
            protected_met: protected.map(|r| r <= PROTECTED_TARGET),
            unprotected_vs_direct_baseline: unprotected,
            unprotected_target: UNPROTECTED_TARGET,
            unprotected_crashed: crashed,
            unprotected_met: if crashed {
                Some(true)
            } else {
                unprotected.map(|r| r >= UNPROTECTED_TARGET)
            },
            tollgate_baseline_vs_direct: ratio(p99("baseline-tollgate"), p99("baseline")),
        }
    }

    /// The ratios and whether each target is met, in one sentence.
    pub fn sentence(&self) -> String {
        let r = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}×"));
        let met = |m: Option<bool>| match m {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "unknown",
        };
        format!(
            "Headline ratios (heartbeat PATCH p99): protected / baseline through tollgate = {} \
             (target ≤ {}×: {}); unprotected / direct baseline = {}{} (target ≥ {}× or a \
             crash: {}); tollgate alone adds {} over the direct baseline.",
            r(self.protected_vs_tollgate_baseline),
            fmt(self.protected_target),
            met(self.protected_met),
            r(self.unprotected_vs_direct_baseline),
            if self.unprotected_crashed {
                ", apiserver crashed"
            } else {
                ""
            },
            fmt(self.unprotected_target),
            met(self.unprotected_met),
            r(self.tollgate_baseline_vs_direct),
        )
    }

    /// The ratios as a table.
    pub fn table(&self) -> Table {
        let r = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}×"));
        let met = |m: Option<bool>| match m {
            Some(true) => "yes".to_owned(),
            Some(false) => "no".to_owned(),
            None => "–".to_owned(),
        };
        Table {
            header: ["heartbeat PATCH p99 ratio", "measured", "target", "met"]
                .map(String::from)
                .to_vec(),
            rows: vec![
                vec![
                    "protected / baseline through tollgate".into(),
                    r(self.protected_vs_tollgate_baseline),
                    format!("≤ {}×", fmt(self.protected_target)),
                    met(self.protected_met),
                ],
                vec![
                    "unprotected / direct baseline".into(),
                    format!(
                        "{}{}",
                        r(self.unprotected_vs_direct_baseline),
                        if self.unprotected_crashed {
                            " (crashed)"
                        } else {
                            ""
                        }
                    ),
                    format!("≥ {}× or a crash", fmt(self.unprotected_target)),
                    met(self.unprotected_met),
                ],
                vec![
                    "baseline through tollgate / direct baseline".into(),
                    r(self.tollgate_baseline_vs_direct),
                    "–".into(),
                    "–".into(),
                ],
            ],
        }
    }
}

/// What every run shared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Setup {
    pub nodes: u64,
    pub pods: u64,
    pub heartbeat_nodes: u64,
    pub patches_per_second: f64,
    pub lists_per_minute: f64,
    pub duration_seconds: f64,
    pub quota_bytes_per_second: u64,
    pub quota_burst_bytes: u64,
    pub sim_args: Vec<String>,
    pub tollgate_args: Vec<String>,
    pub loadgen_args: Vec<String>,
}

/// One run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    /// `baseline`, `unprotected`, `protected`.
    pub name: String,
    pub title: String,
    pub through_tollgate: bool,
    pub list_storm: bool,
    /// The run's directory, relative to the demo's.
    pub dir: String,
    /// Modeled OOM kills of the simulated apiserver during the run.
    pub sim_restarts: u64,
    /// loadgen's `summary.json` for this run, as it wrote it.
    pub loadgen: serde_json::Value,
}

/// The figures a reader compares first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Headline {
    pub run: String,
    pub title: String,
    pub patch_p50_ms: Option<f64>,
    pub patch_p99_ms: Option<f64>,
    pub list_p99_ms: Option<f64>,
    pub lists_served_per_minute: f64,
    pub rejected_429: u64,
    pub errors: u64,
    pub sim_crashes: u64,
}

impl Headline {
    pub fn of(run: &RunSummary, lg: &LoadgenRun) -> Headline {
        let ops: Vec<String> = lg.summary["operations"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|o| o["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        Headline {
            run: run.name.clone(),
            title: run.title.clone(),
            patch_p50_ms: lg.latency_ms("patch", "p50"),
            patch_p99_ms: lg.latency_ms("patch", "p99"),
            list_p99_ms: lg.latency_ms("list", "p99"),
            lists_served_per_minute: lg.ok_per_minute("list"),
            rejected_429: ops.iter().map(|o| lg.status_count(o, "429")).sum(),
            errors: ops.iter().map(|o| lg.errors(o)).sum(),
            sim_crashes: run.sim_restarts,
        }
    }
}

pub fn is_demo(dir: &Path) -> bool {
    read_summary(dir).is_ok()
}

pub fn read_summary(dir: &Path) -> Result<DemoSummary, ReportError> {
    let path = dir.join("summary.json");
    let text = std::fs::read_to_string(&path).map_err(|source| ReportError::Read {
        path: path.clone(),
        source,
    })?;
    let s: DemoSummary = serde_json::from_str(&text).map_err(|e| ReportError::Format {
        path: path.clone(),
        message: e.to_string(),
    })?;
    if s.schema != SCHEMA {
        return Err(ReportError::Format {
            path,
            message: format!("schema {:?}, not {SCHEMA}", s.schema),
        });
    }
    Ok(s)
}

/// The headline table.
pub fn headline_table(h: &[Headline]) -> Table {
    Table {
        header: [
            "run",
            "heartbeat PATCH p99 ms",
            "PATCH p50 ms",
            "LIST p99 ms",
            "LISTs served/min",
            "429s",
            "errors (not 429)",
            "sim crashes",
        ]
        .map(String::from)
        .to_vec(),
        rows: h
            .iter()
            .map(|h| {
                vec![
                    h.title.clone(),
                    opt(h.patch_p99_ms),
                    opt(h.patch_p50_ms),
                    opt(h.list_p99_ms),
                    fmt(h.lists_served_per_minute.round()),
                    h.rejected_429.to_string(),
                    h.errors.to_string(),
                    h.sim_crashes.to_string(),
                ]
            })
            .collect(),
    }
}

/// One sentence per comparison the demo is about.
pub fn verdict(h: &[Headline]) -> String {
    let get = |n: &str| h.iter().find(|x| x.run == n);
    let p99 = |n: &str| get(n).and_then(|x| x.patch_p99_ms);
    let mut s = String::new();
    if let (Some(b), Some(u), Some(p)) = (p99("baseline"), p99("unprotected"), p99("protected")) {
        if b > 0.0 {
            s = format!(
                "Heartbeat PATCH p99: {} ms without LISTs; {} ms ({:.1}× the baseline) under the \
                 LIST storm without tollgate; {} ms ({:.1}×) with tollgate in front.",
                fmt(b),
                fmt(u),
                u / b,
                fmt(p),
                p / b
            );
            // Four-run demos: the protected run against the baseline on its own path.
            if let Some(bt) = p99("baseline-tollgate").filter(|v| *v > 0.0) {
                s.push_str(&format!(
                    " Through tollgate without LISTs: {} ms; the protected run's is {:.2}× \
                     that.",
                    fmt(bt),
                    p / bt
                ));
            }
        }
    }
    if let Some(u) = get("unprotected").filter(|u| u.sim_crashes > 0) {
        s.push_str(&format!(
            " Without tollgate the simulated apiserver was OOM-killed {} time(s).",
            u.sim_crashes
        ));
    }
    if let Some(p) = get("protected") {
        s.push_str(&format!(
            " Tollgate served {} LISTs/min and answered {} with 429.",
            fmt(p.lists_served_per_minute.round()),
            p.rejected_429
        ));
    }
    s.trim().to_owned()
}

/// One demo run as the report reads it: its summary, loadgen's output, and the memory and
/// quota samples.
type DemoRun<'a> = (&'a RunSummary, LoadgenRun, Vec<(f64, f64)>, Vec<(f64, f64)>);

/// The demo's report.
pub fn document(dir: &Path) -> Result<Document, ReportError> {
    let s = read_summary(dir)?;
    let mut runs: Vec<DemoRun> = Vec::new();
    for r in &s.runs {
        let run_dir = dir.join(&r.dir);
        let lg = LoadgenRun::read(&run_dir.join("loadgen"))?;
        let memory = read_samples(&run_dir.join("memory.csv"))?;
        let quota = read_samples(&run_dir.join("quota.csv"))?;
        runs.push((r, lg, memory, quota));
    }
    let ratios = s.ratios.clone().unwrap_or_else(|| Ratios::of(&s.headline));
    let mut blocks = vec![
        Block::Text(verdict(&s.headline)),
        Block::Text(ratios.sentence()),
        Block::Table(ratios.table()),
        Block::Text(setup_text(&s)),
    ];
    blocks.extend(over_time(&runs));
    blocks.push(Block::Heading("Each run".into()));
    for (r, lg, ..) in &runs {
        blocks.push(Block::Text(format!(
            "**{}** ({}; sim crashes: {}):",
            r.title, r.dir, r.sim_restarts
        )));
        blocks.push(Block::Table(operations_table(lg)));
    }
    Ok(Document {
        title: "Tollgate demo: a LIST storm against node heartbeats".into(),
        headline: headline_table(&s.headline),
        blocks,
    })
}

/// What was run, in a sentence the reader needs before the numbers.
fn setup_text(s: &DemoSummary) -> String {
    format!(
        "Setup: a simulated control plane with the modeled cost (a 2-core apiserver and \
         etcd), {} nodes and {} pods; {} nodes heartbeat with status PATCHes at {}/s; the \
         storm is {} consistent LISTs of all pods per minute (they read etcd); each run \
         lasts {} s on a freshly started control plane. Tollgate in enforce mode, quota \
         {} bytes/s, burst {} bytes.{}",
        s.setup.nodes,
        s.setup.pods,
        s.setup.heartbeat_nodes,
        fmt(s.setup.patches_per_second),
        fmt(s.setup.lists_per_minute),
        fmt(s.setup.duration_seconds),
        s.setup.quota_bytes_per_second,
        s.setup.quota_burst_bytes,
        if s.quick { " (quick version)" } else { "" }
    )
}

/// The runs side by side, per second: latencies, 429s, errors and LISTs served, the quota pool
/// and the modeled apiserver's memory.
fn over_time(runs: &[DemoRun]) -> Vec<Block> {
    vec![
        Block::Heading("Latency over time".into()),
        chart(
            "Heartbeat PATCH p99 per second",
            "ms",
            runs.iter()
                .map(|(r, lg, ..)| lg.latency_series("patch", &r.title, |x| x.p99_ms))
                .collect(),
            true,
        ),
        chart(
            "Heartbeat PATCH p50 per second",
            "ms",
            runs.iter()
                .map(|(r, lg, ..)| lg.latency_series("patch", &r.title, |x| x.p50_ms))
                .collect(),
            true,
        ),
        chart(
            "LIST p99 per second",
            "ms",
            runs.iter()
                .map(|(r, lg, ..)| lg.latency_series("list", &r.title, |x| x.p99_ms))
                .collect(),
            true,
        ),
        Block::Heading("429s, errors and LISTs served over time".into()),
        chart(
            "429 answers per second (all operations)",
            "429/s",
            runs.iter()
                .map(|(r, lg, ..)| lg.total_series(&r.title, |x| x.rejected_429))
                .collect(),
            false,
        ),
        chart(
            "Errors per second (5xx, transport, other 4xx)",
            "errors/s",
            runs.iter()
                .map(|(r, lg, ..)| lg.total_series(&r.title, |x| x.errors - x.rejected_429))
                .collect(),
            false,
        ),
        chart(
            "LISTs served (2xx) per second",
            "LIST/s",
            runs.iter()
                .map(|(r, lg, ..)| lg.series("list", &r.title, |x| x.ok))
                .collect(),
            false,
        ),
        Block::Heading("Tollgate's quota pool and the apiserver's memory".into()),
        chart(
            "Quota pool level (tollgate_quota_available_bytes; negative: debt)",
            "bytes",
            runs.iter()
                .map(|(r, _, _, q)| Series {
                    name: r.title.clone(),
                    points: q.clone(),
                })
                .collect(),
            false,
        ),
        chart(
            "Modeled apiserver memory (tollgate_sim_virtual_memory_bytes)",
            "bytes",
            runs.iter()
                .map(|(r, _, m, _)| Series {
                    name: r.title.clone(),
                    points: m.clone(),
                })
                .collect(),
            false,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(run: &str, p99: f64, crashes: u64) -> Headline {
        Headline {
            run: run.into(),
            title: run.into(),
            patch_p50_ms: Some(1.0),
            patch_p99_ms: Some(p99),
            list_p99_ms: None,
            lists_served_per_minute: 30.0,
            rejected_429: 5,
            errors: 0,
            sim_crashes: crashes,
        }
    }

    #[test]
    fn the_verdict_names_the_ratios() {
        let v = verdict(&[
            h("baseline", 10.0, 0),
            h("unprotected", 1000.0, 2),
            h("protected", 12.0, 0),
        ]);
        assert!(v.contains("100.0× the baseline"), "{v}");
        assert!(v.contains("(1.2×)"), "{v}");
        assert!(v.contains("OOM-killed 2 time(s)"), "{v}");
        assert!(v.contains("answered 5 with 429"), "{v}");
        let t = headline_table(&[h("baseline", 10.0, 0)]);
        assert_eq!(t.rows[0][1], "10");
    }

    #[test]
    fn ratios_compare_each_run_with_the_baseline_on_its_path() {
        let mut runs = vec![
            h("baseline", 10.0, 0),
            h("baseline-tollgate", 20.0, 0),
            h("unprotected", 90.0, 0),
            h("protected", 36.0, 0),
        ];
        let r = Ratios::of(&runs);
        assert_eq!(r.protected_vs_tollgate_baseline, Some(1.8));
        assert_eq!(r.protected_met, Some(false));
        assert_eq!(r.unprotected_vs_direct_baseline, Some(9.0));
        assert_eq!(r.unprotected_met, Some(false));
        assert_eq!(r.tollgate_baseline_vs_direct, Some(2.0));
        assert!(
            r.sentence().contains("1.80× (target ≤ 1.5×: NOT met)"),
            "{}",
            r.sentence()
        );
        // A crash meets the unprotected target whatever the p99.
        runs[2].sim_crashes = 1;
        runs[3].patch_p99_ms = Some(30.0);
        let r = Ratios::of(&runs);
        assert_eq!(
            (r.protected_met, r.unprotected_met),
            (Some(true), Some(true))
        );
        assert_eq!(r.table().rows[1][1], "9.00× (crashed)");
        // Three-run summaries (no baseline through tollgate) have no protected ratio.
        let r = Ratios::of(&[h("baseline", 10.0, 0), h("protected", 12.0, 0)]);
        assert_eq!(
            (r.protected_vs_tollgate_baseline, r.protected_met),
            (None, None)
        );
    }
}
