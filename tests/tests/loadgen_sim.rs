//! loadgen against the simulated kube-apiserver (`tollgate-bench sim`), end to end: the real
//! `loadgen` binary against the real simulator on ephemeral loopback ports, its
//! `summary.json` checked against what was asked for and against what the simulator itself
//! counted (`apiserver_request_total`, scraped with kubectl before and after each run).
//!
//! - every operation in one run (HTTP/1.1), then LISTs from the watch cache and exact LISTs
//!   paged with `continue`, node heartbeats (strategic merge) over HTTP/2 with TLS;
//! - `loadgen seed` then `loadgen cleanup` removes exactly what seed made;
//! - the simulator's own max-in-flight 429s (plain text, `Retry-After: 1`) counted, then
//!   retried with `--honor-retry-after` (as a non-admin user: `system:masters` is never
//!   refused, which is checked too);
//! - Ctrl-C (SIGINT) still writes the results.
//!
//! Each test starts its own simulator, so the tests run in parallel.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;
use tempfile::TempDir;
use tests::{eventually, fresh_workspace_binary, Kubectl, SimProcess};

/// How long a loadgen command may take beyond its `--duration` before it is killed.
const LOADGEN_GRACE: Duration = Duration::from_secs(90);

/// Allowed difference between the requests made and rate × duration.
const RATE_TOLERANCE: f64 = 0.01;

// ---------------------------------------------------------------------------------------------
// loadgen as a child process

/// The `loadgen` binary, built from the current sources.
fn loadgen_binary() -> PathBuf {
    fresh_workspace_binary("loadgen", &["loadgen", "apimodel"])
}

/// A loadgen child process whose stdout and stderr go to files in its own temp dir.
struct Loadgen {
    shown: String,
    child: Child,
    dir: TempDir,
}

