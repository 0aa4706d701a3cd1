//! The relist-storm guard end to end (issue 6): 500 informer-like watchers (`loadgen
//! --watches`, which relist after a 410) are connected through tollgate in enforce mode to the
//! modeled simulated apiserver; a storm of consistent LISTs sent straight to the apiserver
//! OOM-kills it; it restarts with a cold watch cache, and once the cache is filled every
//! watcher's old revision is too old (410), so all 500 relist at once.
//!
//! - with the guard, tollgate ramps heavy admission (pool rate, burst, heavy in-flight) from
//!   10% over the warm-up window: the relists are spread out and the apiserver does not crash
//!   again;
//! - without it (`relistGuard.enabled: false`, everything else equal), the pool's full burst
//!   lets the relists in together and the apiserver is OOM-killed again.
//!
//! Sizing (see bench/MODEL.md for the constants): 1,000 pods of ~3.3 KB, so a LIST of all pods
//! is ~3.2 MB of JSON; a `resourceVersion=0` LIST holds half its bytes (encode buffer), ~1.6 MB,
//! and leaves ~6.4 MB of garbage; a consistent one holds ~5 MB and leaves ~66 MB. The
//! apiserver's base is ~210 MB (binary + watch cache) and Go lets its heap grow to twice what a
//! collection finds live, so the limit is 1 GiB: a batch of 100 cache LISTs (~370 MB live at
//! most, a heap goal under 750 MB) stays under it (the watchers connect in batches of 100 for
//! that reason), 500 at once (~1 GB live) do not, and the guard's 10% start (20 MB/s, a 100 MB
//! burst, 40 in flight) keeps far below it. Per-client rate limits are off in both halves, so the guard is the only
//! difference (500 kubelets would be 500 clients).

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use tests::{
    eventually, fresh_workspace_binary, http_get, SimProcess, TollgateOptions, TollgateProcess,
};

const WATCHERS: u64 = 500;
const BATCH: u64 = 100;
/// Pool rate of the test's tollgate (the guard starts at 10% of it).
const POOL_RATE: f64 = 200e6;
const WARMUP_SECONDS: f64 = 20.0;
/// How long after the crash the apiserver is watched for a second one.
const OBSERVE: Duration = Duration::from_secs(25);
/// Every loadgen runs longer than the test; they are killed when it ends.
const LOADGEN_DURATION: &str = "300s";

fn config(guard: bool) -> String {
    format!(
        "mode: enforce
upstream:
  healthCheck: {{enabled: true, path: /readyz, intervalSeconds: 0.5, timeoutSeconds: 2}}
  # process_start_time_seconds is how tollgate sees the restart: scraped every second.
  metricsScrape: {{enabled: true, path: /metrics, intervalSeconds: 1}}
lanes:
  # Watches are long-running: no in-flight limit in the workload lane they use.
  maxInflight: {{workload: 0, heavy: 400}}
quota:
  # The guard's ramp of a fixed pool (the adaptive budget has tests of its own).
  mode: static
  bytesPerSecond: {POOL_RATE}
  burstBytes: 1000000000
  perClient: {{requestsPerSecond: 0}}
relistGuard: {{enabled: {guard}, warmupSeconds: {WARMUP_SECONDS}, startFraction: 0.1}}
"
    )
}

/// A loadgen child process, output to files in `dir`, killed (by its handle) on drop.
struct Loadgen {
    child: Child,
    shown: String,
}

impl Loadgen {
    fn spawn(dir: &Path, name: &str, args: &[&str]) -> anyhow::Result<Loadgen> {
        let shown = format!("loadgen {}", args.join(" "));
        let child = Command::new(fresh_workspace_binary(
            "loadgen",
            &["loadgen", "kubeio", "apimodel"],
        ))
        .args(args)
        .env_remove("KUBECONFIG")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(File::create(dir.join(format!("{name}.stdout")))?)
        .stderr(File::create(dir.join(format!("{name}.stderr")))?)
        .spawn()
        .with_context(|| format!("starting `{shown}`"))?;
        Ok(Loadgen { child, shown })
    }

