//! The demo's `summary.json` (schema `tollgate.demo/v1`) and its report: the runs side by
//! side (baseline heartbeats direct and through tollgate, LIST storm without tollgate, LIST
//! storm through tollgate with its default adaptive budget, and the static pools tried for the
//! best one), each holding loadgen's summary for that run, the headline figures — heartbeat
//! PATCH p50/p99 beside the LISTs served per minute (goodput) — and the headline ratios with
//! their targets.
//!
//! Layout of a demo directory:
//! - `summary.json`, `summary.md`, `report.html`;
//! - `runs/<run>/loadgen/` (loadgen's output), `runs/<run>/memory.csv` (the modeled
//!   apiserver's memory, sampled each second), `runs/<run>/quota.csv` and `budget.csv`
//!   (tollgate's quota pool level and heavy-lane budget, through-tollgate runs only), and the
//!   programs' logs.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::loadgen::{chart, operations_table, opt, read_samples, LoadgenRun};
use super::svg::Series;
use super::{fmt, Block, Document, ReportError, Table};

mod ratios;
mod runs;
pub use ratios::{
    judge, target_ms, Ratios, GOODPUT_TARGET, TARGET_BASELINE_MULTIPLE, TARGET_FLOOR_MS,
    UNPROTECTED_TARGET,
};
pub use runs::{Headline, RunSummary, Setup};

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

/// The headline table: each run's heartbeat PATCH p99 and p50 beside its goodput.
pub fn headline_table(h: &[Headline]) -> Table {
    Table {
        header: [
            "run",
            "heartbeat PATCH p99 ms",
            "PATCH p50 ms",
            "LISTs served/min (goodput)",
            "heartbeats within target",
            "LIST p99 ms",
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
                    fmt((h.lists_served_per_minute * 10.0).round() / 10.0),
                    match h.within_target {
                        Some(true) => "yes".into(),
                        Some(false) => "no".into(),
                        None => "–".into(),
                    },
                    opt(h.list_p99_ms),
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
            " Tollgate served {} LISTs/min (its goodput) and answered {} with 429.",
            fmt((p.lists_served_per_minute * 10.0).round() / 10.0),
            p.rejected_429
        ));
    }
    let best = h
        .iter()
        .filter(|x| x.run.starts_with("static-") && x.within_target == Some(true))
        .max_by(|a, b| {
            a.lists_served_per_minute
                .total_cmp(&b.lists_served_per_minute)
        });
    if let Some(b) = best {
        s.push_str(&format!(
            " The best static pool tried ({}) served {} LISTs/min within the target.",
            b.title,
            fmt((b.lists_served_per_minute * 10.0).round() / 10.0)
        ));
    }
    s.trim().to_owned()
}

/// One demo run as the report reads it: its summary, loadgen's output, and the sampled metrics.
struct DemoRun<'a> {
    run: &'a RunSummary,
    lg: LoadgenRun,
    memory: Vec<(f64, f64)>,
    quota: Vec<(f64, f64)>,
    budget: Vec<(f64, f64)>,
}

