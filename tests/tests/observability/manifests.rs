//! `deploy/` against the real kube-apiserver 1.20.2 of the test suite.
//!
//! What is tested, and what cannot be on loopback:
//! - the manifests pass `kubectl apply --dry-run=server`;
//! - the apiserver, bound to 127.0.0.1 with `--advertise-address` elsewhere and the lease
//!   endpoint reconciler, publishes the `kubernetes` endpoint as advertise address : the port
//!   it binds (`--secure-port`) — so a proxy that holds the advertise address and that port
//!   receives every in-cluster client, and an apiserver moved to another port would publish
//!   the other port;
//! - tollgate, started with the static pod's own flags, serves the API on that same port on
//!   another address while the apiserver holds 127.0.0.1:PORT;
//! - the static pod's and the systemd unit's flags, with deploy/tollgate.yaml and a kubeadm
//!   PKI, pass `tollgate check-config`; a bad file fails it with exit 64 and the line.
//!
//! Not on loopback: the advertise address cannot be tollgate's own here. Endpoints refuse
//! loopback addresses ("may not be in the loopback range"), and the only other addresses of
//! this machine are not ours to serve tests on, so the endpoint is published for 192.0.2.10
//! (TEST-NET-1, never contacted) and tollgate listens on 127.0.0.2. The link between the two —
//! tollgate's `--listen` IP:port equals the apiserver's advertise address and secure port — is
//! checked on the manifests themselves.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;
use tests::{eventually, fresh_workspace_binary, http_get, RealApiserver};

use crate::{repo_root, Spawned, START_TIMEOUT};

/// The node IP the manifests are written for (TEST-NET-1).
const NODE_IP: &str = "192.0.2.10";

/// `--flag=value` of a command line.
fn flag<'a>(args: &'a [String], name: &str) -> anyhow::Result<&'a str> {
    let prefix = format!("{name}=");
    args.iter()
        .find_map(|a| a.strip_prefix(&prefix))
        .with_context(|| format!("no {name} in {args:?}"))
}

/// The container command of a pod (from kubectl's JSON).
fn command(pod: &Value) -> anyhow::Result<Vec<String>> {
    pod["spec"]["containers"][0]["command"]
        .as_array()
        .context("a pod without a command")?
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .context("a non-string argument")
        })
        .collect()
}

/// kubeadm's /etc/kubernetes/pki, made from the test apiserver's PKI under `root`.
fn kubeadm_pki(api: &RealApiserver, root: &Path) -> anyhow::Result<()> {
    let pki = root.join("etc/kubernetes/pki");
    std::fs::create_dir_all(&pki)?;
    for (var, name) in [
        ("KUBE_CA_CERT", "ca.crt"),
        ("KUBE_FRONT_PROXY_CA_CERT", "front-proxy-ca.crt"),
        ("KUBE_FRONT_PROXY_CLIENT_CERT", "front-proxy-client.crt"),
        ("KUBE_FRONT_PROXY_CLIENT_KEY", "front-proxy-client.key"),
        // kubeadm's apiserver-kubelet-client is in system:masters, as the test admin is.
        ("KUBE_ADMIN_CERT", "apiserver-kubelet-client.crt"),
        ("KUBE_ADMIN_KEY", "apiserver-kubelet-client.key"),
    ] {
        std::fs::copy(api.file(var)?, pki.join(name))?;
    }
    let served = api.file("KUBE_CA_CERT")?.with_file_name("apiserver.crt");
    std::fs::copy(&served, pki.join("apiserver.crt"))?;
    std::fs::copy(
        served.with_file_name("apiserver.key"),
        pki.join("apiserver.key"),
    )?;
    Ok(())
}

