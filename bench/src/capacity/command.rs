//! `tollgate-bench capacity EXECUTION.yaml`: replays what the results file already holds into
//! the search, runs the experiments it still wants (appending each repetition as it
//! finishes), and writes the metric (`capacity.json`, `summary.md`) and the report
//! (`report.html`, `report.md`). With `clusterSize`, it does so for each size under
//! `sizes/<size>/` and writes the sizing recommendation (`sizing.json` and the report) on top.

use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use super::execution::{number, ClusterSize, Execution};
use super::experiment::{self, Binaries};
use super::results::ResultsFile;
use super::search::{Cell, Metric, Step};
use crate::report::capacity::Sizing;

/// The finished metric, as written to `capacity.json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub execution: String,
    pub fingerprint: String,
    pub metric: Metric,
    pub load_name: String,
    pub resource_name: String,
    /// Capacity: per resource value, the highest load meeting the SLOs (null: none).
    /// Demand: per load value, the least resource amount meeting them (null: none).
    pub values: Vec<MetricPoint>,
    /// Every experiment's verdict: grid[load][resource] (null: not run).
    pub grid: Vec<Vec<Option<bool>>>,
    pub loads: Vec<f64>,
    pub resources: Vec<f64>,
    pub experiments_run_now: usize,
    pub experiments_replayed: usize,
}

#[derive(Debug, Serialize)]
pub struct MetricPoint {
    pub at: f64,
    pub value: Option<f64>,
}

/// Runs the command on the execution file `execution`, writing into `output`, until it
/// finishes or `stop` resolves (Ctrl-C, SIGTERM); stopping drops the experiment in progress,
/// which kills its children, and keeps every finished repetition.
pub async fn main(
    execution: &Path,
    output: &Path,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let exec = Execution::load(execution)?;
    let bins = Binaries::beside_current_exe()?;
    let work = async {
        match &exec.cluster_size {
            None => {
                let outcome = run(&exec, &bins, output).await?;
                println!("{}", summary_markdown(&exec, &outcome));
                Ok::<_, anyhow::Error>(())
            }
            Some(cs) => run_sizes(&exec, cs, &bins, output).await.map(|_| ()),
        }
    };
    tokio::select! {
        o = work => o?,
        () = stop => anyhow::bail!(
            "stopped; finished experiments are kept in {} (results.jsonl): rerun the same \
             command to continue",
            output.display()
        ),
    };
    let page = crate::report::write_report(output)?;
    println!("results: {}", output.display());
    println!("report: {}", page.display());
    Ok(())
}

/// The search once per cluster size (each resumable in its own directory), then the sizing
/// recommendation: the least resource sustaining the target load per size, fitted linearly.
pub async fn run_sizes(
    exec: &Execution,
    cs: &ClusterSize,
    bins: &Binaries,
    output: &Path,
) -> anyhow::Result<Sizing> {
    use crate::report::capacity as rc;
    let target_load = cs
        .target_load
        .or_else(|| exec.load.values.last().copied())
        .context("the load dimension is empty")?;
    let mut sizes = Vec::new();
    for z in &cs.sizes {
        let dir_name = format!("sizes/{}", number(z.size));
        let dir = output.join(&dir_name);
        eprintln!(
            "capacity: cluster size {} {}",
            number(z.size),
            cs.unit.name()
        );
        let sub = exec.for_size(z);
        let outcome = run(&sub, bins, &dir).await?;
        println!("{}", summary_markdown(&sub, &outcome));
        crate::report::write_report(&dir)?;
        let needed = rc::needed(&rc::read_capacity(&dir)?, target_load);
        sizes.push(rc::SizeNeed {
            size: z.size,
            dir: dir_name,
            needed,
        });
    }
    let points: Vec<(f64, f64)> = sizes
        .iter()
        .filter_map(|z| Some((z.size, z.needed?)))
        .collect();
    let sizing = Sizing {
        execution: exec.name.clone(),
        unit: cs.unit.name().into(),
        load_name: exec.load.name.clone(),
        resource_name: exec.resource.name.clone(),
        target_load,
        sizes,
        fit: rc::linear_fit(&points),
        resource_is_quota_rate: resource_is_quota_rate(exec),
    };
    std::fs::write(
        output.join("sizing.json"),
        serde_json::to_string_pretty(&sizing)?,
    )?;
    match sizing.fit {
        Some(f) => println!(
            "sizing: {} needed for {} {} ≈ {} + {} × {}",
            sizing.resource_name,
            number(target_load),
            sizing.load_name,
            f.intercept,
            f.slope,
            sizing.unit
        ),
        None => println!("sizing: no cluster size met the target load; no fit"),
    }
    Ok(sizing)
}

/// Whether the resource dimension is tollgate's quota rate, so the fit is a quota setting.
fn resource_is_quota_rate(exec: &Execution) -> bool {
    let Some(tg) = &exec.sut.tollgate else {
        return false;
    };
    tg.args.iter().enumerate().any(|(i, a)| {
        a == "--quota-bytes-per-second={resource}"
            || (a == "--quota-bytes-per-second"
                && tg.args.get(i + 1).is_some_and(|v| v == "{resource}"))
    })
}

