//! In-cluster configuration, as client-go's `rest.InClusterConfig` builds it
//! for a pod: the server from `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT`,
//! the service account's token and CA from the files the kubelet mounts
//! (`/var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt,namespace}`).
//!
//! The token is handed on as a `tokenFile` ([`ResolvedContext::token_file`]),
//! the same path a kubeconfig's `tokenFile` takes, so a long-running client
//! re-reads it as the kubelet rotates the projected token (client-go: at most
//! once a minute) and no second token-file reader exists.
//!
//! [`resolve`] is the order kubectl and client-go's deferred loading follow:
//! `--server`, else a kubeconfig (`--kubeconfig`, `KUBECONFIG`, `~/.kube/config`),
//! else in-cluster when the service variables are set.
//!
//! Unlike client-go, an unreadable `ca.crt` is an error rather than a log
//! line followed by the system roots: a pod's API server is never signed by
//! a public CA, so the run would fail later with a vaguer message.

use std::path::{Path, PathBuf};

use crate::kubeconfig::{self, KubeconfigError, ResolvedContext};

/// Where the kubelet mounts a pod's service-account credentials.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The name credentials errors show for the in-cluster identity.
pub const USER: &str = "in-cluster service account";

/// Why the in-cluster configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum InClusterError {
    #[error("in-cluster configuration: reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("in-cluster configuration: {path} is empty")]
    Empty { path: PathBuf },
}

/// `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`, when both are set
/// and non-empty (client-go's test for "running in a pod").
pub fn service_from_env() -> Option<(String, String)> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT").ok()?;
    (!host.is_empty() && !port.is_empty()).then_some((host, port))
}

/// The in-cluster context for the service at `host:port`, with the
/// credentials in `dir`. The token is checked readable now and read again
/// by the client as it rotates.
pub fn load(host: &str, port: &str, dir: &Path) -> Result<ResolvedContext, InClusterError> {
    let token_file = dir.join("token");
    if read(&token_file)?.trim().is_empty() {
        return Err(InClusterError::Empty { path: token_file });
    }
    let ca = read(&dir.join("ca.crt"))?;
    // kubectl: POD_NAMESPACE first, then the mounted namespace file.
    let namespace = std::env::var("POD_NAMESPACE")
        .ok()
        .or_else(|| std::fs::read_to_string(dir.join("namespace")).ok())
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty());
    // net.JoinHostPort: an IPv6 address goes in brackets.
    let server = if host.contains(':') {
        format!("https://[{host}]:{port}")
    } else {
        format!("https://{host}:{port}")
    };
    Ok(ResolvedContext {
        server,
        ca_pem: Some(ca.into_bytes()),
        token_file: Some(token_file),
        user: Some(USER.to_string()),
        namespace,
        ..Default::default()
    })
}

/// The context a client without `--server` uses: the kubeconfig kubectl would
/// read (`explicit`, `KUBECONFIG`, `~/.kube/config`) and its `context`; when
/// there is none and the process runs in a pod, the in-cluster configuration
/// with the credentials in `service_account_dir` (default [`SERVICE_ACCOUNT_DIR`]).
pub fn resolve(
    explicit: Option<&Path>,
    context: Option<&str>,
    service_account_dir: Option<&Path>,
) -> Result<ResolvedContext, KubeconfigError> {
    match kubeconfig::paths(explicit) {
        Ok(files) => kubeconfig::load(&files, context),
        Err(KubeconfigError::NotFound) => match service_from_env() {
            Some((host, port)) => {
                let dir = service_account_dir.unwrap_or(Path::new(SERVICE_ACCOUNT_DIR));
                Ok(load(&host, &port, dir)?)
            }
            None => Err(KubeconfigError::NotFound),
        },
        Err(e) => Err(e),
    }
}

fn read(path: &Path) -> Result<String, InClusterError> {
    std::fs::read_to_string(path).map_err(|source| InClusterError::Read {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service_account(token: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("token"), token).expect("token");
        std::fs::write(dir.path().join("ca.crt"), "CAPEM").expect("ca");
        std::fs::write(dir.path().join("namespace"), "team-b\n").expect("namespace");
        dir
    }

    #[test]
    fn a_pod_gets_the_service_and_a_token_file() {
        let dir = service_account("abc\n");
        let ctx = load("10.96.0.1", "443", dir.path()).expect("load");
        assert_eq!(ctx.server, "https://10.96.0.1:443");
        assert_eq!(ctx.ca_pem.as_deref(), Some(&b"CAPEM"[..]));
        assert_eq!(ctx.token, None, "a token file, so that it is re-read");
        assert_eq!(ctx.token_file, Some(dir.path().join("token")));
        assert_eq!(ctx.read_token().expect("token").as_deref(), Some("abc"));
        assert_eq!(ctx.user.as_deref(), Some(USER));
        let v6 = load("fd00::1", "6443", dir.path()).expect("v6");
        assert_eq!(v6.server, "https://[fd00::1]:6443");
    }

    #[test]
    fn missing_or_empty_credentials_are_named() {
        let dir = service_account("  \n");
        let err = load("h", "1", dir.path()).expect_err("empty token");
        assert!(err.to_string().ends_with("token is empty"), "{err}");
        std::fs::write(dir.path().join("token"), "t").expect("token");
        std::fs::remove_file(dir.path().join("ca.crt")).expect("rm");
        let err = load("h", "1", dir.path()).expect_err("no CA");
        assert!(
            err.to_string()
                .starts_with("in-cluster configuration: reading")
                && err.to_string().ends_with("ca.crt"),
            "{err}"
        );
    }
}
