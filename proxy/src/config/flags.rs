//! The command-line flags that override the file's settings, each with
//! its default in its help.

use std::path::PathBuf;

use super::settings::budget::QuotaMode;
use super::{Config, Mode};

/// Flags; each one given overrides the file.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Flags {
    /// YAML configuration file; flags override its settings [default: none, built-in defaults]
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address clients connect to [default: 0.0.0.0:6443]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// apiserver URL; repeat for several (least outstanding requests) [default: none, required]
    #[arg(long = "upstream", value_name = "URL")]
    pub upstreams: Vec<String>,
    /// kubeconfig giving the apiserver address, its CA and tollgate's own identity (for its own requests, as --upstream-client-cert) [default: none]
    #[arg(long, value_name = "FILE")]
    pub upstream_kubeconfig: Option<PathBuf>,
    /// CA bundle (PEM) verifying the apiservers' serving certificates [default: none]
    #[arg(long, value_name = "FILE")]
    pub upstream_ca: Option<PathBuf>,
    /// Serving certificate (PEM), as kube-apiserver's flag; with --tls-private-key-file turns on TLS toward clients; re-read when the file changes (tls.certFile) [default: none, plain HTTP]
    #[arg(long, alias = "tls-cert", value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// Serving private key (PEM), as kube-apiserver's flag; re-read when the file changes (tls.keyFile) [default: none]
    #[arg(long, alias = "tls-key", value_name = "FILE")]
    pub tls_private_key_file: Option<PathBuf>,
    /// CA (PEM) verifying client certificates, as kube-apiserver's flag; re-read when the file changes (tls.clientCaFile) [default: none, certificates not requested]
    #[arg(long, alias = "client-ca", value_name = "FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// Front-proxy client certificate presented to the apiserver with the identity headers of certificate clients [default: none]
    #[arg(long, value_name = "FILE")]
    pub front_proxy_cert: Option<PathBuf>,
    /// Front-proxy private key [default: none]
    #[arg(long, value_name = "FILE")]
    pub front_proxy_key: Option<PathBuf>,
    /// Identity headers the apiserver trusts, comma-separated, as its flag of the same name; stripped from every request beside X-Remote-* and those learned from ConfigMap kube-system/extension-apiserver-authentication (upstream.requestHeaders.usernameHeaders) [default: none]
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub requestheader_username_headers: Vec<String>,
    /// Group headers the apiserver trusts, comma-separated, as its flag of the same name (upstream.requestHeaders.groupHeaders) [default: none]
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub requestheader_group_headers: Vec<String>,
    /// Extra-header prefixes the apiserver trusts, comma-separated, as its flag of the same name (upstream.requestHeaders.extraHeadersPrefixes) [default: none]
    #[arg(long, value_name = "PREFIXES", value_delimiter = ',')]
    pub requestheader_extra_headers_prefix: Vec<String>,
    /// UID headers the apiserver trusts, comma-separated, as its flag of the same name; for an apiserver without that flag (before 1.32) name any, e.g. X-Remote-Uid: with all four lists set tollgate need not learn them to be ready (upstream.requestHeaders.uidHeaders) [default: none]
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub requestheader_uid_headers: Vec<String>,
    /// tollgate's own client certificate, for its own requests: health checks, the metrics scrape, the identity-headers ConfigMap, TokenReviews, the container count (upstream.clientCertFile) [default: none]
    #[arg(long, value_name = "FILE")]
    pub upstream_client_cert: Option<PathBuf>,
    /// tollgate's own private key, with --upstream-client-cert (upstream.clientKeyFile) [default: none]
    #[arg(long, value_name = "FILE")]
    pub upstream_client_key: Option<PathBuf>,
    /// Admin listener address (/metrics, /healthz, /readyz, /debug/patterns, /debug/budget) [default: 127.0.0.1:9443]
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// Admin listener's serving certificate (PEM); with --admin-tls-private-key-file turns on TLS there; re-read when the file changes (admin.tls.certFile) [default: none, plain HTTP]
    #[arg(long, alias = "admin-tls-cert", value_name = "FILE")]
    pub admin_tls_cert_file: Option<PathBuf>,
    /// Admin listener's private key (PEM); re-read when the file changes (admin.tls.keyFile) [default: none]
    #[arg(long, alias = "admin-tls-key", value_name = "FILE")]
    pub admin_tls_private_key_file: Option<PathBuf>,
    /// CA (PEM) whose client certificates /metrics and /debug/* require; /healthz, /livez, /readyz stay open; re-read when the file changes (admin.tls.clientCaFile) [default: none, open]
    #[arg(long, alias = "admin-client-ca", value_name = "FILE")]
    pub admin_client_ca_file: Option<PathBuf>,
    /// Decision mode: off = decide nothing; dryRun = decide and count, delay and reject nothing; enforce = queue and reject (429) [default: dryRun]
    #[arg(long, value_enum)]
    pub mode: Option<Mode>,
    /// Heavy-lane budget: static = the pool and in-flight budget as configured; adaptive = steered by the protected lanes' latency, the static values as ceilings where set (quota.mode) [default: adaptive]
    #[arg(long, value_enum, value_name = "MODE")]
    pub quota_mode: Option<QuotaMode>,
    /// Refill rate of the byte-cost quota pool, bytes per second; in adaptive mode, when set, its ceiling (quota.bytesPerSecond) [default: 268435456; adaptive: no ceiling but quota.adaptive.maxBytesPerSecond, 4 GiB/s]
    #[arg(long, value_name = "BYTES")]
    pub quota_bytes_per_second: Option<f64>,
    /// Most bytes the quota pool holds (quota.burstBytes); static mode only: the adaptive pool holds no burst, it paces [default: 1073741824]
    #[arg(long, value_name = "BYTES")]
    pub quota_burst_bytes: Option<f64>,
    /// Seconds a heavy request may wait for the quota pool before a 429, e.g. 10 or 2.5s (quota.maxWaitSeconds) [default: 10]
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub max_wait: Option<f64>,
    /// Cluster-wide etcd-read bytes per second shared by the tollgates of all masters through etcd; 0 = off (quota.global.etcdBytesPerSecond) [default: 0, off]
    #[arg(long, value_name = "BYTES")]
    pub global_etcd_bytes_per_second: Option<f64>,
    /// Name of the shared budget in its default key prefix /tollgate/budget/<NAME> (quota.global.cluster) [default: default]
    #[arg(long, value_name = "NAME")]
    pub global_cluster: Option<String>,
    /// etcd servers the shared budget coordinates through, comma-separated, as kube-apiserver's flag (quota.global.etcdServers) [default: none, shared budget off]
    #[arg(long, value_name = "URLS", value_delimiter = ',')]
    pub etcd_servers: Vec<String>,
    /// CA (PEM) verifying etcd's serving certificate, as kube-apiserver's flag (quota.global.caFile) [default: none]
    #[arg(long, value_name = "FILE")]
    pub etcd_cafile: Option<PathBuf>,
    /// Client certificate (PEM) presented to etcd, as kube-apiserver's flag (quota.global.certFile) [default: none]
    #[arg(long, value_name = "FILE")]
    pub etcd_certfile: Option<PathBuf>,
    /// Private key (PEM) of --etcd-certfile, as kube-apiserver's flag (quota.global.keyFile) [default: none]
    #[arg(long, value_name = "FILE")]
    pub etcd_keyfile: Option<PathBuf>,
}

