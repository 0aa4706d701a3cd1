//! Operating tollgate (issue 11), end to end on loopback:
//!
//! - [`queries`]: a real Prometheus (Debian's `prometheus`) scrapes tollgate and loadgen while
//!   load runs and loads `dashboards/rules.yaml`; every PromQL expression of every dashboard
//!   panel and every rule is evaluated through its query API and must return a series, except
//!   the written list of expected-empty ones; `promtool check rules` passes.
//! - [`tables`]: the metrics tables of `proxy/README.md` and `loadgen/README.md` name exactly
//!   the metrics a live scrape exports.
//! - [`objects`]: the `PrometheusRule` and `ServiceMonitor` in `dashboards/` are what
//!   `rules.yaml` generates; every alert has a description and a runbook section.
//! - [`manifests`]: `deploy/` against the real kube-apiserver: `kubectl apply --dry-run=server`,
//!   the `kubernetes` endpoint the apiserver publishes, tollgate on the apiserver's port beside
//!   it, and the manifests' flags and config through `tollgate check-config`.
//!
//! [`LoadRun`] is the running system the first two share the shape of: the simulator, tollgate
//! enforcing a small quota in front of it (so requests are admitted, queued and rejected), and
//! loadgen with `--metrics-listen`.

mod manifests;
mod objects;
mod queries;
mod tables;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use tempfile::TempDir;
use tests::{
    eventually, fresh_workspace_binary, http_get, SimProcess, TollgateOptions, TollgateProcess,
};

/// The repository root (tests/ is one level below it).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// How long a server may take to open its listener or a scrape to show up.
const START_TIMEOUT: Duration = Duration::from_secs(30);

// === impl Spawned ===

/// A child process of ours with its stderr in a file, killed (by its own handle) and reaped on drop.
struct Spawned {
    what: String,
    child: Child,
    log: PathBuf,
}

impl Spawned {
    fn start(what: &str, cmd: &mut Command, log: PathBuf) -> anyhow::Result<Spawned> {
        let child = cmd
            .stdout(Stdio::null())
            .stderr(File::create(&log).with_context(|| format!("creating {}", log.display()))?)
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        Ok(Spawned {
            what: what.to_string(),
            child,
            log,
        })
    }

    /// The port of the one TCP socket the process listens on (found in /proc: the processes
    /// are started on port 0 and do not all print what they bound).
    fn listening_port(&mut self) -> anyhow::Result<u16> {
        let pid = self.child.id();
        eventually(START_TIMEOUT, &format!("{} listening", self.what), || {
            if let Ok(Some(status)) = self.child.try_wait() {
                anyhow::bail!("{} exited ({status}): {}", self.what, self.log_text());
            }
            Ok(listening_ports(pid)?.first().copied())
        })
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// TCP ports in LISTEN state on sockets that process `pid` holds.
fn listening_ports(pid: u32) -> anyhow::Result<Vec<u16>> {
    let mut inodes = std::collections::HashSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let Ok(target) = std::fs::read_link(fd?.path()) else {
            continue;
        };
        if let Some(inode) = target
            .to_string_lossy()
            .strip_prefix("socket:[")
            .and_then(|s| s.strip_suffix(']'))
        {
            inodes.insert(inode.to_string());
        }
    }
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is f[1] (ADDR:PORT in hex), st is f[3] (0A = LISTEN), inode f[9].
            if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                if let Some(port) = f[1].rsplit(':').next() {
                    ports.push(u16::from_str_radix(port, 16)?);
                }
            }
        }
    }
    Ok(ports)
}

// === impl LoadRun ===

/// tollgate's configuration under load: enforce with a pool far smaller than the LIST load so
/// requests are admitted, queued and rejected; scraping the upstream every second (object
/// counts, node count for the pool's scaling); a relist guard that stays active long enough to
/// be seen.
const TOLLGATE_CONFIG: &str = "\
mode: enforce
upstream:
  healthCheck: {intervalSeconds: 1, timeoutSeconds: 1}
  metricsScrape: {intervalSeconds: 1}
lanes:
  heavyThresholdBytes: 65536
quota:
  bytesPerSecond: 2000000
  burstBytes: 4000000
  maxWaitSeconds: 2
  perClient: {requestsPerSecond: 100, burst: 100}
  scaling: {mode: nodeProportional, bytesPerSecondPerUnit: 1000, burstBytesPerUnit: 0}
relistGuard: {warmupSeconds: 600, startFraction: 0.5}
";

/// The simulator, tollgate in front of it, loadgen running against tollgate.
struct LoadRun {
    // Dropped in this order: loadgen first, then the servers.
    loadgen: Spawned,
    /// `127.0.0.1:PORT` of loadgen's `/metrics`.
    loadgen_metrics: String,
    late_sim: Spawned,
    tollgate: TollgateProcess,
    _sim: SimProcess,
    config: PathBuf,
    dir: TempDir,
}

