//! How to reach the API server (shared by runs, scenarios, seed and cleanup).

use std::path::PathBuf;

use crate::target::{HttpVersion, TargetOptions};

/// How to reach the API server (shared by runs, seed and cleanup).
#[derive(Debug, Clone, clap::Args)]
pub struct TargetArgs {
    /// API server URL (e.g. https://127.0.0.1:6443); without it the kubeconfig is used, else (in a pod) the service account.
    #[arg(long, help_heading = "Target")]
    pub server: Option<String>,
    /// Kubeconfig file [default: $KUBECONFIG, else ~/.kube/config]; exec credential plugins are run.
    #[arg(long, help_heading = "Target")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context [default: current-context].
    #[arg(long, help_heading = "Target")]
    pub context: Option<String>,
    /// PEM CA bundle to verify the server [default: the kubeconfig's].
    #[arg(long, help_heading = "Target")]
    pub certificate_authority: Option<PathBuf>,
    /// PEM client certificate (with --client-key) [default: the kubeconfig's].
    #[arg(long, help_heading = "Target")]
    pub client_certificate: Option<PathBuf>,
    /// PEM client private key [default: the kubeconfig's].
    #[arg(long, help_heading = "Target")]
    pub client_key: Option<PathBuf>,
    /// Bearer token [default: the kubeconfig's].
    #[arg(long, help_heading = "Target")]
    pub token: Option<String>,
    /// Do not verify the server certificate [default: false].
    #[arg(long, help_heading = "Target")]
    pub insecure_skip_tls_verify: bool,
    /// Server name to verify the certificate against [default: the URL's host].
    #[arg(long, help_heading = "Target")]
    pub tls_server_name: Option<String>,
    /// HTTP version: auto = HTTP/2 over TLS when offered, else HTTP/1.1 (client-go's behaviour).
    #[arg(long, value_enum, default_value_t = HttpVersion::Auto, help_heading = "Target")]
    pub http_version: HttpVersion,
    /// Shorthand for --http-version 2.
    #[arg(long, help_heading = "Target")]
    pub http2: bool,
    /// In a pod without a kubeconfig: the service-account directory. Hidden: a
    /// pod always has the kubelet's mount; tests cannot write there, so they
    /// point this at files of their own.
    #[arg(long, hide = true, default_value = kubeio::incluster::SERVICE_ACCOUNT_DIR)]
    pub service_account_dir: PathBuf,
}

impl TargetArgs {
    /// The target options these flags describe.
    pub fn options(&self) -> TargetOptions {
        TargetOptions {
            server: self.server.clone(),
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            certificate_authority: self.certificate_authority.clone(),
            client_certificate: self.client_certificate.clone(),
            client_key: self.client_key.clone(),
            token: self.token.clone(),
            insecure_skip_tls_verify: self.insecure_skip_tls_verify,
            tls_server_name: self.tls_server_name.clone(),
            service_account_dir: Some(self.service_account_dir.clone()),
            http: if self.http2 {
                HttpVersion::Http2
            } else {
                self.http_version
            },
        }
    }
}
