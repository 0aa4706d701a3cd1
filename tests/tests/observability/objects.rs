//! The prometheus-operator objects in `dashboards/`, generated here from `dashboards/rules.yaml`
//! (the one source of the rules): `prometheusrule.yaml` (a `PrometheusRule` whose spec is
//! rules.yaml's groups, comments kept) and `servicemonitor.yaml` (a `Service` over tollgate's
//! static pods and a `ServiceMonitor` whose job name is the one the alerts select).
//!
//! The committed files must equal what is generated; after editing rules.yaml, regenerate
//! them with `UPDATE_DASHBOARDS=1 cargo nextest run -p tests --test observability objects`.
//! Every alert has a description and a runbook_url whose section exists in RUNBOOK.md, and the
//! PrometheusRule's rules pass `promtool check rules`.

use std::path::Path;
use std::process::Command;

use anyhow::Context;

use crate::repo_root;

/// The job name the alerts select (`up{job="tollgate"}`): the Service's name, which
/// prometheus-operator makes the job label.
const JOB: &str = "tollgate";

/// What the generated files say about themselves.
const GENERATED: &str = "\
# Generated from dashboards/rules.yaml by tests/tests/observability/objects.rs; do not edit:
# edit rules.yaml, then `UPDATE_DASHBOARDS=1 cargo nextest run -p tests --test observability objects`.
";

/// rules.yaml as a `PrometheusRule`: its groups (from the `groups:` line on, comments kept)
/// indented under `spec`.
fn prometheus_rule(rules: &str) -> anyhow::Result<String> {
    let start = rules
        .find("\ngroups:")
        .context("rules.yaml has no top-level `groups:`")?
        + 1;
    let mut out = String::from(GENERATED);
    out.push_str(
        "#
# prometheus-operator's form of dashboards/rules.yaml. Prometheus selects PrometheusRules by
# label (ruleSelector; kube-prometheus-stack's default wants `release: <its release name>`):
# add that label here if yours does.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: tollgate
  namespace: kube-system
  labels: {app.kubernetes.io/name: tollgate, app.kubernetes.io/component: monitoring}
spec:
",
    );
    for line in rules[start..].lines() {
        if !line.is_empty() {
            out.push_str("  ");
            out.push_str(line);
        }
        out.push('\n');
    }
    Ok(out)
}

/// The `Service` and `ServiceMonitor` that scrape tollgate's admin listener from the
/// monitoring network, as deploy/README.md "Monitoring" sets it up.
fn service_monitor(rules: &str) -> anyhow::Result<String> {
    anyhow::ensure!(
        rules.contains(&format!("up{{job=\"{JOB}\"}}")),
        "rules.yaml no longer selects job=\"{JOB}\": change JOB (the Service's name) with it"
    );
    let mut out = String::from(GENERATED);
    out.push_str(&format!(
        "#
# prometheus-operator scraping tollgate's admin listener on every master from the monitoring
# network: the admin listener bound to the node IP with TLS and a client CA of its own
# (deploy/README.md \"Monitoring\"). The Service selects the static pods (deploy/kubeadm/
# tollgate.yaml's labels) and its name is the job label the alerts select (job=\"{JOB}\").
# Secret kube-system/tollgate-scrape holds the CA of the admin listener's serving certificate
# (ca.crt: the cluster CA when it serves the apiserver's certificate) and Prometheus' client
# certificate signed by the admin client CA (tls.crt, tls.key).
apiVersion: v1
kind: Service
metadata:
  name: {JOB}
  namespace: kube-system
  labels: {{app.kubernetes.io/name: tollgate, app.kubernetes.io/component: monitoring}}
spec:
  clusterIP: None
  selector: {{component: tollgate, tier: control-plane}}
  ports:
  - {{name: admin, port: 9443, targetPort: 9443, protocol: TCP}}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {JOB}
  namespace: kube-system
  labels: {{app.kubernetes.io/name: tollgate, app.kubernetes.io/component: monitoring}}
spec:
  selector:
    matchLabels: {{app.kubernetes.io/name: tollgate, app.kubernetes.io/component: monitoring}}
  namespaceSelector: {{matchNames: [kube-system]}}
  endpoints:
  - port: admin
    path: /metrics
    scheme: https
    interval: 30s
    tlsConfig:
      ca: {{secret: {{name: tollgate-scrape, key: ca.crt}}}}
      cert: {{secret: {{name: tollgate-scrape, key: tls.crt}}}}
      keySecret: {{name: tollgate-scrape, key: tls.key}}
"
    ));
    Ok(out)
}

