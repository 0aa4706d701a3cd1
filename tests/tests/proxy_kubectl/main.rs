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
    abbreviated, str_at, user_info, whoami, CertAuthority, CertKeyPem, KubeUser, Kubectl, Scheme,
    SimProcess, TollgateOptions, TollgateProcess,
};

mod identity;
mod patterns;
mod reads;
mod watches;
mod writes;

use identity::*;
use patterns::*;
use reads::*;
use watches::*;
use writes::*;

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

/// Learning which store serves consistent LISTs needs two simulators (one per setting); once
/// is enough, over plain HTTP.
#[test]
fn consistent_list_store_is_learned_from_the_apiservers_metrics() -> anyhow::Result<()> {
    patterns::store_is_learned_from_storage_list_metrics(tests::Scheme::Http)
}

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
        Self::start_with(client, sim_extra, &[])
    }

    /// [`Stack::start`] with extra tollgate arguments.
    fn start_with(
        client: Scheme,
        sim_extra: &[&str],
        tollgate_args: &[String],
    ) -> anyhow::Result<Self> {
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
        // The sim publishes no extension-apiserver-authentication: the names it trusts
        // (its defaults; no uid header), all four kinds, or tollgate is never ready.
        options.args.extend(
            [
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                "--requestheader-uid-headers=X-Remote-Uid",
            ]
            .map(String::from),
        );
        options.args.extend(tollgate_args.iter().cloned());
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
