//! `tollgate-bench demo`: what tollgate does, shown on this machine in a few minutes with
//! nothing but this repository. The simulated control plane with the modeled cost (a 2-core
//! apiserver and etcd at reduced Tess.IO scale) gets four runs, each on a freshly started
//! control plane:
//!
//! 1. **baseline**: node heartbeats (status PATCHes) only, straight to the apiserver;
//! 2. **baseline-tollgate**: the same heartbeats through tollgate, so the protected run is
//!    compared with what tollgate costs on its own, not with a path it does not take;
//! 3. **unprotected**: heartbeats plus a storm of consistent LIST-all-pods, straight to the
//!    apiserver;
//! 4. **protected**: the same, through tollgate in enforce mode.
//!
//! The headline ratios: the protected run's heartbeat PATCH p99 against the baseline through
//! tollgate (target ≤ 1.5×), the unprotected one's against the direct baseline (target ≥ 10×,
//! or the apiserver crashed).
//!
//! Each run is a `loadgen` run; the modeled apiserver's memory and restarts and tollgate's quota
//! pool are sampled each second. The directory gets `summary.json` (schema
//! `tollgate.demo/v1`: the runs, each with loadgen's summary, and the headline), `summary.md`
//! and `report.html` (see [`crate::report::demo`]).
//!
//! - [`crate::process`]: children and metric scrapes (shared with the capacity experiments).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio_util::sync::CancellationToken;

use crate::capacity::experiment::Binaries;
use crate::capacity::samples::{write_csv, Samples};
use crate::report::demo::{DemoSummary, Headline, Ratios, RunSummary, Setup, SCHEMA};
use crate::report::loadgen::LoadgenRun;

use crate::process::{self, start, word_after, Scraper, Started};
use kubeio::promtext::unlabelled;

/// What the demo is asked to do; `None` takes the default of the mode (full or `quick`), as
/// documented on the flags of [`crate::cli::DemoArgs`].
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// Directory for the report and each run's files.
    pub output: PathBuf,
    /// The ~1-minute version: a smaller control plane and shorter runs.
    pub quick: bool,
    pub nodes: Option<u64>,
    pub pods: Option<u64>,
    pub seconds: Option<u64>,
    pub lists_per_minute: Option<f64>,
    pub heartbeat_nodes: u64,
    pub patches_per_second: f64,
    pub quota_bytes_per_second: Option<u64>,
    pub quota_burst_bytes: Option<u64>,
    /// The modeled apiserver's memory limit (the sim's `--memory-limit`).
    pub memory_limit: String,
}

/// The four runs: name, title, LIST storm, through tollgate.
const RUNS: [(&str, &str, bool, bool); 4] = [
    ("baseline", "baseline: heartbeats only", false, false),
    (
        "baseline-tollgate",
        "baseline through tollgate: heartbeats only",
        false,
        true,
    ),
    ("unprotected", "LIST storm, no tollgate", true, false),
    ("protected", "LIST storm through tollgate", true, true),
];

/// The demo's settings once defaults are applied.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) setup: Setup,
}

