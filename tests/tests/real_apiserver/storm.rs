//! A LIST storm on the real apiserver, straight at it and then through tollgate with nothing set
//! but `--mode enforce` (issue 16): tollgate's default budget must keep the heartbeats faster than
//! the storm without it, and still serve LISTs. A functional check with generous margins; the
//! figures are the goodput benchmark's (bench/scripts/goodput.sh). The test runs alone
//! (.config/nextest.toml): its latencies must not be other tests' load.
//!
//! Each storm begins on a cluster at rest: heartbeats alone for [`LEAD_IN`], then the LISTs, as a
//! storm meets a tollgate that has been running. Started together, tollgate learned its baseline
//! from heartbeats already slowed by the first LISTs (256 ms in one CI run, where the apiserver at
//! rest answers in ~20 ms), so its default target let nearly everything in; a tollgate restarted
//! into a running storm is the goodput benchmark's cold-start case, not this test's.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::{KubeVersion, RealApiserver, TollgateOptions, TollgateProcess};

use super::loadgen::{code, loadgen, op, summary, target, target_at, LOADGEN_GRACE};

/// Pods of ~3.3 KB: one LIST of all of them is ~33 MB, the storm (a smaller one does
/// not hurt the heartbeats of an apiserver that has the machine to itself).
const PODS: u64 = 10_000;
const POD_BYTES: u64 = 900;
const NODES: u64 = 20;
/// Long enough that the direct storm's LISTs pile up: in 20 s the first LIST from a cold etcd,
/// which pauses the apiserver through tollgate too, decided both p99s (201 vs 207 ms).
const STORM_SECONDS: u64 = 40;
/// Heartbeats alone before the LISTs start: 200 of them, twice the quiet samples tollgate needs
/// for a baseline.
const LEAD_IN: Duration = Duration::from_secs(10);
const HEARTBEATS: &str = "20/s";

/// The storm's LISTs, per version: what harms that apiserver directly.
/// - 1.20.2: 240 consistent LISTs of all pods a minute, each a quorum read of 33 MB from etcd.
/// - The current release serves those from the watch cache and is not hurt by them while it has
///   the CPU, so with them the outcome followed the machine's load (bench/RESULTS.md, "The 1.37.2
///   storm test"). What hurts it is a relist storm: 50 informers of all pods
///   starting at once, each a LIST (`resourceVersion=0`) then a WATCH, as after an apiserver
///   restart in a cluster of many controllers: 50 LISTs of 33 MB encoded at once. Sent directly
///   the scenario matrix's best even rate within 50 ms was 37 informers (bench/RESULTS.md,
///   inf-50).
///
/// Returns loadgen's arguments and the summary's operation that counts the LISTs served.
fn storm_lists(version: KubeVersion) -> (&'static [&'static str], &'static str) {
    match version {
        KubeVersion::V1_20 => (
            &[
                "--lists",
                "240/min",
                "-A",
                "--list-rv",
                "consistent",
                "--timeout",
                "60s",
                "--drain-timeout",
                "30s",
            ],
            "list",
        ),
        KubeVersion::Current => (
            &[
                "--watches",
                "50",
                "--watch-all-namespaces",
                "--timeout",
                "60s",
                "--drain-timeout",
                "5s",
            ],
            "watch-list",
        ),
    }
}

