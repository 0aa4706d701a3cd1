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
//! - Ctrl-C (SIGINT) and SIGTERM still write the results (drained, marked interrupted) and
//!   exit 128 + the signal;
//! - in a pod (`KUBERNETES_SERVICE_HOST`, the service-account files): the token file is
//!   re-read as it rotates; exit codes of usage and bad-input errors;
//! - `loadgen nodes`: heartbeats, leases, daemons, `--bind`, relists after 410, presets.
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
use tests::{eventually, fresh_workspace_binary, whoami, Kubectl, SimProcess};

/// How long a loadgen command may take beyond its `--duration` before it is killed.
mod incluster;
mod interrupt;
mod nodes;
mod operations;
mod rejections;
mod seeding;

const LOADGEN_GRACE: Duration = Duration::from_secs(90);

/// Allowed difference between the requests made and rate × duration.
const RATE_TOLERANCE: f64 = 0.01;

// ---------------------------------------------------------------------------------------------
// loadgen as a child process

/// The `loadgen` binary, built from the current sources.
fn loadgen_binary() -> PathBuf {
    fresh_workspace_binary("loadgen", &["loadgen", "kubeio", "apimodel"])
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
        Loadgen::spawn_env(args, &[])
    }

    /// Like [`Loadgen::spawn`], with `env` set for the child.
    fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Loadgen> {
        let dir = tempfile::Builder::new()
            .prefix("tollgate-e2e-loadgen-")
            .tempdir()?;
        let shown = format!("loadgen {}", args.join(" "));
        let child = Command::new(loadgen_binary())
            .args(args)
            .env_remove("KUBECONFIG")
            // Only the in-cluster tests run loadgen as if in a pod, even when the tests do.
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
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
