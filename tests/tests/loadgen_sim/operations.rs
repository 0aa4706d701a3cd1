//! Every operation against the sim, counts matched to the sim's own request counter.

use super::*;

/// Every operation in one run over HTTP/1.1: a label-selected consistent LIST, GETs, pod
/// label PATCHes (merge), creates, deletes, a burst, and informer-like watches timing the
/// delivery of those writes.
#[test]
fn every_operation_in_one_run() -> anyhow::Result<()> {
    let sim = SimProcess::start(&["--nodes", "3", "--pods", "30", "--namespaces", "2"])?;
    let k = sim.kubectl();
    let seed = target_args(
        &sim,
        &["--nodes", "10", "--pods", "10", "--namespaces", "1"],
    )?;
    let mut seed_args = vec!["seed"];
    seed_args.extend(strs(&seed));
    let seeded = loadgen(&seed_args, Duration::ZERO)?;
    anyhow::ensure!(
        seeded.stdout.contains("seed: 21 created"),
        "seed: {}",
        seeded.stdout
    );

    let out = TempDir::new()?;
    let secs = 10.0;
    let output = out.path().display().to_string();
    let run = target_args(
        &sim,
        &[
            "--http-version",
            "1.1",
            "--duration",
            "10s",
            "-n",
            "loadgen-ns-0",
            "--objects",
            "10",
            "--lists",
            "5/s",
            "-l",
            "app.kubernetes.io/managed-by=loadgen",
            "--list-rv",
            "consistent",
            "--gets",
            "20/s",
            "--patches",
            "20/s",
            "--patch-target",
            "pod-labels",
            "--patch-type",
            "merge",
            "--creates",
            "10/s",
            "--deletes",
            "5/s",
            "--burst",
            "20",
            "--watches",
            "4",
            "--no-progress",
            "--output",
            &output,
        ],
    )?;
    let before = RequestCounts::scrape(&k)?;
    let finished = loadgen(&strs(&run), Duration::from_secs_f64(secs))?;
    let after = RequestCounts::scrape(&k)?;
    for row in [
        "list",
        "get",
        "patch",
        "create",
        "delete",
        "burst-create",
        "watch-event",
    ] {
        anyhow::ensure!(
            finished.stdout.lines().any(|l| l.starts_with(row)),
            "no `{row}` row in the table:\n{}",
            finished.stdout
        );
    }

    let s = read_summary(out.path())?;
    anyhow::ensure!(
        s["schema"] == "loadgen.summary/v1"
            && s["interrupted"] == false
            && s["schedule"] == "constant",
        "summary header: {s:#}"
    );
    let lists = check_clean_op(&s, "list", 5.0, secs, "200")?;
    let gets = check_clean_op(&s, "get", 20.0, secs, "200")?;
    let patches = check_clean_op(&s, "patch", 20.0, secs, "200")?;
    let creates = check_clean_op(&s, "create", 10.0, secs, "201")?;
    let l = op(&s, "list")?;
    anyhow::ensure!(
        (
            l["verb"].as_str(),
            l["resource"].as_str(),
            l["scope"].as_str()
        ) == (Some("LIST"), Some("pods"), Some("namespace")),
        "list labels: {l:#}"
    );

    // Deletes take the pods this run created: a tick that comes before any unclaimed create
    // has returned (the first, at t = 0, and others on a slow machine) is skipped, not sent.
    let d = op(&s, "delete")?;
    let deletes = num(d, "requests");
    anyhow::ensure!(
        deletes + num(d, "skipped") == 50 && num(d, "skipped") <= 5,
        "delete: {d:#}"
    );
    anyhow::ensure!(
        num(d, "errors") == 0 && num(d, "ok") == deletes && num(d, "dropped") == 0,
        "delete: {d:#}"
    );
    check_latency(d)?;

    for name in ["burst-create", "burst-delete"] {
        let b = op(&s, name)?;
        anyhow::ensure!(
            num(b, "requests") == 20 && num(b, "ok") == 20 && num(b, "errors") == 0,
            "{name}: {b:#}"
        );
        check_latency(b)?;
    }

    // Watches: every watcher sees every create and every label patch; each of those events
    // carries a fresh written-at stamp and is timed once per watcher. A watcher may miss
    // (as a timed event) writes made before its first LIST returned, or delivered after the
    // run's end: allow 15%.
    let w = &s["watches"];
    anyhow::ensure!(
        num(w, "watchers") == 4 && num(w, "active_at_end") == 4 && num(w, "errors") == 0,
        "watches: {w:#}"
    );
    let writes = patches + creates + 20;
    let timed = num(op(&s, "watch-event")?, "requests");
    anyhow::ensure!(
        timed <= 4 * writes && timed as f64 >= 0.85 * (4 * writes) as f64,
        "watch-event: {timed} timed deliveries, expected about 4 × {writes}: {w:#}"
    );
    anyhow::ensure!(num(w, "events") >= timed, "watches: {w:#}");
    let we = op(&s, "watch-event")?;
    check_latency(we)?;
    let p99 = we["latency_ms"]["p99"].as_f64().unwrap_or(f64::MAX);
    anyhow::ensure!(p99 < 5_000.0, "watch-event p99 {p99} ms: {we:#}");
    let watch_lists = num(op(&s, "watch-list")?, "requests");
    anyhow::ensure!(watch_lists == 4, "watch-list: {watch_lists}");

    // What the simulator served, by its own count, is what loadgen says it sent.
    let pods = |verb: &'static str, scope: &'static str, code: &'static str| {
        served(
            &before,
            &after,
            &[
                ("verb", verb),
                ("resource", "pods"),
                ("subresource", ""),
                ("scope", scope),
                ("code", code),
            ],
        )
    };
    let expected = [
        ("LIST", "namespace", "200", lists + watch_lists),
        ("GET", "resource", "200", gets),
        ("PATCH", "resource", "200", patches),
        ("POST", "namespace", "201", creates + 20),
        ("DELETE", "resource", "200", deletes + 20),
        ("WATCH", "namespace", "200", 4),
    ];
    for (verb, scope, status, n) in expected {
        let got = pods(verb, scope, status);
        anyhow::ensure!(
            got == n,
            "the simulator served {got} {verb} pods ({scope}) → {status}, loadgen reports {n}"
        );
    }
    check_output_files(out.path(), &s)?;

    // The run's writes landed: the pods it patched carry the tick label.
    let patched = k.json(&[
        "get",
        "pod",
        "-n",
        "loadgen-ns-0",
        "loadgen-pod-3",
        "-o",
        "json",
    ])?;
    anyhow::ensure!(
        patched["metadata"]["labels"]["loadgen.tollgate.dev/tick"].is_string()
            && patched["metadata"]["annotations"]["loadgen.tollgate.dev/written-at"].is_string(),
        "loadgen-pod-3 was not patched: {patched:#}"
    );
    still_running(sim)
}

