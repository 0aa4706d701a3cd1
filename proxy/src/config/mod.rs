//! Configuration: a YAML file (`--config`) with every setting and its
//! default, and command-line flags that override the file. Parsed into typed
//! structs before any port is bound; unknown fields are errors.

use std::path::{Path, PathBuf};

use serde::Deserialize;

mod bounds;
pub mod diff;
mod flags;
pub mod settings;

pub use flags::Flags;
pub use settings::predict::{Patterns, Store, StoreSetting};

/// The configuration file's `apiVersion`.
pub const API_VERSION: &str = "tollgate.io/v1alpha1";
/// The configuration file's `kind`.
pub const KIND: &str = "TollgateConfiguration";

/// What tollgate does with what it learns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "camelCase")]
pub enum Mode {
    /// Forward, classify, learn, export; decide nothing (fail-open).
    Off,
    /// Decide everything, delay and reject nothing; metrics and logs say
    /// what enforcement would have done. How operators roll it out.
    #[default]
    #[value(name = "dryRun")]
    DryRun,
    /// Queue and reject (429) as decided.
    Enforce,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::DryRun => "dryRun",
            Mode::Enforce => "enforce",
        }
    }
}

/// The HTTP version of light requests to the apiservers (`upstream.lightProtocol`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LightProtocol {
    /// HTTP/2 streams on light-only connections.
    #[default]
    Http2,
    /// Kept-alive HTTP/1.1 connections, capped by `upstream.maxLightConnections`.
    Http1,
}

/// The whole configuration. Every field has a default right for a
/// 5,000-node cluster.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Config {
    /// The file's schema version, [`API_VERSION`]. Optional for now (a file
    /// without it is read as this version); any other value is refused.
    pub api_version: Option<String>,
    /// The file's kind, [`KIND`]. Optional for now; any other value is refused.
    pub kind: Option<String>,
    /// Client listener address. Default `0.0.0.0:6443`.
    pub listen: String,
    /// Client connections open at once; past it a new connection is closed
    /// as soon as it is accepted (counted in
    /// `tollgate_connections_refused_total`). Keep it under the process's
    /// open-file limit. Default `50000` (a 5,000-node cluster's kubelets,
    /// node agents and controllers, with room).
    pub max_connections: usize,
    /// Client connections open at once from one address (under
    /// `maxConnections`); past it that address's new connections are closed at
    /// once, so one address holding silent connections cannot lock out the others.
    /// `0`: no such cap. Behind a load balancer that hides client addresses
    /// (every client then comes from its few addresses) raise it or set `0`.
    /// Default `1000` (a node's agents hold tens; a controller pod, hundreds at most).
    pub max_connections_per_source: usize,
    /// Admin listener (`/metrics`, `/healthz`, `/readyz`, `/debug/patterns`);
    /// `null` turns it off. Default `127.0.0.1:9443`.
    pub admin_listen: Option<String>,
    /// The admin listener's bounds.
    pub admin: Admin,
    /// Decision mode. Default `dryRun`.
    pub mode: Mode,
    /// Serving TLS and client authentication.
    pub tls: ServingTls,
    /// The apiservers.
    pub upstream: Upstream,
    /// Client-side timeouts.
    pub timeouts: Timeouts,
    /// The pattern cache and predictor.
    pub patterns: Patterns,
    /// Graceful drain on SIGTERM.
    pub drain: Drain,
    /// TokenReviews telling who a bearer token belongs to (classification only).
    pub token_review: TokenReview,
    /// Lanes and their in-flight limits.
    pub lanes: settings::enforce::Lanes,
    /// The byte-cost quota pool, fair queues, per-client limits.
    pub quota: settings::enforce::Quota,
    /// The relist-storm guard.
    pub relist_guard: settings::enforce::RelistGuard,
}

/// Bounds of the admin listener, which serves scrapers and operators: a few
/// connections, never held open.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Admin {
    /// Connections open at once; past it a new one is closed at once. Default `64`.
    pub max_connections: usize,
    /// Seconds a client has to send its request headers. Default `10`.
    pub header_read_seconds: f64,
    /// Seconds a connection may stay open with no request in flight. Default `60`.
    pub idle_seconds: f64,
    /// TLS on the admin listener. `/debug/patterns` names users and `/metrics`
    /// the cluster's shape: bind the listener to 127.0.0.1, or serve it over
    /// TLS with a client CA, whose certificates `/metrics` and `/debug/*` then
    /// require (401 without one). `/healthz`, `/livez` and `/readyz` stay open
    /// to anyone who reaches the listener (probes send no certificate).
    pub tls: ServingTls,
}

