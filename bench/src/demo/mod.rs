//! `tollgate-bench demo`: what tollgate does, shown on this machine in a few minutes with
//! nothing but this repository. The simulated control plane with the modeled cost (a 2-core
//! apiserver and etcd at reduced Tess.IO scale) gets these runs, each on a freshly started
//! control plane:
//!
//! 1. **baseline**: node heartbeats (status PATCHes) only, straight to the apiserver;
//! 2. **baseline-tollgate**: the same heartbeats through tollgate, so the protected run is
//!    compared with what tollgate costs on its own, not with a path it does not take;
//! 3. **unprotected**: heartbeats plus a storm of consistent LIST-all-pods, straight to the
//!    apiserver;
//! 4. **protected**: the same, through tollgate in enforce mode with its default adaptive
//!    budget (no pool set by hand; `--quota-bytes-per-second` makes it a static pool);
//! 5. **static-…**: the storm through a few static pools (`--quota-mode static`), a short
//!    search for the best one ([`static_pools`]), whose goodput the protected run's is
//!    compared with.
//!
//! Every run is judged by tollgate's default adaptive target (heartbeat PATCH p99 ≤ max(2 × the
//! baseline through tollgate, 50 ms), no heartbeat failing, no crash) and shows its goodput,
//! the LISTs served per minute. The headline ratios: the protected run's heartbeat p99 against
//! the baseline through tollgate (within that target), the unprotected one's against the direct
//! baseline (≥ 10×, or the apiserver crashed), and the protected goodput against the best
//! static pool's (≥ 80%).
//!
//! Each run is a `loadgen` run; the modeled apiserver's memory and restarts and tollgate's
//! budget and quota pool are sampled each second. The directory gets `summary.json` (schema
//! `tollgate.demo/v1`: the runs, each with loadgen's summary, and the headline), `summary.md`
//! and `report.html` (see [`crate::report::demo`]).
//!
//! - [`run`]: one run (children, loadgen, samples).
//! - [`static_pools`]: the short search for the best static pool.

mod run;
pub mod static_pools;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};

use crate::capacity::experiment::Binaries;
use crate::report::demo::{
    judge, target_ms, DemoSummary, Headline, Ratios, RunSummary, Setup, SCHEMA,
};
use crate::report::loadgen::LoadgenRun;
use static_pools::Tried;

/// What the demo is asked to do; `None` takes the default of the mode (full or `quick`), as
/// documented on the flags of [`crate::cli::DemoArgs`].
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// Directory for the report and each run's files.
    pub output: PathBuf,
    /// The ~2-minute version: a smaller control plane and 10-second runs.
    pub quick: bool,
    pub nodes: Option<u64>,
    pub pods: Option<u64>,
    pub seconds: Option<u64>,
    pub lists_per_minute: Option<f64>,
    pub heartbeat_nodes: u64,
    pub patches_per_second: f64,
    /// A static pool for the protected run, set by hand; none: tollgate's adaptive default.
    pub quota_bytes_per_second: Option<u64>,
    pub quota_burst_bytes: Option<u64>,
    /// Static pools to try for the best one; none: the mode's default.
    pub static_pools: Option<usize>,
    /// The modeled apiserver's memory limit (the sim's `--memory-limit`).
    pub memory_limit: String,
}

/// The four main runs: name, title, LIST storm, through tollgate.
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
    /// The first static pool tried, bytes/s.
    pub(crate) first_static_pool: u64,
}

pub(crate) fn plan(a: &DemoConfig) -> Plan {
    let q = a.quick;
    let nodes = a.nodes.unwrap_or(if q { 300 } else { 1_000 });
    let pods = a.pods.unwrap_or(if q { 10_000 } else { 30_000 });
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
    // Tollgate as a new user runs it: enforcing, every other setting its default (the adaptive
    // budget; a heavy request waits at most 10 s, within loadgen's timeout below, so a refused
    // LIST shows as a 429, not as a timeout).
    let mut tollgate_args = strings(&["--mode", "enforce"]);
    if let Some(rate) = a.quota_bytes_per_second {
        tollgate_args.extend(static_pool_args(rate, burst));
    }
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
            duration_seconds: a.seconds.unwrap_or(if q { 10 } else { DEFAULT_SECONDS }) as f64,
            quota_bytes_per_second: a.quota_bytes_per_second,
            quota_burst_bytes: burst,
            static_pools: a.static_pools.unwrap_or(2),
            sim_args,
            tollgate_args,
            loadgen_args,
        },
        // bench/RESULTS.md's demo section: 20 MB/s served ~8 LISTs/min of 30,000 pods at a
        // heartbeat p99 of 41–71 ms (the edge of a 50 ms target), ~22/min of 10,000 pods
        // (--quick) at 25–35 ms.
        first_static_pool: 20_000_000,
    }
}

/// Each run's length by default: six runs (four, and two static pools) of 35 s take what four
/// of 50 s took before the static pools were measured.
const DEFAULT_SECONDS: u64 = 35;

