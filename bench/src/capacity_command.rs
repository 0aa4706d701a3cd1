//! `tollgate-bench capacity EXECUTION.yaml`: replays what the results file already holds into
//! the search, runs the experiments it still wants (appending each repetition as it
//! finishes), and writes the metric (`capacity.json`, `summary.md`) and the report
//! (`report.html`, `report.md`). With `clusterSize`, it does so for each size under
//! `sizes/<size>/` and writes the sizing recommendation (`sizing.json` and the report) on top.
//!
//! It sits above [`crate::capacity`] (the search, which knows nothing of reports) and
//! [`crate::report`] (which reads what the search wrote).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::capacity::execution::{number, ClusterSize, Execution};
use crate::capacity::experiment::{self, Binaries};
use crate::capacity::goodput::{self, Objective, Served};
use crate::capacity::results::{Record, ResultsFile};
use crate::capacity::search::{Cell, Metric, Step, Verdicts};
use crate::report::capacity::{ExperimentPoint, Point, Sizing};

/// The finished metric, as written to `capacity.json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub execution: String,
    pub fingerprint: String,
    pub metric: Metric,
    /// What a capacity maximises: `goodput` (LISTs served per minute) with tollgate in front,
    /// `offeredLoad` without, and for demand.
    pub maximises: Objective,
    pub load_name: String,
    pub resource_name: String,
    /// Capacity: per resource value, the highest offered load meeting the SLOs, or with
    /// `maximises: goodput` the most LISTs served per minute among the experiments meeting
    /// them (null: none). Demand: per load value, the least resource amount meeting them. Each
    /// with the offered load and what was served in the experiment it was read off.
    pub values: Vec<Point>,
    /// Every experiment's verdict: grid[load][resource] (null: not run).
    pub grid: Vec<Vec<Option<bool>>>,
    /// Every experiment run, with what it served beside the load it was offered.
    pub experiments: Vec<ExperimentPoint>,
    pub loads: Vec<f64>,
    pub resources: Vec<f64>,
    pub experiments_run_now: usize,
    pub experiments_replayed: usize,
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
    for w in exec.warnings() {
        eprintln!("capacity: warning: {w}");
    }
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

/// The search in `output`: replays `results.jsonl`, runs the experiments it still wants, and
/// writes `capacity.json` and `summary.md`.
pub async fn run(exec: &Execution, bins: &Binaries, output: &Path) -> anyhow::Result<Outcome> {
    std::fs::create_dir_all(output).with_context(|| format!("creating {}", output.display()))?;
    let mut results = ResultsFile::open(&output.join("results.jsonl"), &exec.fingerprint())?;
    let replayed = results.verdicts(exec.repetitions).len();
    if replayed > 0 {
        eprintln!(
            "capacity: replaying {replayed} finished experiments from {}",
            results.path().display()
        );
    }
    let (nl, nr) = (exec.load.values.len(), exec.resource.values.len());
    let mut ran = 0;
    let metric = loop {
        let verdicts = results.verdicts(exec.repetitions);
        match exec.search.next(nl, nr, &verdicts) {
            Step::Done(metric) => break metric,
            Step::Run(cell) => {
                run_experiment(exec, bins, output, &mut results, cell).await?;
                ran += 1;
            }
        }
    };
    let outcome = outcome(exec, &results, metric, ran, replayed);
    let json = serde_json::to_string_pretty(&outcome)?;
    std::fs::write(output.join("capacity.json"), json)?;
    std::fs::write(output.join("summary.md"), summary_markdown(exec, &outcome))?;
    Ok(outcome)
}

/// Runs the repetitions of `cell` that `results` does not hold yet, appending each as it finishes.
async fn run_experiment(
    exec: &Execution,
    bins: &Binaries,
    output: &Path,
    results: &mut ResultsFile,
    cell: Cell,
) -> anyhow::Result<()> {
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
        eprintln!("capacity:   {}", verdict_line(&record));
        results.append(record)?;
    }
    Ok(())
}

/// One repetition's verdict for the progress log: pass or fail, time, each SLO, what was served.
fn verdict_line(record: &Record) -> String {
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
    let served = record.served.map_or(String::new(), |s| {
        format!(
            "; served {} LISTs/min, {} MB",
            number((s.lists_per_minute * 10.0).round() / 10.0),
            number((s.bytes as f64 / 1e5).round() / 10.0)
        )
    });
    format!(
        "{} in {:.0} s: {}{served}",
        if record.ok { "PASS" } else { "FAIL" },
        record.seconds,
        detail.join("; ")
    )
}