/// The manifests' paths moved under `root`, the config file to the repo's example.
fn rooted(args: &[String], root: &Path) -> Vec<String> {
    let config = repo_root().join("deploy/tollgate.yaml");
    args.iter()
        .map(|a| {
            a.replace("/etc/tollgate/tollgate.yaml", &config.display().to_string())
                .replace(
                    "/etc/kubernetes/",
                    &format!("{}/etc/kubernetes/", root.display()),
                )
        })
        .collect()
}

/// `tollgate check-config ARGS`: (exit code, stdout + stderr).
fn check_config(args: &[String]) -> anyhow::Result<(i32, String)> {
    let out = Command::new(fresh_workspace_binary(
        "tollgate",
        &["proxy", "kubeio", "apimodel"],
    ))
    .arg("check-config")
    .args(args)
    .output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

/// The arguments after the binary of a systemd `KEY=` line, `${NODE_IP}` filled in.
fn unit_args(unit: &str, key: &str) -> anyhow::Result<Vec<String>> {
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .with_context(|| format!("no {key} in the unit"))?;
    Ok(line
        .replace("${NODE_IP}", NODE_IP)
        .split_whitespace()
        .skip(1)
        .map(str::to_string)
        .collect())
}

#[test]
fn manifests_are_valid_and_tollgate_takes_the_published_endpoint() -> anyhow::Result<()> {
    let api = RealApiserver::start(&[
        "--bind-address=127.0.0.1",
        &format!("--advertise-address={NODE_IP}"),
        "--endpoint-reconciler-type=lease",
    ])?;
    let kubectl = api.kubectl()?;
    let port: u16 = api
        .url
        .rsplit(':')
        .next()
        .context("apiserver URL without port")?
        .parse()?;
    let deploy = repo_root().join("deploy");

    // The static pods, as the server validated them (dry run: nothing is created).
    let pod = |name: &str| -> anyhow::Result<Value> {
        let file = deploy.join("kubeadm").join(name);
        kubectl.json(&[
            "apply",
            "--dry-run=server",
            "-o",
            "json",
            "-f",
            &file.display().to_string(),
        ])
    };
    let tollgate_pod = command(&pod("tollgate.yaml")?)?;
    let apiserver_pod = command(&pod("kube-apiserver.yaml")?)?;

    // What the apiserver publishes: its advertise address and the port it binds.
    let endpoint = eventually(START_TIMEOUT, "the kubernetes endpoint published", || {
        let ep = kubectl.json(&[
            "get",
            "endpoints",
            "kubernetes",
            "-n",
            "default",
            "-o",
            "json",
        ])?;
        let subset = &ep["subsets"][0];
        Ok(subset["addresses"][0]["ip"]
            .as_str()
            .map(|ip| (ip.to_string(), subset["ports"][0]["port"].as_u64())))
    })?;
    anyhow::ensure!(
        endpoint == (NODE_IP.to_string(), Some(u64::from(port))),
        "kubectl get endpoints kubernetes: {endpoint:?}, want {NODE_IP}:{port} (advertise address : secure port)"
    );
    // So the manifests must give tollgate exactly that address and port, and the apiserver
    // loopback on the same port.
    let secure_port = flag(&apiserver_pod, "--secure-port")?;
    let advertise = flag(&apiserver_pod, "--advertise-address")?;
    anyhow::ensure!(
        flag(&apiserver_pod, "--bind-address")? == "127.0.0.1",
        "apiserver not on loopback"
    );
    anyhow::ensure!(
        flag(&tollgate_pod, "--listen")? == format!("{advertise}:{secure_port}"),
        "tollgate --listen is not the apiserver's advertise address and secure port"
    );
    anyhow::ensure!(
        flag(&tollgate_pod, "--upstream")? == format!("https://127.0.0.1:{secure_port}")
    );

    // The manifests' tollgate flags with a kubeadm PKI and deploy/tollgate.yaml.
    let root = tempfile::Builder::new()
        .prefix("tollgate-e2e-deploy-")
        .tempdir()?;
    kubeadm_pki(&api, root.path())?;
    let pod_args = rooted(&tollgate_pod[1..], root.path());
    let (code, out) = check_config(&pod_args)?;
    anyhow::ensure!(
        code == 0,
        "check-config with the static pod's flags: exit {code}: {out}"
    );
    let unit = std::fs::read_to_string(deploy.join("systemd/tollgate.service"))?;
    let start = unit_args(&unit, "ExecStart=")?;
    let pre = unit_args(&unit, "ExecStartPre=")?;
    anyhow::ensure!(
        pre.first().map(String::as_str) == Some("check-config") && pre[1..] == start[..]
    );
    anyhow::ensure!(
        start == tollgate_pod[1..],
        "the unit's flags differ from the static pod's"
    );
    let (code, out) = check_config(&rooted(&start, root.path()))?;
    anyhow::ensure!(
        code == 0,
        "check-config with the unit's flags: exit {code}: {out}"
    );
    // And a bad file is caught, with its line.
    let bad = root.path().join("bad.yaml");
    let good = std::fs::read_to_string(repo_root().join("deploy/tollgate.yaml"))?;
    std::fs::write(
        &bad,
        good.replace("  heavyThresholdBytes:", "  heavyThresholdByte:"),
    )?;
    let mut bad_args = pod_args.clone();
    bad_args[0] = format!("--config={}", bad.display());
    let (code, out) = check_config(&bad_args)?;
    anyhow::ensure!(
        code == 64 && out.contains("heavyThresholdByte") && out.contains("line "),
        "bad file: exit {code}: {out}"
    );

    // tollgate with the static pod's flags on the apiserver's port, beside it: 127.0.0.2
    // stands for the node IP, the admin listener on a free port.
    let args: Vec<String> = pod_args
        .iter()
        .map(|a| match a.split_once('=') {
            Some(("--listen", _)) => format!("--listen=127.0.0.2:{port}"),
            Some(("--admin-listen", _)) => "--admin-listen=127.0.0.1:0".into(),
            Some(("--upstream", _)) => format!("--upstream={}", api.url),
            _ => a.clone(),
        })
        .collect();
    let mut cmd = Command::new(fresh_workspace_binary(
        "tollgate",
        &["proxy", "kubeio", "apimodel"],
    ));
    cmd.args(&args);
    let mut tollgate = Spawned::start("tollgate", &mut cmd, root.path().join("tollgate.log"))?;
    tollgate.listening_port()?;
    let admin = eventually(START_TIMEOUT, "tollgate's admin listener", || {
        let ports = crate::listening_ports(tollgate.child.id())?;
        Ok(ports
            .into_iter()
            .find(|p| *p != port)
            .map(|p| format!("127.0.0.1:{p}")))
    })?;
    let through = |args: &[&str]| {
        let server = format!("--server=https://127.0.0.2:{port}");
        let mut all = vec![server.as_str(), "--tls-server-name=localhost"];
        all.extend_from_slice(args);
        kubectl.ok(&all)
    };
    let out = eventually(START_TIMEOUT, "kubectl through tollgate", || {
        Ok(through(&[
            "get",
            "endpoints",
            "kubernetes",
            "-n",
            "default",
            "-o",
            "name",
        ])
        .ok())
    })
    .map_err(|e| e.context(tollgate.log_text()))?;
    anyhow::ensure!(out.trim() == "endpoints/kubernetes", "{out}");
    let (code, metrics) = http_get(&admin, "/metrics", Duration::from_secs(5))?;
    anyhow::ensure!(
        code == 200 && metrics.contains("tollgate_requests_total{"),
        "tollgate counted nothing: {metrics}"
    );
    anyhow::ensure!(
        metrics.contains(&format!(
            "tollgate_upstream_healthy{{upstream=\"{}\"}} 1",
            api.url
        )),
        "tollgate's upstream not healthy:\n{metrics}\n{}",
        tollgate.log_text()
    );
    drop(tollgate);
    Ok(())
}
