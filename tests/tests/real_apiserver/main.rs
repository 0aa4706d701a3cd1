//! The real-apiserver tier: a real kube-apiserver with its own etcd as the reference, in two
//! versions ([`tests::KubeVersion`]): 1.20.2 (the shared tools' `start.sh`) and the current release
//! pinned in `scripts/kube-current/` (`scripts/kube-current-start.sh`), both built once by
//! `scripts/deps.sh --tests`. Every test runs on each version, as `MODULE::v1_20::NAME` and
//! `MODULE::current::NAME` ([`per_version!`]); where the two apiservers legitimately differ the
//! test's expectation follows the version, and `tests/CONFORMANCE.md` lists each difference.
//!
//! - `proxy`: tollgate in front of it with the front-proxy certificate: identities, encodings,
//!   watches, paging and the apiserver's own 429, as kubectl and curl see them.
//! - `identity_headers`: an apiserver that trusts more identity headers than `X-Remote-*`:
//!   none of them gets through from a client, and enforce mode will not start blind to them.
//! - `conformance`: the same requests against it and against `tollgate-bench sim`, compared
//!   (the table is published in `tests/CONFORMANCE.md`).
//! - `loadgen`: loadgen's counts checked against what the apiserver did.
//! - `stores`: which store serves a consistent LIST on each version, as tollgate learns it.
//! - `storm`: a storm directly and through tollgate's default budget (runs alone): LISTs from
//!   etcd on 1.20.2, an informers' relist storm on the current release (see `storm.rs`).
//!
//! Each test starts its own apiserver (~7 s), so the tests are few and each checks much.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use serde_json::Value;

/// One `#[test]` per Kubernetes version for each `fn NAME(version: KubeVersion) ->
/// anyhow::Result<()>` named, in modules `v1_20` and `current` of the module it is used in.
macro_rules! per_version {
    (@v1_20 $($name:ident),+) => {
        mod v1_20 {
            $(
                #[test]
                fn $name() -> anyhow::Result<()> {
                    super::$name(tests::KubeVersion::V1_20)
                }
            )+
        }
    };
    (@current $($name:ident),+) => {
        mod current {
            $(
                #[test]
                fn $name() -> anyhow::Result<()> {
                    super::$name(tests::KubeVersion::Current)
                }
            )+
        }
    };
    ($($name:ident),+ $(,)?) => {
        per_version!(@v1_20 $($name),+);
        per_version!(@current $($name),+);
    };
}

mod conformance;
mod identity_headers;
mod loadgen;
mod proxy;
mod served_as_real;
mod stack;
mod stores;
mod storm;

/// `--max-time` of every curl (watches end sooner, by their `timeoutSeconds`).
const CURL_MAX_TIME: &str = "60";

// === curl ===

/// One server as curl reaches it: base URL, the CA to trust, a client certificate, a token.
#[derive(Debug, Clone)]
pub struct Http {
    pub base: String,
    pub cacert: Option<PathBuf>,
    pub cert: Option<(PathBuf, PathBuf)>,
    pub token: Option<String>,
    /// `--http2` (over TLS: ALPN h2) instead of HTTP/1.1.
    pub http2: bool,
    /// Where request and response bodies are written.
    scratch: PathBuf,
}

/// What came back.
#[derive(Debug, Clone)]
pub struct Reply {
    pub code: u16,
    /// `1.1` or `2`.
    pub version: String,
    /// Lower-case names, in order (the last response's, after any `100 Continue`).
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

static REQUEST_NUMBER: AtomicU64 = AtomicU64::new(0);

impl Http {
    pub fn new(base: &str, scratch: &Path) -> Self {
        Self {
            base: base.to_string(),
            cacert: None,
            cert: None,
            token: None,
            http2: false,
            scratch: scratch.to_path_buf(),
        }
    }

    pub fn with_cacert(mut self, ca: PathBuf) -> Self {
        self.cacert = Some(ca);
        self
    }

