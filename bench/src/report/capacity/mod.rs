//! The report of a capacity run: the capacity (or demand) curve, Theodolite's grid of SLO
//! verdicts, every experiment's SLO values, latency/429/error rates over time per experiment,
//! and — when the execution named cluster sizes — the sizing recommendation: a linear fit of
//! the resource needed against cluster size (nodes or containers, KEP-5546's two modes) and
//! the tollgate quota settings that follow from it.
//!
//! Layout read: `capacity.json`, `results.jsonl`, `experiments/*/loadgen/`; with cluster sizes,
//! `sizing.json` and one such directory per size under `sizes/<size>/`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::loadgen::{read_samples, LoadgenRun};
use super::svg::{verdict_grid, Chart, Series};
use super::{fmt, Block, Document, ReportError, Table};
use crate::capacity::goodput::{Objective, Served};
use crate::capacity::results::Record;

mod sizing;
pub use sizing::{linear_fit, needed, quota_settings, Fit, SizeNeed, Sizing};

/// `capacity.json`, as `capacity_command` writes it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityJson {
    pub execution: String,
    pub metric: String,
    /// Absent in files written before goodput: the offered load.
    #[serde(default)]
    pub maximises: Objective,
    pub load_name: String,
    pub resource_name: String,
    pub values: Vec<Point>,
    pub grid: Vec<Vec<Option<bool>>>,
    #[serde(default)]
    pub experiments: Vec<ExperimentPoint>,
    pub loads: Vec<f64>,
    pub resources: Vec<f64>,
}

/// The metric at one value of the outer dimension, and the experiment it was read off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Point {
    pub at: f64,
    pub value: Option<f64>,
    /// The offered load of that experiment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<f64>,
    /// What it served.
    #[serde(flatten)]
    pub served: Option<Served>,
}