pub(crate) fn plan(a: &DemoConfig) -> Plan {
    let q = a.quick;
    let nodes = a.nodes.unwrap_or(if q { 300 } else { 1_000 });
    let pods = a.pods.unwrap_or(if q { 10_000 } else { 30_000 });
    // Each admitted LIST of 30,000 pods holds the modeled etcd (one core, and its backend lock
    // against write commits) for ~0.3 s, delaying the heartbeats that arrive meanwhile. The
    // p99 stays at the baseline only while those are under 1% of all heartbeats: fewer than
    // ~2 such LISTs a minute, which 5 MB/s admits and 20 MB/s (8 a minute) does not (runs A–D
    // of bench/RESULTS.md's demo section). The quick demo's 10-second runs at a third of the
    // size keep 20 MB/s.
    let rate = a
        .quota_bytes_per_second
        .unwrap_or(if q { 20_000_000 } else { 5_000_000 });
    // About one LIST of every pod: seeded pods are ~2 KB of JSON, and a LIST's cost is its
    // bytes sent plus twice the bytes it reads from etcd.
    let burst = a.quota_burst_bytes.unwrap_or(pods * 2_100 * 4);
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let sim_args = strings(&[
        "--nodes",
        &nodes.to_string(),
        "--pods",
        &pods.to_string(),
        "--cost-model",
        "modeled",
        "--virtual-cpus",
        "2",
        "--memory-limit",
        &a.memory_limit,
    ]);
    let tollgate_args = strings(&[
        "--mode",
        "enforce",
        "--quota-bytes-per-second",
        &rate.to_string(),
        "--quota-burst-bytes",
        &burst.to_string(),
        // A LIST waits at most this long for the pool, then gets its 429: well within
        // loadgen's timeout below, so a refused LIST shows as a 429, not as a timeout.
        "--max-wait",
        "5",
    ]);
    let loadgen_args = strings(&[
        "--patches",
        &format!("{}/s", a.patches_per_second),
        "--patch-target",
        "node-status",
        "--objects",
        &a.heartbeat_nodes.to_string(),
        // A request still unanswered after this counts as an error (timeout); short enough
        // that a run ends soon after its schedule does.
        "--timeout",
        if q { "15s" } else { "30s" },
        "--drain-timeout",
        if q { "5s" } else { "15s" },
        "--no-progress",
    ]);
    Plan {
        setup: Setup {
            nodes,
            pods,
            heartbeat_nodes: a.heartbeat_nodes,
            patches_per_second: a.patches_per_second,
            lists_per_minute: a.lists_per_minute.unwrap_or(if q { 600.0 } else { 180.0 }),
            duration_seconds: a.seconds.unwrap_or(if q { 10 } else { 50 }) as f64,
            quota_bytes_per_second: rate,
            quota_burst_bytes: burst,
            sim_args,
            tollgate_args,
            loadgen_args,
        },
    }
}

/// Runs the demo; returns the report's path. `stop` (Ctrl-C) ends it early, killing children.
pub async fn main(
    args: DemoConfig,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let bins = Binaries::beside_current_exe()?;
    let page = tokio::select! {
        r = run(&args, &bins) => r?,
        () = stop => bail!("stopped"),
    };
    println!("report: {}", page.display());
    println!(
        "        {} and {}",
        args.output.join("summary.md").display(),
        args.output.join("summary.json").display()
    );
    Ok(())
}

fn say(msg: &str) {
    eprintln!("demo: {msg}");
}

pub async fn run(args: &DemoConfig, bins: &Binaries) -> anyhow::Result<PathBuf> {
    let p = plan(args);
    let out = &args.output;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let t0 = Instant::now();
    say(&format!(
        "four runs of {} s on a simulated control plane ({} nodes, {} pods, modeled cost): \
         heartbeats only (direct, then through tollgate), LIST storm without tollgate, LIST \
         storm through tollgate",
        p.setup.duration_seconds, p.setup.nodes, p.setup.pods
    ));
    let mut runs = Vec::new();
    let mut headline = Vec::new();
    for (i, (name, title, storm, tollgate)) in RUNS.iter().enumerate() {
        let label = format!("[{}/{}] {title}", i + 1, RUNS.len());
        let dir = out.join("runs").join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let restarts = one_run(&p, bins, &dir, &label, *storm, *tollgate).await?;
        let lg = LoadgenRun::read(&dir.join("loadgen"))?;
        let run = RunSummary {
            name: (*name).into(),
            title: (*title).into(),
            through_tollgate: *tollgate,
            list_storm: *storm,
            dir: format!("runs/{name}"),
            sim_restarts: restarts,
            loadgen: lg.summary.clone(),
        };
        let h = Headline::of(&run, &lg);
        say(&format!(
            "{label}: heartbeat PATCH p99 {} ms, {} LISTs served/min, {} 429s, {} errors, {} sim crashes",
            h.patch_p99_ms.map_or("–".into(), crate::report::fmt),
            crate::report::fmt(h.lists_served_per_minute.round()),
            h.rejected_429,
            h.errors,
            h.sim_crashes
        ));
        headline.push(h);
        runs.push(run);
    }
    let ratios = Ratios::of(&headline);
    let summary = DemoSummary {
        schema: SCHEMA.into(),
        quick: args.quick,
        setup: p.setup.clone(),
        runs,
        headline,
        ratios: Some(ratios),
    };
    let path = out.join("summary.json");
    std::fs::write(&path, serde_json::to_string_pretty(&summary)?)
        .with_context(|| format!("writing {}", path.display()))?;
    let page = crate::report::write_report(out)?;
    say(&crate::report::demo::verdict(&summary.headline));
    if let Some(r) = &summary.ratios {
        say(&r.sentence());
    }
    say(&format!("done in {:.0} s", t0.elapsed().as_secs_f64()));
    Ok(page)
}