impl Default for Admin {
    fn default() -> Self {
        Admin {
            max_connections: 64,
            header_read_seconds: 10.0,
            idle_seconds: 60.0,
            tls: ServingTls::default(),
        }
    }
}

/// Asking the apiserver who a bearer token belongs to, for classification
/// only. Needs RBAC for tollgate's own identity to create `tokenreviews`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct TokenReview {
    /// Review tokens at all. Default `false`.
    pub enabled: bool,
    /// Seconds an answer is kept (a rejected token's too). Default `300`.
    pub cache_seconds: f64,
    /// Reviews a second one client address may cause, on average; its tokens past
    /// it are not reviewed then (classified by their claims). Default `1`.
    pub per_source_per_second: f64,
    /// Reviews one client address may cause at once after a quiet spell. Default `10`.
    pub per_source_burst: usize,
    /// Reviews of one client address's tokens in flight at once. Default `2`.
    pub per_source_in_flight: usize,
}

impl Default for TokenReview {
    fn default() -> Self {
        TokenReview {
            enabled: false,
            cache_seconds: 300.0,
            per_source_per_second: 1.0,
            per_source_burst: 10,
            per_source_in_flight: 2,
        }
    }
}

/// TLS toward clients. Without cert and key tollgate serves plain HTTP. The
/// files' content is re-read when it changes ([`crate::tls::serving`]); their
/// paths need a restart.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ServingTls {
    /// Serving certificate chain (PEM). Default: none (plain HTTP).
    pub cert_file: Option<PathBuf>,
    /// Serving private key (PEM). Default: none.
    pub key_file: Option<PathBuf>,
    /// CA that client certificates are verified against. Default: none
    /// (client certificates are not requested).
    pub client_ca_file: Option<PathBuf>,
}

/// The apiservers and tollgate's credentials toward them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Upstream {
    /// apiserver URLs (`https://host:port`). Default: none; at least one is
    /// required unless `kubeconfig` names the server.
    pub urls: Vec<String>,
    /// kubeconfig whose current context gives the server (when `urls` is
    /// empty), the CA (when `caFile` is unset) and tollgate's own identity
    /// (when `clientCertFile` is unset). Default: none.
    pub kubeconfig: Option<PathBuf>,
    /// CA that the apiservers' serving certificates are verified against.
    /// Default: none (only `http://` upstreams work).
    pub ca_file: Option<PathBuf>,
    /// Front-proxy client certificate, presented with the identity headers of
    /// certificate clients. Default: none (certificate clients are forwarded anonymous).
    pub front_proxy_cert_file: Option<PathBuf>,
    /// Front-proxy private key. Default: none.
    pub front_proxy_key_file: Option<PathBuf>,
    /// tollgate's own client certificate, for health checks only. Default: none.
    pub client_cert_file: Option<PathBuf>,
    /// tollgate's own private key. Default: none.
    pub client_key_file: Option<PathBuf>,
    /// Most open requests per HTTP/2 connection to an apiserver; another
    /// connection is opened past it. Keep at or below the apiserver's
    /// `--http2-max-streams-per-connection` (100 on recent releases). Default `100`.
    pub max_streams_per_connection: usize,
    /// The HTTP version of light requests (everything but LISTs, watches,
    /// long-running requests and the heavy lane) to the apiservers: `http2`,
    /// streams on connections of their own beside the bulk ones; `http1`,
    /// kept-alive HTTP/1.1 connections, one request at a time each, at most
    /// `maxLightConnections` busy (past it, HTTP/2). Bulk requests are always
    /// HTTP/2. Default `http2` (bench/RESULTS.md, issue 21). Needs a restart.
    pub light_protocol: LightProtocol,
    /// With `lightProtocol: http1`: most light requests in flight over
    /// HTTP/1.1 at once, hence busy HTTP/1.1 connections to any apiserver;
    /// past it light requests go over HTTP/2 (they never wait for a
    /// connection). Idle connections are kept up to this many per apiserver
    /// (anonymous and front-proxy each) and closed after 60 s. Default `256`:
    /// a 5,000-node cluster's heartbeats and controllers keep tens in
    /// flight per master, and the apiserver serves 600 at once by default.
    pub max_light_connections: usize,
    /// Seconds to open a connection to an apiserver: TCP connect and TLS
    /// handshake together, on every path (watches and upgrades included).
    /// Past it the request gets a 504 Status and the upstream is ejected.
    /// Default `10`.
    pub connect_timeout_seconds: f64,
    /// Bounds on each exchange with an apiserver once connected: response
    /// headers, pauses in a body, HTTP/2 pings (see [`crate::forward::stall`]).
    pub timeouts: settings::forward::UpstreamTimeouts,
    /// Health check settings.
    pub health_check: HealthCheck,
    /// Scraping of the apiserver's object counts (`apiserver_storage_objects`,
    /// or `etcd_object_counts` on older releases) into the resource priors.
    pub metrics_scrape: MetricsScrape,
    /// Request headers the apiservers take as front-proxy identity, beside
    /// `X-Remote-*` and those learned from ConfigMap
    /// `kube-system/extension-apiserver-authentication`: stripped from every
    /// request (see [`crate::requestheader`]). Needed in enforce mode with a
    /// front-proxy certificate when tollgate cannot read that ConfigMap.
    pub request_headers: settings::requestheader::Settings,
}