/// What a finished loadgen command did.
struct Finished {
    shown: String,
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Finished {
    /// Fails, quoting its output, unless loadgen exited 0.
    fn ok(self) -> anyhow::Result<Finished> {
        anyhow::ensure!(
            self.status.success(),
            "`{}` failed ({}):\nstderr: {}\nstdout: {}",
            self.shown,
            self.status,
            self.stderr.trim(),
            self.stdout.trim()
        );
        Ok(self)
    }
}

impl Loadgen {
    fn spawn(args: &[&str]) -> anyhow::Result<Loadgen> {
        let dir = tempfile::Builder::new()
            .prefix("tollgate-e2e-loadgen-")
            .tempdir()?;
        let shown = format!("loadgen {}", args.join(" "));
        let child = Command::new(loadgen_binary())
            .args(args)
            .env_remove("KUBECONFIG")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(File::create(dir.path().join("stdout"))?)
            .stderr(File::create(dir.path().join("stderr"))?)
            .spawn()
            .with_context(|| format!("starting `{shown}`"))?;
        Ok(Loadgen { shown, child, dir })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn output(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    /// Waits for loadgen to exit; kills it and fails after `timeout`.
    fn wait(mut self, timeout: Duration) -> anyhow::Result<Finished> {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                anyhow::bail!(
                    "`{}` did not exit within {timeout:?} and was killed; stderr: {}\nstdout: {}",
                    self.shown,
                    self.output("stderr").trim(),
                    self.output("stdout").trim()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Ok(Finished {
            status,
            stdout: self.output("stdout"),
            stderr: self.output("stderr"),
            shown: std::mem::take(&mut self.shown),
        })
    }
}

impl Drop for Loadgen {
    fn drop(&mut self) {
        // Our own child, by its handle; a no-op once it has exited and been reaped.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs loadgen to completion; `duration` is its `--duration` (0 for seed/cleanup).
fn loadgen(args: &[&str], duration: Duration) -> anyhow::Result<Finished> {
    Loadgen::spawn(args)?.wait(duration + LOADGEN_GRACE)?.ok()
}

/// `--server URL` plus the TLS flags for the simulator (its CA written to a file) and `extra`.
fn target_args(sim: &SimProcess, extra: &[&str]) -> anyhow::Result<Vec<String>> {
    let mut args = vec!["--server".to_string(), sim.url.clone()];
    if let Some(ca) = &sim.server_ca_pem {
        let path = sim.dir().join("loadgen-ca.crt");
        std::fs::write(&path, ca)?;
        args.push("--certificate-authority".into());
        args.push(path.display().to_string());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    Ok(args)
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

// ---------------------------------------------------------------------------------------------
// summary.json and the other output files

/// `summary.json` of an `--output` directory.
fn read_summary(out: &Path) -> anyhow::Result<Value> {
    let path = out.join("summary.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The operation named `name` in a summary.
fn op<'a>(summary: &'a Value, name: &str) -> anyhow::Result<&'a Value> {
    summary["operations"]
        .as_array()
        .and_then(|ops| ops.iter().find(|o| o["name"] == name))
        .with_context(|| {
            format!(
                "no operation `{name}` in summary.json: {}",
                serde_json::to_string_pretty(summary).unwrap_or_default()
            )
        })
}

fn num(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(u64::MAX)
}

/// The count of status `code` in an operation's `status_codes`.
fn code(op: &Value, code: &str) -> u64 {
    op["status_codes"][code].as_u64().unwrap_or(0)
}

/// Checks an operation that ran at `rate`/s for `secs` with no error: the requests made are
/// rate × duration within [`RATE_TOLERANCE`], none dropped, every answer `status`.
fn check_clean_op(
    summary: &Value,
    name: &str,
    rate: f64,
    secs: f64,
    status: &str,
) -> anyhow::Result<u64> {
    let o = op(summary, name)?;
    let requests = num(o, "requests");
    let intended = rate * secs;
    anyhow::ensure!(
        (requests as f64 - intended).abs() <= intended * RATE_TOLERANCE,
        "{name}: {requests} requests, intended {intended} ({rate}/s × {secs} s): {o:#}"
    );
    anyhow::ensure!(
        num(o, "dropped") == 0 && num(o, "cancelled") == 0 && num(o, "errors") == 0,
        "{name}: dropped, cancelled or failed requests: {o:#}"
    );
    anyhow::ensure!(
        num(o, "ok") == requests && code(o, status) == requests,
        "{name}: not every answer was {status}: {o:#}"
    );
    let rate_per_s = o["rate_per_s"].as_f64().unwrap_or(0.0);
    anyhow::ensure!(
        (rate_per_s - rate).abs() <= rate * RATE_TOLERANCE,
        "{name}: achieved rate {rate_per_s}/s, target {rate}/s"
    );
    check_latency(o)?;
    anyhow::ensure!(num(o, "bytes") > 0, "{name}: no bytes counted: {o:#}");
    Ok(requests)
}

/// Latency percentiles are present, positive and ordered.
fn check_latency(o: &Value) -> anyhow::Result<()> {
    let l = &o["latency_ms"];
    let keys = ["p50", "p75", "p90", "p95", "p99", "p99.9", "max"];
    let values: Vec<f64> = keys.iter().map(|k| l[k].as_f64().unwrap_or(-1.0)).collect();
    anyhow::ensure!(
        values[0] > 0.0 && values.windows(2).all(|w| w[0] <= w[1]),
        "{}: latency percentiles not positive and ordered: {l}",
        o["name"]
    );
    Ok(())
}

/// `perfdata.json` is ClusterLoader2 PerfData with one item per operation of the summary,
/// `timeseries.csv` has its header and rows, and every operation has a histogram file.
fn check_output_files(out: &Path, summary: &Value) -> anyhow::Result<()> {
    let perf: Value = serde_json::from_str(&std::fs::read_to_string(out.join("perfdata.json"))?)?;
    anyhow::ensure!(perf["version"] == "v1", "perfdata version: {perf}");
    let items = perf["dataItems"].as_array().context("perfdata dataItems")?;
    let ops = summary["operations"].as_array().context("operations")?;
    anyhow::ensure!(
        items.len() == ops.len(),
        "{} perfdata items for {} operations",
        items.len(),
        ops.len()
    );
    for (item, o) in items.iter().zip(ops) {
        for p in ["Perc50", "Perc90", "Perc99"] {
            anyhow::ensure!(
                item["data"][p].is_number(),
                "perfdata item without {p}: {item}"
            );
        }
        anyhow::ensure!(item["unit"] == "ms", "perfdata unit: {item}");
        let labels = &item["labels"];
        anyhow::ensure!(
            labels["Operation"] == o["name"]
                && labels["Verb"] == o["verb"]
                && labels["Resource"] == o["resource"]
                && labels["Count"].as_str() == Some(o["requests"].to_string().as_str()),
            "perfdata labels {labels} do not match summary operation {}",
            o["name"]
        );
        for l in ["Scope", "ErrorRate", "Rate429"] {
            anyhow::ensure!(
                labels[l].is_string(),
                "perfdata label {l} missing: {labels}"
            );
        }
        let hdr = out
            .join("histograms")
            .join(format!("{}.hdr", o["name"].as_str().unwrap_or("?")));
        anyhow::ensure!(
            std::fs::metadata(&hdr)
                .map(|m| m.len() > 0)
                .unwrap_or(false),
            "{} missing or empty",
            hdr.display()
        );
    }
    let csv = std::fs::read_to_string(out.join("timeseries.csv"))?;
    let mut lines = csv.lines();
    anyhow::ensure!(
        lines.next()
            == Some("second,operation,completed,ok,rejected_429,errors,dropped,bytes,p50_ms,p99_ms,max_ms"),
        "timeseries.csv header: {csv:.200}"
    );
    anyhow::ensure!(lines.count() > 0, "timeseries.csv has no rows");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// the simulator's own request counts

/// `apiserver_request_total` of the simulator, one entry per label set.
struct RequestCounts(Vec<(BTreeMap<String, String>, f64)>);

impl RequestCounts {
    fn scrape(k: &Kubectl) -> anyhow::Result<RequestCounts> {
        let text = k.ok(&["get", "--raw", "/metrics"])?;
        let mut out = Vec::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let labels = labels
                .split("\",")
                .filter_map(|kv| {
                    let (k, v) = kv.split_once("=\"")?;
                    Some((k.to_string(), v.trim_end_matches('"').to_string()))
                })
                .collect();
            out.push((labels, value.trim().parse().unwrap_or(0.0)));
        }
        Ok(RequestCounts(out))
    }

    /// The sum over label sets that match every `(label, value)` of `filter`.
    fn sum(&self, filter: &[(&str, &str)]) -> u64 {
        self.0
            .iter()
            .filter(|(labels, _)| {
                filter
                    .iter()
                    .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, n)| *n)
            .sum::<f64>() as u64
    }
}

/// Requests the simulator counted between two scrapes, for `filter`.
fn served(before: &RequestCounts, after: &RequestCounts, filter: &[(&str, &str)]) -> u64 {
    after.sum(filter).saturating_sub(before.sum(filter))
}

/// Fails if the simulator died during the test.
fn still_running(mut sim: SimProcess) -> anyhow::Result<()> {
    anyhow::ensure!(
        sim.is_running(),
        "the simulator (pid {}) exited during the test; its log:\n{}",
        sim.pid(),
        sim.log()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// the tests

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

/// Every object of a kind as `namespace/name` (cluster-scoped: `name`).
fn names(k: &Kubectl, kind: &str) -> anyhow::Result<BTreeSet<String>> {
    let out = k.ok(&[
        "get",
        kind,
        "-A",
        "-o",
        "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}{\"\\n\"}{end}",
    ])?;
    Ok(out
        .lines()
        .map(|l| l.trim_start_matches('/').to_string())
        .filter(|l| !l.is_empty())
        .collect())
}

/// `loadgen seed` creates its namespaces, nodes and pods (labelled as loadgen's);
/// `loadgen cleanup` deletes exactly them: the simulator's own objects and an unlabelled
/// namespace and pod named like loadgen's remain.
#[test]
fn seed_then_cleanup_removes_exactly_what_seed_made() -> anyhow::Result<()> {
    let sim = SimProcess::start(&[
        "--nodes",
        "4",
        "--pods",
        "40",
        "--namespaces",
        "2",
        "--kubelet-delete-delay",
        "100ms",
    ])?;
    let k = sim.kubectl();
    // Others' objects that look like loadgen's but are not labelled as its.
    // (`kubectl create namespace` sends protobuf, which the sim refuses: create from JSON.)
    let namespace = serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "loadgen-ns-9"}
    });
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "loadgen-pod-0", "namespace": "loadgen-ns-9", "labels": {"app": "other"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    });
    for (name, object) in [("namespace", namespace), ("pod", pod)] {
        let file = sim.dir().join(format!("other-{name}.json"));
        std::fs::write(&file, object.to_string())?;
        k.ok(&["create", "-f", &file.display().to_string()])?;
    }

    let kinds = ["namespaces", "nodes", "pods"];
    let mut before = BTreeMap::new();
    for kind in kinds {
        before.insert(kind, names(&k, kind)?);
    }

    let seed = target_args(
        &sim,
        &[
            "--nodes",
            "7",
            "--pods",
            "30",
            "--namespaces",
            "3",
            "--pod-bytes",
            "500",
        ],
    )?;
    let mut args = vec!["seed"];
    args.extend(strs(&seed));
    let seeded = loadgen(&args, Duration::ZERO)?;
    anyhow::ensure!(
        seeded
            .stdout
            .contains("seed: 40 created, 0 already there, 0 failed"),
        "seed: {}",
        seeded.stdout
    );
    let selector = "app.kubernetes.io/managed-by=loadgen";
    let count = |kind: &str| -> anyhow::Result<usize> {
        Ok(k.ok(&["get", kind, "-A", "-l", selector, "-o", "name"])?
            .lines()
            .count())
    };
    anyhow::ensure!(
        (count("namespaces")?, count("nodes")?, count("pods")?) == (3, 7, 30),
        "seeded objects by label"
    );
    let seeded_pod = k.json(&[
        "get",
        "pod",
        "-n",
        "loadgen-ns-1",
        "loadgen-pod-1",
        "-o",
        "json",
    ])?;
    anyhow::ensure!(
        seeded_pod["spec"]["nodeName"] == "loadgen-node-1"
            && seeded_pod["metadata"]["annotations"]["loadgen.tollgate.dev/padding"]
                .as_str()
                .map(str::len)
                == Some(500),
        "loadgen-pod-1: {seeded_pod:#}"
    );
    // Seeding again changes nothing.
    let again = loadgen(&args, Duration::ZERO)?;
    anyhow::ensure!(
        again
            .stdout
            .contains("seed: 0 created, 40 already there, 0 failed"),
        "second seed: {}",
        again.stdout
    );

    let cleanup = target_args(&sim, &[])?;
    let mut args = vec!["cleanup"];
    args.extend(strs(&cleanup));
    let cleaned = loadgen(&args, Duration::ZERO)?;
    anyhow::ensure!(
        cleaned.stdout.contains("cleanup: 40 deleted") && cleaned.stdout.contains("0 failed"),
        "cleanup: {}",
        cleaned.stdout
    );
    // Pods bound to nodes go gracefully and namespaces terminate: wait for them to be gone.
    eventually(
        Duration::from_secs(60),
        "exactly the objects from before seeding",
        || {
            for kind in kinds {
                let now = names(&k, kind)?;
                if &now != before.get(kind).context("kind")? {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )?;
    let other = k.json(&[
        "get",
        "pod",
        "-n",
        "loadgen-ns-9",
        "loadgen-pod-0",
        "-o",
        "json",
    ])?;
    anyhow::ensure!(other["metadata"]["labels"]["app"] == "other", "{other:#}");
    still_running(sim)
}

/// An HTTP answer: status, headers (lower-cased names) and body.
type Answer = (u16, Vec<(String, String)>, String);

/// One HTTP/1.1 request over a new connection, and its answer.
fn raw_get(url: &str, path: &str, token: &str) -> anyhow::Result<Answer> {
    let addr = url.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").context("no end of headers")?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .context("no status line")?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok((status, headers, body.to_string()))
}

/// The simulator's max-in-flight filter refuses a non-admin user with 429 (plain text,
/// `Retry-After: 1`); loadgen counts each first-try 429, and with `--honor-retry-after`
/// retries after the server's Retry-After, counting retries and final 429s apart. The counts
/// match what the simulator served. `system:masters` is never refused.
///
/// The load: LISTs of 1,500 pods and GETs of one node, both at 40/s on the same ticks,
/// against `--max-requests-inflight 1`: whichever arrives second while the other is still
/// being answered is refused.
#[test]
fn counts_the_sims_429s_and_retries_after_them() -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(
        &tokens,
        "admin-token,admin,1,\"system:masters\"\nuser-token,load-tester,2,\"load-testers\"\n",
    )?;
    let sim = SimProcess::start(&[
        "--token-auth-file",
        &tokens.display().to_string(),
        "--max-requests-inflight",
        "1",
        "--nodes",
        "10",
        "--pods",
        "1500",
        "--namespaces",
        "1",
    ])?;
    // kubectl sends no token over plain HTTP: it scrapes the simulator's metrics as
    // system:anonymous, only while loadgen is not running (so never refused).
    let k = sim.kubectl();
    let (who, _, _) = whoami(&k)?;
    anyhow::ensure!(who == "system:anonymous", "kubectl is served as {who}");
    // The node the GETs address (loadgen-node-0), seeded as admin.
    let seed = target_args(&sim, &["--token", "admin-token", "--nodes", "1"])?;
    let mut seed_args = vec!["seed"];
    seed_args.extend(strs(&seed));
    loadgen(&seed_args, Duration::ZERO)?;

    let load = |extra: &[&str], token: &str, out: &Path| -> anyhow::Result<Vec<String>> {
        let output = out.display().to_string();
        let mut args = vec![
            "--token",
            token,
            "--duration",
            "5s",
            "--lists",
            "40/s",
            "-A",
            "--list-rv",
            "cache",
            "--gets",
            "40/s",
            "--get-resource",
            "nodes",
            "--objects",
            "1",
            "--no-progress",
            "--output",
            &output,
        ];
        args.extend_from_slice(extra);
        target_args(&sim, &args)
    };
    // What the simulator answered to loadgen's pod LISTs and node GETs.
    let answered = |before: &RequestCounts, after: &RequestCounts, code: Option<&'static str>| {
        let mut lists = vec![("verb", "LIST"), ("resource", "pods"), ("scope", "cluster")];
        let mut gets = vec![
            ("verb", "GET"),
            ("resource", "nodes"),
            ("scope", "resource"),
        ];
        lists.extend(code.map(|c| ("code", c)));
        gets.extend(code.map(|c| ("code", c)));
        (served(before, after, &lists), served(before, after, &gets))
    };

    // 1. No retries: every first-try 429 is counted, as the simulator's plain-text body.
    let out = TempDir::new()?;
    let before = RequestCounts::scrape(&k)?;
    let run = Loadgen::spawn(&strs(&load(&[], "user-token", out.path())?))?;
    // Meanwhile: requests of our own (LISTs of namespaces), as the same user, until one is
    // refused; that 429 is what loadgen must understand.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (status, headers, body) = loop {
        let answer = raw_get(&sim.url, "/api/v1/namespaces", "user-token")?;
        if answer.0 == 429 || Instant::now() >= deadline {
            break answer;
        }
    };
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    anyhow::ensure!(
        status == 429
            && header("retry-after") == Some("1")
            && header("content-type").is_some_and(|c| c.starts_with("text/plain"))
            && body.contains("Too many requests, please try again later."),
        "no 429 as expected from the sim within 20 s; the last answer: {status} {headers:?}\n{body:.300}"
    );
    run.wait(Duration::from_secs(5) + LOADGEN_GRACE)?.ok()?;
    let after = RequestCounts::scrape(&k)?;
    let s = read_summary(out.path())?;
    let mut refused = 0;
    for name in ["list", "get"] {
        let o = op(&s, name)?;
        let requests = num(o, "requests");
        let rejected = code(o, "429");
        refused += rejected;
        anyhow::ensure!(
            (requests as f64 - 200.0).abs() <= 200.0 * RATE_TOLERANCE && num(o, "dropped") == 0,
            "{name}: {o:#}"
        );
        anyhow::ensure!(
            num(&o["retries"], "first_try_429") == rejected
                && num(&o["retries"], "retries") == 0
                && num(&o["rejections_429_body"], "plain_text") == rejected
                && num(&o["rejections_429_body"], "status_json") == 0
                && o["error_classes"]["429"].as_u64().unwrap_or(0) == rejected
                && num(o, "ok") + rejected == requests
                && num(o, "errors") == rejected,
            "{name}: 429 accounting: {o:#}"
        );
        let rate_429 = o["rate_429"].as_f64().unwrap_or(-1.0);
        anyhow::ensure!(
            (rate_429 - rejected as f64 / requests as f64).abs() < 1e-9,
            "{name}: rate_429 {rate_429}: {o:#}"
        );
    }
    anyhow::ensure!(refused > 0, "no 429 counted: {s:#}");
    // Our own probes asked for namespaces: the pod LISTs and node GETs are loadgen's alone.
    let (list, get) = (op(&s, "list")?, op(&s, "get")?);
    let all = answered(&before, &after, None);
    let rejected = answered(&before, &after, Some("429"));
    anyhow::ensure!(
        all == (num(list, "requests"), num(get, "requests"))
            && rejected == (code(list, "429"), code(get, "429")),
        "the simulator answered (LISTs, GETs) {all:?}, with 429 {rejected:?}; loadgen: {s:#}"
    );
    check_output_files(out.path(), &s)?;

    // 2. With --honor-retry-after: first-try 429s are retried after Retry-After (1 s).
    let out = TempDir::new()?;
    let before = RequestCounts::scrape(&k)?;
    let args = load(
        &["--honor-retry-after", "--max-retries", "5"],
        "user-token",
        out.path(),
    )?;
    loadgen(&strs(&args), Duration::from_secs(5))?;
    let after = RequestCounts::scrape(&k)?;
    let s = read_summary(out.path())?;
    let mut totals = (0, 0, 0, 0, 0);
    let mut slowest: f64 = 0.0;
    for name in ["list", "get"] {
        let o = op(&s, name)?;
        let r = &o["retries"];
        let (requests, first, retries, last) = (
            num(o, "requests"),
            num(r, "first_try_429"),
            num(r, "retries"),
            num(r, "final_429"),
        );
        anyhow::ensure!(
            (requests as f64 - 200.0).abs() <= 200.0 * RATE_TOLERANCE
                && retries >= first
                && last == code(o, "429")
                && num(o, "ok") + last == requests,
            "{name}: retry accounting: {o:#}"
        );
        totals = (
            totals.0 + requests,
            totals.1 + first,
            totals.2 + retries,
            totals.3 + last,
            totals.4 + num(o, "ok"),
        );
        slowest = slowest.max(o["latency_ms"]["max"].as_f64().unwrap_or(0.0));
    }
    let (requests, first, retries, last, _) = totals;
    anyhow::ensure!(first > 0, "no first-try 429 with retries: {s:#}");
    anyhow::ensure!(
        slowest >= 1000.0,
        "a retried request waited the 1 s Retry-After, but the slowest took {slowest} ms: {s:#}"
    );
    // Every attempt reached the simulator: one per request plus one per retry; each retry
    // followed a 429, and so did each request still refused at the end.
    let all = answered(&before, &after, None);
    let rejected = answered(&before, &after, Some("429"));
    anyhow::ensure!(
        all.0 + all.1 == requests + retries && rejected.0 + rejected.1 == retries + last,
        "the simulator answered {all:?} (LISTs, GETs), {rejected:?} with 429; loadgen: \
         {requests} requests, {retries} retries, {last} final 429s"
    );

    // 3. The same load as system:masters is never refused.
    let out = TempDir::new()?;
    loadgen(
        &strs(&load(&[], "admin-token", out.path())?),
        Duration::from_secs(5),
    )?;
    let s = read_summary(out.path())?;
    check_clean_op(&s, "list", 40.0, 5.0, "200")?;
    check_clean_op(&s, "get", 40.0, 5.0, "200")?;
    still_running(sim)
}

/// `kubectl auth whoami`: user name, UID and groups.
fn whoami(k: &Kubectl) -> anyhow::Result<(String, String, Vec<String>)> {
    let v = k.json(&["auth", "whoami", "-o", "json"])?;
    let info = &v["status"]["userInfo"];
    Ok((
        info["username"].as_str().unwrap_or("").to_string(),
        info["uid"].as_str().unwrap_or("").to_string(),
        info["groups"]
            .as_array()
            .map(|g| {
                g.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
    ))
}

/// Ctrl-C (SIGINT to loadgen's pid) stops a long run early and still writes the results.
#[test]
fn ctrl_c_still_writes_the_results() -> anyhow::Result<()> {
    let sim = SimProcess::start(&["--nodes", "3", "--pods", "30", "--namespaces", "1"])?;
    let k = sim.kubectl();
    let out = TempDir::new()?;
    let output = out.path().display().to_string();
    let args = target_args(
        &sim,
        &[
            "--duration",
            "10m",
            "--lists",
            "20/s",
            "-A",
            "--watches",
            "2",
            "--no-progress",
            "--output",
            &output,
        ],
    )?;
    let started = Instant::now();
    let run = Loadgen::spawn(&strs(&args))?;
    // Wait until the load is flowing: the simulator has served 20 of its LISTs.
    let before = RequestCounts::scrape(&k)?;
    eventually(
        Duration::from_secs(60),
        "20 LISTs served to loadgen",
        || {
            let now = RequestCounts::scrape(&k)?;
            Ok((served(
                &before,
                &now,
                &[("verb", "LIST"), ("resource", "pods"), ("scope", "cluster")],
            ) >= 20)
                .then_some(()))
        },
    )?;
    let pid = run.pid().to_string();
    let kill = Command::new("kill").args(["-INT", &pid]).status()?;
    anyhow::ensure!(kill.success(), "kill -INT {pid}: {kill}");
    let finished = run.wait(Duration::from_secs(60))?.ok()?;
    anyhow::ensure!(
        started.elapsed() < Duration::from_secs(120),
        "loadgen ran {:?} of its 10 minutes",
        started.elapsed()
    );
    anyhow::ensure!(
        finished.stderr.contains("interrupted"),
        "stderr: {}",
        finished.stderr
    );
    let s = read_summary(out.path())?;
    anyhow::ensure!(s["interrupted"] == true, "summary: {s:#}");
    let duration = s["duration_s"].as_f64().unwrap_or(f64::MAX);
    anyhow::ensure!(duration < 100.0, "duration_s {duration}");
    let l = op(&s, "list")?;
    let requests = num(l, "requests");
    anyhow::ensure!(
        requests >= 20 && num(l, "errors") == 0,
        "list after Ctrl-C: {l:#}"
    );
    // The requests made match the run's real length at 20/s (in-flight ones cancelled).
    let intended = 20.0 * duration;
    anyhow::ensure!(
        (requests + num(l, "cancelled")) as f64 >= intended - 2.0
            && (requests as f64) <= intended + 2.0,
        "{requests} LISTs in {duration} s at 20/s: {l:#}"
    );
    anyhow::ensure!(num(&s["watches"], "watchers") == 2, "{s:#}");
    check_output_files(out.path(), &s)?;
    still_running(sim)
}
