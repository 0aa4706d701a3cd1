//! One SLO experiment: start the system under test for one (load, resource) cell, run loadgen
//! against it, check the SLOs on its `summary.json` and read what it served (LISTs answered 2xx
//! per minute and their bytes: [`super::goodput`]), stop everything. Through tollgate, its
//! quota pool level is sampled each second into the experiment's `quota.csv` (the report
//! charts it).
//!
//! The programs are the workspace's own binaries, run as child processes (each killed when
//! its handle drops, so an error or Ctrl-C leaves nothing behind): `tollgate-bench sim`,
//! `tollgate` and `loadgen`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio_util::sync::CancellationToken;

use crate::process::{run_ok, start, word_after, Scraper, Started};

use super::execution::{number, substitute, Execution};
use super::goodput::Served;
use super::results::{Record, SloOutcome};
use super::samples;
use super::search::Cell;
use super::slo::Summary;

/// Where the three programs are.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub bench: PathBuf,
    pub tollgate: PathBuf,
    pub loadgen: PathBuf,
}

impl Binaries {
    /// This executable, and `tollgate` and `loadgen` beside it (as cargo builds them), unless
    /// `TOLLGATE_BIN` / `LOADGEN_BIN` say otherwise.
    pub fn beside_current_exe() -> anyhow::Result<Binaries> {
        let bench = std::env::current_exe().context("locating tollgate-bench")?;
        let dir = bench
            .parent()
            .context("tollgate-bench has no directory")?
            .to_owned();
        let pick = |var: &str, name: &str| {
            std::env::var_os(var)
                .map(PathBuf::from)
                .unwrap_or_else(|| dir.join(name))
        };
        let b = Binaries {
            tollgate: pick("TOLLGATE_BIN", "tollgate"),
            loadgen: pick("LOADGEN_BIN", "loadgen"),
            bench,
        };
        for p in [&b.tollgate, &b.loadgen] {
            if !p.exists() {
                bail!(
                    "{} is missing: build it (cargo build --release -p tollgate -p loadgen) or point {} at it",
                    p.display(),
                    if p == &b.tollgate { "TOLLGATE_BIN" } else { "LOADGEN_BIN" }
                );
            }
        }
        Ok(b)
    }
}

/// The directory of one experiment's files, under the run's output.
pub fn experiment_dir(output: &Path, exec: &Execution, cell: Cell, repetition: u32) -> PathBuf {
    output.join("experiments").join(format!(
        "load-{}_resource-{}_rep-{}",
        number(exec.load.values[cell.load]),
        number(exec.resource.values[cell.resource]),
        repetition + 1
    ))
}