/// Periodic scrape of an upstream's `/metrics`, with tollgate's own identity.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct MetricsScrape {
    /// Scrape at all. Default `true`.
    pub enabled: bool,
    /// Path requested. Default `/metrics`.
    pub path: String,
    /// Seconds between scrapes. Default `30`.
    pub interval_seconds: f64,
}

impl Default for MetricsScrape {
    fn default() -> Self {
        MetricsScrape {
            enabled: true,
            path: "/metrics".into(),
            interval_seconds: 30.0,
        }
    }
}

/// Periodic health checks of each upstream.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct HealthCheck {
    /// Check at all. Default `true`.
    pub enabled: bool,
    /// Path requested. Default `/readyz`.
    pub path: String,
    /// Seconds between checks (and between retries of an ejected upstream). Default `5`.
    pub interval_seconds: f64,
    /// Seconds a check may take. Default `2`.
    pub timeout_seconds: f64,
}

/// Client-side timeouts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Timeouts {
    /// Seconds a client has to send its request headers (HTTP/1). Default `10`.
    pub header_read_seconds: f64,
    /// Seconds for an ordinary (not long-running) request to get its response
    /// headers from the apiserver; the apiserver's own limit is 60. Default `70`.
    pub request_seconds: f64,
    /// Seconds between HTTP/2 keep-alive pings to clients. Default `30`.
    pub keep_alive_seconds: f64,
    /// Seconds a client connection may stay open with no request in flight
    /// (a watch is in flight for as long as it lasts), as the apiserver's 90. Default `90`.
    pub idle_seconds: f64,
}

/// Graceful drain.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Drain {
    /// Seconds over which open connections (and their watches) are closed
    /// after SIGTERM, so clients do not all relist at once. Default `30`.
    pub window_seconds: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            api_version: None,
            kind: None,
            listen: "0.0.0.0:6443".into(),
            max_connections: 50_000,
            max_connections_per_source: 1000,
            admin_listen: Some("127.0.0.1:9443".into()),
            admin: Admin::default(),
            mode: Mode::DryRun,
            tls: ServingTls::default(),
            upstream: Upstream::default(),
            timeouts: Timeouts::default(),
            patterns: Patterns::default(),
            drain: Drain::default(),
            token_review: TokenReview::default(),
            lanes: Default::default(),
            quota: Default::default(),
            relist_guard: Default::default(),
        }
    }
}

impl Default for Upstream {
    fn default() -> Self {
        Upstream {
            urls: Vec::new(),
            kubeconfig: None,
            ca_file: None,
            front_proxy_cert_file: None,
            front_proxy_key_file: None,
            client_cert_file: None,
            client_key_file: None,
            max_streams_per_connection: 100,
            light_protocol: LightProtocol::Http2,
            max_light_connections: 256,
            connect_timeout_seconds: 10.0,
            timeouts: Default::default(),
            health_check: HealthCheck::default(),
            metrics_scrape: MetricsScrape::default(),
            request_headers: Default::default(),
        }
    }
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck {
            enabled: true,
            path: "/readyz".into(),
            interval_seconds: 5.0,
            timeout_seconds: 2.0,
        }
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header_read_seconds: 10.0,
            request_seconds: 70.0,
            keep_alive_seconds: 30.0,
            idle_seconds: 90.0,
        }
    }
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            window_seconds: 30.0,
        }
    }
}

/// A refused setting.
fn invalid(field: &'static str, reason: &str) -> Result<(), ConfigError> {
    Err(ConfigError::Invalid {
        field,
        reason: reason.to_string(),
    })
}

/// A configuration that cannot be used, with where and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid setting {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error(transparent)]
    Kubeconfig(#[from] kubeio::kubeconfig::KubeconfigError),
}

