//! TLS for the simulated apiserver, set up the way kube-apiserver's is: HTTP/2 and HTTP/1.1
//! over ALPN, and client certificates *optional* — a client without one can still present a
//! bearer token or be anonymous. A certificate that is presented must chain to one of the
//! trusted bundles (`--client-ca-file` ∪ `--requestheader-client-ca-file`); *which* of them
//! signed it, and so what it may assert, is decided per request by [`super::authn`].
//!
//! rustls runs on ring only (see DEPENDENCIES.md); the configs here name the ring provider
//! explicitly, so they work whether or not a process-wide default was installed.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{VerifierBuilderError, WebPkiClientVerifier};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::pki::CertKeyPem;

/// ALPN protocols the sim offers, preferred first, as kube-apiserver does.
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading PEM of the {what}")]
    Pem {
        what: &'static str,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("no certificate found in the {what} PEM")]
    NoCertificate { what: &'static str },
    #[error("certificate of the {what} is not usable as a trust root")]
    BadRoot {
        what: &'static str,
        #[source]
        source: rustls::Error,
    },
    #[error("building the client certificate verifier")]
    Verifier(#[source] VerifierBuilderError),
    #[error("building the TLS configuration")]
    Config(#[source] rustls::Error),
}

/// Which client certificates the server asks for and accepts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientAuth {
    /// PEM bundles whose union the presented certificate must chain to. Empty: the server
    /// does not ask for client certificates at all.
    pub ca_bundles: Vec<String>,
}

// === impl ClientAuth ===

impl ClientAuth {
    /// No client certificates requested.
    pub fn none() -> Self {
        Self::default()
    }

    /// Client certificates requested but optional, verified against the union of `bundles`
    /// (`None`s skipped, so `[client_ca, requestheader_ca]` can be passed as they are).
    pub fn optional<'a>(bundles: impl IntoIterator<Item = Option<&'a str>>) -> Self {
        Self {
            ca_bundles: bundles.into_iter().flatten().map(str::to_owned).collect(),
        }
    }
}

/// Installs ring as the process-wide rustls provider; a provider already installed (ring, by
/// someone else) is left alone.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// All certificates in a PEM bundle, in order; at least one.
pub fn parse_certs(
    pem: &str,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem { what, source })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { what });
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in a PEM document.
pub fn parse_key(pem: &str, what: &'static str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|source| TlsError::Pem { what, source })
}

/// A root store holding every certificate of every bundle.
pub fn root_store<'a>(
    bundles: impl IntoIterator<Item = &'a str>,
    what: &'static str,
) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for bundle in bundles {
        for cert in parse_certs(bundle, what)? {
            roots
                .add(cert)
                .map_err(|source| TlsError::BadRoot { what, source })?;
        }
    }
    Ok(roots)
}

/// A verifier accepting client certificates that chain to `bundles` (with the clientAuth
/// usage, in their validity period). `optional`: a client may also present none.
pub fn client_cert_verifier<'a>(
    bundles: impl IntoIterator<Item = &'a str>,
    what: &'static str,
    optional: bool,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let roots = Arc::new(root_store(bundles, what)?);
    let mut builder = WebPkiClientVerifier::builder_with_provider(roots, provider());
    if optional {
        builder = builder.allow_unauthenticated();
    }
    builder.build().map_err(TlsError::Verifier)
}

