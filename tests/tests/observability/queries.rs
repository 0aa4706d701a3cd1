//! Every PromQL expression of the dashboards and rules, evaluated by a real Prometheus that
//! scrapes tollgate and loadgen under load.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;
use tests::{eventually, http_get};

use crate::{repo_root, LoadRun, Spawned, START_TIMEOUT};

/// Expressions that are empty while all is well, each with the reason. Matched against the
/// expression as written in the dashboard (variables substituted) or as Prometheus reports the
/// rule (`/api/v1/rules`). They must still parse and evaluate; every other expression must
/// return at least one series. An entry that matches no expression fails the test.
const EXPECTED_EMPTY: &[(&str, &str)] = &[
    ("TollgateDown", "fires only when a scrape of tollgate fails (up == 0)"),
    (
        "TollgateNoHealthyUpstream",
        "fires only when every upstream fails its health checks",
    ),
    (
        "TollgateUpstreamDown",
        "fires only while an upstream is out of rotation; both are healthy once the late one came up",
    ),
    (
        "TollgateSystemLaneRejecting",
        "the test's clients are unauthenticated, so nothing runs in the system lane; fires only on a system-lane rejection",
    ),
    (
        "TollgateQuotaExhausted",
        "fires only while the pool is below 5% of its capacity: in this run it may or may not be at the moment of the query",
    ),
    (
        "TollgateHeavyQueueBacklog",
        "fires only with more than 256 queued heavy requests; this run queues a few",
    ),
    (
        "TollgateHighRejectRate",
        "fires only when more than half a lane is rejected: in this run it may or may not be",
    ),
    (
        "TollgatePredictionErrorHigh",
        "fires only when predictions are off by 2x with more than 1 MiB/s of traffic",
    ),
    (
        "TollgateConfigReloadFailed",
        "the run's one refused reload happens before Prometheus starts, so its first sample is already 1 and increase() sees none; in production the counter is exported at 0 from tollgate's start, so the first refusal fires it",
    ),
    (
        "TollgateCertificateReloadFailed",
        "fires only when a listener's certificate files change and do not load; this run serves plain HTTP",
    ),
    (
        "TollgateInternalErrors",
        "fires only on tollgate's own internal errors, which a healthy run has none of",
    ),
    (
        "TollgateUpstreamErrors",
        "fires only when upstream errors exceed 5% of requests; the simulators answer everything",
    ),
];

/// Grafana's variables as the test substitutes them: all clusters (the test's series have no
/// `cluster` label, which `.*` matches), all instances, and a rate window that holds several of
/// the test's 1 s scrapes.
fn substitute(expr: &str) -> String {
    expr.replace("$__rate_interval", "20s")
        .replace("$cluster", ".*")
        .replace("$instance", ".*")
}

/// (where, expression) for every target of every panel of every dashboard JSON file.
fn dashboard_queries(dir: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    anyhow::ensure!(
        files.len() >= 2,
        "want the tollgate and loadgen dashboards in {}",
        dir.display()
    );
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        let dash: Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", file.display()))?;
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let vars = dash["templating"]["list"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        anyhow::ensure!(
            vars.iter()
                .any(|v| v["name"] == "datasource" && v["type"] == "datasource"),
            "{name}: no `datasource` variable"
        );
        anyhow::ensure!(
            vars.iter().any(|v| v["name"] == "cluster"
                && v["includeAll"] == true
                && v["allValue"] == ".*"),
            "{name}: no `cluster` variable with All = .*"
        );
        let mut panels = dash["panels"].as_array().cloned().unwrap_or_default();
        // Panels inside collapsed rows.
        for row in dash["panels"].as_array().into_iter().flatten() {
            panels.extend(row["panels"].as_array().cloned().unwrap_or_default());
        }
        for panel in panels {
            let title = panel["title"].as_str().unwrap_or("?").to_string();
            for target in panel["targets"].as_array().into_iter().flatten() {
                anyhow::ensure!(
                    target["datasource"]["uid"] == "${datasource}",
                    "{name} / {title}: target not on the `datasource` variable"
                );
                let expr = target["expr"]
                    .as_str()
                    .with_context(|| format!("{name} / {title}: a target without expr"))?;
                anyhow::ensure!(
                    expr.contains("cluster=~\"$cluster\""),
                    "{name} / {title}: not filtered by the cluster variable: {expr}"
                );
                let expr = substitute(expr);
                anyhow::ensure!(
                    !expr.contains('$'),
                    "{name} / {title}: unknown variable in {expr}"
                );
                let ref_id = target["refId"].as_str().unwrap_or("?");
                out.push((format!("{name} / {title} [{ref_id}]"), expr));
            }
        }
    }
    Ok(out)
}

/// Percent-encoding for a query parameter.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// GET a Prometheus API path; the `data` of a `success` answer.
fn api(addr: &str, path: &str) -> anyhow::Result<Value> {
    let (code, body) = http_get(addr, path, Duration::from_secs(10))?;
    let v: Value =
        serde_json::from_str(&body).with_context(|| format!("GET {path}: HTTP {code}: {body}"))?;
    anyhow::ensure!(v["status"] == "success", "GET {path}: HTTP {code}: {body}");
    Ok(v["data"].clone())
}

