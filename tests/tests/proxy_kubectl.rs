//! kubectl (and curl) THROUGH the real `tollgate` binary to the simulated kube-apiserver, end
//! to end: the sim serves TLS with a client CA, a token file and a front-proxy CA; tollgate
//! sits in front of it with its own serving certificate, the same client CA and a front-proxy
//! client certificate the sim trusts. Clients reach tollgate over plain HTTP (`::http`; kubectl
//! then sends no credentials, so users are anonymous) and over TLS (`::tls`; a client
//! certificate user and a token user). Each test starts its own sim and tollgate, so the
//! tests run in parallel and may write.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;
use tempfile::TempDir;
use tests::{
    CertAuthority, CertKeyPem, KubeUser, Kubectl, Scheme, SimProcess, TollgateOptions,
    TollgateProcess,
};

const NODES: usize = 100;
const PODS: usize = 3000;
const NAMESPACES: usize = 3;
/// The CN of tollgate's front-proxy client certificate (`--requestheader-allowed-names`).
const FRONT_PROXY_CN: &str = "tollgate-e2e-front-proxy";
/// How long a test waits for a watcher to print an expected line.
const WATCH_WAIT: Duration = Duration::from_secs(30);
/// `--max-time` of every curl.
const CURL_MAX_TIME: &str = "60";

/// Runs each named test function once with clients on plain HTTP and once on TLS:
/// `NAME::http` and `NAME::tls`.
macro_rules! over_http_and_tls {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn http() -> anyhow::Result<()> {
                super::$name(tests::Scheme::Http)
            }
            #[test]
            fn tls() -> anyhow::Result<()> {
                super::$name(tests::Scheme::Tls)
            }
        }
    )*};
}

over_http_and_tls!(
    reads_match_the_upstream,
    paging_with_chunk_size,
    label_patch_delete,
    watch_prints_changes_made_by_another_kubectl,
    long_watch_sees_every_event_in_order,
    identity_is_the_clients,
    spoofed_remote_headers_never_reach_the_upstream,
    debug_patterns_after_a_mixed_load,
);

// === the stack: sim (TLS, authn) ← tollgate ← clients ===

/// A sim with authentication, and tollgate in front of it.
struct Stack {
    /// Clients reach tollgate over this.
    client: Scheme,
    proxy: TollgateProcess,
    sim: SimProcess,
    /// Client certificate of user `carol` (groups `team-a`, `team-b`) and its files.
    carol: CertKeyPem,
    carol_files: (PathBuf, PathBuf),
    /// tollgate's front-proxy client certificate files (for the control test direct to the sim).
    front_proxy_files: (PathBuf, PathBuf),
    /// The sim's serving CA, as a file (for curl direct to the sim).
    sim_ca_file: PathBuf,
    // Last: certificates and the token file, removed after both processes are gone.
    inputs: TempDir,
}

impl Stack {
    fn start(client: Scheme, sim_extra: &[&str]) -> anyhow::Result<Self> {
        let inputs = tempfile::Builder::new()
            .prefix("tollgate-e2e-inputs-")
            .tempdir()?;
        let dir = inputs.path();
        let tokens = dir.join("tokens.csv");
        std::fs::write(
            &tokens,
            "alice-token,alice,uid-alice,\"dev,ops\"\nbob-token,bob,uid-bob\n",
        )?;
        let client_ca = CertAuthority::generate("e2e-client-ca")?;
        let client_ca_file = dir.join("client-ca.crt");
        std::fs::write(&client_ca_file, client_ca.cert_pem())?;
        let front_proxy_ca = CertAuthority::generate("e2e-front-proxy-ca")?;
        let front_proxy_ca_file = dir.join("front-proxy-ca.crt");
        std::fs::write(&front_proxy_ca_file, front_proxy_ca.cert_pem())?;
        let front_proxy = front_proxy_ca.issue_client(FRONT_PROXY_CN, &[])?;
        let front_proxy_files = front_proxy.write_to_dir(dir, "front-proxy-client")?;
        let carol = client_ca.issue_client("carol", &["team-a", "team-b"])?;
        let carol_files = carol.write_to_dir(dir, "carol")?;

        let (nodes, pods, namespaces) =
            (NODES.to_string(), PODS.to_string(), NAMESPACES.to_string());
        let (tokens, client_ca_file, front_proxy_ca_file) = (
            tokens.display().to_string(),
            client_ca_file.display().to_string(),
            front_proxy_ca_file.display().to_string(),
        );
        let mut args = vec![
            "--tls",
            "--nodes",
            &nodes,
            "--pods",
            &pods,
            "--namespaces",
            &namespaces,
            "--token-auth-file",
            &tokens,
            "--client-ca-file",
            &client_ca_file,
            "--requestheader-client-ca-file",
            &front_proxy_ca_file,
            "--requestheader-allowed-names",
            FRONT_PROXY_CN,
        ];
        args.extend_from_slice(sim_extra);
        let sim = SimProcess::start(&args)?;
        let sim_ca_file = dir.join("sim-ca.crt");
        std::fs::write(
            &sim_ca_file,
            sim.server_ca_pem.as_deref().context("the sim serves TLS")?,
        )?;

        let mut options = TollgateOptions::in_front_of(&sim);
        options.front_proxy = Some(front_proxy);
        if client == Scheme::Tls {
            options.tls = true;
            options.client_ca_pem = Some(client_ca.cert_pem().to_string());
        }
        let proxy = TollgateProcess::start(&options)?;
        let prefix = format!("{}://127.0.0.1:", client.url_scheme());
        anyhow::ensure!(
            proxy.url.starts_with(&prefix),
            "tollgate serves {}, expected {prefix}…",
            proxy.url
        );
        Ok(Self {
            client,
            proxy,
            sim,
            carol,
            carol_files,
            front_proxy_files,
            sim_ca_file,
            inputs,
        })
    }