/// The finished metric, with every verdict and what each experiment served.
fn outcome(
    exec: &Execution,
    results: &ResultsFile,
    metric: Vec<Option<usize>>,
    ran: usize,
    replayed: usize,
) -> Outcome {
    let (nl, nr) = (exec.load.values.len(), exec.resource.values.len());
    let verdicts = results.verdicts(exec.repetitions);
    let served = results.served(exec.repetitions);
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
    let maximises = match exec.search.metric {
        // Results replayed from before goodput was recorded can only say the offered load.
        Metric::Capacity if !served.is_empty() => Objective::of(exec),
        _ => Objective::OfferedLoad,
    };
    let values = metric_points(exec, &metric, maximises, &verdicts, &served);
    let experiments = verdicts
        .iter()
        .map(|(cell, ok)| ExperimentPoint {
            load: exec.load.values[cell.load],
            resource: exec.resource.values[cell.resource],
            ok: *ok,
            served: served.get(cell).copied(),
        })
        .collect();
    Outcome {
        execution: exec.name.clone(),
        fingerprint: exec.fingerprint(),
        metric: exec.search.metric,
        maximises,
        load_name: exec.load.name.clone(),
        resource_name: exec.resource.name.clone(),
        values,
        grid,
        experiments,
        loads: exec.load.values.clone(),
        resources: exec.resource.values.clone(),
        experiments_run_now: ran,
        experiments_replayed: replayed,
    }
}

/// The metric read off each row or column, with the experiment it was read off: capacity
/// per resource value (the chosen load by [`goodput::chosen`]), demand per load value.
fn metric_points(
    exec: &Execution,
    metric: &[Option<usize>],
    maximises: Objective,
    verdicts: &Verdicts,
    served: &BTreeMap<Cell, Served>,
) -> Vec<Point> {
    let (loads, resources) = (&exec.load.values, &exec.resource.values);
    let point = |at: f64, cell: Option<Cell>, value: Option<f64>| {
        let served = cell.and_then(|c| served.get(&c).copied());
        Point {
            at,
            value: match maximises {
                Objective::Goodput => served.map(|s| s.lists_per_minute),
                Objective::OfferedLoad => value,
            },
            load: cell.map(|c| loads[c.load]),
            served,
        }
    };
    match exec.search.metric {
        Metric::Capacity => resources
            .iter()
            .zip(metric)
            .enumerate()
            .map(|(r, (at, capacity))| {
                let cell = |load| Cell { load, resource: r };
                let load = goodput::chosen(maximises, *capacity, |l| {
                    Some((*verdicts.get(&cell(l))?, served.get(&cell(l)).copied()))
                });
                point(*at, load.map(cell), load.map(|l| loads[l]))
            })
            .collect(),
        Metric::Demand => loads
            .iter()
            .zip(metric)
            .enumerate()
            .map(|(l, (at, demand))| {
                let cell = demand.map(|resource| Cell { load: l, resource });
                point(*at, cell, demand.map(|r| resources[r]))
            })
            .collect(),
    }
}

/// The metric as a table, and the grid of verdicts as Theodolite draws it (loads up, resources
/// across; ✓ pass, ✗ fail, · not run).
pub fn summary_markdown(exec: &Execution, o: &Outcome) -> String {
    use crate::report::capacity as rc;
    let mut s = format!("# Capacity: {}\n\n", exec.name);
    let metric = match o.metric {
        Metric::Capacity => "capacity",
        Metric::Demand => "demand",
    };
    s.push_str(&format!(
        "Metric: **{:?}** ({}); search {:?}{}; {} experiments run now, {} replayed.\n\n",
        o.metric,
        rc::metric_meaning(metric, o.maximises),
        exec.search.strategy,
        if exec.search.lower_bound {
            " with lower-bound restriction"
        } else {
            ""
        },
        o.experiments_run_now,
        o.experiments_replayed
    ));
    s.push_str(
        &rc::metric_table(
            metric,
            o.maximises,
            &o.load_name,
            &o.resource_name,
            &o.values,
        )
        .markdown(),
    );
    s.push('\n');
    s.push_str(&rc::verdict_grid_markdown(
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
