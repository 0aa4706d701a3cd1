//! Where the load goes and how to reach it: `--server` with TLS flags, a
//! kubeconfig context or, in a pod, the service account (see [`kubeio::incluster`]), with its [`Credentials`], and the pooled hyper client
//! (rustls, ring) used for everything but the scheduled operations (watches,
//! seeding, checks, scraping); those send through [`crate::conn`].
//!
//! HTTP version, as in client-go: `auto` offers HTTP/2 and HTTP/1.1 by ALPN over
//! TLS and speaks HTTP/1.1 over plain TCP; `2` forces HTTP/2 (prior knowledge
//! on plain TCP); `1.1` forces HTTP/1.1 (one connection per in-flight request).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Uri};
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kubeio::kubeconfig::{self, KubeconfigError};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::credentials::{Credentials, CredentialsError, Source};

/// Which HTTP version to speak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum HttpVersion {
    /// HTTP/2 over TLS when the server offers it (ALPN), else HTTP/1.1 (client-go's default).
    #[default]
    Auto,
    /// HTTP/1.1 only.
    #[value(name = "1.1")]
    Http1,
    /// HTTP/2 only (prior knowledge on plain http://).
    #[value(name = "2")]
    Http2,
}

/// The target as given on the command line; `resolve` reads files and builds TLS.
#[derive(Debug, Clone, Default)]
pub struct TargetOptions {
    pub server: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub certificate_authority: Option<PathBuf>,
    pub client_certificate: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    pub token: Option<String>,
    pub insecure_skip_tls_verify: bool,
    pub tls_server_name: Option<String>,
    pub http: HttpVersion,
    /// Where the in-cluster service-account files are [default: the kubelet's mount].
    pub service_account_dir: Option<PathBuf>,
}

/// A resolved target: a server URL and the credentials to use on it.
#[derive(Debug, Clone)]
pub struct Target {
    pub server: Uri,
    /// The bearer token or exec credential, kept fresh; shared by every client.
    pub credentials: Credentials,
    /// The kubeconfig context's namespace, if any.
    pub namespace: Option<String>,
    pub http: HttpVersion,
    tls: Option<Arc<rustls::ClientConfig>>,
    tls_server_name: Option<String>,
}

/// Why a target could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error(transparent)]
    Kubeconfig(#[from] KubeconfigError),
    #[error("invalid server URL `{0}`: expected http(s)://host[:port][/prefix]")]
    Url(String),
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: no PEM {kind} found")]
    NoPem {
        what: &'static str,
        kind: &'static str,
    },
    #[error("{what}")]
    Tls {
        what: &'static str,
        #[source]
        source: rustls::Error,
    },
    #[error("https server {0} needs --certificate-authority (or a kubeconfig CA) or --insecure-skip-tls-verify")]
    NoTrust(String),
    #[error("--client-certificate and --client-key must be given together")]
    HalfClientCert,
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
}

impl TargetOptions {
    /// Resolves flags over the kubeconfig: an explicit `--server` needs no
    /// kubeconfig; any TLS or token flag overrides the kubeconfig's value.
    pub fn resolve(&self) -> Result<Target, TargetError> {
        self.resolve_with(None, None)
    }

    /// Like [`resolve`](Self::resolve), but for another URL (`--server-metrics`
    /// of the apiserver or etcd) and, if given, with credentials already
    /// started (so an exec plugin is not run once more per URL).
    pub fn resolve_with(
        &self,
        url: Option<&str>,
        credentials: Option<&Credentials>,
    ) -> Result<Target, TargetError> {
        let mut ctx = match &self.server {
            Some(s) => kubeconfig::ResolvedContext {
                server: s.clone(),
                ..Default::default()
            },
            None => kubeio::incluster::resolve(
                self.kubeconfig.as_deref(),
                self.context.as_deref(),
                self.service_account_dir.as_deref(),
            )?,
        };
        if let Some(p) = &self.certificate_authority {
            ctx.ca_pem = Some(read(p)?);
        }
        if self.client_certificate.is_some() != self.client_key.is_some() {
            return Err(TargetError::HalfClientCert);
        }
        if let (Some(c), Some(k)) = (&self.client_certificate, &self.client_key) {
            ctx.client_cert_pem = Some(read(c)?);
            ctx.client_key_pem = Some(read(k)?);
        }
        if let Some(t) = &self.token {
            ctx.token = Some(t.clone());
        }
        ctx.insecure_skip_tls_verify |= self.insecure_skip_tls_verify;
        if self.tls_server_name.is_some() {
            ctx.tls_server_name = self.tls_server_name.clone();
        }
        if let Some(u) = url {
            ctx.server = u.to_string();
        }
        let server: Uri = ctx
            .server
            .trim_end_matches('/')
            .parse()
            .map_err(|_| TargetError::Url(ctx.server.clone()))?;
        let scheme = server.scheme_str().unwrap_or("");
        if !(scheme == "http" || scheme == "https") || server.authority().is_none() {
            return Err(TargetError::Url(ctx.server.clone()));
        }
        // Checked before any plugin runs: a missing CA is the user's to fix first.
        if scheme == "https" && ctx.ca_pem.is_none() && !ctx.insecure_skip_tls_verify {
            return Err(TargetError::NoTrust(ctx.server.clone()));
        }
        let credentials = match credentials {
            Some(c) => c.clone(),
            None => Credentials::start(credential_source(&ctx))?,
        };
        let tls = if scheme == "https" {
            Some(Arc::new(tls_config(&ctx, &credentials)?))
        } else {
            None
        };
        Ok(Target {
            server,
            credentials,
            namespace: ctx.namespace,
            http: self.http,
            tls,
            tls_server_name: ctx.tls_server_name,
        })
    }
}