    /// Waits for it to exit (it must, within `timeout`).
    fn wait(&mut self, timeout: Duration) -> anyhow::Result<()> {
        eventually(timeout, &format!("`{}` to exit", self.shown), || {
            Ok(self.child.try_wait()?.map(|_| ()))
        })
    }
}

impl Drop for Loadgen {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sum of the samples of `name` whose labels include every pair of `labels` (Prometheus text).
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            (n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())
            .flatten()
        })
        .sum()
}

/// The simulator's `/metrics` (it may be down: restarting).
fn sim_metrics(sim: &SimProcess) -> anyhow::Result<String> {
    let addr = sim.url.trim_start_matches("http://");
    let (code, body) = http_get(addr, "/metrics", Duration::from_secs(5))?;
    anyhow::ensure!(code == 200, "sim /metrics: {code}");
    Ok(body)
}

fn watches(m: &str) -> f64 {
    metric(m, "apiserver_longrunning_requests", &[("verb", "WATCH")])
}

/// What one run saw after the crash.
#[derive(Debug, Default)]
struct Observed {
    restarts: f64,
    /// Most watches the apiserver held after the restart (the relisted watchers).
    rewatched: f64,
    guard_triggers: f64,
    /// Lowest and highest effective pool rate tollgate reported after the crash.
    min_rate: f64,
    max_rate: f64,
    /// tollgate's heavy decisions after the crash: admitted, and held back (queued or 429).
    heavy_admitted: f64,
    heavy_held: f64,
    /// Most heavy requests tollgate had in flight at once after the crash.
    max_heavy_inflight: f64,
    /// Seconds from the crash to the second one, if any.
    second_crash_after: Option<f64>,
}

fn heavy(m: &str, decision: &str) -> f64 {
    metric(
        m,
        "tollgate_decisions_total",
        &[("lane", "heavy"), ("decision", decision)],
    )
}

fn run(guard: bool) -> anyhow::Result<Observed> {
    let mut sim = SimProcess::start(&[
        "--cost-model",
        "modeled",
        "--nodes",
        "20",
        "--pods",
        "1000",
        "--pod-bytes",
        "3300",
        "--memory-limit",
        "1Gi",
        // Down for 2 s: longer than the 1 s storm that kills it, so it dies once.
        "--model-set",
        "restart_seconds=2",
    ])?;
    let dir = tempfile::Builder::new()
        .prefix("tollgate-e2e-restart-guard-")
        .tempdir()?;
    let config_path = dir.path().join("tollgate.yaml");
    std::fs::write(&config_path, config(guard))?;
    let mut options = TollgateOptions::in_front_of(&sim);
    options.args = vec!["--config".into(), config_path.display().to_string()];
    let mut tollgate = TollgateProcess::start(&options)?;
    let admin = || tollgate_metrics(&tollgate);

    // Node heartbeats keep writing, so the pod watchers' revisions fall behind the store's
    // (as in a live cluster): after the restart they are too old.
    let _heartbeats = Loadgen::spawn(
        dir.path(),
        "heartbeats",
        &[
            "--server",
            &tollgate.url,
            "--duration",
            LOADGEN_DURATION,
            "--patches",
            "20/s",
            "--objects",
            "20",
            "--object-prefix",
            "",
            "--no-progress",
        ],
    )?;
    let mut watchers = Vec::new();
    for b in 1..=WATCHERS / BATCH {
        let count = BATCH.to_string();
        watchers.push(Loadgen::spawn(
            dir.path(),
            &format!("watchers-{b}"),
            &[
                "--server",
                &tollgate.url,
                "--duration",
                LOADGEN_DURATION,
                "--watches",
                &count,
                "--watch-all-namespaces",
                "--no-progress",
            ],
        )?);
        let want = (b * BATCH) as f64;
        eventually(Duration::from_secs(60), &format!("{want} watches"), || {
            Ok(sim_metrics(&sim)
                .ok()
                .filter(|m| watches(m) >= want)
                .map(|_| ()))
        })?;
    }
    let before = sim_metrics(&sim)?;
    anyhow::ensure!(
        metric(&before, "tollgate_sim_restarts_total", &[]) == 0.0,
        "the apiserver crashed before the storm (the watchers' first LISTs): {}",
        sim.log()
    );
    let admin_before = admin()?;

    // The storm that kills it: consistent LISTs of every pod, straight to the apiserver.
    let mut storm = Loadgen::spawn(
        dir.path(),
        "storm",
        &[
            "--server",
            &sim.url,
            "--lists",
            "150/s",
            "-A",
            "--list-rv",
            "consistent",
            "--duration",
            "1s",
            "--timeout",
            "5s",
            "--drain-timeout",
            "1s",
            "--no-progress",
        ],
    )?;
    let crashed_at = eventually(
        Duration::from_secs(20),
        "the storm to crash the apiserver",
        || {
            Ok(sim_metrics(&sim)
                .ok()
                .filter(|m| metric(m, "tollgate_sim_restarts_total", &[]) >= 1.0)
                .map(|_| Instant::now()))
        },
    )?;
    storm.wait(Duration::from_secs(30))?;

    let mut o = Observed {
        min_rate: f64::INFINITY,
        ..Observed::default()
    };
    while crashed_at.elapsed() < OBSERVE {
        if let Ok(m) = sim_metrics(&sim) {
            o.restarts = metric(&m, "tollgate_sim_restarts_total", &[]);
            o.rewatched = o.rewatched.max(watches(&m));
            if o.restarts >= 2.0 {
                o.second_crash_after = Some(crashed_at.elapsed().as_secs_f64());
                break;
            }
        }
        let a = admin()?;
        let rate = metric(&a, "tollgate_quota_rate_bytes_per_second", &[]);
        o.min_rate = o.min_rate.min(rate);
        o.max_rate = o.max_rate.max(rate);
        o.max_heavy_inflight = o.max_heavy_inflight.max(metric(
            &a,
            "tollgate_lane_inflight_requests",
            &[("lane", "heavy")],
        ));
        std::thread::sleep(Duration::from_millis(200)); // a sampling interval, not a wait
    }
    let a = admin()?;
    o.guard_triggers = metric(&a, "tollgate_relist_guard_triggers_total", &[]);
    o.heavy_admitted = heavy(&a, "admit") - heavy(&admin_before, "admit");
    o.heavy_held = heavy(&a, "queue") + heavy(&a, "reject")
        - heavy(&admin_before, "queue")
        - heavy(&admin_before, "reject");
    anyhow::ensure!(sim.is_running(), "the simulator exited: {}", sim.log());
    anyhow::ensure!(tollgate.is_running(), "tollgate exited: {}", tollgate.log());
    drop(watchers);
    Ok(o)
}