/// Over HTTP/2 with TLS: field-selected LISTs across namespaces from the watch cache
/// (`--list-rv cache`), node status heartbeats (strategic merge) watched by node watchers,
/// GETs of nodes; then over HTTP/1.1 with TLS, exact LISTs (`--list-rv exact`) paged with
/// `--list-limit`, each page a request to the simulator and the whole LIST one to loadgen.
#[test]
fn lists_by_consistency_and_node_heartbeats_over_tls() -> anyhow::Result<()> {
    let sim = SimProcess::start(&["--tls", "--nodes", "3", "--pods", "60", "--namespaces", "2"])?;
    let k = sim.kubectl();
    let seed = target_args(&sim, &["--nodes", "10", "--pods", "20"])?;
    let mut seed_args = vec!["seed"];
    seed_args.extend(strs(&seed));
    loadgen(&seed_args, Duration::ZERO)?;

    // 1. HTTP/2: cache lists with a field selector, heartbeats, node GETs, node watches.
    let out = TempDir::new()?;
    let output = out.path().display().to_string();
    let secs = 8.0;
    let run = target_args(
        &sim,
        &[
            "--http2",
            "--duration",
            "8s",
            "--objects",
            "10",
            "--lists",
            "10/s",
            "-A",
            "--field-selector",
            "spec.nodeName=loadgen-node-1",
            "--list-rv",
            "cache",
            "--patches",
            "20/s",
            "--patch-target",
            "node-status",
            "--patch-type",
            "strategic",
            "--gets",
            "10/s",
            "--get-resource",
            "nodes",
            "--watches",
            "3",
            "--watch-resource",
            "nodes",
            "--no-progress",
            "--output",
            &output,
        ],
    )?;
    let before = RequestCounts::scrape(&k)?;
    loadgen(&strs(&run), Duration::from_secs_f64(secs))?;
    let after = RequestCounts::scrape(&k)?;
    let s = read_summary(out.path())?;
    let lists = check_clean_op(&s, "list", 10.0, secs, "200")?;
    let patches = check_clean_op(&s, "patch", 20.0, secs, "200")?;
    let gets = check_clean_op(&s, "get", 10.0, secs, "200")?;
    let l = op(&s, "list")?;
    anyhow::ensure!(
        (l["verb"].as_str(), l["scope"].as_str()) == (Some("LIST(rv=0)"), Some("cluster")),
        "list labels: {l:#}"
    );
    let expected = [
        ("LIST", "pods", "", "cluster", lists),
        ("PATCH", "nodes", "status", "resource", patches),
        ("GET", "nodes", "", "resource", gets),
        ("WATCH", "nodes", "", "cluster", 3),
    ];
    for (verb, resource, sub, scope, n) in expected {
        let got = served(
            &before,
            &after,
            &[
                ("verb", verb),
                ("resource", resource),
                ("subresource", sub),
                ("scope", scope),
                ("code", "200"),
            ],
        );
        anyhow::ensure!(
            got == n,
            "the simulator served {got} {verb} {resource}/{sub} ({scope}), loadgen reports {n}"
        );
    }
    // The field selector was applied: each LIST carried the two pods bound to
    // loadgen-node-1 (pods 1 and 11), about what kubectl gets for the same request.
    let path = "/api/v1/pods?fieldSelector=spec.nodeName%3Dloadgen-node-1&resourceVersion=0";
    let reference = k.ok(&["get", "--raw", path])?;
    let items: Value = serde_json::from_str(&reference)?;
    anyhow::ensure!(
        items["items"].as_array().map(Vec::len) == Some(2),
        "kubectl got {reference:.300}"
    );
    let per_list = num(l, "bytes") as f64 / lists as f64;
    let want = reference.trim_end().len() as f64;
    anyhow::ensure!(
        (per_list - want).abs() <= want * 0.05,
        "a LIST returned {per_list} bytes on average, the same request with kubectl {want}"
    );
    // Heartbeats were strategic merges of the Ready condition (merged by type), stamped.
    let node = k.json(&["get", "node", "loadgen-node-4", "-o", "json"])?;
    let conditions = node["status"]["conditions"]
        .as_array()
        .context("conditions")?;
    anyhow::ensure!(
        conditions.len() == 1
            && conditions[0]["type"] == "Ready"
            && conditions[0]["message"] == "kubelet is posting ready status"
            && conditions[0]["lastHeartbeatTime"].is_string()
            && node["status"]["capacity"]["pods"] == "110",
        "loadgen-node-4 after heartbeats: {node:#}"
    );
    // The node watchers timed the heartbeats (each stamped with loadgen's clock).
    let w = &s["watches"];
    let timed = num(op(&s, "watch-event")?, "requests");
    anyhow::ensure!(
        num(w, "errors") == 0
            && timed as f64 >= 0.85 * (3 * patches) as f64
            && timed <= 3 * patches,
        "watch-event: {timed} for {patches} heartbeats × 3 watchers: {w:#}"
    );
    check_output_files(out.path(), &s)?;

    // 2. HTTP/1.1: exact lists, paged by 3 (20 pods in `default`: 7 pages).
    let out = TempDir::new()?;
    let output = out.path().display().to_string();
    let secs = 5.0;
    let run = target_args(
        &sim,
        &[
            "--http-version",
            "1.1",
            "--duration",
            "5s",
            "--lists",
            "10/s",
            "--list-rv",
            "exact",
            "--list-limit",
            "3",
            "--no-progress",
            "--output",
            &output,
        ],
    )?;
    let before = RequestCounts::scrape(&k)?;
    loadgen(&strs(&run), Duration::from_secs_f64(secs))?;
    let after = RequestCounts::scrape(&k)?;
    let s = read_summary(out.path())?;
    let lists = check_clean_op(&s, "list", 10.0, secs, "200")?;
    anyhow::ensure!(op(&s, "list")?["verb"] == "LIST(exact)", "{s:#}");
    let pages = served(
        &before,
        &after,
        &[
            ("verb", "LIST"),
            ("resource", "pods"),
            ("scope", "namespace"),
            ("code", "200"),
        ],
    );
    let failed = served(&before, &after, &[("verb", "LIST"), ("resource", "pods")]) - pages;
    anyhow::ensure!(
        pages == 7 * lists && failed == 0,
        "the simulator served {pages} LIST pages ({failed} failed) for {lists} paged lists of 7 pages"
    );
    let reference = k.ok(&["get", "--raw", "/api/v1/namespaces/default/pods"])?;
    let per_list = num(op(&s, "list")?, "bytes") as f64 / lists as f64;
    let whole = reference.trim_end().len() as f64;
    anyhow::ensure!(
        per_list > whole * 0.9,
        "a paged LIST read {per_list} bytes on average, the whole list is {whole}"
    );
    still_running(sim)
}