    pub fn with_cert(mut self, cert: PathBuf, key: PathBuf) -> Self {
        self.cert = Some((cert, key));
        self
    }

    pub fn with_token(mut self, token: &str) -> Self {
        self.token = Some(token.to_string());
        self
    }

    pub fn with_http2(mut self) -> Self {
        self.http2 = true;
        self
    }

    /// `GET path`.
    pub fn get(&self, path: &str) -> anyhow::Result<Reply> {
        self.send("GET", path, None, &[])
    }

    /// `METHOD path` with an optional `(content type, body)` and extra `Name: value` headers.
    pub fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, &str)>,
        headers: &[&str],
    ) -> anyhow::Result<Reply> {
        let n = REQUEST_NUMBER.fetch_add(1, Ordering::Relaxed);
        std::fs::create_dir_all(&self.scratch)?;
        let head_file = self.scratch.join(format!("{n}.head"));
        let body_file = self.scratch.join(format!("{n}.body"));
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", CURL_MAX_TIME, "-X", method])
            .arg("-D")
            .arg(&head_file)
            .arg("-o")
            .arg(&body_file)
            .args(["-w", "%{http_code} %{http_version}"]);
        cmd.arg(if self.http2 { "--http2" } else { "--http1.1" });
        if let Some(ca) = &self.cacert {
            cmd.arg("--cacert").arg(ca);
        }
        if let Some((cert, key)) = &self.cert {
            cmd.arg("--cert").arg(cert).arg("--key").arg(key);
        }
        if let Some(t) = &self.token {
            cmd.arg("-H").arg(format!("Authorization: Bearer {t}"));
        }
        for h in headers {
            cmd.arg("-H").arg(h);
        }
        if let Some((content_type, data)) = body {
            let request_file = self.scratch.join(format!("{n}.request"));
            std::fs::write(&request_file, data)?;
            cmd.arg("-H").arg(format!("Content-Type: {content_type}"));
            cmd.arg("--data-binary")
                .arg(format!("@{}", request_file.display()));
        }
        cmd.arg(format!("{}{path}", self.base));
        let out = cmd.output().context("running curl")?;
        anyhow::ensure!(
            out.status.success(),
            "curl {method} {}{path} failed ({}): {}",
            self.base,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let written = String::from_utf8_lossy(&out.stdout);
        let (code, version) = written
            .trim()
            .split_once(' ')
            .with_context(|| format!("curl printed {written:?}"))?;
        let head = std::fs::read_to_string(&head_file).unwrap_or_default();
        // With a `100 Continue` first, the last header block is the response's.
        let last_block = head
            .split("\r\n\r\n")
            .filter(|b| !b.trim().is_empty())
            .last()
            .unwrap_or("");
        let headers = last_block
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let body = std::fs::read(&body_file).unwrap_or_default();
        let _ = std::fs::remove_file(&head_file);
        let _ = std::fs::remove_file(&body_file);
        Ok(Reply {
            code: code
                .parse()
                .with_context(|| format!("HTTP code {code:?}"))?,
            version: version.to_string(),
            headers,
            body,
        })
    }
}

impl Reply {
    /// The first header called `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON.
    pub fn json(&self) -> anyhow::Result<Value> {
        serde_json::from_slice(&self.body).with_context(|| {
            format!(
                "HTTP {} body is not JSON: {}",
                self.code,
                self.text().chars().take(300).collect::<String>()
            )
        })
    }

    /// A watch stream: one JSON event per line.
    pub fn events(&self) -> anyhow::Result<Vec<Value>> {
        self.text()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).with_context(|| format!("watch line {l:?}")))
            .collect()
    }

    /// Fails with the body unless the code is `code`.
    pub fn expect(self, code: u16, what: &str) -> anyhow::Result<Self> {
        anyhow::ensure!(
            self.code == code,
            "{what}: HTTP {} (expected {code}): {}",
            self.code,
            self.text().chars().take(500).collect::<String>()
        );
        Ok(self)
    }
}

/// The names of a List's items, in order.
pub fn item_names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i["metadata"]["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}
