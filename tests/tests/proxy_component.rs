//! tollgate run as a control-plane component (issue 18), the real binary:
//! - a fresh tollgate's `/metrics` has the known label sets at zero, its own cost
//!   (`process_*`) and `tollgate_build_info` with the revision `--version` prints;
//! - `--log-format json` writes one JSON object per line, `-v`/`--log-level` sets the level,
//!   and `RUST_LOG` wins over it;
//! - a configuration file's `apiVersion` and `kind` are optional, and refused when wrong.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::Context;
use serde_json::Value;
use tests::{
    eventually, fresh_workspace_binary, LineReader, SimProcess, TollgateOptions, TollgateProcess,
    TOLLGATE_START_TIMEOUT,
};

fn tollgate() -> Command {
    Command::new(fresh_workspace_binary(
        "tollgate",
        &["proxy", "kubeio", "apimodel"],
    ))
}

/// Our own child, killed by its handle and reaped when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The value of the sample `series` (name and labels as exported) in `/metrics` text.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn a_fresh_tollgate_exports_known_label_sets_at_zero_its_cost_and_its_build() -> anyhow::Result<()>
{
    let sim = SimProcess::start(&[])?;
    let tg = TollgateProcess::start(&TollgateOptions::in_front_of(&sim))?;
    let text = tg.admin_ok("/metrics")?;
    for series in [
        r#"tollgate_config_reloads_total{result="ok"}"#,
        r#"tollgate_config_reloads_total{result="error"}"#,
        r#"tollgate_errors_total{source="downstream"}"#,
        r#"tollgate_errors_total{source="upstream"}"#,
        r#"tollgate_errors_total{source="internal"}"#,
        r#"tollgate_queue_wait_seconds_count{lane="heavy"}"#,
        r#"tollgate_queue_wait_seconds_count{lane="workload"}"#,
        r#"tollgate_queue_wait_seconds_bucket{le="+Inf",lane="system"}"#,
        r#"tollgate_relist_guard_triggers_total{cause="recovered"}"#,
        r#"tollgate_relist_guard_triggers_total{cause="restarted"}"#,
        r#"tollgate_certificate_reloads_total{listener="client",result="error"}"#,
        r#"tollgate_quota_reconciled_bytes_total{direction="debt"}"#,
    ] {
        anyhow::ensure!(
            sample(&text, series) == Some(0.0),
            "{series} is not exported at 0:\n{text}"
        );
    }

    // Its own cost, as client_golang names it.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs_f64();
    let value = |name: &str| sample(&text, name).with_context(|| format!("no {name}:\n{text}"));
    anyhow::ensure!(value("process_cpu_seconds_total")? >= 0.0);
    anyhow::ensure!(
        value("process_resident_memory_bytes")? > 1e6,
        "RSS under 1 MB?"
    );
    anyhow::ensure!(
        value("process_open_fds")? >= 5.0,
        "stdio and two listeners at least"
    );
    let started = value("process_start_time_seconds")?;
    anyhow::ensure!(
        started <= now + 1.0 && started > now - 120.0,
        "started at {started}, now {now}"
    );

    // The build: `--version` and tollgate_build_info say the same revision.
    let out = tollgate().arg("--version").output()?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let revision = version
        .split_once("(revision ")
        .and_then(|(_, r)| r.strip_suffix(')'))
        .with_context(|| format!("no revision in `tollgate --version`: {version:?}"))?;
    anyhow::ensure!(
        revision == "unknown"
            || (revision.len() == 12 && revision.bytes().all(|b| b.is_ascii_hexdigit())),
        "revision {revision:?}"
    );
    let build = format!(
        r#"tollgate_build_info{{version="{}",revision="{revision}"}}"#,
        env!("CARGO_PKG_VERSION")
    );
    anyhow::ensure!(sample(&text, &build) == Some(1.0), "no {build} 1:\n{text}");
    Ok(())
}

