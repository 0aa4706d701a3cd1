//! rustls configurations: serving (with optional client certificates) and
//! the upstream client (CA, optional client identity, ALPN). ring is the only
//! crypto provider.
//!
//! Client certificates are handled as kube-apiserver handles them: the TLS
//! handshake accepts any certificate the client proves it holds the key of,
//! and the chain is checked against the client CA afterwards
//! ([`ClientCertAuthority::verify`]), by the authenticator. A certificate
//! from an unknown CA is then no identity (the request may still carry a
//! bearer token), instead of a handshake failure the client can only report
//! as a broken connection.
//!
//! [`serving`]: the serving certificate and client CA of a listener, re-read
//! when their files change.

pub mod serving;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

/// A certificate, key or CA that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read PEM {what} from {path}: {reason}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("no certificate in {0}")]
    Empty(PathBuf),
    #[error("TLS setup ({what}): {source}")]
    Rustls {
        what: &'static str,
        #[source]
        source: rustls::Error,
    },
    #[error("client CA {path}: {reason}")]
    Verifier { path: PathBuf, reason: String },
}

/// A certificate chain and its key.
#[derive(Debug)]
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Identity {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

/// Every certificate in a PEM file.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_err = |reason: String| TlsError::Pem {
        what: "certificates",
        path: path.to_path_buf(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::Empty(path.to_path_buf()));
    }
    Ok(certs)
}

/// A certificate chain and private key from two PEM files.
pub fn load_identity(cert: &Path, key: &Path) -> Result<Identity, TlsError> {
    let chain = load_certs(cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Pem {
        what: "private key",
        path: key.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok(Identity { chain, key })
}

/// Every certificate in PEM bytes; `origin` names them in errors.
pub fn certs_from_pem(pem: &[u8], origin: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what: "certificates",
            path: origin.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty(origin.to_path_buf()));
    }
    Ok(certs)
}

/// A chain and key from PEM bytes; `origin` names them in errors.
pub fn identity_from_pem(cert: &[u8], key: &[u8], origin: &Path) -> Result<Identity, TlsError> {
    let chain = certs_from_pem(cert, origin)?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsError::Pem {
        what: "private key",
        path: origin.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok(Identity { chain, key })
}

/// A root store from PEM bytes; `origin` names them in errors.
pub fn roots_from_pem(pem: &[u8], origin: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certs_from_pem(pem, origin)? {
        roots.add(cert).map_err(|source| TlsError::Rustls {
            what: "CA certificate",
            source,
        })?;
    }
    Ok(roots)
}

/// A root store of the certificates in a PEM file.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|source| TlsError::Rustls {
            what: "CA certificate",
            source,
        })?;
    }
    Ok(roots)
}

/// Serving configuration offering h2 and http/1.1. With a client CA,
/// certificates are requested but not required (token users, anonymous), and
/// any certificate is accepted at the handshake: [`ClientCertAuthority`]
/// decides afterwards whether it is an identity.
pub fn server_config(
    identity: Identity,
    clients: Option<&ClientCertAuthority>,
) -> Result<ServerConfig, TlsError> {
    crate::install_crypto_provider();
    let builder = ServerConfig::builder();
    let builder = match clients {
        Some(authority) => builder.with_client_cert_verifier(Arc::new(DeferToAuthenticator {
            authority: authority.clone(),
        })),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(identity.chain, identity.key)
        .map_err(|source| TlsError::Rustls {
            what: "serving certificate",
            source,
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

// === impl ClientCertAuthority ===

/// The client CA, checking certificate chains after the handshake.
#[derive(Debug, Clone)]
pub struct ClientCertAuthority {
    verifier: Arc<dyn ClientCertVerifier>,
}

impl ClientCertAuthority {
    /// The CA certificates in the PEM file `path`.
    pub fn load(path: &Path) -> Result<Self, TlsError> {
        ClientCertAuthority::new(load_roots(path)?, path)
    }

    /// The CA certificates `roots`, read from `origin` (named in errors).
    pub fn new(roots: RootCertStore, origin: &Path) -> Result<Self, TlsError> {
        crate::install_crypto_provider();
        let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
            .allow_unauthenticated()
            .build()
            .map_err(|e| TlsError::Verifier {
                path: origin.to_path_buf(),
                reason: e.to_string(),
            })?;
        Ok(ClientCertAuthority { verifier })
    }

    /// Whether `chain` (leaf first, as the client sent it) is signed by this
    /// CA, valid now and meant for client authentication.
    pub fn verify(&self, chain: &[CertificateDer<'_>]) -> bool {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return false;
        };
        self.verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .is_ok()
    }
}

/// The handshake side of client certificates: the client must prove it holds
/// the certificate's key (the signature checks), but the chain itself is left
/// to the authenticator, as in kube-apiserver, whose handshake requests client
/// certificates with `VerifyClientCertIfGiven` and whose x509 authenticator
/// then fails the request, not the connection.
#[derive(Debug)]
struct DeferToAuthenticator {
    authority: ClientCertAuthority,
}

impl ClientCertVerifier for DeferToAuthenticator {
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        // The CA names tell clients with several certificates which to send.
        self.authority.verifier.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.authority
            .verifier
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.authority
            .verifier
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.authority.verifier.supported_verify_schemes()
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }
}

/// Client configuration toward the apiservers: verify against `roots`
/// (none: an empty store, so only plain `http://` upstreams work), present
/// `identity` if given. ALPN is set by the connector.
pub fn client_config(
    roots: Option<&RootCertStore>,
    identity: Option<&Identity>,
) -> Result<ClientConfig, TlsError> {
    crate::install_crypto_provider();
    let builder = ClientConfig::builder()
        .with_root_certificates(roots.cloned().unwrap_or_else(RootCertStore::empty));
    match identity {
        Some(id) => builder
            .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
            .map_err(|source| TlsError::Rustls {
                what: "upstream client certificate",
                source,
            }),
        None => Ok(builder.with_no_client_auth()),
    }
}