    /// kubectl through tollgate without credentials.
    fn anonymous(&self) -> anyhow::Result<Kubectl> {
        self.proxy.kubectl_as("anonymous", &KubeUser::None)
    }

    /// kubectl through tollgate as token user `alice` (over HTTP kubectl sends no token).
    fn alice(&self) -> anyhow::Result<Kubectl> {
        self.proxy
            .kubectl_as("alice", &KubeUser::Token("alice-token".into()))
    }

    /// kubectl through tollgate as certificate user `carol`.
    fn carol(&self) -> anyhow::Result<Kubectl> {
        self.proxy.kubectl_as(
            "carol",
            &KubeUser::ClientCert {
                cert_pem: self.carol.cert_pem.clone(),
                key_pem: self.carol.key_pem.clone(),
            },
        )
    }

    /// The kubectl users of this client scheme: over TLS carol (certificate) and alice
    /// (token); over HTTP kubectl sends no credentials, so one anonymous user.
    fn users(&self) -> anyhow::Result<Vec<(&'static str, Kubectl)>> {
        Ok(match self.client {
            Scheme::Tls => vec![("carol", self.carol()?), ("alice", self.alice()?)],
            Scheme::Http => vec![("anonymous", self.anonymous()?)],
        })
    }

    /// kubectl straight to the sim (no tollgate), as token user `bob`.
    fn direct(&self) -> anyhow::Result<Kubectl> {
        self.sim
            .kubectl_as("bob-direct", &KubeUser::Token("bob-token".into()))
    }

    /// curl to tollgate's client URL + `path`, trusting its serving CA.
    fn curl(&self, who: Who) -> anyhow::Result<Curl> {
        let mut c = Curl::new(&self.proxy.url);
        c.cacert = self.proxy.serving_ca_file()?;
        match who {
            Who::Anonymous => {}
            Who::Token(t) => c.token = Some(t.to_string()),
            Who::Carol => c.cert = Some(self.carol_files.clone()),
        }
        Ok(c)
    }

