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

/// `capacity.json`, as `capacity::command` writes it.
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

/// `sizing.json`: what each cluster size needed, and the fit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sizing {
    pub execution: String,
    /// `nodes` or `containers`.
    pub unit: String,
    pub load_name: String,
    pub resource_name: String,
    /// The load the recommendation must sustain.
    pub target_load: f64,
    pub sizes: Vec<SizeNeed>,
    pub fit: Option<Fit>,
    /// Whether the resource dimension is tollgate's quota rate (`--quota-bytes-per-second`):
    /// then the fit is the quota configuration itself.
    pub resource_is_quota_rate: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SizeNeed {
    pub size: f64,
    /// The size's capacity directory, relative to the sizing one.
    pub dir: String,
    /// The least resource amount sustaining the target load (none: no amount tried did).
    pub needed: Option<f64>,
}

/// needed ≈ intercept + slope × size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fit {
    pub intercept: f64,
    pub slope: f64,
    /// Coefficient of determination (1: a perfect line; NaN written as null with one point).
    pub r2: Option<f64>,
}

/// Least squares over (size, needed); one point gives a line through the origin (needed
/// proportional to size, KEP-5546's proportional mode).
pub fn linear_fit(points: &[(f64, f64)]) -> Option<Fit> {
    match points {
        [] => None,
        [(x, y)] if *x != 0.0 => Some(Fit {
            intercept: 0.0,
            slope: y / x,
            r2: None,
        }),
        [_] => None,
        _ => {
            let n = points.len() as f64;
            let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
            let my = points.iter().map(|p| p.1).sum::<f64>() / n;
            let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
            let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
            let syy: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
            if sxx == 0.0 {
                return None;
            }
            let slope = sxy / sxx;
            let r2 = if syy == 0.0 {
                1.0
            } else {
                sxy * sxy / (sxx * syy)
            };
            Some(Fit {
                intercept: my - slope * mx,
                slope,
                r2: Some(r2),
            })
        }
    }
}

/// From one size's outcome, the least resource amount that sustains `target_load`: demand at
/// that load, or the smallest resource whose capacity reaches it — with tollgate in front
/// (`maximises: goodput`), whose LISTs served per minute reach it: a load tollgate mostly
/// answers with 429s is not sustained.
pub fn needed(c: &CapacityJson, target_load: f64) -> Option<f64> {
    if c.metric == "demand" {
        c.values
            .iter()
            .find(|p| (p.at - target_load).abs() < 1e-9)
            .and_then(|p| p.value)
    } else {
        c.values
            .iter()
            .find(|p| p.value.is_some_and(|v| v >= target_load - 1e-9))
            .map(|p| p.at)
    }
}