/// One run on a fresh control plane; returns the modeled apiserver's restarts during it.
async fn one_run(
    p: &Plan,
    bins: &Binaries,
    dir: &Path,
    label: &str,
    storm: bool,
    through_tollgate: bool,
) -> anyhow::Result<u64> {
    say(&format!("{label}: starting the simulated control plane…"));
    // Children are killed when these drop, at the end of the run.
    let (_sim, sim_url) = start_control_plane(p, bins, dir).await?;
    let (_tollgate, target, admin) = if through_tollgate {
        let (t, target, admin) = start_tollgate(p, bins, dir, &sim_url).await?;
        (Some(t), target, admin)
    } else {
        (None, sim_url.clone(), None)
    };

    let scraper = Scraper::new();
    let sim_metrics = format!("{sim_url}/metrics");
    let restarts_before = restarts(&scraper, &sim_metrics).await;
    let args = loadgen_args(p, dir, target, storm);
    say(&format!(
        "{label}: {} s of load{}…",
        p.setup.duration_seconds,
        if through_tollgate {
            " through tollgate"
        } else {
            ""
        }
    ));
    let done = CancellationToken::new();
    let sampler = tokio::spawn(sample_loop(
        scraper.clone(),
        sim_metrics.clone(),
        admin.map(|a| format!("{a}/metrics")),
        done.clone(),
        label.to_owned(),
        p.setup.duration_seconds,
    ));
    let limit = Duration::from_secs_f64(p.setup.duration_seconds + 120.0);
    let status = process::run_to_end(&bins.loadgen, &args, &dir.join("loadgen.log"), limit).await;
    done.cancel();
    let (memory, quota) = sampler.await.unwrap_or_default();
    write_csv(&dir.join("memory.csv"), "modeled_memory_bytes", &memory)?;
    if through_tollgate {
        write_csv(&dir.join("quota.csv"), "quota_available_bytes", &quota)?;
    }
    let status = status?;
    if !dir.join("loadgen").join("summary.json").exists() {
        bail!(
            "loadgen wrote no summary ({status}); see {}",
            dir.join("loadgen.log").display()
        );
    }
    let after = restarts(&scraper, &sim_metrics).await;
    Ok(after.saturating_sub(restarts_before))
}

/// The simulated control plane, with the heartbeating nodes seeded (loadgen PATCHes the
/// nodes its seed creates); returns it and its URL.
async fn start_control_plane(
    p: &Plan,
    bins: &Binaries,
    dir: &Path,
) -> anyhow::Result<(Started, String)> {
    let mut sim_args: Vec<String> = ["sim", "--listen", "127.0.0.1:0", "--exit-with-stdin"]
        .map(String::from)
        .to_vec();
    sim_args.extend(p.setup.sim_args.iter().cloned());
    let sim = start(
        &bins.bench,
        &sim_args,
        &dir.join("sim.log"),
        "serving the Kubernetes API at ",
    )
    .await?;
    let sim_url = word_after(&sim.line, "serving the Kubernetes API at ")
        .context("the sim printed no URL")?
        .to_owned();
    let seed_args: Vec<String> = [
        "seed",
        "--server",
        &sim_url,
        "--nodes",
        &p.setup.heartbeat_nodes.to_string(),
        "--pods",
        "0",
    ]
    .map(String::from)
    .to_vec();
    let status = process::run_to_end(
        &bins.loadgen,
        &seed_args,
        &dir.join("seed.log"),
        Duration::from_secs(300),
    )
    .await?;
    if !status.success() {
        bail!(
            "loadgen seed failed ({status}); see {}",
            dir.join("seed.log").display()
        );
    }
    Ok((sim, sim_url))
}