/// Runs one repetition of one experiment and returns its record (SLO failures are a record
/// with `ok: false`; only a failure to run at all is an error).
pub async fn run(
    exec: &Execution,
    bins: &Binaries,
    output: &Path,
    cell: Cell,
    repetition: u32,
) -> anyhow::Result<Record> {
    let load = exec.load.values[cell.load];
    let resource = exec.resource.values[cell.resource];
    let dir = experiment_dir(output, exec, cell, repetition);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let started_at = time::OffsetDateTime::now_utc();
    let t0 = Instant::now();

    // Held to the end: dropping it kills the system under test.
    let sut = SystemUnderTest::start(exec, bins, &dir, load, resource).await?;
    if !exec.loadgen.seed.is_empty() {
        let mut args = vec!["seed".to_owned()];
        args.extend(sut.target.iter().cloned());
        args.extend(substitute(&exec.loadgen.seed, load, resource));
        run_ok(
            &bins.loadgen,
            &args,
            &dir.join("seed.log"),
            Duration::from_secs(600),
        )
        .await?;
    }
    let summary = run_load(exec, bins, &dir, &sut, load, resource).await?;

    let slos = check_slos(exec, &summary);
    let ok = slos.iter().all(|s| s.ok);
    let served = Served::of(&summary);
    Ok(Record {
        load,
        load_index: cell.load,
        resource,
        resource_index: cell.resource,
        repetition,
        ok,
        slos,
        served: Some(served),
        output: dir
            .strip_prefix(output)
            .ok()
            .map(|p| p.display().to_string()),
        started: started_at
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// The sim and tollgate of one experiment, as children killed on drop, and how loadgen
/// reaches them.
struct SystemUnderTest {
    _sim: Option<Started>,
    _tollgate: Option<Started>,
    /// loadgen's flags naming its target: the sim's or tollgate's URL, or the cluster's
    /// kubeconfig.
    target: Vec<String>,
    /// Tollgate's `/metrics`, when it runs.
    tollgate_metrics: Option<String>,
}

impl SystemUnderTest {
    async fn start(
        exec: &Execution,
        bins: &Binaries,
        dir: &Path,
        load: f64,
        resource: f64,
    ) -> anyhow::Result<SystemUnderTest> {
        let mut sut = SystemUnderTest {
            _sim: None,
            _tollgate: None,
            target: Vec::new(),
            tollgate_metrics: None,
        };
        let mut upstream: Vec<String> = Vec::new();
        if let Some(sim) = &exec.sut.sim {
            let mut args = vec![
                "sim".to_owned(),
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--exit-with-stdin".into(),
            ];
            args.extend(substitute(&sim.args, load, resource));
            const READY: &str = "serving the Kubernetes API at ";
            let s = start(&bins.bench, &args, &dir.join("sim.log"), READY).await?;
            let url = word_after(&s.line, READY)
                .context("the sim's ready line has no URL")?
                .to_owned();
            sut.target = vec!["--server".into(), url.clone()];
            upstream = vec!["--upstream".into(), url];
            sut._sim = Some(s);
        } else if let Some(k) = &exec.sut.kubeconfig {
            sut.target = vec!["--kubeconfig".into(), k.display().to_string()];
            upstream = vec!["--upstream-kubeconfig".into(), k.display().to_string()];
        }
        if let Some(tg) = &exec.sut.tollgate {
            let mut args = vec![
                "--listen".to_owned(),
                "127.0.0.1:0".into(),
                "--admin-listen".into(),
                "127.0.0.1:0".into(),
            ];
            args.extend(upstream);
            args.extend(substitute(&tg.args, load, resource));
            const READY: &str = "tollgate serving at ";
            let t = start(&bins.tollgate, &args, &dir.join("tollgate.log"), READY).await?;
            let url = word_after(&t.line, READY)
                .context("tollgate's ready line has no URL")?
                .to_owned();
            sut.tollgate_metrics = word_after(&t.line, "(admin ").map(|a| format!("{a}/metrics"));
            sut.target = vec!["--server".into(), url];
            if let Some(k) = &exec.sut.kubeconfig {
                // Credentials stay the cluster's; only the address is tollgate's.
                sut.target
                    .extend(["--kubeconfig".into(), k.display().to_string()]);
            }
            sut._tollgate = Some(t);
        }
        Ok(sut)
    }
}

/// The experiment's loadgen run, with tollgate's quota pool sampled each second into
/// `quota.csv` meanwhile; returns loadgen's summary.
async fn run_load(
    exec: &Execution,
    bins: &Binaries,
    dir: &Path,
    sut: &SystemUnderTest,
    load: f64,
    resource: f64,
) -> anyhow::Result<Summary> {
    let out = dir.join("loadgen");
    let mut args = sut.target.clone();
    args.extend(substitute(&exec.loadgen.args, load, resource));
    args.extend([
        "--duration".into(),
        exec.duration.clone(),
        "--output".into(),
        out.display().to_string(),
        "--no-progress".into(),
    ]);
    let limit = humantime_secs(&exec.duration).unwrap_or(600.0) * 2.0 + 180.0;
    let done = CancellationToken::new();
    let sampler = sut.tollgate_metrics.clone().map(|url| {
        tokio::spawn(samples::each_second(
            Scraper::new(),
            url,
            "tollgate_quota_available_bytes",
            done.clone(),
        ))
    });
    let ran = run_ok(
        &bins.loadgen,
        &args,
        &dir.join("loadgen.log"),
        Duration::from_secs_f64(limit),
    )
    .await;
    done.cancel();
    if let Some(sampler) = sampler {
        let quota = sampler.await.unwrap_or_default();
        samples::write_csv(&dir.join("quota.csv"), "quota_available_bytes", &quota)?;
    }
    ran?;
    let summary_path = out.join("summary.json");
    let text = std::fs::read_to_string(&summary_path)
        .with_context(|| format!("reading {}", summary_path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a loadgen summary", summary_path.display()))
}

/// Each SLO checked against loadgen's summary (a non-finite value counts as missing).
fn check_slos(exec: &Execution, summary: &Summary) -> Vec<SloOutcome> {
    exec.slos
        .iter()
        .map(|s| {
            let v = s.check(&summary.operations, summary.duration_s);
            SloOutcome {
                name: v.name,
                value: v.value.filter(|x| x.is_finite()),
                limit: v.limit,
                ok: v.ok,
            }
        })
        .collect()
}

/// Seconds in a loadgen-style duration ("90s", "2m", "1h", "500ms").
fn humantime_secs(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().ok()?;
    Some(match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations() {
        assert_eq!(super::humantime_secs("90s"), Some(90.0));
        assert_eq!(super::humantime_secs("2m"), Some(120.0));
        assert_eq!(super::humantime_secs("500ms"), Some(0.5));
        assert_eq!(super::humantime_secs("abc"), None);
    }
}
