//! No client stranded in the middle of a list (issue 37): real kubectl's paginated `get pods
//! -A --chunk-size 500` through tollgate in enforce, while loadgen storms it with consistent
//! LISTs of every pod, against the simulated apiserver. kubectl's first page waits its turn
//! (its client, certificate user `carol`, is a flow of its own beside the anonymous storm);
//! every `continue` page after it is admitted at once (`reason="continuation"`), priced at its
//! 500 pods rather than at all 3000, and none gets a 429. kubectl used to get the first page,
//! then `429 Retry-After: 53` on the second, and hang.
//!
//! Sizing: 3,000 pods of ~4 KB, so a LIST of all of them is ~12 MB and costs ~36 MB (a
//! consistent read from etcd: bytes sent plus twice the bytes read); the static pool refills
//! 4 MB/s up to 16 MB, so it admits one storm LIST every ~9 s (each into debt) and the storm's
//! queue stays full. A page of 500 pods costs ~6 MB.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;
use tests::{
    eventually, fresh_workspace_binary, CertAuthority, KubeUser, SimProcess, TollgateOptions,
    TollgateProcess,
};

const PODS: usize = 3000;
const CHUNK: &str = "500";
const FRONT_PROXY_CN: &str = "tollgate-e2e-front-proxy";
/// Every page of kubectl's list arrives within this, storm or not (the first page may wait
/// for the pool: about two storm LISTs' refill, ~20 s at most).
const LIST_WITHIN: Duration = Duration::from_secs(45);

const CONFIG: &str = "mode: enforce
upstream:
  # The simulator's --requestheader-* defaults (enforce with a front-proxy certificate wants them).
  requestHeaders:
    usernameHeaders: [X-Remote-User]
    groupHeaders: [X-Remote-Group]
    extraHeadersPrefixes: [X-Remote-Extra-]
quota:
  mode: static
  bytesPerSecond: 4000000
  burstBytes: 16000000
  maxWaitSeconds: 15
  retryAfter: {maxSeconds: 10}
";

/// A loadgen child, killed on drop.
struct Loadgen(Child);

