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

/// The target every run's heartbeats are held to is tollgate's default adaptive target:
/// PATCH p99 ≤ max(this × the baseline through tollgate, [`TARGET_FLOOR_MS`]), with no heartbeat
/// failing and no apiserver crash.
pub const TARGET_BASELINE_MULTIPLE: f64 = 2.0;
pub const TARGET_FLOOR_MS: f64 = 50.0;
/// The unprotected run must be at least this multiple of the direct baseline (or crash).
pub const UNPROTECTED_TARGET: f64 = 10.0;
/// The protected run must serve at least this fraction of the best static pool's goodput.
pub const GOODPUT_TARGET: f64 = 0.8;

/// The heartbeat PATCH p99 target in ms, from the baseline through tollgate's p99.
pub fn target_ms(baseline_tollgate_p99: Option<f64>) -> Option<f64> {
    baseline_tollgate_p99.map(|b| (TARGET_BASELINE_MULTIPLE * b).max(TARGET_FLOOR_MS))
}

/// Sets each run's `within_target` against the target the baseline through tollgate gives.
pub fn judge(h: &mut [Headline]) {
    let target = target_ms(
        h.iter()
            .find(|x| x.run == "baseline-tollgate")
            .and_then(|x| x.patch_p99_ms),
    );
    for x in h {
        x.within_target = match (target, x.patch_p99_ms) {
            (Some(t), Some(p)) => Some(p <= t && x.heartbeat_failures == 0 && x.sim_crashes == 0),
            _ => None,
        };
    }
}

/// The demo's claims: heartbeat PATCH p99 ratios, each against the baseline that takes the same
/// path (tollgate's own cost is not charged to the storm, nor hidden from it), and the protected
/// run's goodput against the best static pool the demo tried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ratios {
    /// protected p99 / baseline-through-tollgate p99.
    pub protected_vs_tollgate_baseline: Option<f64>,
    /// The target as a ratio: [`target_ms`] / baseline-through-tollgate p99.
    pub protected_target: f64,
    /// [`target_ms`], when the baseline through tollgate has a p99.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protected_target_ms: Option<f64>,
    /// The protected run is within the target: p99 at most the target, no heartbeat failed,
    /// no crash (None: a p99 is missing).
    pub protected_met: Option<bool>,
    /// unprotected p99 / direct baseline p99.
    pub unprotected_vs_direct_baseline: Option<f64>,
    pub unprotected_target: f64,
    /// The unprotected run's apiserver crashed (the target is met either way then).
    pub unprotected_crashed: bool,
    pub unprotected_met: Option<bool>,
    /// baseline-through-tollgate p99 / direct baseline p99: what tollgate alone adds.
    pub tollgate_baseline_vs_direct: Option<f64>,
    /// Static pools the demo ran (runs `static-…`); 0: the best static pool was not measured.
    #[serde(default)]
    pub static_pools_tried: usize,
    /// The static pool run within the target that served the most LISTs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_static: Option<String>,
    /// protected LISTs served/min / the best static pool's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protected_vs_best_static: Option<f64>,
    #[serde(default = "goodput_target")]
    pub goodput_target: f64,
    /// `protected_vs_best_static >= goodput_target` and the protected run within the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput_met: Option<bool>,
}