/// Starts tollgate with `args` (and `RUST_LOG` as given, or unset), waits for its ready line
/// (and, if given, for `until` in its log), stops it, and returns what it logged.
fn logged(
    dir: &Path,
    name: &str,
    args: &[&str],
    rust_log: Option<&str>,
    until: Option<&str>,
) -> anyhow::Result<String> {
    let log = dir.join(format!("{name}.log"));
    let mut cmd = tollgate();
    cmd.args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        // Nothing listens there: tollgate starts and finds its upstream unhealthy.
        .args(["--upstream", "http://127.0.0.1:9"])
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log)?);
    if let Some(v) = rust_log {
        cmd.env("RUST_LOG", v);
    }
    let mut child = cmd.spawn().context("starting tollgate")?;
    let stdout = child.stdout.take().context("tollgate's stdout")?;
    let child = Killed(child);
    let mut lines = LineReader::spawn(format!("tollgate {name} stdout"), stdout);
    // The log line "tollgate started" is written before the ready line.
    lines.wait_for(TOLLGATE_START_TIMEOUT, "its ready line", |l| {
        l.starts_with("tollgate serving at")
    })?;
    if let Some(needle) = until {
        let wait = format!("{needle:?} in tollgate's log");
        eventually(TOLLGATE_START_TIMEOUT, &wait, || {
            Ok(std::fs::read_to_string(&log)?
                .contains(needle)
                .then_some(()))
        })?;
    }
    drop(child);
    Ok(std::fs::read_to_string(&log)?)
}

#[test]
fn json_logs_at_the_level_asked_and_rust_log_wins() -> anyhow::Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("tollgate-e2e-logs-")
        .tempdir()?;
    let json = logged(dir.path(), "json", &["--log-format", "json"], None, None)?;
    let records: Vec<Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("not a JSON line: {l:?}")))
        .collect::<anyhow::Result<_>>()?;
    let started = records
        .iter()
        .find(|r| r["message"] == "tollgate started")
        .with_context(|| format!("no \"tollgate started\" record:\n{json}"))?;
    anyhow::ensure!(
        started["level"] == "INFO"
            && started["listen"]
                .as_str()
                .is_some_and(|l| l.starts_with("127.0.0.1:"))
            && started["timestamp"].is_string(),
        "fields at the top level: {started}"
    );

    let quiet = logged(dir.path(), "warn", &["-v", "warn"], None, None)?;
    anyhow::ensure!(
        !quiet.contains("tollgate started"),
        "an info line at -v warn:\n{quiet}"
    );
    // At debug, the first health check's connection attempt is logged.
    let debug = logged(dir.path(), "klog", &["--v=4"], None, Some("DEBUG"))?;
    anyhow::ensure!(debug.contains("connecting to 127.0.0.1:9"), "{debug}");
    let env = logged(
        dir.path(),
        "env",
        &["--log-level", "warn"],
        Some("info"),
        None,
    )?;
    anyhow::ensure!(
        env.contains("tollgate started"),
        "RUST_LOG=info does not win over --log-level warn:\n{env}"
    );
    Ok(())
}

#[test]
fn the_config_file_version_is_optional_and_refused_when_wrong() -> anyhow::Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("tollgate-e2e-version-")
        .tempdir()?;
    let check = |name: &str, head: &str| -> anyhow::Result<(Option<i32>, String)> {
        let file = dir.path().join(name);
        std::fs::write(
            &file,
            format!("{head}upstream: {{urls: [\"http://127.0.0.1:9\"]}}\n"),
        )?;
        let out = tollgate()
            .arg("check-config")
            .arg("--config")
            .arg(&file)
            .output()?;
        Ok((
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ))
    };
    for (name, head) in [
        ("none.yaml", ""),
        (
            "versioned.yaml",
            "apiVersion: tollgate.io/v1alpha1\nkind: TollgateConfiguration\n",
        ),
    ] {
        let (code, out) = check(name, head)?;
        anyhow::ensure!(code == Some(0), "{name}: exit {code:?}: {out}");
    }
    for (name, head, field) in [
        (
            "future.yaml",
            "apiVersion: tollgate.io/v1\nkind: TollgateConfiguration\n",
            "apiVersion",
        ),
        (
            "kind.yaml",
            "apiVersion: tollgate.io/v1alpha1\nkind: KubeletConfiguration\n",
            "kind",
        ),
    ] {
        let (code, out) = check(name, head)?;
        anyhow::ensure!(
            code == Some(64) && out.contains(&format!("invalid setting {field}")),
            "{name}: exit {code:?}, want 64 naming {field}: {out}"
        );
    }
    Ok(())
}