/// tollgate's flags for a fixed pool of `rate` bytes/s.
fn static_pool_args(rate: u64, burst: u64) -> Vec<String> {
    vec![
        "--quota-mode".into(),
        "static".into(),
        "--quota-bytes-per-second".into(),
        rate.to_string(),
        "--quota-burst-bytes".into(),
        burst.to_string(),
    ]
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

pub(crate) fn say(msg: &str) {
    eprintln!("demo: {msg}");
}

pub async fn run(args: &DemoConfig, bins: &Binaries) -> anyhow::Result<PathBuf> {
    let p = plan(args);
    let out = &args.output;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let t0 = Instant::now();
    let total = RUNS.len() + p.setup.static_pools;
    say(&format!(
        "{total} runs of {} s on a simulated control plane ({} nodes, {} pods, modeled cost): \
         heartbeats only (direct, then through tollgate), LIST storm without tollgate, LIST \
         storm through tollgate ({}), then {} static pools for the best one",
        p.setup.duration_seconds,
        p.setup.nodes,
        p.setup.pods,
        match p.setup.quota_bytes_per_second {
            None => "its default adaptive budget".to_owned(),
            Some(r) => format!("a static pool of {r} bytes/s set by hand"),
        },
        p.setup.static_pools
    ));
    let mut runs = Vec::new();
    let mut headline = Vec::new();
    for (i, (name, title, storm, tollgate)) in RUNS.iter().enumerate() {
        let title = match (*name, p.setup.quota_bytes_per_second) {
            ("protected", None) => format!("{title} (adaptive default)"),
            ("protected", Some(r)) => format!("{title} (static pool {}, set by hand)", mb(r)),
            _ => (*title).to_owned(),
        };
        let tollgate = tollgate.then_some(p.setup.tollgate_args.as_slice());
        let label = format!("[{}/{total}] {title}", i + 1);
        let (run, h) = measure(&p, bins, out, name, &title, &label, *storm, tollgate).await?;
        headline.push(h);
        runs.push(run);
    }
    judge(&mut headline);
    let target = target_ms(
        headline
            .iter()
            .find(|h| h.run == "baseline-tollgate")
            .and_then(|h| h.patch_p99_ms),
    );
    // The static pools: each judged as it ends, for the next to be chosen.
    let mut tried: Vec<Tried> = Vec::new();
    while let Some(rate) = static_pools::next(p.first_static_pool, p.setup.static_pools, &tried) {
        let name = format!("static-{rate}");
        let title = format!("LIST storm through a static pool of {}", mb(rate));
        let label = format!("[{}/{total}] {title}", RUNS.len() + tried.len() + 1);
        let mut args = vec!["--mode".to_owned(), "enforce".to_owned()];
        args.extend(static_pool_args(rate, p.setup.quota_burst_bytes));
        let (run, h) = measure(&p, bins, out, &name, &title, &label, true, Some(&args)).await?;
        headline.push(h);
        runs.push(run);
        judge(&mut headline);
        let h = headline.last().context("a headline per run")?;
        tried.push(Tried {
            bytes_per_second: rate,
            within_target: h.within_target == Some(true),
            lists_per_minute: h.lists_served_per_minute,
        });
        say(&format!(
            "{label}: {} the target{}",
            if h.within_target == Some(true) {
                "within"
            } else {
                "NOT within"
            },
            target.map_or(String::new(), |t| format!(
                " (heartbeat PATCH p99 ≤ {} ms)",
                crate::report::fmt(t)
            ))
        ));
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

/// A rate in MB/s, for titles.
fn mb(rate: u64) -> String {
    format!("{} MB/s", crate::report::fmt(rate as f64 / 1e6))
}

/// One run in `out/runs/<name>`, and its headline (not yet judged against the target).
#[allow(clippy::too_many_arguments)]
async fn measure(
    p: &Plan,
    bins: &Binaries,
    out: &std::path::Path,
    name: &str,
    title: &str,
    label: &str,
    storm: bool,
    tollgate: Option<&[String]>,
) -> anyhow::Result<(RunSummary, Headline)> {
    let dir = out.join("runs").join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let restarts = run::one_run(p, bins, &dir, label, storm, tollgate).await?;
    let lg = LoadgenRun::read(&dir.join("loadgen"))?;
    let run = RunSummary {
        name: name.into(),
        title: title.into(),
        through_tollgate: tollgate.is_some(),
        list_storm: storm,
        dir: format!("runs/{name}"),
        sim_restarts: restarts,
        tollgate_args: tollgate.map(<[String]>::to_vec).unwrap_or_default(),
        loadgen: lg.summary.clone(),
    };
    let h = Headline::of(&run, &lg);
    say(&format!(
        "{label}: heartbeat PATCH p50 {} ms, p99 {} ms; {} LISTs served/min (goodput), {} 429s, \
         {} errors, {} sim crashes",
        h.patch_p50_ms.map_or("–".into(), crate::report::fmt),
        h.patch_p99_ms.map_or("–".into(), crate::report::fmt),
        crate::report::fmt((h.lists_served_per_minute * 10.0).round() / 10.0),
        h.rejected_429,
        h.errors,
        h.sim_crashes
    ));
    Ok((run, h))
}