fn goodput_target() -> f64 {
    GOODPUT_TARGET
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
        let target = target_ms(p99("baseline-tollgate"));
        let statics: Vec<&Headline> = h.iter().filter(|x| x.run.starts_with("static-")).collect();
        let best = statics
            .iter()
            .filter(|x| x.within_target == Some(true))
            .max_by(|a, b| {
                a.lists_served_per_minute
                    .total_cmp(&b.lists_served_per_minute)
            });
        let protected_met = get("protected").and_then(|x| x.within_target);
        let vs_best = match (get("protected"), best) {
            (Some(p), Some(b)) if b.lists_served_per_minute > 0.0 => {
                Some(p.lists_served_per_minute / b.lists_served_per_minute)
            }
            _ => None,
        };
        Ratios {
            protected_vs_tollgate_baseline: protected,
            protected_target: ratio(target, p99("baseline-tollgate"))
                .unwrap_or(TARGET_BASELINE_MULTIPLE),
            protected_target_ms: target,
            protected_met,
            unprotected_vs_direct_baseline: unprotected,
            unprotected_target: UNPROTECTED_TARGET,
            unprotected_crashed: crashed,
            unprotected_met: if crashed {
                Some(true)
            } else {
                unprotected.map(|r| r >= UNPROTECTED_TARGET)
            },
            tollgate_baseline_vs_direct: ratio(p99("baseline-tollgate"), p99("baseline")),
            static_pools_tried: statics.len(),
            best_static: best.map(|b| b.title.clone()),
            protected_vs_best_static: vs_best,
            goodput_target: GOODPUT_TARGET,
            goodput_met: vs_best.map(|r| r >= GOODPUT_TARGET && protected_met == Some(true)),
        }
    }

    /// The best static pool's comparison, in words.
    fn goodput_words(&self) -> String {
        match (&self.best_static, self.protected_vs_best_static) {
            _ if self.static_pools_tried == 0 => {
                "the best static pool's goodput was not measured (no static pool tried)".into()
            }
            (Some(best), Some(r)) => format!(
                "protected goodput = {:.0}% of the best of {} static pools tried ({best}; target \
                 ≥ {:.0}%: {})",
                r * 100.0,
                self.static_pools_tried,
                self.goodput_target * 100.0,
                met(self.goodput_met)
            ),
            _ => format!(
                "none of the {} static pools tried kept the heartbeats within the target",
                self.static_pools_tried
            ),
        }
    }

    /// The ratios and whether each target is met, in one sentence.
    pub fn sentence(&self) -> String {
        let r = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}×"));
        format!(
            "Headline ratios (heartbeat PATCH p99): protected / baseline through tollgate = {} \
             (target ≤ {}: {}); unprotected / direct baseline = {}{} (target ≥ {}× or a \
             crash: {}); tollgate alone adds {} over the direct baseline; {}.",
            r(self.protected_vs_tollgate_baseline),
            self.target_words(),
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
            self.goodput_words(),
        )
    }

    /// The protected target: tollgate's default adaptive target, as a ratio and in ms.
    fn target_words(&self) -> String {
        format!(
            "{:.2}× = max({}× baseline, {} ms){}",
            self.protected_target,
            fmt(TARGET_BASELINE_MULTIPLE),
            fmt(TARGET_FLOOR_MS),
            self.protected_target_ms
                .map_or(String::new(), |t| format!(" = {} ms", fmt(t)))
        )
    }

    /// The ratios as a table.
    pub fn table(&self) -> Table {
        let r = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}×"));
        let yes_no = |m: Option<bool>| match m {
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
                    format!("≤ {}", self.target_words()),
                    yes_no(self.protected_met),
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
                    yes_no(self.unprotected_met),
                ],
                vec![
                    "baseline through tollgate / direct baseline".into(),
                    r(self.tollgate_baseline_vs_direct),
                    "–".into(),
                    "–".into(),
                ],
                vec![
                    format!(
                        "protected LISTs served / best static pool's ({})",
                        match (self.static_pools_tried, &self.best_static) {
                            (0, _) => "not measured".to_owned(),
                            (n, Some(b)) => format!("{b}, best of {n} tried"),
                            (n, None) => format!("none of {n} tried within the target"),
                        }
                    ),
                    self.protected_vs_best_static
                        .map_or("–".into(), |v| format!("{:.0}%", v * 100.0)),
                    format!("≥ {:.0}%", self.goodput_target * 100.0),
                    yes_no(self.goodput_met),
                ],
            ],
        }
    }
}

fn met(m: Option<bool>) -> &'static str {
    match m {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "unknown",
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
    /// The protected run's hand-set static pool; none: tollgate's default adaptive budget.
    pub quota_bytes_per_second: Option<u64>,
    /// The static pools' burst (and the hand-set pool's).
    pub quota_burst_bytes: u64,
    /// Static pools the demo tries for the best one (0: not measured).
    #[serde(default)]
    pub static_pools: usize,
    pub sim_args: Vec<String>,
    pub tollgate_args: Vec<String>,
    pub loadgen_args: Vec<String>,
}