/// Tollgate in front of the sim; returns it, its address and its admin address.
async fn start_tollgate(
    p: &Plan,
    bins: &Binaries,
    dir: &Path,
    sim_url: &str,
) -> anyhow::Result<(Started, String, Option<String>)> {
    let mut a: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--upstream",
        sim_url,
    ]
    .map(String::from)
    .to_vec();
    a.extend(p.setup.tollgate_args.iter().cloned());
    let t = start(
        &bins.tollgate,
        &a,
        &dir.join("tollgate.log"),
        "tollgate serving at ",
    )
    .await?;
    let target = word_after(&t.line, "serving at ")
        .context("tollgate printed no address")?
        .to_owned();
    let admin = word_after(&t.line, "(admin ").map(str::to_owned);
    Ok((t, target, admin))
}

/// loadgen's flags for one run: the heartbeats, the LIST storm if any, length and output.
fn loadgen_args(p: &Plan, dir: &Path, target: String, storm: bool) -> Vec<String> {
    let mut args = vec!["--server".to_owned(), target];
    args.extend(p.setup.loadgen_args.iter().cloned());
    if storm {
        args.extend(
            [
                "--lists",
                &format!("{}/min", p.setup.lists_per_minute),
                "--list-resource",
                "pods",
                "-A",
                "--list-rv",
                "consistent",
            ]
            .map(String::from),
        );
    }
    args.extend([
        "--duration".into(),
        format!("{}s", p.setup.duration_seconds),
        "--output".into(),
        dir.join("loadgen").display().to_string(),
    ]);
    args
}

/// `tollgate_sim_restarts_total`, retried for a while: the apiserver may be restarting.
async fn restarts(scraper: &Scraper, url: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(v) = scraper
            .text(url)
            .await
            .and_then(|t| unlabelled(&t, "tollgate_sim_restarts_total"))
        {
            return v as u64;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    0
}

/// Samples the modeled memory and the quota pool each second until `done`, printing progress
/// every 10 s.
async fn sample_loop(
    scraper: Scraper,
    sim: String,
    tollgate: Option<String>,
    done: CancellationToken,
    label: String,
    seconds: f64,
) -> (Samples, Samples) {
    let t0 = Instant::now();
    let (mut memory, mut quota) = (Vec::new(), Vec::new());
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut next_progress = 10.0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = done.cancelled() => break,
        }
        let at = t0.elapsed().as_secs_f64().floor();
        let mem = scraper
            .text(&sim)
            .await
            .and_then(|t| unlabelled(&t, "tollgate_sim_virtual_memory_bytes"));
        if let Some(m) = mem {
            memory.push((at, m));
        }
        let pool = match &tollgate {
            Some(url) => scraper
                .text(url)
                .await
                .and_then(|t| unlabelled(&t, "tollgate_quota_available_bytes")),
            None => None,
        };
        if let Some(q) = pool {
            quota.push((at, q));
        }
        if at >= next_progress {
            next_progress += 10.0;
            let mem = mem.map_or("unreachable (restarting?)".into(), |m| {
                format!("{:.0} MB", m / 1e6)
            });
            let pool = pool.map_or(String::new(), |q| format!(", quota pool {:.0} MB", q / 1e6));
            let phase = if at <= seconds { "" } else { " (draining)" };
            say(&format!(
                "{label}: {at:.0}/{seconds:.0} s{phase}, apiserver memory {mem}{pool}"
            ));
        }
    }
    (memory, quota)
}