/// One experiment's verdict (over all its repetitions) and what it served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExperimentPoint {
    pub load: f64,
    pub resource: f64,
    pub ok: bool,
    #[serde(flatten)]
    pub served: Option<Served>,
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, ReportError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReportError::Read {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| ReportError::Format {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

pub fn read_capacity(dir: &Path) -> Result<CapacityJson, ReportError> {
    read_json(&dir.join("capacity.json"))
}

/// The records of `results.jsonl` (the header line and torn lines skipped).
pub fn read_records(dir: &Path) -> Vec<Record> {
    std::fs::read_to_string(dir.join("results.jsonl"))
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The report of a capacity directory (with or without cluster sizes).
pub fn document(dir: &Path) -> Result<Document, ReportError> {
    let sizing_path = dir.join("sizing.json");
    if sizing_path.exists() {
        let s: Sizing = read_json(&sizing_path)?;
        return sizing::document(dir, &s);
    }
    let c = read_capacity(dir)?;
    let mut doc = Document {
        title: format!("Capacity: {}", c.execution),
        headline: headline_of(&c),
        blocks: vec![],
    };
    doc.blocks.extend(capacity_blocks(dir, &c, ""));
    Ok(doc)
}

/// What the metric's value is, in a few words.
pub fn metric_meaning(metric: &str, maximises: Objective) -> &'static str {
    match (metric, maximises) {
        ("demand", _) => "least resources meeting the SLOs",
        (_, Objective::Goodput) => {
            "most LISTs served per minute (goodput) among the experiments meeting the SLOs"
        }
        (_, Objective::OfferedLoad) => "highest load meeting the SLOs",
    }
}

/// The metric per value of the outer dimension, with the offered load and what was served in
/// the experiment it was read off (also the table of the `summary.md` a capacity run writes).
pub(crate) fn metric_table(
    metric: &str,
    maximises: Objective,
    load_name: &str,
    resource_name: &str,
    values: &[Point],
) -> Table {
    let mut header = if metric == "demand" {
        vec![
            load_name.to_owned(),
            format!("least {resource_name} meeting the SLOs"),
        ]
    } else if maximises == Objective::Goodput {
        vec![
            resource_name.to_owned(),
            "LISTs served/min (goodput) within the SLOs".to_owned(),
            format!("at {load_name}"),
        ]
    } else {
        vec![
            resource_name.to_owned(),
            format!("highest {load_name} meeting the SLOs"),
        ]
    };
    let goodput_column = maximises != Objective::Goodput || metric == "demand";
    if goodput_column {
        header.push("LISTs served/min".into());
    }
    header.push("served MB".into());
    let none = || "none".to_owned();
    let rows = values
        .iter()
        .map(|p| {
            let mut row = vec![fmt(p.at), p.value.map_or_else(none, fmt)];
            if !goodput_column {
                row.push(p.load.map_or_else(none, fmt));
            } else {
                row.push(p.served.map_or("–".into(), |s| fmt(s.lists_per_minute)));
            }
            row.push(p.served.map_or("–".into(), |s| fmt(s.bytes as f64 / 1e6)));
            row
        })
        .collect();
    Table { header, rows }
}

fn headline_of(c: &CapacityJson) -> Table {
    metric_table(
        &c.metric,
        c.maximises,
        &c.load_name,
        &c.resource_name,
        &c.values,
    )
}

fn grid_markdown(c: &CapacityJson) -> String {
    verdict_grid_markdown(
        &c.load_name,
        &c.resource_name,
        &c.loads,
        &c.resources,
        &c.grid,
    )
}

/// The verdict grid as Theodolite draws it, loads up and resources across; also the grid of
/// the `summary.md` a capacity run writes.
pub(crate) fn verdict_grid_markdown(
    load_name: &str,
    resource_name: &str,
    loads: &[f64],
    resources: &[f64],
    grid: &[Vec<Option<bool>>],
) -> String {
    let mut s = format!(
        "SLO verdicts ({load_name} down, {resource_name} across; ✓ pass, ✗ fail, · not run):\n\n| |"
    );
    for r in resources {
        s.push_str(&format!(" {} |", fmt(*r)));
    }
    s.push_str("\n|---|");
    s.push_str(&"---|".repeat(resources.len()));
    s.push('\n');
    for (l, row) in loads.iter().zip(grid).rev() {
        s.push_str(&format!("| {} |", fmt(*l)));
        for v in row {
            s.push_str(match v {
                Some(true) => " ✓ |",
                Some(false) => " ✗ |",
                None => " · |",
            });
        }
        s.push('\n');
    }
    s
}

/// The curve, grid, experiment table and time series of one capacity directory.
fn capacity_blocks(dir: &Path, c: &CapacityJson, prefix: &str) -> Vec<Block> {
    let mut blocks = vec![
        Block::Chart(metric_curve(c, prefix)),
        Block::Figure {
            svg: verdict_grid(
                &c.loads,
                &c.resources,
                &c.grid,
                &c.load_name,
                &c.resource_name,
            ),
            markdown: grid_markdown(c),
        },
    ];
    let records = read_records(dir);
    if records.is_empty() {
        return blocks;
    }
    let (table, runs) = experiment_table(dir, c, &records);
    blocks.push(Block::Heading(format!("{prefix}Experiments")));
    blocks.push(Block::Table(table));
    blocks.extend(experiment_charts(c, prefix, &runs));
    blocks
}

/// The metric: capacity (load, or with tollgate goodput, per resource amount, beside the load
/// offered) or demand (resource per load).
fn metric_curve(c: &CapacityJson, prefix: &str) -> Chart {
    let demand = c.metric == "demand";
    let series = |name: &str, f: fn(&Point) -> Option<f64>| Series {
        name: name.into(),
        points: c
            .values
            .iter()
            .filter_map(|p| Some((p.at, f(p)?)))
            .collect(),
    };
    let goodput = !demand && c.maximises == Objective::Goodput;
    Chart {
        title: format!("{prefix}{} curve", capitalized(&c.metric)),
        x_label: if demand {
            c.load_name.clone()
        } else {
            c.resource_name.clone()
        },
        y_label: if demand {
            c.resource_name.clone()
        } else if goodput {
            format!("LISTs served/min; {}", c.load_name)
        } else {
            c.load_name.clone()
        },
        series: if goodput {
            vec![
                series("goodput (LISTs served/min)", |p| p.value),
                series("offered load", |p| p.load),
            ]
        } else {
            vec![series(&c.metric, |p| p.value)]
        },
        log_y: false,
    }
}

/// One experiment's loadgen output and quota samples, named `load×resource`.
type ExperimentRun = (String, LoadgenRun, Vec<(f64, f64)>);

/// One row per repetition (cell, verdict, each SLO's value), and the runs whose files are
/// still there.
fn experiment_table(
    dir: &Path,
    c: &CapacityJson,
    records: &[Record],
) -> (Table, Vec<ExperimentRun>) {
    let mut t = Table {
        header: vec![
            c.load_name.clone(),
            c.resource_name.clone(),
            "rep".into(),
            "verdict".into(),
            "LISTs served/min".into(),
            "served MB".into(),
        ],
        rows: vec![],
    };
    for s in &records[0].slos {
        t.header.push(s.name.clone());
    }
    let mut runs = Vec::new();
    for r in records {
        let mut row = vec![
            fmt(r.load),
            fmt(r.resource),
            (r.repetition + 1).to_string(),
            if r.ok { "pass" } else { "fail" }.into(),
            r.served.map_or("–".into(), |s| fmt(s.lists_per_minute)),
            r.served.map_or("–".into(), |s| fmt(s.bytes as f64 / 1e6)),
        ];
        row.extend(r.slos.iter().map(|s| {
            format!(
                "{}{}",
                s.value.map_or("missing".into(), fmt),
                if s.ok { "" } else { " ✗" }
            )
        }));
        t.rows.push(row);
        if let Some(out) = &r.output {
            if let Ok(lg) = LoadgenRun::read(&dir.join(out).join("loadgen")) {
                let quota = read_samples(&dir.join(out).join("quota.csv")).unwrap_or_default();
                runs.push((format!("{}×{}", fmt(r.load), fmt(r.resource)), lg, quota));
            }
        }
    }
    (t, runs)
}

/// Per second, one series per experiment: each operation's p99, 429s, other errors, and
/// tollgate's quota pool when sampled.
fn experiment_charts(c: &CapacityJson, prefix: &str, runs: &[ExperimentRun]) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut ops: Vec<String> = runs
        .iter()
        .flat_map(|(_, lg, _)| lg.timeseries.keys().cloned())
        .collect();
    ops.sort();
    ops.dedup();
    let chart = |title: String, y: &str, series: Vec<Series>, log_y| {
        Block::Chart(Chart {
            title,
            x_label: "second of the experiment".into(),
            y_label: y.into(),
            series,
            log_y,
        })
    };
    for op in &ops {
        blocks.push(chart(
            format!(
                "{prefix}{op} p99 per second, per experiment ({} × {})",
                c.load_name, c.resource_name
            ),
            "ms",
            runs.iter()
                .map(|(n, lg, _)| lg.latency_series(op, n, |x| x.p99_ms))
                .collect(),
            true,
        ));
    }
    blocks.push(chart(
        format!("{prefix}429 answers per second, per experiment"),
        "429/s",
        runs.iter()
            .map(|(n, lg, _)| lg.total_series(n, |x| x.rejected_429))
            .collect(),
        false,
    ));
    blocks.push(chart(
        format!("{prefix}Errors per second (other than 429), per experiment"),
        "errors/s",
        runs.iter()
            .map(|(n, lg, _)| lg.total_series(n, |x| x.errors - x.rejected_429))
            .collect(),
        false,
    ));
    if runs.iter().any(|(_, _, q)| !q.is_empty()) {
        blocks.push(chart(
            format!("{prefix}Quota pool level, per experiment"),
            "bytes",
            runs.iter()
                .map(|(n, _, q)| Series {
                    name: n.clone(),
                    points: q.clone(),
                })
                .collect(),
            false,
        ));
    }
    blocks
}

fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