/// One run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    /// `baseline`, `baseline-tollgate`, `unprotected`, `protected`, `static-<bytes/s>`.
    pub name: String,
    pub title: String,
    pub through_tollgate: bool,
    pub list_storm: bool,
    /// The run's directory, relative to the demo's.
    pub dir: String,
    /// Modeled OOM kills of the simulated apiserver during the run.
    pub sim_restarts: u64,
    /// tollgate's flags in this run (besides addresses), if it ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tollgate_args: Vec<String>,
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
    /// LISTs answered 2xx per minute: the goodput.
    pub lists_served_per_minute: f64,
    pub rejected_429: u64,
    pub errors: u64,
    /// Heartbeat PATCHes not answered 2xx (429s and errors).
    #[serde(default)]
    pub heartbeat_failures: u64,
    pub sim_crashes: u64,
    /// Heartbeats within tollgate's default adaptive target (see [`judge`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within_target: Option<bool>,
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
            heartbeat_failures: lg.errors("patch") + lg.status_count("patch", "429"),
            sim_crashes: run.sim_restarts,
            within_target: None,
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
            heartbeat_failures: 0,
            sim_crashes: crashes,
            within_target: None,
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
        // Goodput beside the heartbeat p99 and p50, for every run.
        assert_eq!(t.header[3], "LISTs served/min (goodput)");
        assert_eq!(t.rows[0][2..4], ["1", "30"]);
    }

    #[test]
    fn the_target_is_tollgates_default_adaptive_one() {
        assert_eq!(target_ms(Some(10.0)), Some(50.0));
        assert_eq!(target_ms(Some(40.0)), Some(80.0));
        assert_eq!(target_ms(None), None);
        let mut runs = vec![
            h("baseline", 10.0, 0),
            h("baseline-tollgate", 40.0, 0),
            h("unprotected", 900.0, 0),
            h("protected", 80.0, 0),
            h("static-1", 81.0, 0),
        ];
        runs[0].heartbeat_failures = 1;
        judge(&mut runs);
        let within: Vec<Option<bool>> = runs.iter().map(|x| x.within_target).collect();
        assert_eq!(
            within,
            [
                Some(false),
                Some(true),
                Some(false),
                Some(true),
                Some(false)
            ],
            "a failed heartbeat or a p99 over 80 ms misses it"
        );
    }

    #[test]
    fn ratios_compare_each_run_with_the_baseline_on_its_path() {
        let mut runs = vec![
            h("baseline", 10.0, 0),
            h("baseline-tollgate", 20.0, 0),
            h("unprotected", 90.0, 0),
            h("protected", 60.0, 0),
        ];
        judge(&mut runs);
        let r = Ratios::of(&runs);
        // The target: max(2 × 20 ms, 50 ms) = 50 ms, 2.5× the baseline through tollgate.
        assert_eq!(r.protected_vs_tollgate_baseline, Some(3.0));
        assert_eq!(r.protected_target, 2.5);
        assert_eq!(r.protected_target_ms, Some(50.0));
        assert_eq!(r.protected_met, Some(false));
        assert_eq!(r.unprotected_vs_direct_baseline, Some(9.0));
        assert_eq!(r.unprotected_met, Some(false));
        assert_eq!(r.tollgate_baseline_vs_direct, Some(2.0));
        assert!(
            r.sentence()
                .contains("3.00× (target ≤ 2.50× = max(2× baseline, 50 ms) = 50 ms: NOT met)"),
            "{}",
            r.sentence()
        );
        assert!(r.sentence().contains("not measured"), "{}", r.sentence());
        // A crash meets the unprotected target whatever the p99.
        runs[2].sim_crashes = 1;
        runs[3].patch_p99_ms = Some(30.0);
        judge(&mut runs);
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

    #[test]
    fn goodput_is_compared_with_the_best_static_pool_within_the_target() {
        let mut runs = vec![
            h("baseline-tollgate", 20.0, 0),
            h("protected", 45.0, 0),
            h("static-10", 30.0, 0),
            h("static-20", 49.0, 0),
            h("static-40", 70.0, 0),
        ];
        runs[1].lists_served_per_minute = 8.0;
        runs[2].lists_served_per_minute = 4.0;
        runs[3].lists_served_per_minute = 9.0;
        runs[4].lists_served_per_minute = 16.0; // served more, but over the 50 ms target
        judge(&mut runs);
        let r = Ratios::of(&runs);
        assert_eq!(r.static_pools_tried, 3);
        assert_eq!(r.best_static.as_deref(), Some("static-20"));
        let vs = r.protected_vs_best_static.unwrap();
        assert!((vs - 8.0 / 9.0).abs() < 1e-9, "{vs}");
        assert_eq!(r.goodput_met, Some(true));
        assert!(
            r.sentence().contains("89% of the best of 3"),
            "{}",
            r.sentence()
        );
        assert_eq!(r.table().rows[3][1], "89%");
        let v = verdict(&runs);
        assert!(v.contains("static-20) served 9 LISTs/min"), "{v}");
        // Below 80% of it: not met.
        runs[1].lists_served_per_minute = 7.0;
        assert_eq!(Ratios::of(&runs).goodput_met, Some(false));
    }
}