/// `path` holds `want`, or (with `UPDATE_DASHBOARDS=1`) is made to.
fn check_or_write(path: &Path, want: &str) -> anyhow::Result<()> {
    if std::env::var_os("UPDATE_DASHBOARDS").is_some_and(|v| v == "1") {
        std::fs::write(path, want).with_context(|| format!("writing {}", path.display()))?;
        return Ok(());
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    anyhow::ensure!(
        have == want,
        "{} differs from what dashboards/rules.yaml generates; regenerate it with \
         `UPDATE_DASHBOARDS=1 cargo nextest run -p tests --test observability objects`",
        path.display()
    );
    Ok(())
}

#[test]
fn objects_committed_are_the_ones_rules_yaml_generates() -> anyhow::Result<()> {
    let dir = repo_root().join("dashboards");
    let rules = std::fs::read_to_string(dir.join("rules.yaml"))?;
    let rule = prometheus_rule(&rules)?;
    check_or_write(&dir.join("prometheusrule.yaml"), &rule)?;
    check_or_write(&dir.join("servicemonitor.yaml"), &service_monitor(&rules)?)?;

    // The PrometheusRule's spec, taken back out, is a rules file promtool accepts with as
    // many rules as rules.yaml.
    let spec = rule
        .split_once("\nspec:\n")
        .context("no spec")?
        .1
        .lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let tmp = tempfile::Builder::new()
        .prefix("tollgate-e2e-prometheusrule-")
        .tempdir()?;
    let mut found = Vec::new();
    for (name, text) in [("spec.yaml", spec.as_str()), ("rules.yaml", rules.as_str())] {
        let file = tmp.path().join(name);
        std::fs::write(&file, text)?;
        let out = Command::new("promtool")
            .args(["check", "rules"])
            .arg(&file)
            .output()
            .context(
                "running promtool (Debian package `prometheus`: bash scripts/deps.sh --tests)",
            )?;
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        anyhow::ensure!(
            out.status.success(),
            "promtool check rules {name}: {said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        found.push(
            said.lines()
                .find(|l| l.contains("rules found"))
                .unwrap_or_default()
                .to_string(),
        );
    }
    anyhow::ensure!(found[0] == found[1], "{found:?}");
    Ok(())
}

#[test]
fn every_alert_has_a_description_and_a_runbook_section() -> anyhow::Result<()> {
    let dir = repo_root().join("dashboards");
    let rules = std::fs::read_to_string(dir.join("rules.yaml"))?;
    let runbook = std::fs::read_to_string(dir.join("RUNBOOK.md"))?;
    // GitHub's anchors of the runbook's sections: the heading, lower-cased.
    let anchors: Vec<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| h.trim().to_lowercase())
        .collect();
    let alerts: Vec<&str> = rules.split("- alert: ").skip(1).collect();
    anyhow::ensure!(alerts.len() >= 10, "only {} alerts found", alerts.len());
    for alert in alerts {
        let name = alert.split_whitespace().next().unwrap_or("?");
        let body = alert.split("\n      - ").next().unwrap_or(alert);
        anyhow::ensure!(
            body.contains("\n          description: \""),
            "{name}: no description"
        );
        anyhow::ensure!(
            !body.contains("runbook: "),
            "{name}: an inline runbook left"
        );
        let url = body
            .lines()
            .find_map(|l| l.trim().strip_prefix("runbook_url: "))
            .with_context(|| format!("{name}: no runbook_url"))?
            .trim_matches('"');
        let anchor = url
            .strip_prefix("dashboards/RUNBOOK.md#")
            .with_context(|| format!("{name}: runbook_url {url} is not a RUNBOOK.md section"))?;
        anyhow::ensure!(
            anchor == name.to_lowercase() && anchors.iter().any(|a| a == anchor),
            "{name}: no section #{anchor} in RUNBOOK.md"
        );
    }
    Ok(())
}