/// How many series (or samples) an instant query returns; an error if it does not parse or
/// evaluate.
fn series(addr: &str, expr: &str) -> anyhow::Result<usize> {
    let data = api(addr, &format!("/api/v1/query?query={}", encode(expr)))?;
    Ok(match &data["result"] {
        Value::Array(a) => a.len(),
        Value::Null => 0,
        _ => 1, // scalar or string
    })
}

#[test]
fn every_dashboard_and_rule_expression_returns_series_from_a_real_prometheus() -> anyhow::Result<()>
{
    let started = Instant::now();
    let root = repo_root();
    let rules = root.join("dashboards/rules.yaml");
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .context("running promtool (Debian package `prometheus`: bash scripts/deps.sh --tests)")?;
    anyhow::ensure!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let run = LoadRun::start()?;
    let dir = run.dir.path().join("prometheus");
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             rule_files: [{rules:?}]\n\
             scrape_configs:\n\
             - job_name: tollgate\n  static_configs: [{{targets: [{tollgate:?}]}}]\n\
             - job_name: loadgen\n  static_configs: [{{targets: [{loadgen:?}]}}]\n",
            rules = rules.display().to_string(),
            tollgate = run.tollgate.admin_addr,
            loadgen = run.loadgen_metrics,
        ),
    )?;
    let mut cmd = Command::new("prometheus");
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .args(["--web.listen-address=127.0.0.1:0", "--log.level=warn"]);
    let mut prometheus = Spawned::start("prometheus", &mut cmd, dir.join("prometheus.log"))?;
    let addr = format!("127.0.0.1:{}", prometheus.listening_port()?);
    let context = |e: anyhow::Error| {
        e.context(format!(
            "prometheus log:\n{}\n{}",
            prometheus.log_text(),
            run.logs()
        ))
    };

    // Both targets up, the rules loaded and healthy, and a few scrapes in so rates have points.
    eventually(
        START_TIMEOUT,
        "prometheus scraping tollgate and loadgen",
        || {
            let targets = api(&addr, "/api/v1/targets")?;
            let active = targets["activeTargets"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let up = active.iter().filter(|t| t["health"] == "up").count();
            Ok((active.len() == 2 && up == 2).then_some(()))
        },
    )
    .map_err(context)?;
    eventually(START_TIMEOUT, "five scrapes of each target", || {
        Ok((series(&addr, "count_over_time(up[1m]) >= 5")? == 2).then_some(()))
    })
    .map_err(context)?;

    // The rules as Prometheus loaded them: every one healthy (evaluated without error).
    let mut queries = dashboard_queries(&root.join("dashboards"))?;
    let groups = api(&addr, "/api/v1/rules")?;
    for group in groups["groups"].as_array().into_iter().flatten() {
        for rule in group["rules"].as_array().into_iter().flatten() {
            let name = rule["name"].as_str().unwrap_or("?");
            anyhow::ensure!(
                rule["health"] != "err",
                "rule {name}: {}",
                rule["lastError"]
            );
            let query = rule["query"].as_str().context("a rule without a query")?;
            queries.push((format!("rules.yaml / {name}"), query.to_string()));
        }
    }
    anyhow::ensure!(
        queries.len() > 60,
        "only {} expressions found",
        queries.len()
    );
    for (name, reason) in EXPECTED_EMPTY {
        anyhow::ensure!(!reason.is_empty(), "expected-empty {name}: no reason given");
        anyhow::ensure!(
            queries.iter().any(|(w, e)| w.ends_with(name) || e == name),
            "expected-empty entry {name:?} matches no expression"
        );
    }
    let expected_empty = |w: &str, e: &str| {
        EXPECTED_EMPTY
            .iter()
            .any(|(n, _)| w.ends_with(n) || e == *n)
    };

    // Everything parses and evaluates; everything else returns series. Recording rules and
    // rates need an evaluation or two after the first scrapes, so empty ones are asked again
    // until the deadline.
    let deadline = Instant::now() + START_TIMEOUT;
    let mut results: BTreeMap<String, (String, usize)> = BTreeMap::new();
    loop {
        for (w, e) in &queries {
            if results.get(w.as_str()).is_some_and(|(_, n)| *n > 0) {
                continue;
            }
            let n = series(&addr, e)
                .with_context(|| format!("{w}: {e}"))
                .map_err(context)?;
            results.insert(w.clone(), (e.clone(), n));
        }
        let missing: Vec<String> = results
            .iter()
            .filter(|(w, (e, n))| *n == 0 && !expected_empty(w, e))
            .map(|(w, (e, _))| format!("{w}: {e}"))
            .collect();
        if missing.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            return Err(context(anyhow::anyhow!(
                "{} expressions returned no series:\n{}",
                missing.len(),
                missing.join("\n")
            )));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let empty: Vec<&String> = results
        .iter()
        .filter(|(_, (_, n))| *n == 0)
        .map(|(w, _)| w)
        .collect();
    eprintln!(
        "{} expressions evaluated in {:?}; empty (all expected): {empty:?}",
        results.len(),
        started.elapsed()
    );
    drop(prometheus);
    Ok(())
}