/// The demo's report.
pub fn document(dir: &Path) -> Result<Document, ReportError> {
    let s = read_summary(dir)?;
    let mut runs: Vec<DemoRun> = Vec::new();
    for r in &s.runs {
        let run_dir = dir.join(&r.dir);
        let lg = LoadgenRun::read(&run_dir.join("loadgen"))?;
        runs.push(DemoRun {
            run: r,
            lg,
            memory: read_samples(&run_dir.join("memory.csv"))?,
            quota: read_samples(&run_dir.join("quota.csv"))?,
            budget: read_samples(&run_dir.join("budget.csv"))?,
        });
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
    for DemoRun { run: r, lg, .. } in &runs {
        let tollgate = if r.tollgate_args.is_empty() {
            String::new()
        } else {
            format!("; tollgate {}", r.tollgate_args.join(" "))
        };
        blocks.push(Block::Text(format!(
            "**{}** ({}; sim crashes: {}{tollgate}):",
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
    let budget = match s.setup.quota_bytes_per_second {
        None => "its default adaptive budget (no pool set by hand)".to_owned(),
        Some(r) => format!(
            "a static pool set by hand (--quota-mode static, {r} bytes/s, burst {} bytes)",
            s.setup.quota_burst_bytes
        ),
    };
    let statics = match s.setup.static_pools {
        0 => " The best static pool was not measured.".to_owned(),
        n => format!(
            " For comparison, up to {n} static pools (--quota-mode static, burst {} bytes) \
             each get the storm, the best being the one within the target that served the most.",
            s.setup.quota_burst_bytes
        ),
    };
    format!(
        "Setup: a simulated control plane with the modeled cost (a 2-core apiserver and \
         etcd), {} nodes and {} pods; {} nodes heartbeat with status PATCHes at {}/s; the \
         storm is {} consistent LISTs of all pods per minute (they read etcd); each run \
         lasts {} s on a freshly started control plane. The protected run is tollgate in \
         enforce mode with {budget}.{statics} The target, tollgate's default adaptive one: \
         heartbeat PATCH p99 ≤ max(2 × the baseline through tollgate, 50 ms), no heartbeat \
         failing, no crash.{}",
        s.setup.nodes,
        s.setup.pods,
        s.setup.heartbeat_nodes,
        fmt(s.setup.patches_per_second),
        fmt(s.setup.lists_per_minute),
        fmt(s.setup.duration_seconds),
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
                .map(|d| d.lg.latency_series("patch", &d.run.title, |x| x.p99_ms))
                .collect(),
            true,
        ),
        chart(
            "Heartbeat PATCH p50 per second",
            "ms",
            runs.iter()
                .map(|d| d.lg.latency_series("patch", &d.run.title, |x| x.p50_ms))
                .collect(),
            true,
        ),
        chart(
            "LIST p99 per second",
            "ms",
            runs.iter()
                .map(|d| d.lg.latency_series("list", &d.run.title, |x| x.p99_ms))
                .collect(),
            true,
        ),
        Block::Heading("429s, errors and LISTs served over time".into()),
        chart(
            "429 answers per second (all operations)",
            "429/s",
            runs.iter()
                .map(|d| d.lg.total_series(&d.run.title, |x| x.rejected_429))
                .collect(),
            false,
        ),
        chart(
            "Errors per second (5xx, transport, other 4xx)",
            "errors/s",
            runs.iter()
                .map(|d| d.lg.total_series(&d.run.title, |x| x.errors - x.rejected_429))
                .collect(),
            false,
        ),
        chart(
            "LISTs served (2xx) per second",
            "LIST/s",
            runs.iter()
                .map(|d| d.lg.series("list", &d.run.title, |x| x.ok))
                .collect(),
            false,
        ),
        Block::Heading("Tollgate's budget, its quota pool and the apiserver's memory".into()),
        chart(
            "Heavy-lane budget (tollgate_budget_bytes_per_second: the adaptive controller's, or the static pool's rate)",
            "bytes/s",
            samples(runs, |d| &d.budget),
            false,
        ),
        chart(
            "Quota pool level (tollgate_quota_available_bytes; negative: debt)",
            "bytes",
            samples(runs, |d| &d.quota),
            false,
        ),
        chart(
            "Modeled apiserver memory (tollgate_sim_virtual_memory_bytes)",
            "bytes",
            samples(runs, |d| &d.memory),
            false,
        ),
    ]
}

/// One sampled metric of each run, as chart series.
fn samples(runs: &[DemoRun], f: for<'a> fn(&'a DemoRun) -> &'a [(f64, f64)]) -> Vec<Series> {
    runs.iter()
        .map(|d| Series {
            name: d.run.title.clone(),
            points: f(d).to_vec(),
        })
        .collect()
}

#[cfg(test)]
mod tests;