pub async fn run(exec: &Execution, bins: &Binaries, output: &Path) -> anyhow::Result<Outcome> {
    std::fs::create_dir_all(output).with_context(|| format!("creating {}", output.display()))?;
    let mut results = ResultsFile::open(&output.join("results.jsonl"), &exec.fingerprint())?;
    let (nl, nr) = (exec.load.values.len(), exec.resource.values.len());
    let replayed = results.verdicts(exec.repetitions).len();
    if replayed > 0 {
        eprintln!(
            "capacity: replaying {replayed} finished experiments from {}",
            results.path().display()
        );
    }
    let mut ran = 0;
    let metric = loop {
        let verdicts = results.verdicts(exec.repetitions);
        match exec.search.next(nl, nr, &verdicts) {
            Step::Done(metric) => break metric,
            Step::Run(cell) => {
                let done = results.repetitions().get(&cell).map_or(0, |r| r.len()) as u32;
                for rep in done..exec.repetitions {
                    eprintln!(
                        "capacity: experiment {} {} × {} {} (repetition {}/{})…",
                        number(exec.load.values[cell.load]),
                        exec.load.name,
                        number(exec.resource.values[cell.resource]),
                        exec.resource.name,
                        rep + 1,
                        exec.repetitions
                    );
                    let record = experiment::run(exec, bins, output, cell, rep).await?;
                    let detail: Vec<String> = record
                        .slos
                        .iter()
                        .map(|s| {
                            format!(
                                "{} {} (limit {})",
                                s.name,
                                s.value.map_or("missing".into(), |v| format!("{v:.3}")),
                                number(s.limit)
                            )
                        })
                        .collect();
                    eprintln!(
                        "capacity:   {} in {:.0} s: {}",
                        if record.ok { "PASS" } else { "FAIL" },
                        record.seconds,
                        detail.join("; ")
                    );
                    results.append(record)?;
                }
                ran += 1;
            }
        }
    };
    let verdicts = results.verdicts(exec.repetitions);
    let grid = (0..nl)
        .map(|l| {
            (0..nr)
                .map(|r| {
                    verdicts
                        .get(&Cell {
                            load: l,
                            resource: r,
                        })
                        .copied()
                })
                .collect()
        })
        .collect();
    let (at, of) = match exec.search.metric {
        Metric::Capacity => (&exec.resource.values, &exec.load.values),
        Metric::Demand => (&exec.load.values, &exec.resource.values),
    };
    let values = at
        .iter()
        .zip(&metric)
        .map(|(a, m)| MetricPoint {
            at: *a,
            value: m.map(|i| of[i]),
        })
        .collect();
    let outcome = Outcome {
        execution: exec.name.clone(),
        fingerprint: exec.fingerprint(),
        metric: exec.search.metric,
        load_name: exec.load.name.clone(),
        resource_name: exec.resource.name.clone(),
        values,
        grid,
        loads: exec.load.values.clone(),
        resources: exec.resource.values.clone(),
        experiments_run_now: ran,
        experiments_replayed: replayed,
    };
    let json = serde_json::to_string_pretty(&outcome)?;
    std::fs::write(output.join("capacity.json"), json)?;
    std::fs::write(output.join("summary.md"), summary_markdown(exec, &outcome))?;
    Ok(outcome)
}

/// The metric as a table, and the grid of verdicts as Theodolite draws it (loads up, resources
/// across; ✓ pass, ✗ fail, · not run).
pub fn summary_markdown(exec: &Execution, o: &Outcome) -> String {
    let mut s = format!("# Capacity: {}\n\n", exec.name);
    let (at_name, of_name, what) = match o.metric {
        Metric::Capacity => (
            &o.resource_name,
            &o.load_name,
            "highest load meeting the SLOs",
        ),
        Metric::Demand => (
            &o.load_name,
            &o.resource_name,
            "least resources meeting the SLOs",
        ),
    };
    s.push_str(&format!(
        "Metric: **{:?}** ({what}); search {:?}{}; {} experiments run now, {} replayed.\n\n",
        o.metric,
        exec.search.strategy,
        if exec.search.lower_bound {
            " with lower-bound restriction"
        } else {
            ""
        },
        o.experiments_run_now,
        o.experiments_replayed
    ));
    s.push_str(&format!("| {at_name} | {of_name} |\n|---|---|\n"));
    for p in &o.values {
        s.push_str(&format!(
            "| {} | {} |\n",
            number(p.at),
            p.value.map_or("none".into(), number)
        ));
    }
    s.push('\n');
    s.push_str(&crate::report::capacity::verdict_grid_markdown(
        &o.load_name,
        &o.resource_name,
        &o.loads,
        &o.resources,
        &o.grid,
    ));
    s.push_str("\nSLOs:\n");
    for slo in &exec.slos {
        let bound = match (slo.max, slo.min) {
            (Some(m), None) => format!("≤ {}", number(m)),
            (None, Some(m)) => format!("≥ {}", number(m)),
            (Some(a), Some(b)) => format!("between {} and {}", number(b), number(a)),
            (None, None) => String::new(),
        };
        s.push_str(&format!("- {} {bound}\n", slo.display_name()));
    }
    s
}