/// The quota settings the fit recommends (tollgate's configuration file keys). Burst keeps
/// tollgate's default ratio of 4 s of rate.
pub fn quota_settings(s: &Sizing, fit: Fit) -> String {
    let mode = if s.unit == "containers" {
        "containerProportional"
    } else {
        "nodeProportional"
    };
    let base = fit.intercept.max(0.0).round();
    let per = fit.slope.max(0.0).round();
    // The fit measured fixed pools: in the adaptive mode (the default) these would be ceilings.
    format!(
        "quota:\n  mode: static\n  bytesPerSecond: {base}          # the fit's intercept{}\n  \
         burstBytes: {}\n  scaling:\n    mode: {mode}\n    bytesPerSecondPerUnit: {per}   # per {}\n    \
         burstBytesPerUnit: {}\n",
        if fit.intercept < 0.0 {
            " (negative, clamped to 0)"
        } else {
            ""
        },
        (base * 4.0).max(1.0),
        s.unit.trim_end_matches('s'),
        per * 4.0
    )
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
        return sizing_document(dir, &s);
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

fn sizing_document(dir: &Path, s: &Sizing) -> Result<Document, ReportError> {
    let mut headline = Table {
        header: vec![
            s.unit.clone(),
            format!(
                "{} needed for {} {}",
                s.resource_name,
                fmt(s.target_load),
                s.load_name
            ),
        ],
        rows: vec![],
    };
    for z in &s.sizes {
        headline
            .rows
            .push(vec![fmt(z.size), z.needed.map_or("none".into(), fmt)]);
    }
    let mut blocks = vec![Block::Heading("Sizing recommendation".into())];
    match s.fit {
        Some(f) => {
            blocks.push(Block::Text(format!(
                "Linear fit: {} needed ≈ {} + {} × {}{}.",
                s.resource_name,
                fmt(f.intercept),
                fmt(f.slope),
                s.unit,
                f.r2.map_or(" (one size: proportional)".into(), |r| format!(
                    " (R² = {r:.3})"
                ))
            )));
            let mut fit_series = Series {
                name: "fit".into(),
                points: vec![],
            };
            for z in &s.sizes {
                fit_series
                    .points
                    .push((z.size, f.intercept + f.slope * z.size));
            }
            blocks.push(Block::Chart(Chart {
                title: format!("{} needed against cluster size", s.resource_name),
                x_label: s.unit.clone(),
                y_label: s.resource_name.clone(),
                series: vec![
                    Series {
                        name: "measured".into(),
                        points: s
                            .sizes
                            .iter()
                            .filter_map(|z| Some((z.size, z.needed?)))
                            .collect(),
                    },
                    fit_series,
                ],
                log_y: false,
            }));
            if s.resource_is_quota_rate {
                blocks.push(Block::Text(
                    "Tollgate quota settings (configuration file) from the fit:".into(),
                ));
                blocks.push(Block::Code(quota_settings(s, f)));
            } else {
                blocks.push(Block::Text(format!(
                    "The resource dimension is not tollgate's quota rate; size {} as the fit says.",
                    s.resource_name
                )));
            }
        }
        None => blocks.push(Block::Text(
            "No fit: fewer than one cluster size met the target load with any resource amount tried."
                .into(),
        )),
    }
    for z in &s.sizes {
        let sub = dir.join(&z.dir);
        if let Ok(c) = read_capacity(&sub) {
            blocks.push(Block::Heading(format!("{} {}", fmt(z.size), s.unit)));
            blocks.push(Block::Table(headline_of(&c)));
            blocks.extend(capacity_blocks(
                &sub,
                &c,
                &format!("{} {}: ", fmt(z.size), s.unit),
            ));
        }
    }
    Ok(Document {
        title: format!("Capacity and sizing: {}", s.execution),
        headline,
        blocks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_a_line() {
        let f = linear_fit(&[(100.0, 15.0), (200.0, 25.0), (400.0, 45.0)]).unwrap();
        assert!((f.slope - 0.1).abs() < 1e-9 && (f.intercept - 5.0).abs() < 1e-9);
        assert!((f.r2.unwrap() - 1.0).abs() < 1e-9);
        let one = linear_fit(&[(1000.0, 50.0)]).unwrap();
        assert_eq!((one.intercept, one.slope), (0.0, 0.05));
        assert!(linear_fit(&[]).is_none());
        assert!(linear_fit(&[(5.0, 1.0), (5.0, 2.0)]).is_none());
    }

    fn outcome(metric: &str, values: &[(f64, Option<f64>)]) -> CapacityJson {
        CapacityJson {
            execution: "e".into(),
            metric: metric.into(),
            maximises: Objective::OfferedLoad,
            load_name: "l".into(),
            resource_name: "r".into(),
            values: values
                .iter()
                .map(|(at, value)| Point {
                    at: *at,
                    value: *value,
                    load: None,
                    served: None,
                })
                .collect(),
            grid: vec![],
            experiments: vec![],
            loads: vec![],
            resources: vec![],
        }
    }

    #[test]
    fn needed_reads_either_metric() {
        // capacity: per resource, highest load
        let c = outcome(
            "capacity",
            &[(10.0, None), (20.0, Some(60.0)), (40.0, Some(120.0))],
        );
        assert_eq!(needed(&c, 120.0), Some(40.0));
        assert_eq!(needed(&c, 60.0), Some(20.0));
        assert_eq!(needed(&c, 250.0), None);
        // demand: per load, least resource
        let d = outcome("demand", &[(60.0, Some(10.0)), (120.0, Some(30.0))]);
        assert_eq!(needed(&d, 120.0), Some(30.0));
    }

    #[test]
    fn the_goodput_table_puts_the_offered_load_beside_the_lists_served() {
        let served = |g: f64, b: u64| {
            Some(Served {
                lists_per_minute: g,
                bytes: b,
            })
        };
        let points = [
            Point {
                at: 2.0,
                value: Some(20.5),
                load: Some(1920.0),
                served: served(20.5, 3_000_000),
            },
            Point {
                at: 4.0,
                value: None,
                load: None,
                served: None,
            },
        ];
        let t = metric_table(
            "capacity",
            Objective::Goodput,
            "LIST calls/min",
            "vCPUs",
            &points,
        );
        assert_eq!(
            t.header,
            [
                "vCPUs",
                "LISTs served/min (goodput) within the SLOs",
                "at LIST calls/min",
                "served MB"
            ]
        );
        assert_eq!(t.rows[0], ["2", "20.5", "1920", "3"]);
        assert_eq!(t.rows[1], ["4", "none", "none", "–"]);
        let mut plain = points[0].clone();
        plain.value = Some(1920.0);
        let t = metric_table("capacity", Objective::OfferedLoad, "l", "r", &[plain]);
        assert_eq!(t.header[1], "highest l meeting the SLOs");
        assert_eq!(t.rows[0], ["2", "1920", "20.5", "3"]);
        // A capacity in goodput sustains a target load only when that many were served.
        let mut c = outcome("capacity", &[(2.0, Some(20.5)), (4.0, Some(130.0))]);
        c.maximises = Objective::Goodput;
        assert_eq!(needed(&c, 120.0), Some(4.0));
    }

    #[test]
    fn quota_settings_follow_the_unit() {
        let s = Sizing {
            execution: "e".into(),
            unit: "containers".into(),
            load_name: "l".into(),
            resource_name: "quota bytes/s".into(),
            target_load: 120.0,
            sizes: vec![],
            fit: None,
            resource_is_quota_rate: true,
        };
        let q = quota_settings(
            &s,
            Fit {
                intercept: -5.0,
                slope: 1000.0,
                r2: Some(0.9),
            },
        );
        assert!(q.contains("mode: containerProportional"), "{q}");
        assert!(
            q.contains("quota:\n  mode: static\n"),
            "a fitted pool is fixed: {q}"
        );
        assert!(q.contains("bytesPerSecondPerUnit: 1000"), "{q}");
        assert!(q.contains("clamped"), "{q}");
    }
}
