//! The simulator's settings (the library's side of `tollgate-bench sim`'s flags, which
//! [`crate::cli::SimArgs`] parses) and why it may fail to start.

use crate::sim::auth::authn::AuthnConfig;
use crate::sim::auth::pki::CertAuthority;
use crate::sim::auth::tls;
use crate::sim::model::ModelConfig;
use crate::sim::storage::seed_objects::SeedSpec;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Why the simulator could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot listen on {0}")]
    Bind(String, #[source] std::io::Error),
    #[error("{0}")]
    Config(String),
    #[error("etcd at {endpoints}")]
    Etcd {
        endpoints: String,
        #[source]
        source: crate::sim::storage::store::StoreError,
    },
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where objects are kept (`--store`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// In memory: the simulated store is everything.
    Memory,
    /// In a real etcd (`--etcd-endpoints`), with the in-memory store as the watch cache.
    Etcd,
}

/// `--cost-model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CostModel {
    /// Serve as fast as possible: no modeled cost, no crashes.
    None,
    /// Charge each request what a real apiserver and etcd would spend (bench/MODEL.md).
    Modeled,
}

/// The serving certificate with `--tls`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServingCert {
    /// Issued by a CA generated at start; both are written to `cert_dir` if given.
    Generated { cert_dir: Option<PathBuf> },
    /// `--tls-cert-file` and `--tls-private-key-file` (PEM).
    Files { cert: PathBuf, key: PathBuf },
}

/// Everything the simulator needs to start; each field's meaning and default is documented
/// on the flag of the same name in [`crate::cli::SimArgs`].
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Address to serve on; port 0 picks a free port.
    pub listen: String,
    /// HTTPS when set.
    pub tls: Option<ServingCert>,
    pub kubeconfig_out: Option<PathBuf>,
    pub seed: SeedSpec,
    pub max_requests_inflight: usize,
    pub max_mutating_requests_inflight: usize,
    pub history_window: usize,
    pub store: StoreKind,
    pub etcd_endpoints: Vec<String>,
    pub watch_cache_wait_timeout: Duration,
    pub max_request_body_bytes: usize,
    pub bookmark_interval: Duration,
    pub count_poll_period: Duration,
    pub kubelet_delete_delay: Duration,
    /// `--kubelet` and `--scheduler`: the simulator's own clients.
    pub cluster: crate::sim::cluster::ClusterConfig,
    pub exit_with_stdin: bool,
    pub authn: AuthnConfig,
    pub model: ModelConfig,
    pub kube_version: crate::sim::kube_version::KubeVersion,
}

pub(crate) fn read_file(path: &Path) -> Result<String, SimError> {
    std::fs::read_to_string(path).map_err(|source| SimError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The TLS server config and, when we generated the certificate, the CA that signed it.
pub fn tls_setup(
    serving: &ServingCert,
    authn: &AuthnConfig,
) -> Result<(Arc<rustls::ServerConfig>, Option<String>), SimError> {
    let (cert, key, ca) = match serving {
        ServingCert::Files { cert, key } => (read_file(cert)?, read_file(key)?, None),
        ServingCert::Generated { cert_dir } => {
            let ca = CertAuthority::generate("tollgate-sim-ca")
                .map_err(|e| SimError::Config(e.to_string()))?;
            let serving = ca
                .issue_server(&["localhost", "127.0.0.1", "::1"])
                .map_err(|e| SimError::Config(e.to_string()))?;
            if let Some(dir) = cert_dir {
                ca.cert_key_pem()
                    .write_to_dir(dir, "ca")
                    .map_err(|e| SimError::Config(e.to_string()))?;
                serving
                    .write_to_dir(dir, "apiserver")
                    .map_err(|e| SimError::Config(e.to_string()))?;
            }
            (
                serving.cert_pem,
                serving.key_pem,
                Some(ca.cert_pem().to_string()),
            )
        }
    };
    let cfg = tls::server_config(&cert, &key, &authn.tls_client_auth())
        .map_err(|e| SimError::Config(e.to_string()))?;
    Ok((cfg, ca))
}