impl LoadRun {
    /// Starts everything and waits until tollgate has counted decisions and loadgen serves
    /// its metrics. Also makes the metrics that only appear on events appear: a relist-guard
    /// trigger (a second upstream that comes up after tollgate started), a refused and an
    /// accepted configuration reload, and a request tollgate answers 400 (a downstream error).
    fn start() -> anyhow::Result<LoadRun> {
        let dir = tempfile::Builder::new()
            .prefix("tollgate-e2e-observability-")
            .tempdir()?;
        let sim_args = ["--nodes", "20", "--pods", "400", "--namespaces", "2"];
        let sim = SimProcess::start(&sim_args)?;
        // A second upstream on a port that is free now and taken only once tollgate has seen
        // it fail: its recovery triggers the relist guard (cause `recovered`).
        let late_port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let config = dir.path().join("tollgate.yaml");
        std::fs::write(&config, TOLLGATE_CONFIG)?;
        let mut options = TollgateOptions::in_front_of(&sim);
        options.args = vec![
            "--config".into(),
            config.display().to_string(),
            "--upstream".into(),
            format!("http://127.0.0.1:{late_port}"),
        ];
        let tollgate = TollgateProcess::start(&options)?;
        let metrics = |name: &str| -> anyhow::Result<Option<String>> {
            let (code, body) = http_get(&tollgate.admin_addr, "/metrics", Duration::from_secs(5))?;
            anyhow::ensure!(code == 200, "tollgate /metrics: HTTP {code}");
            Ok(body.lines().any(|l| l.starts_with(name)).then_some(body))
        };
        let late_unhealthy =
            format!("tollgate_upstream_healthy{{upstream=\"http://127.0.0.1:{late_port}\"}} 0");
        eventually(START_TIMEOUT, "the late upstream marked unhealthy", || {
            metrics(&late_unhealthy)
        })?;
        let bench = fresh_workspace_binary(
            "tollgate-bench",
            &["bench", "loadgen", "kubeio", "apimodel"],
        );
        let mut late = Command::new(bench);
        late.args(["sim", "--exit-with-stdin", "--listen"])
            .arg(format!("127.0.0.1:{late_port}"))
            .args(sim_args)
            .stdin(Stdio::piped());
        let late_sim = Spawned::start(
            "the late simulator",
            &mut late,
            dir.path().join("late-sim.log"),
        )?;
        eventually(START_TIMEOUT, "the relist guard triggered", || {
            metrics("tollgate_relist_guard_triggers_total{cause=\"recovered\"}")
        })?;

        // A refused reload (unknown field), then an accepted one.
        std::fs::write(&config, format!("{TOLLGATE_CONFIG}bogusField: 1\n"))?;
        eventually(START_TIMEOUT, "a refused reload counted", || {
            metrics("tollgate_config_reloads_total{result=\"error\"}")
        })?;
        std::fs::write(&config, TOLLGATE_CONFIG)?;
        eventually(START_TIMEOUT, "an accepted reload counted", || {
            metrics("tollgate_config_reloads_total{result=\"ok\"}")
        })?;
        // An unreadable query: tollgate's own 400 (errors_total{source="downstream"}).
        let client_addr = tollgate
            .url
            .strip_prefix("http://")
            .context("tollgate serves plain HTTP here")?
            .to_string();
        let (code, _) = http_get(
            &client_addr,
            "/api/v1/pods?limit=abc",
            Duration::from_secs(5),
        )?;
        anyhow::ensure!(
            code == 400,
            "limit=abc through tollgate: HTTP {code}, want 400"
        );

        let loadgen_bin = fresh_workspace_binary("loadgen", &["loadgen", "kubeio", "apimodel"]);
        let mut cmd = Command::new(loadgen_bin);
        cmd.args([
            "--server",
            &tollgate.url,
            "--no-progress",
            "--duration",
            "300s",
        ])
        .args(["--metrics-listen", "127.0.0.1:0", "--timeout", "10s"])
        // Cluster-wide pod LISTs (~800 KB each: heavy) far beyond the 2 MB/s pool; a
        // few per-namespace ones; watches; node GETs that are light.
        .args(["--lists", "8/s", "-A", "--list-rv", "cache"])
        .args(["--watches", "4", "--watch-resource", "pods"])
        .arg("--output")
        .arg(dir.path().join("loadgen-out"))
        .stdin(Stdio::null());
        let mut loadgen = Spawned::start("loadgen", &mut cmd, dir.path().join("loadgen.log"))?;
        let port = loadgen.listening_port()?;
        let loadgen_metrics = format!("127.0.0.1:{port}");
        eventually(
            START_TIMEOUT,
            "tollgate queued and rejected requests",
            || {
                let Some(body) = metrics("tollgate_queue_wait_seconds_count")? else {
                    return Ok(None);
                };
                Ok(body
                    .lines()
                    .any(|l| {
                        l.starts_with("tollgate_decisions_total")
                            && l.contains("decision=\"reject\"")
                    })
                    .then_some(()))
            },
        )?;
        Ok(LoadRun {
            loadgen,
            loadgen_metrics,
            late_sim,
            tollgate,
            _sim: sim,
            config,
            dir,
        })
    }

    /// The text of tollgate's and loadgen's `/metrics`.
    fn scrape(&self) -> anyhow::Result<(String, String)> {
        let get = |addr: &str| -> anyhow::Result<String> {
            let (code, body) = http_get(addr, "/metrics", Duration::from_secs(5))?;
            anyhow::ensure!(code == 200, "GET http://{addr}/metrics: HTTP {code}");
            Ok(body)
        };
        Ok((get(&self.tollgate.admin_addr)?, get(&self.loadgen_metrics)?))
    }

    /// What the processes logged, for failure messages.
    fn logs(&self) -> String {
        format!(
            "tollgate:\n{}\nloadgen:\n{}\nlate simulator:\n{}\n(config {}, dir {})",
            tail(&self.tollgate.log()),
            tail(&self.loadgen.log_text()),
            tail(&self.late_sim.log_text()),
            self.config.display(),
            self.dir.path().display()
        )
    }
}

/// The last lines of a log.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
