//! Reading a kubeconfig ourselves (clusters, users, contexts) instead of
//! pulling in the `kube` crate, which costs ~70% more build time on our
//! machines. Supported: `certificate-authority(-data)`, `insecure-skip-tls-verify`,
//! `tls-server-name`, `client-certificate(-data)`, `client-key(-data)`,
//! `token`, `tokenFile` (spelled as kubectl writes it; a long-running client
//! re-reads it, as loadgen's credentials do every minute), `exec` credential
//! plugins (see [`crate::exec`]; run by the caller), the context's `namespace`,
//! and `KUBECONFIG` lists (first file to define a name wins, as in client-go).
//! `auth-provider` (removed from kubectl in 1.26) is refused with a clear error.
//!
//! Two ways in: [`paths`] + [`load`] as kubectl finds its files (loadgen), or
//! [`load_file`] for one named file's current context (a server's own identity),
//! with [`ResolvedContext::identity_pem`] and [`ResolvedContext::read_token`].

use std::path::{Path, PathBuf};

use base64::Engine;
use serde::Deserialize;

use crate::exec::{ClusterInfo, ExecConfig, ExecPlugin};

/// What a kubeconfig context resolves to: everything needed to reach the server.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResolvedContext {
    pub server: String,
    pub ca_pem: Option<Vec<u8>>,
    pub insecure_skip_tls_verify: bool,
    pub tls_server_name: Option<String>,
    pub client_cert_pem: Option<Vec<u8>>,
    pub client_key_pem: Option<Vec<u8>>,
    /// A static token (`token`).
    pub token: Option<String>,
    /// `tokenFile`, resolved against the kubeconfig's directory.
    pub token_file: Option<PathBuf>,
    /// The `exec` plugin, when the user has no `token` or `tokenFile`.
    pub exec: Option<ExecPlugin>,
    /// The kubeconfig user's name, for messages.
    pub user: Option<String>,
    pub namespace: Option<String>,
}

