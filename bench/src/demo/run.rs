//! One demo run: a fresh simulated control plane, tollgate in front of it if the run says so,
//! loadgen's heartbeats (and LIST storm), and the modeled apiserver's memory and tollgate's
//! budget and quota pool sampled each second.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio_util::sync::CancellationToken;

use super::{say, Plan};
use crate::capacity::experiment::Binaries;
use crate::capacity::samples::{write_csv, Samples};
use crate::process::{self, start, word_after, Scraper, Started};
use kubeio::promtext::unlabelled;

/// One run on a fresh control plane, through tollgate started with `tollgate` (flags besides
/// its addresses) if given; returns the modeled apiserver's restarts during it.
pub(super) async fn one_run(
    p: &Plan,
    bins: &Binaries,
    dir: &Path,
    label: &str,
    storm: bool,
    tollgate: Option<&[String]>,
) -> anyhow::Result<u64> {
    say(&format!("{label}: starting the simulated control plane…"));
    // Children are killed when these drop, at the end of the run.
    let (_sim, sim_url) = start_control_plane(p, bins, dir).await?;
    let through_tollgate = tollgate.is_some();
    let (_tollgate, target, admin) = match tollgate {
        Some(args) => {
            let (t, target, admin) = start_tollgate(args, bins, dir, &sim_url).await?;
            (Some(t), target, admin)
        }
        None => (None, sim_url.clone(), None),
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
    let sampled = sampler.await.unwrap_or_default();
    write_csv(
        &dir.join("memory.csv"),
        "modeled_memory_bytes",
        &sampled.memory,
    )?;
    if through_tollgate {
        write_csv(
            &dir.join("quota.csv"),
            "quota_available_bytes",
            &sampled.quota,
        )?;
        write_csv(
            &dir.join("budget.csv"),
            "budget_bytes_per_second",
            &sampled.budget,
        )?;
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
    args: &[String],
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
    a.extend(args.iter().cloned());
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

/// What the demo samples each second of a run.
#[derive(Debug, Default)]
struct Sampled {
    /// The modeled apiserver's memory.
    memory: Samples,
    /// tollgate's quota pool level and heavy-lane budget (bytes/s).
    quota: Samples,
    budget: Samples,
}

/// Samples the modeled memory and tollgate's pool and budget each second until `done`,
/// printing progress every 10 s.
async fn sample_loop(
    scraper: Scraper,
    sim: String,
    tollgate: Option<String>,
    done: CancellationToken,
    label: String,
    seconds: f64,
) -> Sampled {
    let t0 = Instant::now();
    let mut out = Sampled::default();
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
            out.memory.push((at, m));
        }
        let text = match &tollgate {
            Some(url) => scraper.text(url).await,
            None => None,
        };
        let pool = text
            .as_deref()
            .and_then(|t| unlabelled(t, "tollgate_quota_available_bytes"));
        let budget = text
            .as_deref()
            .and_then(|t| unlabelled(t, "tollgate_budget_bytes_per_second"));
        if let Some(q) = pool {
            out.quota.push((at, q));
        }
        if let Some(b) = budget {
            out.budget.push((at, b));
        }
        if at >= next_progress {
            next_progress += 10.0;
            let mem = mem.map_or("unreachable (restarting?)".into(), |m| {
                format!("{:.0} MB", m / 1e6)
            });
            let budget = budget.map_or(String::new(), |b| {
                format!(", tollgate's budget {:.1} MB/s", b / 1e6)
            });
            let phase = if at <= seconds { "" } else { " (draining)" };
            say(&format!(
                "{label}: {at:.0}/{seconds:.0} s{phase}, apiserver memory {mem}{budget}"
            ));
        }
    }
    out
}
