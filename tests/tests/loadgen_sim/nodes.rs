//! `loadgen nodes`: simulated kubelets and their daemons against the simulator.
//!
//! - nodes registered, status heartbeats and lease renewals exactly as many as the schedule
//!   holds for the duration (counted by loadgen and by the simulator), daemons that see
//!   their own node's pods only (pods bound by `--bind` after every daemon watches);
//! - a daemon relists after its watch expired (410 Gone: a small `--history-window`, no
//!   bookmarks, short watches);
//! - the presets' numbers in the `--dry-run` plan.
//!
//! Counts, never wall-clock accuracy: the heartbeat pacer issues every beat scheduled
//! before the end of `--duration`, however late, so the count is exact; its timing is
//! unit-tested on a paused clock (`loadgen/src/nodes/beats.rs`).

use super::*;

/// The sum of `apiserver_longrunning_requests` for pod watches.
fn pod_watches(k: &Kubectl) -> anyhow::Result<u64> {
    let text = k.ok(&["get", "--raw", "/metrics"])?;
    Ok(text
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_longrunning_requests{")
                && l.contains("verb=\"WATCH\"")
                && l.contains("resource=\"pods\"")
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// Creates `names` as unscheduled pods in `default`, with one kubectl call (a stream of JSON
/// documents, which kubectl reads one by one) so they are there soon after the daemons watch.
fn pending_pods(sim: &SimProcess, k: &Kubectl, names: &[&str]) -> anyhow::Result<()> {
    let docs: Vec<String> = names
        .iter()
        .map(|name| {
            serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
            })
            .to_string()
        })
        .collect();
    let file = sim.dir().join("pending-pods.json");
    std::fs::write(&file, docs.join("\n"))?;
    k.ok(&["create", "-f", &file.display().to_string()])?;
    Ok(())
}

/// 3 nodes × (status every 2 s, lease every 2 s) for 8 s = 12 of each; 2 daemons per node;
/// 2 pods per node created bound; 3 pending pods bound round robin once all 6 daemons watch,
/// so each daemon sees exactly one event: the one pod bound to its node.
#[test]
fn nodes_heartbeat_renew_leases_and_daemons_see_their_pods_only() -> anyhow::Result<()> {
    let sim = SimProcess::start(&[])?;
    let k = sim.kubectl();
    let before = RequestCounts::scrape(&k)?;
    let out = sim.dir().join("nodes-out");
    let args = target_args(
        &sim,
        &[
            "--count",
            "3",
            "--heartbeat",
            "2s",
            "--lease-renew",
            "2s",
            "--daemons-per-node",
            "2",
            "--pods-per-node",
            "2",
            "--bind",
            "--bind-interval",
            "200ms",
            "-n",
            "default",
            "--namespace-allow",
            "default",
            // Long enough for kubectl to create the pending pods on a busy machine: the
            // binder stops with the run.
            "--duration",
            "8s",
            "--no-progress",
            "--output",
            &out.display().to_string(),
        ],
    )?;
    let mut all = vec!["nodes"];
    all.extend(strs(&args));
    let run = Loadgen::spawn(&all)?;
    // Pending pods only once every daemon watches, so they arrive as events, not in a LIST.
    eventually(Duration::from_secs(30), "all 6 daemons watching", || {
        Ok((pod_watches(&k)? >= 6).then_some(()))
    })?;
    pending_pods(&sim, &k, &["pending-a", "pending-b", "pending-c"])?;
    let finished = run.wait(Duration::from_secs(8) + LOADGEN_GRACE)?.ok()?;
    let summary = read_summary(&out)?;

    // Exactly the scheduled beats, each answered 200, and the simulator served as many.
    let after = RequestCounts::scrape(&k)?;
    for (name, resource, subresource) in [
        ("node-heartbeat", "nodes", "status"),
        ("lease-renew", "leases", ""),
    ] {
        let o = op(&summary, name)?;
        anyhow::ensure!(
            num(o, "requests") == 12 && code(o, "200") == 12 && num(o, "errors") == 0,
            "{name}: expected 12 requests, all 200: {o:#}\n{}",
            finished.stdout
        );
        anyhow::ensure!(
            o["target_rate_per_s"].as_f64() == Some(1.5),
            "{name}: {o:#}"
        );
        check_latency(o)?;
        let served = served(
            &before,
            &after,
            &[
                ("verb", "PATCH"),
                ("resource", resource),
                ("subresource", subresource),
            ],
        );
        anyhow::ensure!(served == 12, "{name}: the simulator served {served}");
    }

    // Registered: the nodes, labelled; a heartbeat in each; a renewed lease for each.
    let nodes = k.json(&[
        "get",
        "nodes",
        "-l",
        "loadgen.tollgate.dev/simulated-node=true",
        "-o",
        "json",
    ])?;
    let nodes = nodes["items"].as_array().context("nodes")?.clone();
    let names: BTreeSet<String> = nodes
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    let expected: BTreeSet<String> = (0..3).map(|i| format!("loadgen-node-{i}")).collect();
    anyhow::ensure!(names == expected, "simulated nodes: {names:?}");
    for n in &nodes {
        let ready = n["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
            .context("Ready condition")?;
        anyhow::ensure!(
            ready["lastHeartbeatTime"].is_string(),
            "no heartbeat: {ready}"
        );
    }
    for name in &expected {
        let lease = k.json(&["get", "lease", "-n", "kube-node-lease", name, "-o", "json"])?;
        anyhow::ensure!(
            lease["spec"]["holderIdentity"] == name.as_str()
                && lease["spec"]["renewTime"]
                    .as_str()
                    .is_some_and(|t| t.len() == 27),
            "lease {name}: {lease}"
        );
    }

    // Bound round robin, one pending pod per node; each node's 2 daemons saw it once.
    let mut bound_to = BTreeSet::new();
    for pod in ["pending-a", "pending-b", "pending-c"] {
        let p = k.json(&["get", "pod", "-n", "default", pod, "-o", "json"])?;
        let node = p["spec"]["nodeName"].as_str().unwrap_or("").to_string();
        anyhow::ensure!(expected.contains(&node), "{pod} on `{node}`");
        bound_to.insert(node);
    }
    anyhow::ensure!(bound_to == expected, "pending pods went to {bound_to:?}");
    let n = &summary["nodes"];
    let daemons = &n["daemon_watches"];
    anyhow::ensure!(
        n["nodes"] == 3 && n["daemons"] == 6 && n["pods_bound"] == 3,
        "nodes summary: {n:#}"
    );
    // A daemon watching all pods would have seen 3 events, one watching nothing 0.
    anyhow::ensure!(
        daemons["events"] == 6 && daemons["errors"] == 0 && daemons["relists"] == 0,
        "daemon watches: {daemons:#}"
    );
    let lists = op(&summary, "daemon-list")?;
    anyhow::ensure!(
        num(lists, "requests") == 6 && num(lists, "errors") == 0,
        "daemon-list: {lists:#}"
    );
    let events = op(&summary, "daemon-event")?;
    anyhow::ensure!(num(events, "requests") == 6, "daemon-event: {events:#}");
    let bind = op(&summary, "pod-bind")?;
    anyhow::ensure!(
        num(bind, "requests") == 3 && num(bind, "ok") == 3,
        "pod-bind: {bind:#}"
    );
    check_output_files(&out, &summary)?;
    still_running(sim)
}

/// Watches that end every second and no bookmarks, while pods created elsewhere (not on the
/// daemons' nodes, so they never see them) push the pods' watch window past their last
/// resourceVersion: the daemons' re-watches get 410 and they relist. Node heartbeats alone
/// would not: each resource keeps its own window, as kube-apiserver's cachers do.
#[test]
fn daemons_relist_after_their_watch_expires() -> anyhow::Result<()> {
    let sim = SimProcess::start(&["--history-window", "20", "--bookmark-interval", "1h"])?;
    let out = sim.dir().join("relist-out");
    let args = target_args(
        &sim,
        &[
            "--count",
            "2",
            "--heartbeat",
            "100ms",
            "--lease-renew",
            "0",
            "--daemons-per-node",
            "1",
            "--daemon-watch-timeout",
            "1s",
            "--duration",
            "6s",
            "--no-progress",
            "--output",
            &out.display().to_string(),
        ],
    )?;
    let mut all = vec!["nodes"];
    all.extend(strs(&args));
    let writer_args = target_args(
        &sim,
        &[
            "--creates",
            "20/s",
            "-n",
            "default",
            "--namespace-allow",
            "default",
            "--duration",
            "6s",
            "--no-progress",
        ],
    )?;
    let writer = Loadgen::spawn(&strs(&writer_args))?;
    loadgen(&all, Duration::from_secs(6))?;
    writer.wait(Duration::from_secs(6) + LOADGEN_GRACE)?.ok()?;
    let summary = read_summary(&out)?;
    let daemons = &summary["nodes"]["daemon_watches"];
    anyhow::ensure!(
        daemons["gone_410"].as_u64().unwrap_or(0) >= 1
            && daemons["relists"].as_u64().unwrap_or(0) >= 1,
        "no relist after 410: {daemons:#}"
    );
    let lists = op(&summary, "daemon-list")?;
    anyhow::ensure!(
        num(lists, "requests") > 2 && num(lists, "errors") == 0,
        "daemon-list should count the relists: {lists:#}"
    );
    anyhow::ensure!(
        summary["operations"]
            .as_array()
            .is_some_and(|ops| ops.iter().all(|o| o["name"] != "lease-renew")),
        "--lease-renew 0 still renewed leases: {summary:#}"
    );
    still_running(sim)
}

/// The presets' numbers, as the plan prints them (no server contacted).
#[test]
fn presets_plan_the_documented_numbers() -> anyhow::Result<()> {
    for (preset, line) in [
        ("tess-5k", "nodes    5000 (loadgen-node-K, created or adopted): status every 10s (500.0/s), lease off, 5 daemons and 30 pods per node"),
        ("modern-5k", "nodes    5000 (loadgen-node-K, created or adopted): status every 300s (16.7/s), lease every 10s (500.0/s), 5 daemons and 30 pods per node"),
        ("tess-1k", "nodes    1000 (loadgen-node-K, created or adopted): status every 10s (100.0/s), lease off, 5 daemons and 30 pods per node"),
        ("modern-1k", "nodes    1000 (loadgen-node-K, created or adopted): status every 300s (3.3/s), lease every 10s (100.0/s), 5 daemons and 30 pods per node"),
    ] {
        let plan = loadgen(
            &[
                "--server",
                "http://127.0.0.1:1",
                "--preset",
                preset,
                "--dry-run",
            ],
            Duration::ZERO,
        )?;
        anyhow::ensure!(
            plan.stdout.contains(line),
            "--preset {preset}: no `{line}` in\n{}",
            plan.stdout
        );
    }
    Ok(())
}