/// Why a kubeconfig could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("no kubeconfig: --kubeconfig and --server not given, KUBECONFIG unset, ~/.kube/config missing and not in a cluster (KUBERNETES_SERVICE_HOST unset)")]
    NotFound,
    #[error(transparent)]
    InCluster(#[from] crate::incluster::InClusterError),
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing kubeconfig {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("kubeconfig has no current-context and no --context was given")]
    NoContext,
    #[error("kubeconfig has no {kind} named `{name}`")]
    Missing { kind: &'static str, name: String },
    #[error("kubeconfig user `{user}` uses auth-provider `{provider}`, which is not supported (kubectl dropped auth-provider plugins in 1.26); use an exec plugin (e.g. kubelogin for OIDC), a token or a client certificate")]
    AuthProviderUnsupported { user: String, provider: String },
    #[error("kubeconfig field {field} is not valid base64")]
    Base64 { field: &'static str },
}

#[derive(Debug, Default, Deserialize)]
struct Kubeconfig {
    #[serde(default)]
    clusters: Vec<Named<Cluster>>,
    #[serde(default)]
    users: Vec<Named<User>>,
    #[serde(default)]
    contexts: Vec<Named<Context>>,
    #[serde(default, rename = "current-context")]
    current_context: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "user", alias = "context")]
    value: Option<T>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Cluster {
    #[serde(default)]
    server: String,
    certificate_authority: Option<String>,
    certificate_authority_data: Option<String>,
    #[serde(default)]
    insecure_skip_tls_verify: bool,
    tls_server_name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct User {
    client_certificate: Option<String>,
    client_certificate_data: Option<String>,
    client_key: Option<String>,
    client_key_data: Option<String>,
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<String>,
    exec: Option<ExecConfig>,
    auth_provider: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Context {
    #[serde(default)]
    cluster: String,
    #[serde(default)]
    user: String,
    namespace: Option<String>,
}

/// The kubeconfig files to read: `explicit`, else `$KUBECONFIG` (a `:`-list),
/// else `~/.kube/config`.
pub fn paths(explicit: Option<&Path>) -> Result<Vec<PathBuf>, KubeconfigError> {
    if let Some(p) = explicit {
        return Ok(vec![p.to_path_buf()]);
    }
    if let Some(list) = std::env::var_os("KUBECONFIG") {
        let found: Vec<PathBuf> = std::env::split_paths(&list)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        if !found.is_empty() {
            return Ok(found);
        }
    }
    let home = std::env::var_os("HOME").ok_or(KubeconfigError::NotFound)?;
    let p = PathBuf::from(home).join(".kube").join("config");
    if p.exists() {
        Ok(vec![p])
    } else {
        Err(KubeconfigError::NotFound)
    }
}

/// `files` merged as client-go merges a `KUBECONFIG` list: the first file to
/// define a name wins; the first non-empty `current-context` wins.
struct Merged {
    config: Kubeconfig,
    /// The directory of the file each cluster came from (paths in it are relative to it).
    cluster_dirs: Vec<PathBuf>,
    user_dirs: Vec<PathBuf>,
}

fn merge(files: &[PathBuf]) -> Result<Merged, KubeconfigError> {
    let mut merged = Merged {
        config: Kubeconfig::default(),
        cluster_dirs: Vec::new(),
        user_dirs: Vec::new(),
    };
    let m = &mut merged.config;
    for path in files {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            // client-go skips missing files in a KUBECONFIG list.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && files.len() > 1 => continue,
            Err(source) => {
                return Err(KubeconfigError::Read {
                    path: path.clone(),
                    source,
                })
            }
        };
        let cfg: Kubeconfig =
            serde_saphyr::from_str(&text).map_err(|e| KubeconfigError::Parse {
                path: path.clone(),
                message: e.to_string(),
            })?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        for c in cfg.clusters {
            if !m.clusters.iter().any(|n| n.name == c.name) {
                merged.cluster_dirs.push(dir.clone());
                m.clusters.push(c);
            }
        }
        for u in cfg.users {
            if !m.users.iter().any(|n| n.name == u.name) {
                merged.user_dirs.push(dir.clone());
                m.users.push(u);
            }
        }
        for c in cfg.contexts {
            if !m.contexts.iter().any(|n| n.name == c.name) {
                m.contexts.push(c);
            }
        }
        if m.current_context.as_deref().unwrap_or("").is_empty() {
            m.current_context = cfg.current_context;
        }
    }
    Ok(merged)
}

/// Loads `files` (merged, first definition wins) and resolves `context`
/// (or the current context).
pub fn load(files: &[PathBuf], context: Option<&str>) -> Result<ResolvedContext, KubeconfigError> {
    let merged = merge(files)?;
    let kc = &merged.config;
    let ctx_name = context
        .map(str::to_string)
        .or(kc.current_context.clone())
        .filter(|s| !s.is_empty())
        .ok_or(KubeconfigError::NoContext)?;
    let ctx = find(&kc.contexts, &ctx_name, "context")?.0;
    let (cluster, cdir) = find(&kc.clusters, &ctx.cluster, "cluster")?;
    let cdir = &merged.cluster_dirs[cdir];
    let mut out = ResolvedContext {
        server: cluster.server.clone(),
        insecure_skip_tls_verify: cluster.insecure_skip_tls_verify,
        tls_server_name: cluster.tls_server_name.clone(),
        namespace: ctx.namespace.clone().filter(|n| !n.is_empty()),
        ..Default::default()
    };
    out.ca_pem = data_or_file(
        cluster.certificate_authority_data.as_deref(),
        cluster.certificate_authority.as_deref(),
        cdir,
        "certificate-authority-data",
    )?;
    if !ctx.user.is_empty() {
        let (user, udir) = find(&kc.users, &ctx.user, "user")?;
        resolve_user(&mut out, &ctx.user, user, &merged.user_dirs[udir])?;
    }
    Ok(out)
}

/// The user's credentials into `out`; file names are relative to `dir`.
fn resolve_user(
    out: &mut ResolvedContext,
    name: &str,
    user: &User,
    dir: &Path,
) -> Result<(), KubeconfigError> {
    out.client_cert_pem = data_or_file(
        user.client_certificate_data.as_deref(),
        user.client_certificate.as_deref(),
        dir,
        "client-certificate-data",
    )?;
    out.client_key_pem = data_or_file(
        user.client_key_data.as_deref(),
        user.client_key.as_deref(),
        dir,
        "client-key-data",
    )?;
    out.user = Some(name.to_string());
    // As client-go: `token` first, then `tokenFile`, then the plugin.
    match (&user.token, &user.token_file) {
        (Some(t), _) if !t.is_empty() => out.token = Some(t.clone()),
        (_, Some(f)) if !f.is_empty() => out.token_file = Some(dir.join(f)),
        _ => {}
    }
    if let Some(provider) = &user.auth_provider {
        return Err(KubeconfigError::AuthProviderUnsupported {
            user: name.to_string(),
            provider: provider["name"].as_str().unwrap_or("?").to_string(),
        });
    }
    if let Some(exec) = user
        .exec
        .clone()
        .filter(|_| out.token.is_none() && out.token_file.is_none())
    {
        // client-go: a relative command with a path separator is relative
        // to the kubeconfig's directory; a bare name is looked up in PATH.
        let program = if exec.command.contains('/') {
            dir.join(&exec.command)
        } else {
            PathBuf::from(&exec.command)
        };
        out.exec = Some(ExecPlugin {
            user: name.to_string(),
            config: exec,
            program,
            cluster: ClusterInfo {
                server: out.server.clone(),
                tls_server_name: out.tls_server_name.clone(),
                insecure_skip_tls_verify: out.insecure_skip_tls_verify,
                ca_pem: out.ca_pem.clone(),
            },
        });
    }
    Ok(())
}

/// The current context of the one kubeconfig at `path`.
pub fn load_file(path: &Path) -> Result<ResolvedContext, KubeconfigError> {
    load(&[path.to_path_buf()], None)
}

impl ResolvedContext {
    /// The client certificate and key (PEM), when both are given.
    pub fn identity_pem(&self) -> Option<(&[u8], &[u8])> {
        self.client_cert_pem
            .as_deref()
            .zip(self.client_key_pem.as_deref())
    }

    /// The bearer token now: `token`, else the trimmed contents of `tokenFile`
    /// (read on each call), else none. Exec plugins are not run here.
    pub fn read_token(&self) -> Result<Option<String>, KubeconfigError> {
        if let Some(t) = &self.token {
            return Ok(Some(t.clone()));
        }
        match &self.token_file {
            Some(f) => Ok(Some(read(f)?.trim().to_string())),
            None => Ok(None),
        }
    }
}

fn find<'a, T>(
    list: &'a [Named<T>],
    name: &str,
    kind: &'static str,
) -> Result<(&'a T, usize), KubeconfigError> {
    list.iter()
        .enumerate()
        .find_map(|(i, n)| (n.name == name).then_some(n.value.as_ref().map(|v| (v, i))))
        .flatten()
        .ok_or_else(|| KubeconfigError::Missing {
            kind,
            name: name.to_string(),
        })
}

fn data_or_file(
    data: Option<&str>,
    file: Option<&str>,
    dir: &Path,
    field: &'static str,
) -> Result<Option<Vec<u8>>, KubeconfigError> {
    if let Some(d) = data.filter(|d| !d.is_empty()) {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(d.trim())
            .map_err(|_| KubeconfigError::Base64 { field })?;
        return Ok(Some(bytes));
    }
    match file.filter(|f| !f.is_empty()) {
        Some(f) => Ok(Some(read(&dir.join(f))?.into_bytes())),
        None => Ok(None),
    }
}

fn read(path: &Path) -> Result<String, KubeconfigError> {
    std::fs::read_to_string(path).map_err(|source| KubeconfigError::Read {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
apiVersion: v1
kind: Config
current-context: dev
preferences: {}
clusters:
- name: c1
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority-data: Q0FQRU0=
- name: c2
  cluster:
    server: https://other:6443
    certificate-authority: ca.crt
    insecure-skip-tls-verify: true
contexts:
- name: dev
  context: {cluster: c1, user: alice, namespace: team-a}
- name: prod
  context: {cluster: c2, user: bob}
- name: plugin
  context: {cluster: c1, user: eve}
- name: oidc
  context: {cluster: c1, user: mallory}
users:
- name: alice
  user:
    client-certificate-data: Q0VSVA==
    client-key-data: S0VZ
- name: bob
  user:
    tokenFile: token.txt
- name: eve
  user:
    exec: {command: ./bin/get-token, args: [--x], apiVersion: client.authentication.k8s.io/v1, provideClusterInfo: true}
- name: mallory
  user:
    auth-provider: {name: oidc, config: {}}
"#;

    fn write_config() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("config"), CONFIG).expect("write");
        std::fs::write(dir.path().join("ca.crt"), "CAFILE").expect("write");
        std::fs::write(dir.path().join("token.txt"), "s3cret\n").expect("write");
        dir
    }

    #[test]
    fn current_context_with_inline_data() {
        let dir = write_config();
        let r = load(&[dir.path().join("config")], None).expect("load");
        assert_eq!(r.server, "https://10.0.0.1:6443");
        assert_eq!(r.ca_pem.as_deref(), Some(&b"CAPEM"[..]));
        assert_eq!(r.client_cert_pem.as_deref(), Some(&b"CERT"[..]));
        assert_eq!(r.client_key_pem.as_deref(), Some(&b"KEY"[..]));
        assert_eq!(r.namespace.as_deref(), Some("team-a"));
    }

    #[test]
    fn named_context_with_files_relative_to_the_config() {
        let dir = write_config();
        let r = load(&[dir.path().join("config")], Some("prod")).expect("load");
        assert_eq!(r.ca_pem.as_deref(), Some(&b"CAFILE"[..]));
        assert!(r.insecure_skip_tls_verify);
        assert_eq!(r.token_file, Some(dir.path().join("token.txt")));
        assert_eq!(r.token, None);
    }

    #[test]
    fn token_file_as_kubectl_writes_it_is_read() {
        let dir = write_config();
        std::fs::write(
            dir.path().join("one"),
            "current-context: p\nclusters: [{name: c, cluster: {server: 'https://h:1'}}]\n\
contexts: [{name: p, context: {cluster: c, user: u}}]\n\
users: [{name: u, user: {tokenFile: token.txt}}]\n",
        )
        .expect("write");
        let r = load_file(&dir.path().join("one")).expect("load");
        assert_eq!(r.token_file, Some(dir.path().join("token.txt")));
        assert_eq!(r.read_token().expect("token").as_deref(), Some("s3cret"));
        assert!(r.identity_pem().is_none());
        std::fs::remove_file(dir.path().join("token.txt")).expect("rm");
        assert!(
            r.read_token().is_err(),
            "a tokenFile that went away is an error"
        );
    }

    #[test]
    fn a_static_token_wins_and_certificates_pair_up() {
        let dir = write_config();
        let r = load_file(&dir.path().join("config")).expect("load");
        assert_eq!(r.identity_pem(), Some((&b"CERT"[..], &b"KEY"[..])));
        assert_eq!(r.read_token().expect("none"), None);
        let mut t = r.clone();
        t.token = Some("abc".into());
        t.token_file = Some(dir.path().join("missing"));
        assert_eq!(t.read_token().expect("static").as_deref(), Some("abc"));
    }

    #[test]
    fn exec_plugins_resolve_and_auth_providers_are_refused() {
        let dir = write_config();
        let path = [dir.path().join("config")];
        let r = load(&path, Some("plugin")).expect("exec");
        let exec = r.exec.expect("plugin");
        assert_eq!(exec.user, "eve");
        assert_eq!(exec.program, dir.path().join("./bin/get-token"));
        assert_eq!(exec.config.args, vec!["--x".to_string()]);
        assert_eq!(exec.cluster.server, "https://10.0.0.1:6443");
        assert_eq!(exec.cluster.ca_pem.as_deref(), Some(&b"CAPEM"[..]));
        let err = load(&path, Some("oidc")).expect_err("auth-provider");
        assert!(
            err.to_string()
                .contains("user `mallory` uses auth-provider `oidc`"),
            "{err}"
        );
        let err = load(&path, Some("nope")).expect_err("missing");
        assert_eq!(err.to_string(), "kubeconfig has no context named `nope`");
    }
}