/// `10`, `2.5`, `10s` or `500ms` as seconds.
fn parse_seconds(s: &str) -> Result<f64, String> {
    let (number, scale) = match s.strip_suffix("ms") {
        Some(n) => (n, 0.001),
        None => (s.strip_suffix('s').unwrap_or(s), 1.0),
    };
    let v: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    Ok(v * scale)
}

impl Config {
    /// Override settings with the flags that were given.
    pub fn apply(&mut self, flags: &Flags) {
        fn set<T: Clone>(target: &mut T, flag: &Option<T>) {
            if let Some(v) = flag {
                *target = v.clone();
            }
        }
        fn set_f64(target: &mut f64, flag: Option<f64>) {
            if let Some(v) = flag {
                *target = v;
            }
        }
        fn set_opt<T: Clone>(target: &mut Option<T>, flag: &Option<T>) {
            if flag.is_some() {
                *target = flag.clone();
            }
        }
        set(&mut self.listen, &flags.listen);
        set_opt(&mut self.admin_listen, &flags.admin_listen);
        set(&mut self.mode, &flags.mode);
        set(&mut self.quota.mode, &flags.quota_mode);
        set_opt(
            &mut self.quota.bytes_per_second,
            &flags.quota_bytes_per_second,
        );
        set_opt(&mut self.quota.burst_bytes, &flags.quota_burst_bytes);
        set_f64(&mut self.quota.max_wait_seconds, flags.max_wait);
        let global = &mut self.quota.global;
        set_f64(
            &mut global.etcd_bytes_per_second,
            flags.global_etcd_bytes_per_second,
        );
        set(&mut global.cluster, &flags.global_cluster);
        if !flags.etcd_servers.is_empty() {
            global.etcd_servers.clone_from(&flags.etcd_servers);
        }
        set_opt(&mut global.ca_file, &flags.etcd_cafile);
        set_opt(&mut global.cert_file, &flags.etcd_certfile);
        set_opt(&mut global.key_file, &flags.etcd_keyfile);
        if !flags.upstreams.is_empty() {
            self.upstream.urls = flags.upstreams.clone();
        }
        let names = &mut self.upstream.request_headers;
        for (target, flag) in [
            (
                &mut names.username_headers,
                &flags.requestheader_username_headers,
            ),
            (&mut names.group_headers, &flags.requestheader_group_headers),
            (
                &mut names.extra_headers_prefixes,
                &flags.requestheader_extra_headers_prefix,
            ),
            (&mut names.uid_headers, &flags.requestheader_uid_headers),
        ] {
            if !flag.is_empty() {
                target.clone_from(flag);
            }
        }
        set_opt(&mut self.upstream.ca_file, &flags.upstream_ca);
        set_opt(&mut self.upstream.kubeconfig, &flags.upstream_kubeconfig);
        set_opt(&mut self.tls.cert_file, &flags.tls_cert_file);
        set_opt(&mut self.tls.key_file, &flags.tls_private_key_file);
        set_opt(&mut self.tls.client_ca_file, &flags.client_ca_file);
        set_opt(&mut self.admin.tls.cert_file, &flags.admin_tls_cert_file);
        set_opt(
            &mut self.admin.tls.key_file,
            &flags.admin_tls_private_key_file,
        );
        set_opt(
            &mut self.admin.tls.client_ca_file,
            &flags.admin_client_ca_file,
        );
        set_opt(
            &mut self.upstream.front_proxy_cert_file,
            &flags.front_proxy_cert,
        );
        set_opt(
            &mut self.upstream.front_proxy_key_file,
            &flags.front_proxy_key,
        );
        set_opt(
            &mut self.upstream.client_cert_file,
            &flags.upstream_client_cert,
        );
        set_opt(
            &mut self.upstream.client_key_file,
            &flags.upstream_client_key,
        );
    }
}