impl Drop for Loadgen {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sum of the samples of `name` whose labels include every pair of `labels`.
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

#[test]
fn paged_kubectl_gets_every_page_through_a_list_storm() -> anyhow::Result<()> {
    let inputs = tempfile::Builder::new()
        .prefix("tollgate-e2e-paged-")
        .tempdir()?;
    let dir = inputs.path();
    let client_ca = CertAuthority::generate("paged-client-ca")?;
    let client_ca_file = dir.join("client-ca.crt");
    std::fs::write(&client_ca_file, client_ca.cert_pem())?;
    let front_proxy_ca = CertAuthority::generate("paged-front-proxy-ca")?;
    let front_proxy_ca_file = dir.join("front-proxy-ca.crt");
    std::fs::write(&front_proxy_ca_file, front_proxy_ca.cert_pem())?;
    let front_proxy = front_proxy_ca.issue_client(FRONT_PROXY_CN, &[])?;
    let carol = client_ca.issue_client("carol", &["team-a"])?;

    let pods = PODS.to_string();
    let (client_ca_arg, front_proxy_ca_arg) = (
        client_ca_file.display().to_string(),
        front_proxy_ca_file.display().to_string(),
    );
    let mut sim = SimProcess::start(&[
        "--tls",
        "--nodes",
        "30",
        "--pods",
        &pods,
        "--pod-bytes",
        "4000",
        "--client-ca-file",
        &client_ca_arg,
        "--requestheader-client-ca-file",
        &front_proxy_ca_arg,
        "--requestheader-allowed-names",
        FRONT_PROXY_CN,
    ])?;
    let config = dir.join("tollgate.yaml");
    std::fs::write(&config, CONFIG)?;
    let mut options = TollgateOptions::in_front_of(&sim);
    options.front_proxy = Some(front_proxy);
    options.tls = true;
    options.client_ca_pem = Some(client_ca.cert_pem().to_string());
    options.args = vec!["--config".into(), config.display().to_string()];
    let mut tollgate = TollgateProcess::start(&options)?;
    let serving_ca = tollgate.serving_ca_file()?.context("tollgate serves TLS")?;

    // The storm: anonymous consistent LISTs of every pod, 2 a second, through tollgate.
    let storm_log = std::fs::File::create(dir.join("storm.stderr"))?;
    let _storm = Loadgen(
        Command::new(fresh_workspace_binary(
            "loadgen",
            &["loadgen", "kubeio", "apimodel"],
        ))
        .args([
            "--server",
            &tollgate.url,
            "--certificate-authority",
            &serving_ca.display().to_string(),
            "--lists",
            "2/s",
            "-A",
            "--list-rv",
            "consistent",
            "--duration",
            "300s",
            "--timeout",
            "60s",
            "--no-progress",
        ])
        .env_remove("KUBECONFIG")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(storm_log)
        .spawn()
        .context("starting the loadgen storm")?,
    );
    // Under way: a storm LIST served (the pods' size is learned) and others refused.
    eventually(
        Duration::from_secs(60),
        "the storm fills the heavy lane",
        || {
            let m = tollgate.admin_ok("/metrics")?;
            let heavy = |d: &str| {
                metric(
                    &m,
                    "tollgate_decisions_total",
                    &[("lane", "heavy"), ("mode", "enforce"), ("decision", d)],
                )
            };
            let patterns: Vec<Value> =
                serde_json::from_str(&tollgate.admin_ok("/debug/patterns")?)?;
            let learned = patterns.iter().any(|p| {
                p["resource"] == "pods"
                    && p["consistency"] == "consistent"
                    && p["bytesAvg"].as_f64() > Some(1e6)
            });
            Ok((learned && heavy("reject") >= 3.0).then_some(()))
        },
    )?;

    let kubectl = tollgate.kubectl_as(
        "carol",
        &KubeUser::ClientCert {
            cert_pem: carol.cert_pem.clone(),
            key_pem: carol.key_pem.clone(),
        },
    )?;
    let started = Instant::now();
    let out = kubectl.run(&["get", "pods", "-A", "-o", "name", "--chunk-size", CHUNK])?;
    let took = started.elapsed();
    let m = tollgate.admin_ok("/metrics")?;
    let patterns: Vec<Value> = serde_json::from_str(&tollgate.admin_ok("/debug/patterns")?)?;
    let continued: Vec<&Value> = patterns
        .iter()
        .filter(|p| {
            p["verb"] == "list"
                && p["resource"] == "pods"
                && p["consistency"] == "exact"
                && p["pattern"].as_str().is_some_and(|s| s.contains(" user "))
        })
        .collect();
    let shown = format!(
        "kubectl took {took:?}; stderr: {}\ncontinue pages: {continued:#?}\ncontinuation decisions: {}",
        out.stderr.trim(),
        metric(&m, "tollgate_decisions_total", &[("reason", "continuation")])
    );
    anyhow::ensure!(out.success(), "kubectl failed: {shown}");
    let names = out.stdout.lines().filter(|l| l.starts_with("pod/")).count();
    anyhow::ensure!(names == PODS, "{names} of {PODS} pods: {shown}");
    anyhow::ensure!(took < LIST_WITHIN, "every page, but slowly: {shown}");
    // Its continue pages: each admitted at once, none refused, each priced as a page.
    let pages = PODS / 500 - 1;
    let count: u64 = continued.iter().filter_map(|p| p["count"].as_u64()).sum();
    let rejected: u64 = continued
        .iter()
        .filter_map(|p| p["rejected"].as_u64())
        .sum();
    anyhow::ensure!(
        count == pages as u64,
        "{count} continue pages seen: {shown}"
    );
    anyhow::ensure!(rejected == 0, "continue pages refused: {shown}");
    let at_once = metric(
        &m,
        "tollgate_decisions_total",
        &[
            ("lane", "heavy"),
            ("decision", "admit"),
            ("reason", "continuation"),
        ],
    );
    anyhow::ensure!(at_once >= pages as f64, "{shown}");
    // The storm was refused meanwhile: the pages did not go through an idle proxy.
    let refused = metric(
        &m,
        "tollgate_decisions_total",
        &[("lane", "heavy"), ("decision", "reject")],
    );
    anyhow::ensure!(refused >= 3.0, "the storm was not refused: {shown}");
    anyhow::ensure!(
        tollgate.is_running() && sim.is_running(),
        "{}",
        tollgate.log()
    );
    eprintln!(
        "kubectl listed {names} pods in {took:?}: {count} continue pages admitted at once, \
         {refused} storm LISTs refused"
    );
    Ok(())
}