fn tollgate_metrics(t: &TollgateProcess) -> anyhow::Result<String> {
    t.admin_ok("/metrics")
}

#[test]
fn with_the_guard_the_relists_are_spread_and_the_apiserver_survives() {
    let o = run(true).expect("the guarded run");
    eprintln!("with the guard: {o:?}");
    assert_eq!(o.second_crash_after, None, "crashed again: {o:?}");
    assert_eq!(o.restarts, 1.0, "{o:?}");
    assert!(o.guard_triggers >= 1.0, "the guard never started: {o:?}");
    // The ramp: admission started at a fraction of the pool and rose.
    assert!(o.min_rate <= 0.3 * POOL_RATE, "no ramp: {o:?}");
    assert!(
        o.max_rate > 1.5 * o.min_rate,
        "the rate did not rise: {o:?}"
    );
    // Spread, not starved: relists were held back (queued or 429), others served and the
    // watchers came back.
    assert!(
        o.heavy_held >= 50.0,
        "the relists were not held back: {o:?}"
    );
    assert!(o.heavy_admitted >= 100.0, "few relists served: {o:?}");
    assert!(o.rewatched >= 100.0, "few watchers came back: {o:?}");
    // ~190 cache LISTs at once pass the memory limit; the guard kept far below it.
    assert!(o.max_heavy_inflight < 100.0, "{o:?}");
}

#[test]
fn without_the_guard_the_relist_storm_crashes_it_again() {
    let o = run(false).expect("the unguarded run");
    eprintln!("without the guard: {o:?}");
    assert!(
        o.second_crash_after.is_some() && o.restarts >= 2.0,
        "the relist storm did not crash the apiserver again: {o:?}"
    );
    assert!(
        o.min_rate >= POOL_RATE * 0.99,
        "the pool was scaled down: {o:?}"
    );
}