/// Accepts any client certificate at the handshake (still checking that the
/// client holds its key) and leaves trust to the authenticator, as
/// kube-apiserver does: a certificate from an unknown CA gets 401, not a
/// failed handshake.
#[derive(Debug)]
struct DeferToAuthenticator {
    /// For the CA hints sent to clients and the handshake signature checks.
    inner: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for DeferToAuthenticator {
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        Ok(rustls::server::danger::ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }
}

/// The server side: serving chain and key (PEM), ALPN h2 + http/1.1, client certificates as
/// `client_auth` says.
pub fn server_config(
    cert_pem: &str,
    key_pem: &str,
    client_auth: &ClientAuth,
) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = parse_certs(cert_pem, "serving certificate")?;
    let key = parse_key(key_pem, "serving key")?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?;
    let builder = if client_auth.ca_bundles.is_empty() {
        builder.with_no_client_auth()
    } else {
        let bundles = client_auth.ca_bundles.iter().map(String::as_str);
        let inner = client_cert_verifier(bundles, "client CA", true)?;
        builder.with_client_cert_verifier(Arc::new(DeferToAuthenticator { inner }))
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(TlsError::Config)?;
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// The client side, for tests and loadgen-like clients: trusts `ca_pem`, presents `identity`
/// if given. No ALPN is set: set `alpn_protocols` to what the HTTP client speaks, then wrap
/// the config in an `Arc`.
pub fn client_config(
    ca_pem: &str,
    identity: Option<&CertKeyPem>,
) -> Result<ClientConfig, TlsError> {
    let roots = root_store([ca_pem], "server CA")?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_root_certificates(roots);
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some(id) => {
            let chain = parse_certs(&id.cert_pem, "client certificate")?;
            let key = parse_key(&id.key_pem, "client key")?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(TlsError::Config)
        }
    }
}

/// The client's certificate chain (leaf first) on an accepted connection, owned, ready for
/// [`super::authn::Authenticator::authenticate`]; `None` when the client sent none.
pub fn peer_certificates<IO>(
    stream: &tokio_rustls::server::TlsStream<IO>,
) -> Option<Vec<CertificateDer<'static>>> {
    let (_, conn) = stream.get_ref();
    conn.peer_certificates()
        .filter(|certs| !certs.is_empty())
        .map(<[_]>::to_vec)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may unwrap
mod tests {
    use super::*;
    use crate::sim::auth::pki::CertAuthority;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// Runs one handshake on loopback; returns what the server saw (peer certs, ALPN) or
    /// the client's handshake error.
    async fn handshake(
        server: Arc<ServerConfig>,
        client: ClientConfig,
    ) -> Result<(Option<Vec<CertificateDer<'static>>>, Option<Vec<u8>>), std::io::Error> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        let server_task = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(tcp).await?;
            let seen = (
                peer_certificates(&tls),
                tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec),
            );
            tls.write_all(b"ok").await?;
            tls.shutdown().await?;
            Ok::<_, std::io::Error>(seen)
        });
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let client_result = async {
            let mut tls = connector.connect(name, tcp).await?;
            let mut buf = Vec::new();
            tls.read_to_end(&mut buf).await?;
            assert_eq!(buf, b"ok");
            Ok::<_, std::io::Error>(())
        }
        .await;
        let server_result = server_task.await.unwrap();
        client_result.and(server_result)
    }

    fn setup() -> (CertAuthority, CertAuthority, Arc<ServerConfig>) {
        let serving_ca = CertAuthority::generate("serving-ca").unwrap();
        let client_ca = CertAuthority::generate("client-ca").unwrap();
        let front_proxy_ca = CertAuthority::generate("front-proxy-ca").unwrap();
        let serving = serving_ca
            .issue_server(&["localhost", "127.0.0.1"])
            .unwrap();
        let auth =
            ClientAuth::optional([Some(client_ca.cert_pem()), Some(front_proxy_ca.cert_pem())]);
        let server = server_config(&serving.cert_pem, &serving.key_pem, &auth).unwrap();
        (serving_ca, client_ca, server)
    }

    #[tokio::test]
    async fn server_sees_client_certificate_and_negotiates_h2() {
        let (serving_ca, client_ca, server) = setup();
        let alice = client_ca.issue_client("alice", &["dev"]).unwrap();
        let mut client = client_config(serving_ca.cert_pem(), Some(&alice)).unwrap();
        client.alpn_protocols = vec![b"h2".to_vec()];
        let (certs, alpn) = handshake(server, client).await.unwrap();
        let certs = certs.expect("server sees the client certificate");
        assert_eq!(certs[0], parse_certs(&alice.cert_pem, "t").unwrap()[0]);
        assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    }

    #[tokio::test]
    async fn client_without_certificate_is_accepted() {
        let (serving_ca, _, server) = setup();
        let mut client = client_config(serving_ca.cert_pem(), None).unwrap();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        let (certs, alpn) = handshake(server, client).await.unwrap();
        assert!(certs.is_none());
        assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
    }

    #[tokio::test]
    async fn certificate_from_an_untrusted_ca_is_left_to_the_authenticator() {
        // As kube-apiserver: the handshake succeeds and the request gets 401.
        let (serving_ca, _, server) = setup();
        let stranger = CertAuthority::generate("client-ca").unwrap();
        let mallory = stranger
            .issue_client("mallory", &["system:masters"])
            .unwrap();
        let client = client_config(serving_ca.cert_pem(), Some(&mallory)).unwrap();
        let (certs, _) = handshake(server, client).await.unwrap();
        let certs = certs.expect("the server sees the certificate");
        let authn =
            crate::sim::auth::authn::Authenticator::new(crate::sim::auth::authn::AuthnConfig {
                client_ca_pem: Some(
                    CertAuthority::generate("real-ca")
                        .unwrap()
                        .cert_pem()
                        .to_string(),
                ),
                ..Default::default()
            })
            .unwrap();
        assert!(authn
            .authenticate(&http::HeaderMap::new(), Some(&certs))
            .is_err());
    }

    #[test]
    fn bad_pem_is_a_clear_error() {
        let err = server_config("not pem", "not pem", &ClientAuth::none()).unwrap_err();
        assert!(err.to_string().contains("serving certificate"), "{err}");
        let err = ClientAuth::optional([Some("garbage")]);
        assert!(
            client_cert_verifier(err.ca_bundles.iter().map(String::as_str), "client CA", true)
                .is_err()
        );
    }
}
