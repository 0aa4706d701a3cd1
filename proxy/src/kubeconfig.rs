//! `--upstream-kubeconfig`: the apiserver address, its CA and tollgate's own
//! identity (client certificate or token) from a kubeconfig's current
//! context. tollgate's own identity serves health checks and metrics
//! scraping only; forwarded requests never carry it. Exec plugins and auth
//! providers are not run: without a certificate or token, tollgate's own
//! requests are anonymous (`/readyz` allows that by default).

use std::path::{Path, PathBuf};

use base64::Engine;
use serde::Deserialize;

/// What a kubeconfig says about one apiserver.
#[derive(Debug, Clone, Default)]
pub struct KubeUpstream {
    pub server: String,
    /// CA bundle, PEM.
    pub ca_pem: Option<Vec<u8>>,
    /// Client certificate and key, PEM.
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    pub token: Option<String>,
}

/// A kubeconfig that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("kubeconfig {path}: {reason}")]
pub struct KubeconfigError {
    pub path: PathBuf,
    pub reason: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
struct KubeConfig {
    current_context: Option<String>,
    clusters: Vec<Named<Cluster>>,
    contexts: Vec<Named<Context>>,
    users: Vec<Named<User>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Named<T: Default> {
    name: String,
    #[serde(alias = "cluster", alias = "context", alias = "user")]
    value: T,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
struct Cluster {
    server: String,
    certificate_authority: Option<PathBuf>,
    certificate_authority_data: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Context {
    cluster: String,
    user: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
struct User {
    client_certificate: Option<PathBuf>,
    client_certificate_data: Option<String>,
    client_key: Option<PathBuf>,
    client_key_data: Option<String>,
    token: Option<String>,
    token_file: Option<PathBuf>,
}

/// Read the current context of the kubeconfig at `path`.
pub fn load(path: &Path) -> Result<KubeUpstream, KubeconfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| KubeconfigError {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    parse(&text, path.parent().unwrap_or(Path::new("."))).map_err(|reason| KubeconfigError {
        path: path.to_path_buf(),
        reason,
    })
}

/// Parse kubeconfig text; relative file names are relative to `dir`.
pub fn parse(text: &str, dir: &Path) -> Result<KubeUpstream, String> {
    let kc: KubeConfig = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
    let context_name = kc.current_context.clone().ok_or("no current-context")?;
    let context = find(&kc.contexts, &context_name, "context")?;
    let cluster = find(&kc.clusters, &context.cluster, "cluster")?;
    if cluster.server.is_empty() {
        return Err(format!("cluster {:?} has no server", context.cluster));
    }
    let read = |p: &PathBuf| {
        let p = dir.join(p);
        std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))
    };
    let data = |d: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(d.trim())
            .map_err(|e| format!("bad base64: {e}"))
    };
    let either =
        |data_field: &Option<String>, file: &Option<PathBuf>| -> Result<Option<Vec<u8>>, String> {
            match (data_field, file) {
                (Some(d), _) => data(d).map(Some),
                (None, Some(f)) => read(f).map(Some),
                (None, None) => Ok(None),
            }
        };
    let ca_pem = either(
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
    )?;
    let (identity_pem, token) = match kc.users.iter().find(|u| u.name == context.user) {
        Some(u) => {
            let user = &u.value;
            let cert = either(&user.client_certificate_data, &user.client_certificate)?;
            let key = either(&user.client_key_data, &user.client_key)?;
            let token = match (&user.token, &user.token_file) {
                (Some(t), _) => Some(t.clone()),
                (None, Some(f)) => Some(String::from_utf8_lossy(&read(f)?).trim().to_string()),
                (None, None) => None,
            };
            (cert.zip(key), token)
        }
        None => (None, None),
    };
    Ok(KubeUpstream {
        server: cluster.server.clone(),
        ca_pem,
        identity_pem,
        token,
    })
}

fn find<'a, T: Default>(list: &'a [Named<T>], name: &str, what: &str) -> Result<&'a T, String> {
    list.iter()
        .find(|n| n.name == name)
        .map(|n| &n.value)
        .ok_or_else(|| format!("no {what} named {name:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_context_with_inline_data() {
        let ca = base64::engine::general_purpose::STANDARD.encode("CA PEM");
        let text = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: b\npreferences: {{}}\n\
clusters:\n- name: one\n  cluster: {{server: https://a:6443}}\n\
- name: two\n  cluster:\n    server: https://b:6443\n    certificate-authority-data: {ca}\n    extensions: []\n\
contexts:\n- name: b\n  context: {{cluster: two, user: me, namespace: x}}\n\
users:\n- name: me\n  user:\n    token: abc\n    exec: {{command: x}}\n"
        );
        let k = parse(&text, Path::new(".")).expect("parses");
        assert_eq!(k.server, "https://b:6443");
        assert_eq!(k.ca_pem.as_deref(), Some(&b"CA PEM"[..]));
        assert_eq!(k.token.as_deref(), Some("abc"));
        assert!(k.identity_pem.is_none());
    }

    #[test]
    fn files_are_relative_to_the_kubeconfig() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("c.crt"), "CERT").expect("write");
        std::fs::write(dir.path().join("c.key"), "KEY").expect("write");
        let text = "current-context: c\nclusters: [{name: k, cluster: {server: 'https://h:1'}}]\n\
contexts: [{name: c, context: {cluster: k, user: u}}]\n\
users: [{name: u, user: {client-certificate: c.crt, client-key: c.key}}]\n";
        let k = parse(text, dir.path()).expect("parses");
        assert_eq!(k.identity_pem, Some((b"CERT".to_vec(), b"KEY".to_vec())));
        assert!(parse("current-context: nope\n", dir.path())
            .unwrap_err()
            .contains("nope"));
    }
}