/// One storm against `server` as the given credentials: the heartbeats' PATCH p99 (ms) and the
/// LISTs answered 200. The LISTs start [`LEAD_IN`] after the heartbeats, once `at_rest` says the
/// cluster's rest has been seen (tollgate's baseline).
fn storm(
    kube: &RealApiserver,
    server: &str,
    ca: &Path,
    work: &Path,
    name: &str,
    at_rest: &dyn Fn() -> bool,
) -> anyhow::Result<(f64, u64, Value)> {
    let dir = work.join(name);
    std::fs::create_dir_all(&dir)?;
    let run = |who: &str, out: &str, seconds: u64, more: &[&str]| -> anyhow::Result<Vec<String>> {
        let mut a = target_at(kube, who, server, ca)?;
        a.extend(
            [
                "--duration",
                &format!("{seconds}s"),
                "--no-progress",
                "--output",
                &dir.join(out).display().to_string(),
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        a.extend(more.iter().map(|s| s.to_string()));
        Ok(a)
    };
    let heartbeats = run(
        "ADMIN",
        "hb",
        LEAD_IN.as_secs() + STORM_SECONDS,
        &[
            "--patches",
            HEARTBEATS,
            "--patch-target",
            "node-status",
            "--objects",
            &NODES.to_string(),
            "--timeout",
            "30s",
        ],
    )?;
    let (list_args, list_op) = storm_lists(kube.version);
    let lists = run("USER", "lists", STORM_SECONDS, list_args)?;
    let grace = LEAD_IN + Duration::from_secs(STORM_SECONDS) + LOADGEN_GRACE;
    let (hb_dir, list_dir) = (dir.join("hb.run"), dir.join("lists.run"));
    std::fs::create_dir_all(&hb_dir)?;
    std::fs::create_dir_all(&list_dir)?;
    std::thread::scope(|s| -> anyhow::Result<()> {
        let h = s.spawn(|| loadgen(&heartbeats, grace, &hb_dir));
        // The lead-in is part of the load's schedule, the same for both storms.
        let started = Instant::now();
        while started.elapsed() < LEAD_IN && !h.is_finished() {
            std::thread::sleep(Duration::from_millis(100));
        }
        anyhow::ensure!(
            at_rest(),
            "{name}: no baseline after {LEAD_IN:?} of heartbeats alone"
        );
        loadgen(&lists, grace, &list_dir)?;
        h.join()
            .map_err(|_| anyhow::anyhow!("the heartbeat loadgen panicked"))??;
        Ok(())
    })?;
    let hb = summary(&dir.join("hb"))?;
    let patch = op(&hb, "patch")?;
    let p99 = patch["latency_ms"]["p99"].as_f64().unwrap_or(f64::MAX);
    let lists = summary(&dir.join("lists"))?;
    let list = op(&lists, list_op)?;
    let served = code(list, "200");
    eprintln!(
        "{name}: heartbeat PATCH {}; LIST {} with codes {}",
        patch["latency_ms"], list["latency_ms"], list["status_codes"]
    );
    Ok((p99, served, patch.clone()))
}

/// CPU seconds `pid` has used (user + system), from `/proc/PID/stat`.
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// CPU seconds used by each named process while `f` ran, and the machine's load average after,
/// printed beside a storm's figures: on a 2-core machine shared with builds they say whose
/// cycles the heartbeats waited for.
fn with_cpu<T>(
    name: &str,
    pids: &[(&str, String)],
    f: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let before: Vec<Option<f64>> = pids.iter().map(|(_, pid)| cpu_seconds(pid)).collect();
    let started = Instant::now();
    let out = f()?;
    let used: Vec<String> = pids
        .iter()
        .zip(before)
        .map(|((who, pid), b)| match (b, cpu_seconds(pid)) {
            (Some(b), Some(a)) => format!("{who} {:.1} s", a - b),
            _ => format!("{who} ?"),
        })
        .collect();
    eprintln!(
        "{name}: CPU over {:.0} s: {}; load average {}",
        started.elapsed().as_secs_f64(),
        used.join(", "),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    Ok(out)
}

fn kube_pids(kube: &RealApiserver) -> Vec<(&'static str, String)> {
    [
        ("kube-apiserver", "KUBE_APISERVER_PID"),
        ("etcd", "KUBE_ETCD_PID"),
    ]
    .into_iter()
    .filter_map(|(who, var)| Some((who, kube.var(var).ok()?.to_string())))
    .collect()
}

/// A fresh apiserver seeded with the storm's pods and nodes: each storm gets its own, since one
/// storm's aftermath (memory, garbage collection, LISTs still being encoded for clients that gave
/// up) slows the next one's heartbeats for tens of seconds.
///
/// Its etcd keeps its data in memory (`/dev/shm`, where the machine has it), as the scenario
/// matrix's does: etcd syncs each heartbeat PATCH to disk, and on a shared disk a sync that
/// waits 0.4-3 s stalls every heartbeat behind it, whatever the LISTs do. In one suite run a
/// stall during the heartbeats' lead-in put their p99 at rest at 173 ms, before any LIST, and
/// that run failed (bench/RESULTS.md, "The 1.37.2 storm test").
fn seeded_apiserver(version: KubeVersion, work: &Path) -> anyhow::Result<RealApiserver> {
    let shm = Path::new("/dev/shm");
    let kube = RealApiserver::start_version_in(version, &[], shm.is_dir().then_some(shm))?;
    let mut seed = vec!["seed".to_string()];
    seed.extend(target(&kube, "ADMIN")?);
    seed.extend(
        [
            "--nodes",
            &NODES.to_string(),
            "--pods",
            &PODS.to_string(),
            "--pod-bytes",
            &POD_BYTES.to_string(),
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    loadgen(&seed, LOADGEN_GRACE, work)?;
    Ok(kube)
}

// Each version with its own storm: [`storm_lists`].
per_version!(default_tollgate_keeps_heartbeats_faster_than_the_direct_storm_and_serves_lists);

fn default_tollgate_keeps_heartbeats_faster_than_the_direct_storm_and_serves_lists(
    version: KubeVersion,
) -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let (direct_p99, direct_served) = {
        let kube = seeded_apiserver(version, work.path())?;
        let ca = kube.file("KUBE_CA_CERT")?;
        let (p99, served, _) = with_cpu("direct", &kube_pids(&kube), || {
            storm(&kube, &kube.url, &ca, work.path(), "direct", &|| true)
        })?;
        (p99, served)
    };

    let kube = seeded_apiserver(version, work.path())?;
    let tollgate = TollgateProcess::start(&TollgateOptions {
        upstream_url: kube.url.clone(),
        upstream_ca_pem: Some(kube.ca_pem()?),
        tls: true,
        client_ca_pem: Some(kube.ca_pem()?),
        front_proxy: Some(kube.front_proxy()?),
        args: vec![
            "--mode".into(),
            "enforce".into(),
            "--upstream-client-cert".into(),
            kube.var("KUBE_ADMIN_CERT")?.into(),
            "--upstream-client-key".into(),
            kube.var("KUBE_ADMIN_KEY")?.into(),
        ],
        ..TollgateOptions::default()
    })?;
    let serving_ca = tollgate
        .serving_ca_file()?
        .ok_or_else(|| anyhow::anyhow!("tollgate serves TLS"))?;
    let has_baseline = || {
        tollgate
            .admin_get("/debug/budget")
            .ok()
            .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
            .is_some_and(|b| b["signal"]["baselineSeconds"].is_number())
    };
    let mut pids = kube_pids(&kube);
    pids.push(("tollgate", tollgate.pid().to_string()));
    let (via_p99, via_served, via_patch) = with_cpu("tollgate", &pids, || {
        storm(
            &kube,
            &tollgate.url,
            &serving_ca,
            work.path(),
            "tollgate",
            &has_baseline,
        )
    })?;
    let budget = tollgate.admin_get("/debug/budget").map(|(_, b)| b);
    eprintln!(
        "direct: heartbeat p99 {direct_p99:.1} ms, {direct_served} LISTs served; \
         through tollgate: p99 {via_p99:.1} ms, {via_served} LISTs served; budget {budget:?}"
    );
    anyhow::ensure!(
        kube.is_running(),
        "the apiserver died during the storms; its log:\n{}",
        kube.log()
    );
    anyhow::ensure!(
        via_p99 < direct_p99,
        "through tollgate the heartbeats' p99 was {via_p99:.1} ms, not below the direct storm's \
         {direct_p99:.1} ms ({via_patch:#}); tollgate's log:\n{}",
        tollgate.log()
    );
    anyhow::ensure!(
        via_served >= 1,
        "tollgate served no LIST of the storm; its log:\n{}",
        tollgate.log()
    );
    Ok(())
}
