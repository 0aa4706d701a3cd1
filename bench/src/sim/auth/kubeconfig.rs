//! The kubeconfig `tollgate-bench sim --kubeconfig-out` writes, so `kubectl --kubeconfig F`
//! (and client-go, kube-rs, loadgen) reach the sim as they are, with nothing else on disk:
//! one cluster, one user, one context (current), credentials embedded as `*-data` base64.
//!
//! Written by hand rather than with a YAML library: every scalar is emitted as a JSON
//! string, which is also a valid double-quoted YAML scalar, so any token or URL is escaped
//! correctly.

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

use super::pki::write_file;

/// The cluster, user and context name in written kubeconfigs.
pub const CONTEXT_NAME: &str = "tollgate-sim";

/// The placeholder username written for [`KubeUser::None`] over https.
pub const ANONYMOUS_USERNAME: &str = "anonymous";

/// The credentials a kubeconfig carries.
#[derive(Clone, PartialEq, Eq)]
pub enum KubeUser {
    /// None: the client is anonymous (or admin, when the sim has no authentication).
    None,
    /// A bearer token (`--token-auth-file`).
    Token(String),
    /// A client certificate and key, PEM (`--client-ca-file`).
    ClientCert { cert_pem: String, key_pem: String },
}

impl std::fmt::Debug for KubeUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::Token(_) => f.write_str("Token([elided])"),
            Self::ClientCert { .. } => f.write_str("ClientCert { .. }"),
        }
    }
}

/// Why a kubeconfig was not written.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("writing kubeconfig {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The kubeconfig text for `server_url` (e.g. `https://127.0.0.1:8443`), trusting `ca_pem`
/// (if `None`, kubectl uses the system roots for `https`; `http` needs none).
pub fn render_kubeconfig(server_url: &str, ca_pem: Option<&str>, user: &KubeUser) -> String {
    let q = |s: &str| serde_json::Value::from(s).to_string();
    let b64 = |s: &str| q(&STANDARD.encode(s));
    let name = q(CONTEXT_NAME);
    let mut out = String::new();
    out.push_str("apiVersion: v1\nkind: Config\nclusters:\n");
    out.push_str(&format!("- name: {name}\n  cluster:\n"));
    out.push_str(&format!("    server: {}\n", q(server_url)));
    if let Some(ca) = ca_pem {
        out.push_str(&format!("    certificate-authority-data: {}\n", b64(ca)));
    }
    out.push_str(&format!("users:\n- name: {name}\n"));
    match user {
        // Over https, kubectl prompts for a username when a user has no credentials at all
        // ("Please enter Username:"). A username without a password stops that; the Basic
        // header it then sends is ignored by kube-apiserver (since 1.19), the sim and tollgate.
        KubeUser::None if server_url.starts_with("https:") => {
            out.push_str(&format!(
                "  user:\n    username: {}\n",
                q(ANONYMOUS_USERNAME)
            ));
        }
        KubeUser::None => out.push_str("  user: {}\n"),
        KubeUser::Token(token) => out.push_str(&format!("  user:\n    token: {}\n", q(token))),
        KubeUser::ClientCert { cert_pem, key_pem } => {
            out.push_str("  user:\n");
            out.push_str(&format!("    client-certificate-data: {}\n", b64(cert_pem)));
            out.push_str(&format!("    client-key-data: {}\n", b64(key_pem)));
        }
    }
    out.push_str(&format!(
        "contexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}\n"
    ));
    out.push_str(&format!("current-context: {name}\npreferences: {{}}\n"));
    out
}

/// Writes [`render_kubeconfig`] to `path`, readable by its owner only (it holds credentials).
/// The file is written beside `path` and renamed over it, so a reader never sees half of it.
pub fn write_kubeconfig(
    path: &Path,
    server_url: &str,
    ca_pem: Option<&str>,
    user: &KubeUser,
) -> Result<(), KubeconfigError> {
    let text = render_kubeconfig(server_url, ca_pem, user);
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let result =
        write_file(&tmp, text.as_bytes(), 0o600).and_then(|()| std::fs::rename(&tmp, path));
    result.map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        KubeconfigError::Write {
            path: path.to_path_buf(),
            source,
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may unwrap
mod tests {
    use super::*;
    use std::process::Command;

    /// Runs the installed kubectl on `kubeconfig`; fails loudly if kubectl is missing.
    fn kubectl(kubeconfig: &Path, args: &[&str]) -> String {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .output()
            .expect("kubectl must be installed (/usr/bin/kubectl)");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "kubectl {args:?}: {stderr}");
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn kubectl_reads_what_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        let ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let cert = KubeUser::ClientCert {
            cert_pem: "cert".into(),
            key_pem: "key".into(),
        };
        write_kubeconfig(&path, "https://127.0.0.1:8443", Some(ca), &cert).unwrap();
        assert_eq!(
            kubectl(&path, &["config", "current-context"]).trim(),
            CONTEXT_NAME
        );
        let jsonpath = |p: &str| kubectl(&path, &["config", "view", "--raw", "-o", p]);
        let server = "jsonpath={.clusters[0].cluster.server}";
        assert_eq!(jsonpath(server), "https://127.0.0.1:8443");
        let ca_data = jsonpath("jsonpath={.clusters[0].cluster.certificate-authority-data}");
        assert_eq!(STANDARD.decode(ca_data).unwrap(), ca.as_bytes());
        let key_data = jsonpath("jsonpath={.users[0].user.client-key-data}");
        assert_eq!(STANDARD.decode(key_data).unwrap(), b"key");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }

        // A token with YAML-special characters survives; plain http needs no CA.
        let token = KubeUser::Token("a: #b\"c'".into());
        write_kubeconfig(&path, "http://127.0.0.1:8001", None, &token).unwrap();
        assert_eq!(jsonpath("jsonpath={.users[0].user.token}"), "a: #b\"c'");
        write_kubeconfig(&path, "http://[::1]:8001", None, &KubeUser::None).unwrap();
        assert_eq!(jsonpath(server), "http://[::1]:8001");
        // Over https, "no credentials" carries a bare username so kubectl does not prompt.
        write_kubeconfig(&path, "https://[::1]:8443", None, &KubeUser::None).unwrap();
        let username = jsonpath("jsonpath={.users[0].user.username}");
        assert_eq!(username, ANONYMOUS_USERNAME);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp files left"
        );
    }
}