    /// Both processes must outlive every request.
    fn still_running(mut self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.proxy.is_running(),
            "tollgate (pid {}) exited during the test; its log:\n{}",
            self.proxy.pid(),
            self.proxy.log()
        );
        anyhow::ensure!(
            self.sim.is_running(),
            "the simulator (pid {}) exited during the test; its log:\n{}",
            self.sim.pid(),
            self.sim.log()
        );
        let _ = self.inputs.path();
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum Who {
    Anonymous,
    Token(&'static str),
    Carol,
}

// === curl ===

/// curl against one base URL with optional CA, client certificate and bearer token.
#[derive(Debug, Clone)]
struct Curl {
    base: String,
    cacert: Option<PathBuf>,
    cert: Option<(PathBuf, PathBuf)>,
    token: Option<String>,
}

impl Curl {
    fn new(base: &str) -> Self {
        Self {
            base: base.to_string(),
            cacert: None,
            cert: None,
            token: None,
        }
    }

    /// The common arguments: quiet, fail on no HTTP errors (the status is printed), bounded.
    fn command(&self) -> Command {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", CURL_MAX_TIME]);
        if let Some(ca) = &self.cacert {
            cmd.arg("--cacert").arg(ca);
        }
        if let Some((cert, key)) = &self.cert {
            cmd.arg("--cert").arg(cert).arg("--key").arg(key);
        }
        if let Some(t) = &self.token {
            cmd.arg("-H").arg(format!("Authorization: Bearer {t}"));
        }
        cmd
    }

    /// Runs curl with `args` and then the URL `base + path`; its stdout.
    fn run(&self, args: &[&str], path: &str) -> anyhow::Result<String> {
        let mut cmd = self.command();
        cmd.args(args).arg(format!("{}{path}", self.base));
        let out = cmd.output().context("running curl")?;
        anyhow::ensure!(
            out.status.success(),
            "curl {args:?} {path} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Many requests in one curl process (one connection, in order), from a config file:
    /// `requests` are `(method, path, body)`; prints `%{http_code} %{size_download}` per request.
    fn batch(
        &self,
        dir: &Path,
        requests: &[(&str, String, Option<String>)],
        headers: &[&str],
    ) -> anyhow::Result<Vec<(u16, u64)>> {
        let mut config = String::new();
        for (i, (method, path, body)) in requests.iter().enumerate() {
            if i > 0 {
                config.push_str("next\n");
            }
            let q = |s: &str| serde_json::Value::from(s).to_string();
            config.push_str(&format!("url = {}\n", q(&format!("{}{path}", self.base))));
            config.push_str(&format!("request = {}\n", q(method)));
            config.push_str("output = \"/dev/null\"\n");
            config.push_str("write-out = \"%{http_code} %{size_download}\\n\"\n");
            for h in headers {
                config.push_str(&format!("header = {}\n", q(h)));
            }
            if let Some(t) = &self.token {
                config.push_str(&format!(
                    "header = {}\n",
                    q(&format!("Authorization: Bearer {t}"))
                ));
            }
            if let Some(ca) = &self.cacert {
                config.push_str(&format!("cacert = {}\n", q(&ca.display().to_string())));
            }
            if let Some((cert, key)) = &self.cert {
                config.push_str(&format!("cert = {}\n", q(&cert.display().to_string())));
                config.push_str(&format!("key = {}\n", q(&key.display().to_string())));
            }
            if let Some(b) = body {
                config.push_str(&format!("data-binary = {}\n", q(b)));
            }
        }
        let file = dir.join(format!("curl-batch-{}.conf", requests.len()));
        std::fs::write(&file, config)?;
        let out = Command::new("curl")
            .args(["-sS", "--max-time", CURL_MAX_TIME, "-K"])
            .arg(&file)
            .output()
            .context("running curl")?;
        anyhow::ensure!(
            out.status.success(),
            "curl -K {} failed ({}): {}",
            file.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let results: Vec<(u16, u64)> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let (code, size) = l.split_once(' ')?;
                Some((code.parse().ok()?, size.trim().parse().ok()?))
            })
            .collect();
        anyhow::ensure!(
            results.len() == requests.len(),
            "curl printed {} results for {} requests",
            results.len(),
            requests.len()
        );
        Ok(results)
    }
}

// === helpers ===

fn columns(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

fn items(list: &Value) -> anyhow::Result<&Vec<Value>> {
    list["items"]
        .as_array()
        .with_context(|| format!("no .items in {}", abbreviated(list)))
}

fn abbreviated(v: &Value) -> String {
    v.to_string().chars().take(500).collect()
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// The names of the pods of `namespace`, sorted.
fn pod_names(k: &Kubectl, namespace: &str) -> anyhow::Result<Vec<String>> {
    let out = k.ok(&["get", "pods", "-n", namespace, "-o", "name"])?;
    let mut names: Vec<String> = out
        .lines()
        .filter_map(|l| l.strip_prefix("pod/"))
        .map(String::from)
        .collect();
    names.sort();
    anyhow::ensure!(!names.is_empty(), "no pods in {namespace}");
    Ok(names)
}

/// `(user, uid, groups, extra)` from a SelfSubjectReview.
fn user_info(review: &Value) -> anyhow::Result<(String, String, Vec<String>, Value)> {
    anyhow::ensure!(
        review["kind"] == "SelfSubjectReview",
        "not a SelfSubjectReview: {}",
        abbreviated(review)
    );
    let info = &review["status"]["userInfo"];
    let groups = info["groups"]
        .as_array()
        .map(|g| {
            g.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    Ok((
        str_at(info, "/username").to_string(),
        str_at(info, "/uid").to_string(),
        groups,
        info.get("extra").cloned().unwrap_or(Value::Null),
    ))
}

/// `kubectl auth whoami -o json`: user, uid, groups.
fn whoami(k: &Kubectl) -> anyhow::Result<(String, String, Vec<String>)> {
    let (user, uid, groups, _) = user_info(&k.json(&["auth", "whoami", "-o", "json"])?)?;
    Ok((user, uid, groups))
}

const SELF_SUBJECT_REVIEWS: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
const SELF_SUBJECT_REVIEW: &str =
    r#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#;

/// POST a SelfSubjectReview with curl (`extra` arguments first, e.g. spoofed headers).
fn curl_whoami(c: &Curl, extra: &[&str]) -> anyhow::Result<(String, String, Vec<String>, Value)> {
    let mut args = vec![
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "-H",
        "Accept: application/json",
        "--data-binary",
        SELF_SUBJECT_REVIEW,
    ];
    args.extend_from_slice(extra);
    let out = c.run(&args, SELF_SUBJECT_REVIEWS)?;
    let review: Value = serde_json::from_str(&out)
        .with_context(|| format!("the SelfSubjectReview answer is no JSON: {out}"))?;
    user_info(&review)
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

// === reads ===

fn reads_match_the_upstream(client: Scheme) -> anyhow::Result<()> {
    let stack = Stack::start(client, &[])?;
    let direct = stack.direct()?;
    let direct_nodes = direct.ok(&["get", "--raw", "/api/v1/nodes"])?;
    for (who, k) in stack.users()? {
        let out = k.ok(&["get", "nodes", "--no-headers"])?;
        let rows: Vec<Vec<&str>> = out.lines().map(columns).collect();
        assert_eq!(rows.len(), NODES, "{who}: `get nodes`");
        assert!(rows.iter().all(|r| r.get(1) == Some(&"Ready")), "{who}");

        let out = k.ok(&["get", "pods", "-A", "--no-headers"])?;
        let mut per_ns: BTreeMap<String, usize> = BTreeMap::new();
        for l in out.lines() {
            *per_ns
                .entry(columns(l).first().copied().unwrap_or("").to_string())
                .or_default() += 1;
        }
        let expected: BTreeMap<String, usize> = (1..=NAMESPACES)
            .map(|i| (format!("ns-{i}"), PODS / NAMESPACES))
            .collect();
        assert_eq!(per_ns, expected, "{who}: `get pods -A` per namespace");

        let node = k.json(&["get", "node", "node-7", "-o", "json"])?;
        assert_eq!(str_at(&node, "/metadata/name"), "node-7", "{who}");

        let selected = k.json(&[
            "get",
            "pods",
            "-A",
            "--field-selector",
            "spec.nodeName=node-7",
            "-o",
            "json",
        ])?;
        let selected = items(&selected)?;
        assert_eq!(selected.len(), PODS / NODES, "{who}: pods on node-7");
        assert!(selected
            .iter()
            .all(|p| str_at(p, "/spec/nodeName") == "node-7"));

        // `get --raw`: byte for byte what the sim serves directly (nothing was written).
        let raw = k.ok(&["get", "--raw", "/api/v1/nodes"])?;
        assert!(
            raw == direct_nodes,
            "{who}: `get --raw /api/v1/nodes` through tollgate ({} bytes) differs from the \
             sim's own answer ({} bytes)",
            raw.len(),
            direct_nodes.len()
        );
        let page: Value = serde_json::from_str(&k.ok(&[
            "get",
            "--raw",
            "/api/v1/namespaces/ns-1/pods?limit=5",
        ])?)?;
        assert_eq!(items(&page)?.len(), 5, "{who}: ?limit=5");
        assert!(
            !str_at(&page, "/metadata/continue").is_empty(),
            "{who}: a continue token"
        );
        let version: Value = serde_json::from_str(&k.ok(&["get", "--raw", "/version"])?)?;
        assert!(
            !str_at(&version, "/gitVersion").is_empty(),
            "{who}: /version {version}"
        );
        let missing = k.fails(&["get", "--raw", "/api/v1/namespaces/ns-1/pods/nope"])?;
        assert!(missing.contains("NotFound"), "{who}: {missing}");
    }
    stack.still_running()
}

fn paging_with_chunk_size(client: Scheme) -> anyhow::Result<()> {
    let stack = Stack::start(client, &[])?;
    let expected: BTreeSet<String> = stack
        .direct()?
        .ok(&["get", "pods", "-A", "-o", "name"])?
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(expected.len(), PODS);
    for (who, k) in stack.users()? {
        for chunk in ["250", "1000"] {
            let out = k.ok(&["get", "pods", "-A", "-o", "name", "--chunk-size", chunk])?;
            let names: Vec<&str> = out.lines().collect();
            let unique: BTreeSet<String> = names.iter().map(|s| s.to_string()).collect();
            assert_eq!(
                names.len(),
                PODS,
                "{who}: --chunk-size {chunk}: every pod once"
            );
            assert_eq!(unique, expected, "{who}: --chunk-size {chunk}");
        }
        // Tables page too.
        let out = k.ok(&["get", "pods", "-A", "--no-headers", "--chunk-size", "700"])?;
        assert_eq!(
            out.lines().count(),
            PODS,
            "{who}: table with --chunk-size 700"
        );
    }
    // tollgate saw the pages: the continued ones as exact reads.
    let patterns: Vec<Value> = serde_json::from_str(&stack.proxy.admin_ok("/debug/patterns")?)?;
    let continued: u64 = patterns
        .iter()
        .filter(|p| p["verb"] == "list" && p["resource"] == "pods" && p["consistency"] == "exact")
        .filter_map(|p| p["count"].as_u64())
        .sum();
    let users = stack.users()?.len() as u64;
    // 3000/250 - 1 + 3000/1000 - 1 + 3000/700 (rounded up) - 1 continued pages per user.
    assert_eq!(
        continued,
        users * (11 + 2 + 4),
        "continued pages in {patterns:?}"
    );
    stack.still_running()
}

// === writes ===

fn label_patch_delete(client: Scheme) -> anyhow::Result<()> {
    let stack = Stack::start(client, &["--kubelet-delete-delay", "1s"])?;
    let direct = stack.direct()?;
    for (i, (who, k)) in stack.users()?.into_iter().enumerate() {
        let ns = format!("ns-{}", i + 1);
        let names = pod_names(&k, &ns)?;
        let pod = names[i].as_str();
        let out = k.ok(&["label", "pod", pod, "-n", &ns, &format!("e2e={who}")])?;
        assert_eq!(out.trim(), format!("pod/{pod} labeled"), "{who}");
        let seen = direct.ok(&[
            "get",
            "pod",
            pod,
            "-n",
            &ns,
            "-o",
            "jsonpath={.metadata.labels.e2e}",
        ])?;
        assert_eq!(seen, who, "the sim has the label set through tollgate");
        let selected = k.ok(&[
            "get",
            "pods",
            "-A",
            "-l",
            &format!("e2e={who}"),
            "-o",
            "name",
        ])?;
        assert_eq!(selected.trim(), format!("pod/{pod}"), "{who}");

        let node = format!("node-{}", i + 1);
        let out = k.ok(&[
            "patch",
            "node",
            &node,
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"labels":{"e2e":"patched"}},"spec":{"unschedulable":true}}"#,
        ])?;
        assert_eq!(out.trim(), format!("node/{node} patched"), "{who}");
        let n = direct.json(&["get", "node", &node, "-o", "json"])?;
        assert_eq!(n["metadata"]["labels"]["e2e"], "patched", "{who}");
        assert_eq!(n["spec"]["unschedulable"], true, "{who}");
        let row = k.ok(&["get", "node", &node, "--no-headers"])?;
        assert_eq!(
            columns(&row).get(1),
            Some(&"Ready,SchedulingDisabled"),
            "{who}"
        );
        let json_patch = r#"[{"op":"remove","path":"/spec/unschedulable"}]"#;
        k.ok(&["patch", "node", &node, "--type", "json", "-p", json_patch])?;
        let row = k.ok(&["get", "node", &node, "--no-headers"])?;
        assert_eq!(columns(&row).get(1), Some(&"Ready"), "{who}: json patch");

        // `kubectl delete` waits (a watch through tollgate) until the kubelet has stopped it.
        let out = k.ok(&["delete", "pod", pod, "-n", &ns])?;
        assert_eq!(out.trim(), format!("pod \"{pod}\" deleted"), "{who}");
        let err = direct.fails(&["get", "pod", pod, "-n", &ns])?;
        assert!(err.contains("(NotFound)"), "{who}: {err}");
        let err = k.fails(&["delete", "pod", pod, "-n", &ns])?;
        assert!(err.contains("(NotFound)"), "{who}: deleting again: {err}");
        let left = k.ok(&["get", "pods", "-n", &ns, "--no-headers"])?;
        assert_eq!(left.lines().count(), PODS / NAMESPACES - 1, "{who}");
    }
    stack.still_running()
}

// === watches ===

fn watch_prints_changes_made_by_another_kubectl(client: Scheme) -> anyhow::Result<()> {
    let stack = Stack::start(client, &["--kubelet-delete-delay", "1s"])?;
    let users = stack.users()?;
    // The watcher is the first user; the writer the last (over TLS: a certificate user
    // watches what a token user changes).
    let (watcher_name, k) = &users[0];
    let (writer_name, writer) = &users[users.len() - 1];
    let ns2 = pod_names(k, "ns-2")?;
    let ns3 = pod_names(k, "ns-3")?;
    let pod = ns2[ns2.len() / 2].as_str();
    let elsewhere = ns3[0].as_str();

    let mut watcher = k.background(
        "120s",
        &[
            "get",
            "pods",
            "-n",
            "ns-2",
            "-w",
            "--output-watch-events",
            "--show-labels",
        ],
    )?;
    let event_of = |line: &str, event: &str, label: Option<&str>| {
        let c = columns(line);
        c.first() == Some(&event)
            && c.get(1) == Some(&pod)
            && label.is_none_or(|l| c.last().is_some_and(|ls| ls.split(',').any(|x| x == l)))
    };
    watcher.wait_for_line(WATCH_WAIT, &format!("ADDED {pod}"), |l| {
        event_of(l, "ADDED", None)
    })?;
    writer.ok(&["label", "pod", elsewhere, "-n", "ns-3", "watched=elsewhere"])?;
    writer.ok(&["label", "pod", pod, "-n", "ns-2", "watched=yes"])?;
    watcher.wait_for_line(
        WATCH_WAIT,
        &format!("{watcher_name} sees MODIFIED {pod} watched=yes by {writer_name}"),
        |l| event_of(l, "MODIFIED", Some("watched=yes")),
    )?;
    writer.ok(&["delete", "pod", pod, "-n", "ns-2", "--wait=false"])?;
    watcher.wait_for_line(WATCH_WAIT, &format!("DELETED {pod}"), |l| {
        event_of(l, "DELETED", None)
    })?;
    assert!(watcher.is_running(), "the watch is still open");
    let ns2: BTreeSet<&str> = ns2.iter().map(String::as_str).collect();
    for line in watcher.lines() {
        let name = columns(line).get(1).copied().unwrap_or("");
        assert!(
            ns2.contains(name) || name == "NAME",
            "`get pods -n ns-2 -w` printed a pod not in ns-2: {line}"
        );
    }
    drop(watcher);
    stack.still_running()
}

fn long_watch_sees_every_event_in_order(client: Scheme) -> anyhow::Result<()> {
    const CHANGES: usize = 200;
    let stack = Stack::start(client, &[])?;
    let users = stack.users()?;
    let (who, k) = &users[0];
    let names = pod_names(k, "ns-1")?;
    let per_ns = names.len();

    // Every pod of ns-1 as a row, then one row per change.
    let mut watcher = k.background(
        "300s",
        &[
            "get",
            "pods",
            "-n",
            "ns-1",
            "-w",
            "--no-headers",
            "-o",
            "custom-columns=NAME:.metadata.name,SEQ:.metadata.labels.seq,RV:.metadata.resourceVersion",
        ],
    )?;
    let mut rows = 0;
    watcher.wait_for_line(WATCH_WAIT, &format!("{per_ns} initial rows"), |_| {
        rows += 1;
        rows == per_ns
    })?;

    // 200 merge patches through tollgate, one after another on one connection, each to a
    // different pod (wrapping around), labelled with its sequence number.
    let requests: Vec<(&str, String, Option<String>)> = (1..=CHANGES)
        .map(|seq| {
            let pod = &names[(seq - 1) % names.len()];
            (
                "PATCH",
                format!("/api/v1/namespaces/ns-1/pods/{pod}"),
                Some(format!(r#"{{"metadata":{{"labels":{{"seq":"{seq}"}}}}}}"#)),
            )
        })
        .collect();
    let writer = match stack.client {
        Scheme::Tls => stack.curl(Who::Token("alice-token"))?,
        Scheme::Http => stack.curl(Who::Anonymous)?,
    };
    let started = Instant::now();
    let results = writer.batch(
        stack.proxy.dir(),
        &requests,
        &[
            "Content-Type: application/merge-patch+json",
            "Accept: application/json",
        ],
    )?;
    let codes: BTreeSet<u16> = results.iter().map(|r| r.0).collect();
    assert_eq!(codes, BTreeSet::from([200]), "every PATCH succeeded");

    // The watcher prints every one of them, in order, and nothing else.
    let mut seen: Vec<(String, usize, u64)> = Vec::new();
    let mut last_error = None;
    let r = watcher.wait_for_line(
        Duration::from_secs(60),
        &format!("{CHANGES} change rows"),
        |l| {
            let c = columns(l);
            let parsed = (|| {
                Some((
                    c.first()?.to_string(),
                    c.get(1)?.parse::<usize>().ok()?,
                    c.get(2)?.parse::<u64>().ok()?,
                ))
            })();
            match parsed {
                Some(row) => seen.push(row),
                None => last_error = Some(format!("an unexpected row: {l}")),
            }
            seen.len() == CHANGES || last_error.is_some()
        },
    );
    r.with_context(|| format!("{who}: {} change rows seen", seen.len()))?;
    if let Some(e) = last_error {
        anyhow::bail!("{who}: {e}");
    }
    let seqs: Vec<usize> = seen.iter().map(|r| r.1).collect();
    assert_eq!(
        seqs,
        (1..=CHANGES).collect::<Vec<_>>(),
        "{who}: in order, none lost"
    );
    for (seq, row) in seen.iter().enumerate() {
        assert_eq!(
            row.0,
            names[seq % names.len()],
            "{who}: the pod of change {}",
            seq + 1
        );
    }
    assert!(
        seen.windows(2).all(|w| w[0].2 < w[1].2),
        "{who}: resourceVersions increase"
    );
    assert!(watcher.is_running(), "the watch is still open");
    eprintln!(
        "{who}: {CHANGES} changes written and seen through tollgate in {:?}",
        started.elapsed()
    );
    drop(watcher);
    stack.still_running()
}

// === identities ===

fn identity_is_the_clients(client: Scheme) -> anyhow::Result<()> {
    let stack = Stack::start(client, &[])?;
    let anonymous = (
        "system:anonymous".to_string(),
        String::new(),
        strings(&["system:unauthenticated"]),
    );
    assert_eq!(whoami(&stack.anonymous()?)?, anonymous, "no credentials");

    if client == Scheme::Http {
        // kubectl sends a kubeconfig's credentials only over TLS, so through an HTTP
        // listener every kubectl user is anonymous...
        assert_eq!(whoami(&stack.alice()?)?, anonymous, "kubectl over http");
        // ...but a bearer token sent over HTTP is forwarded as is.
        let (user, uid, groups, _) = curl_whoami(&stack.curl(Who::Token("alice-token"))?, &[])?;
        assert_eq!(
            (user, uid, groups),
            (
                "alice".into(),
                "uid-alice".into(),
                strings(&["dev", "ops", "system:authenticated"])
            )
        );
        return stack.still_running();
    }

    // The certificate user: CN and O reach the sim through the front-proxy headers.
    assert_eq!(
        whoami(&stack.carol()?)?,
        (
            "carol".into(),
            String::new(),
            strings(&["team-a", "team-b", "system:authenticated"])
        ),
        "certificate user"
    );
    // The token user: the token is forwarded, the sim resolves it.
    assert_eq!(
        whoami(&stack.alice()?)?,
        (
            "alice".into(),
            "uid-alice".into(),
            strings(&["dev", "ops", "system:authenticated"])
        ),
        "token user"
    );
    let bob = stack
        .proxy
        .kubectl_as("bob", &KubeUser::Token("bob-token".into()))?;
    assert_eq!(whoami(&bob)?.0, "bob");

    // A token the sim does not know: its 401 comes back through tollgate.
    let wrong = stack
        .proxy
        .kubectl_as("wrong", &KubeUser::Token("not-a-token".into()))?;
    let err = wrong.fails(&["auth", "whoami", "-o", "json"])?;
    assert!(err.contains("Unauthorized"), "{err}");

    // A certificate from a CA tollgate does not trust never authenticates its CN or O.
    let other_ca = CertAuthority::generate("not-the-client-ca")?;
    let forged = other_ca.issue_client("carol", &["system:masters"])?;
    let mallory = stack.proxy.kubectl_as(
        "mallory",
        &KubeUser::ClientCert {
            cert_pem: forged.cert_pem,
            key_pem: forged.key_pem,
        },
    )?;
    let r = mallory.run(&["auth", "whoami", "-o", "json"])?;
    // (tollgate refuses it in the TLS handshake; kube-apiserver would answer 401. Either way
    // it must not be carol.)
    eprintln!(
        "an untrusted client certificate: success={}, stderr: {}",
        r.success(),
        r.stderr.trim()
    );
    if r.success() {
        let (user, _, groups, _) = user_info(&serde_json::from_str(&r.stdout)?)?;
        assert_eq!(user, "system:anonymous", "an untrusted certificate");
        assert!(!groups.iter().any(|g| g == "system:masters"), "{groups:?}");
    }
    // A certificate and a token: as kube-apiserver, the certificate wins.
    let (user, _, _, _) = curl_whoami(
        &{
            let mut c = stack.curl(Who::Carol)?;
            c.token = Some("alice-token".into());
            c
        },
        &[],
    )?;
    assert_eq!(user, "carol", "certificate and token");
    stack.still_running()
}

fn spoofed_remote_headers_never_reach_the_upstream(client: Scheme) -> anyhow::Result<()> {
    let stack = Stack::start(client, &[])?;
    let spoof = [
        "-H",
        "X-Remote-User: spoofed-admin",
        "-H",
        "X-Remote-Group: system:masters",
        "-H",
        "X-Remote-Extra-Scopes: everything",
        "-H",
        "x-remote-user: spoofed-lowercase",
    ];

    // The oracle works: the sim does take these headers from a client presenting the
    // front-proxy certificate (so a leak through tollgate would show).
    let mut control = Curl::new(&stack.sim.url);
    control.cacert = Some(stack.sim_ca_file.clone());
    control.cert = Some(stack.front_proxy_files.clone());
    let (user, _, groups, _) = curl_whoami(
        &control,
        &[
            "-H",
            "X-Remote-User: spoofed-admin",
            "-H",
            "X-Remote-Group: system:masters",
        ],
    )?;
    assert_eq!(
        (user.as_str(), groups.as_slice()),
        (
            "spoofed-admin",
            strings(&["system:masters", "system:authenticated"]).as_slice()
        ),
        "control: the sim honours X-Remote-* from the front proxy"
    );

    let mut cases: Vec<(Who, (&str, Vec<String>))> = vec![
        (
            Who::Anonymous,
            ("system:anonymous", strings(&["system:unauthenticated"])),
        ),
        (
            Who::Token("alice-token"),
            ("alice", strings(&["dev", "ops", "system:authenticated"])),
        ),
    ];
    if client == Scheme::Tls {
        cases.push((
            Who::Carol,
            (
                "carol",
                strings(&["team-a", "team-b", "system:authenticated"]),
            ),
        ));
    }
    let versions: &[&str] = match client {
        Scheme::Tls => &["--http1.1", "--http2"],
        Scheme::Http => &["--http1.1", "--http2-prior-knowledge"],
    };
    for (who, (expected_user, expected_groups)) in cases {
        for version in versions {
            let mut args = vec![*version];
            args.extend_from_slice(&spoof);
            let (user, _, groups, extra) = curl_whoami(&stack.curl(who)?, &args)
                .with_context(|| format!("{who:?} {version}"))?;
            assert_eq!(user, expected_user, "{who:?} {version}: the sim saw");
            assert_eq!(groups, expected_groups, "{who:?} {version}: groups");
            assert!(
                extra.is_null() || extra.as_object().is_some_and(|m| m.is_empty()),
                "{who:?} {version}: extra {extra}"
            );
        }
    }
    stack.still_running()
}

// === what tollgate learned ===

fn debug_patterns_after_a_mixed_load(client: Scheme) -> anyhow::Result<()> {
    const ROUNDS: usize = 8;
    let stack = Stack::start(client, &[])?;
    let names = pod_names(&stack.direct()?, "ns-1")?;
    let curl = match client {
        Scheme::Tls => stack.curl(Who::Token("alice-token"))?,
        Scheme::Http => stack.curl(Who::Anonymous)?,
    };

    // Interleaved: full LISTs of pods and nodes (consistent), a namespace's pods, the pods
    // of one node by field selector (consistent), single GETs and watch-cache LISTs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    enum Kind {
        Pods,
        Nodes,
        NamespacePods,
        PodsOnNode,
        GetPod,
        PodsCached,
    }
    let mut requests: Vec<(&str, String, Option<String>)> = Vec::new();
    let mut kinds = Vec::new();
    for (round, pod) in names.iter().take(ROUNDS).enumerate() {
        for (kind, path) in [
            (Kind::Pods, "/api/v1/pods".to_string()),
            (
                Kind::PodsOnNode,
                format!(
                    "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-{}",
                    round + 1
                ),
            ),
            (Kind::Nodes, "/api/v1/nodes".to_string()),
            (Kind::GetPod, format!("/api/v1/namespaces/ns-1/pods/{pod}")),
            (
                Kind::NamespacePods,
                "/api/v1/namespaces/ns-2/pods".to_string(),
            ),
            (
                Kind::PodsOnNode,
                format!(
                    "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-{}",
                    round + 50
                ),
            ),
            (
                Kind::PodsCached,
                "/api/v1/pods?resourceVersion=0".to_string(),
            ),
        ] {
            requests.push(("GET", path, None));
            kinds.push(kind);
        }
    }
    let results = curl.batch(stack.proxy.dir(), &requests, &["Accept: application/json"])?;
    let mut sizes: BTreeMap<Kind, Vec<u64>> = BTreeMap::new();
    for (kind, (code, size)) in kinds.iter().zip(&results) {
        assert_eq!(*code, 200, "{kind:?}");
        sizes.entry(*kind).or_default().push(*size);
    }
    let avg = |k: Kind| {
        let v = &sizes[&k];
        v.iter().sum::<u64>() as f64 / v.len() as f64
    };

    let patterns: Vec<Value> = serde_json::from_str(&stack.proxy.admin_ok("/debug/patterns")?)?;
    let shown = || {
        patterns
            .iter()
            .map(|p| {
                format!(
                    "{} count={} bytesAvg={} predictedCost={}",
                    p["pattern"], p["count"], p["bytesAvg"], p["predictedCost"]
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let find = |verb: &str, resource: &str, scope: &str, consistency: Option<&str>, field: bool| {
        let found: Vec<(usize, &Value)> = patterns
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                p["verb"] == verb
                    && p["resource"] == resource
                    && p["scope"] == scope
                    && consistency.is_none_or(|c| p["consistency"] == c)
                    && p["pattern"]
                        .as_str()
                        .is_some_and(|s| s.contains("spec.nodeName") == field)
            })
            .collect();
        anyhow::ensure!(
            found.len() == 1,
            "{} patterns for {verb} {resource} {scope} {consistency:?} field={field}:\n{}",
            found.len(),
            shown()
        );
        Ok(found[0])
    };
    let number = |p: &Value, field: &str| p[field].as_f64().unwrap_or(f64::NAN);
    let within = |learned: f64, actual: f64| (learned - actual).abs() <= 0.10 * actual;

    let checks = [
        (
            Kind::Pods,
            "list",
            "pods",
            "cluster",
            Some("consistent"),
            false,
        ),
        (
            Kind::Nodes,
            "list",
            "nodes",
            "cluster",
            Some("consistent"),
            false,
        ),
        (
            Kind::NamespacePods,
            "list",
            "pods",
            "namespace",
            Some("consistent"),
            false,
        ),
        (
            Kind::PodsOnNode,
            "list",
            "pods",
            "cluster",
            Some("consistent"),
            true,
        ),
        (
            Kind::PodsCached,
            "list",
            "pods",
            "cluster",
            Some("cache"),
            false,
        ),
        (Kind::GetPod, "get", "pods", "namespace", None, false),
    ];
    let mut ranks = BTreeMap::new();
    for (kind, verb, resource, scope, consistency, field) in checks {
        let (rank, p) = find(verb, resource, scope, consistency, field)?;
        ranks.insert(kind, rank);
        let n = sizes[&kind].len() as u64;
        assert_eq!(
            p["count"].as_u64(),
            Some(n),
            "{kind:?} count in\n{}",
            shown()
        );
        let (learned, actual) = (number(p, "bytesAvg"), avg(kind));
        assert!(
            within(learned, actual),
            "{kind:?}: learned bytesAvg {learned} vs actual average {actual} (over {n}):\n{}",
            shown()
        );
        eprintln!(
            "{kind:?}: {} learned {learned:.0} B, actual {actual:.0} B, predicted cost {:.0}",
            p["pattern"],
            number(p, "predictedCost")
        );
    }

    // The heavy ones are named first; the field-selector LIST among them although its
    // responses are small: a consistent read with a selector reads every pod.
    let (_, on_node) = find("list", "pods", "cluster", Some("consistent"), true)?;
    let full_pods = avg(Kind::Pods);
    let predicted = number(on_node, "predictedCost");
    assert!(
        avg(Kind::PodsOnNode) < 0.05 * full_pods,
        "the field-selector responses are small: {} vs {full_pods}",
        avg(Kind::PodsOnNode)
    );
    assert!(
        predicted >= 0.9 * full_pods,
        "LIST pods ?fieldSelector=spec.nodeName=X (consistent) predicted {predicted}, \
         less than a full pods LIST ({full_pods}):\n{}",
        shown()
    );
    assert_eq!(
        ranks[&Kind::Pods],
        0,
        "the full consistent pods LIST is the heaviest:\n{}",
        shown()
    );
    for light in [Kind::Nodes, Kind::NamespacePods, Kind::GetPod] {
        assert!(
            ranks[&Kind::PodsOnNode] < ranks[&light],
            "the field-selector LIST ranks above {light:?}:\n{}",
            shown()
        );
    }
    stack.still_running()
}