impl Config {
    /// Admission's part of the configuration.
    pub fn admission(&self) -> settings::enforce::AdmissionSettings<'_> {
        settings::enforce::AdmissionSettings {
            lanes: &self.lanes,
            quota: &self.quota,
            relist_guard: &self.relist_guard,
        }
    }

    /// The file named by `flags.config` (or the defaults), with the flags applied, validated.
    pub fn load(flags: &Flags) -> Result<Config, ConfigError> {
        let mut config = match &flags.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        config.apply(flags);
        if let (true, Some(path)) = (config.upstream.urls.is_empty(), &config.upstream.kubeconfig) {
            config.upstream.urls = vec![kubeio::kubeconfig::load_file(path)?.server];
        }
        config.validate()?;
        Ok(config)
    }

    /// Parse a YAML file; the error names the line and the reason.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_yaml(&text).map_err(|message| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parse YAML text; an empty document is the defaults.
    pub fn from_yaml(text: &str) -> Result<Config, String> {
        if text.trim().is_empty() {
            return Ok(Config::default());
        }
        serde_saphyr::from_str(text).map_err(|e| e.to_string())
    }

    /// Checks that need no files: pairs given together, every number in its
    /// range ([`bounds`]), URLs. Start, `check-config` and reload all call it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_version()?;
        self.validate_upstream_urls()?;
        self.validate_pairs()?;
        self.validate_bounds()?;
        self.upstream
            .request_headers
            .validate()
            .and_then(|()| self.lanes.validate())
            .and_then(|()| self.quota.validate())
            .and_then(|()| self.relist_guard.validate())
            .map_err(|(field, reason)| ConfigError::Invalid { field, reason })
    }

    /// `apiVersion` and `kind`, when given, are the ones this build reads.
    fn validate_version(&self) -> Result<(), ConfigError> {
        for (field, given, want) in [
            ("apiVersion", &self.api_version, API_VERSION),
            ("kind", &self.kind, KIND),
        ] {
            match given {
                Some(v) if v != want => {
                    return invalid(
                        field,
                        &format!("{v:?} is not supported; this tollgate reads {field}: {want}"),
                    )
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn validate_upstream_urls(&self) -> Result<(), ConfigError> {
        if self.upstream.urls.is_empty() {
            return invalid(
                "upstream.urls",
                "at least one upstream URL is required (--upstream)",
            );
        }
        for url in &self.upstream.urls {
            let uri: http::Uri = url.parse().map_err(|e| ConfigError::Invalid {
                field: "upstream.urls",
                reason: format!("{url:?}: {e}"),
            })?;
            match uri.scheme_str() {
                Some("http") | Some("https") if uri.authority().is_some() => {}
                _ => {
                    return invalid(
                        "upstream.urls",
                        &format!("{url:?} is not an http(s)://host:port URL"),
                    )
                }
            }
        }
        Ok(())
    }

    /// Files that only work together: both or neither.
    fn validate_pairs(&self) -> Result<(), ConfigError> {
        let pair = |a: &Option<PathBuf>, b: &Option<PathBuf>| a.is_some() == b.is_some();
        if !pair(&self.tls.cert_file, &self.tls.key_file) {
            return invalid("tls.certFile/keyFile", "give both or neither");
        }
        if self.tls.client_ca_file.is_some() && self.tls.cert_file.is_none() {
            return invalid(
                "tls.clientCaFile",
                "client certificates need TLS (tls.certFile)",
            );
        }
        if !pair(&self.admin.tls.cert_file, &self.admin.tls.key_file) {
            return invalid("admin.tls.certFile/keyFile", "give both or neither");
        }
        if self.admin.tls.client_ca_file.is_some() && self.admin.tls.cert_file.is_none() {
            return invalid(
                "admin.tls.clientCaFile",
                "client certificates need TLS on the admin listener (admin.tls.certFile)",
            );
        }
        if !pair(
            &self.upstream.front_proxy_cert_file,
            &self.upstream.front_proxy_key_file,
        ) {
            return invalid(
                "upstream.frontProxyCertFile/KeyFile",
                "give both or neither",
            );
        }
        if !pair(
            &self.upstream.client_cert_file,
            &self.upstream.client_key_file,
        ) {
            return invalid("upstream.clientCertFile/KeyFile", "give both or neither");
        }
        Ok(())
    }
}

/// The running configuration, replaced whole by a reload; each reader takes
/// an `Arc` of the version it started with (one per request).
pub type Current = crate::snapshot::Snapshot<Config>;

#[cfg(test)]
mod tests;