/// Where the credential comes from: `--token` or the kubeconfig's `token`,
/// else its `tokenFile`, else its exec plugin.
fn credential_source(ctx: &kubeconfig::ResolvedContext) -> Source {
    if let Some(t) = &ctx.token {
        return Source::Static(t.clone());
    }
    if let Some(path) = &ctx.token_file {
        return Source::TokenFile {
            user: ctx.user.clone().unwrap_or_default(),
            path: path.clone(),
        };
    }
    match &ctx.exec {
        Some(plugin) => Source::Exec(Box::new(plugin.clone())),
        None => Source::None,
    }
}

impl Target {
    /// The TLS configuration for `https://` targets (without ALPN).
    pub fn tls_config(&self) -> Option<Arc<rustls::ClientConfig>> {
        self.tls.clone()
    }

    /// `--tls-server-name` or the kubeconfig's, if set.
    pub fn tls_server_name(&self) -> Option<&str> {
        self.tls_server_name.as_deref()
    }
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, TargetError> {
    std::fs::read(path).map_err(|source| TargetError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn tls_config(
    ctx: &kubeconfig::ResolvedContext,
    credentials: &Credentials,
) -> Result<rustls::ClientConfig, TargetError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|source| TargetError::Tls {
            what: "TLS versions",
            source,
        })?;
    let builder = if ctx.insecure_skip_tls_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(insecure::AcceptAny(provider)))
    } else {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ctx.ca_pem.as_deref().unwrap_or_default()) {
            let cert = cert.map_err(|_| TargetError::NoPem {
                what: "certificate authority",
                kind: "certificate",
            })?;
            roots.add(cert).map_err(|source| TargetError::Tls {
                what: "certificate authority",
                source,
            })?;
        }
        if roots.is_empty() {
            return Err(TargetError::NoPem {
                what: "certificate authority",
                kind: "certificate",
            });
        }
        builder.with_root_certificates(roots)
    };
    match (&ctx.client_cert_pem, &ctx.client_key_pem) {
        (Some(cert), Some(key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<_, _>>()
                .map_err(|_| TargetError::NoPem {
                    what: "client certificate",
                    kind: "certificate",
                })?;
            if chain.is_empty() {
                return Err(TargetError::NoPem {
                    what: "client certificate",
                    kind: "certificate",
                });
            }
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| TargetError::NoPem {
                what: "client key",
                kind: "private key",
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|source| TargetError::Tls {
                    what: "client certificate",
                    source,
                })
        }
        // An exec plugin's certificate is looked up at each handshake, so a
        // rotated one is used by the next connection.
        _ => Ok(match credentials.client_cert_resolver() {
            Some(resolver) => builder.with_client_cert_resolver(resolver),
            None => builder.with_no_client_auth(),
        }),
    }
}

// === impl ApiClient ===

/// A pooled HTTP client bound to one target: builds requests with the base
/// path and bearer token, and sends them.
#[derive(Clone, Debug)]
pub struct ApiClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    base: Uri,
    credentials: Credentials,
}

impl ApiClient {
    /// A client for `target`.
    pub fn new(target: &Target) -> ApiClient {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(10)));
        let tls = match &target.tls {
            Some(t) => (**t).clone(),
            // Plain http:// never uses TLS; the connector still wants a config.
            // `loadgen::run` installs ring as the process default provider first.
            None => rustls::ClientConfig::builder()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        };
        let mut builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        if let Some(name) = target
            .tls_server_name
            .clone()
            .and_then(|n| ServerName::try_from(n).ok())
        {
            builder =
                builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
        }
        let connector = match target.http {
            HttpVersion::Auto => builder.enable_http1().enable_http2().wrap_connector(http),
            HttpVersion::Http1 => builder.enable_http1().wrap_connector(http),
            HttpVersion::Http2 => builder.enable_http2().wrap_connector(http),
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .http2_only(target.http == HttpVersion::Http2)
            .build(connector);
        ApiClient {
            client,
            base: target.server.clone(),
            credentials: target.credentials.clone(),
        }
    }

    /// A request to `path_and_query` (starting with `/`) under the server URL.
    pub fn request(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<(&'static str, Bytes)>,
    ) -> Result<Request<Full<Bytes>>, http::Error> {
        let prefix = self.base.path().trim_end_matches('/');
        let uri = Uri::builder()
            .scheme(self.base.scheme_str().unwrap_or("http"))
            .authority(self.base.authority().map(|a| a.as_str()).unwrap_or(""))
            .path_and_query(format!("{prefix}{path_and_query}"))
            .build()?;
        let mut b = Request::builder()
            .method(method)
            .uri(uri)
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::USER_AGENT, "loadgen/0.1");
        if let Some(a) = self.credentials.authorization() {
            b = b.header(http::header::AUTHORIZATION, a);
        }
        match body {
            Some((content_type, bytes)) => b
                .header(http::header::CONTENT_TYPE, content_type)
                .body(Full::new(bytes)),
            None => b.body(Full::new(Bytes::new())),
        }
    }

    /// Sends `req`; the response body is read by the caller.
    pub async fn send(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<http::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
        self.client.request(req).await
    }

    /// The server URL, for messages.
    pub fn server(&self) -> &Uri {
        &self.base
    }

    /// A response was 401: the credentials may need fetching again.
    pub fn unauthorized(&self) {
        self.credentials.unauthorized();
    }
}

mod insecure {
    //! `--insecure-skip-tls-verify`: accept any server certificate, but still
    //! check handshake signatures so the TLS session itself is sound.
    use std::sync::Arc;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};

    #[derive(Debug)]
    pub(super) struct AcceptAny(pub(super) Arc<CryptoProvider>);

    impl ServerCertVerifier for AcceptAny {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
}
