//! A listener's serving certificate, key and client CA, re-read when their files change, as
//! kube-apiserver's dynamic serving certificates are: kubeadm renews certificates in place and
//! cert-manager or kubelet's secret volumes swap them, and the listener picks them up without a
//! restart.
//!
//! Every [`FILE_POLL`] the files are read (a few KiB) and hashed; when the bytes changed they
//! are parsed into a new TLS configuration that new connections get ([`ServingCerts::current`]).
//! Connections already open keep the configuration they were accepted with, so none is dropped.
//! Files that do not parse (a certificate whose new key is not written yet, a truncated file)
//! are refused, logged and counted once, and the running certificate stays; the next change is
//! tried again. Reading the content rather than the modification time also sees the symlink
//! swaps of Kubernetes secret volumes, which leave a file's own mtime alone.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::ServerConfig;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::{identity_from_pem, roots_from_pem, server_config, ClientCertAuthority, TlsError};
use crate::config::ServingTls;
use crate::metrics::{ListenerResultLabel, Metrics};
use crate::snapshot::Snapshot;

/// How often the certificate files (and the configuration file) are checked for changes.
pub const FILE_POLL: Duration = Duration::from_secs(2);

/// What a new connection is served with.
pub struct Served {
    /// The TLS configuration: the serving chain and key, the client CA's verifier.
    pub config: Arc<ServerConfig>,
    /// The client CA that checks a certificate after the handshake (see [`super`]), from the
    /// same file as the configuration's verifier.
    pub clients: Option<ClientCertAuthority>,
}

/// The result of one check of the files.
#[derive(Debug)]
pub enum Refresh {
    /// The files hold what was last tried.
    Unchanged,
    /// New files, loaded: new connections get them.
    Reloaded,
    /// New files that do not load; the running certificate stays.
    Refused(TlsError),
}

/// One listener's serving TLS, reloaded when its files change.
pub struct ServingCerts {
    /// `client` or `admin`: the metrics' and logs' `listener`.
    listener: &'static str,
    files: ServingTls,
    current: Snapshot<Served>,
    /// The hash of the bytes last tried, loaded or refused: a refused file is reported once.
    tried: Mutex<[u8; 32]>,
}

/// The three files' bytes and their hash.
struct Read {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Option<Vec<u8>>,
    hash: [u8; 32],
}

impl ServingCerts {
    /// Load `settings`' files for `listener`; `None` without a certificate (plain HTTP).
    pub fn load(
        listener: &'static str,
        settings: &ServingTls,
    ) -> Result<Option<ServingCerts>, TlsError> {
        let (Some(_), Some(_)) = (&settings.cert_file, &settings.key_file) else {
            return Ok(None);
        };
        let read = read(settings)?;
        let served = parse(settings, &read)?;
        Ok(Some(ServingCerts {
            listener,
            files: settings.clone(),
            current: Snapshot::new(served),
            tried: Mutex::new(read.hash),
        }))
    }

    /// What a connection accepted now is served with.
    pub fn current(&self) -> Arc<Served> {
        self.current.get()
    }

    /// `client` or `admin`.
    pub fn listener(&self) -> &'static str {
        self.listener
    }

    /// Read the files; when their bytes changed since the last try, load them.
    pub fn refresh(&self) -> Refresh {
        let read = match read(&self.files) {
            Ok(r) => r,
            Err(e) => {
                // An unreadable file (mid-rotation, removed) counts once per distinct error.
                let hash = Sha256::digest(e.to_string().as_bytes()).into();
                return match self.try_new(hash) {
                    true => Refresh::Refused(e),
                    false => Refresh::Unchanged,
                };
            }
        };
        if !self.try_new(read.hash) {
            return Refresh::Unchanged;
        }
        match parse(&self.files, &read) {
            Ok(served) => {
                self.current.set(served);
                Refresh::Reloaded
            }
            Err(e) => Refresh::Refused(e),
        }
    }

    /// Whether `hash` differs from what was last tried; it is the last tried from now on.
    fn try_new(&self, hash: [u8; 32]) -> bool {
        let mut tried = match self.tried.lock() {
            Ok(t) => t,
            Err(e) => e.into_inner(),
        };
        std::mem::replace(&mut *tried, hash) != hash
    }
}

/// The files' bytes, hashed together (with their lengths, so bytes moving from one file to
/// the next are a change).
fn read(files: &ServingTls) -> Result<Read, TlsError> {
    let bytes = |path: &Path, what: &'static str| {
        std::fs::read(path).map_err(|e| TlsError::Pem {
            what,
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    };
    let (Some(cert_file), Some(key_file)) = (&files.cert_file, &files.key_file) else {
        return Err(TlsError::Empty(Default::default()));
    };
    let cert = bytes(cert_file, "certificates")?;
    let key = bytes(key_file, "private key")?;
    let ca = files
        .client_ca_file
        .as_deref()
        .map(|p| bytes(p, "client CA"))
        .transpose()?;
    let mut h = Sha256::new();
    for part in [Some(&cert), Some(&key), ca.as_ref()].into_iter().flatten() {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    Ok(Read {
        hash: h.finalize().into(),
        cert,
        key,
        ca,
    })
}

/// A TLS configuration from the files' bytes; the key must match the certificate.
fn parse(files: &ServingTls, read: &Read) -> Result<Served, TlsError> {
    let origin = files.cert_file.as_deref().unwrap_or(Path::new(""));
    let identity = identity_from_pem(&read.cert, &read.key, origin)?;
    let clients = match (&read.ca, &files.client_ca_file) {
        (Some(pem), Some(path)) => {
            Some(ClientCertAuthority::new(roots_from_pem(pem, path)?, path)?)
        }
        _ => None,
    };
    let config = server_config(identity, clients.as_ref())?;
    Ok(Served {
        config: Arc::new(config),
        clients,
    })
}

/// Check `certs`' files every [`FILE_POLL`] until `stop`; log and count each reload
/// (`tollgate_certificate_reloads_total{listener, result}`).
pub async fn reload_loop(
    certs: Vec<Arc<ServingCerts>>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    if certs.is_empty() {
        return;
    }
    let mut tick = tokio::time::interval(FILE_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        for c in &certs {
            // File reads and key parsing: off the request threads.
            let certs = c.clone();
            let Ok(refresh) = tokio::task::spawn_blocking(move || certs.refresh()).await else {
                continue;
            };
            let listener = c.listener();
            let result = match refresh {
                Refresh::Unchanged => continue,
                Refresh::Reloaded => {
                    tracing::info!(
                        listener,
                        "serving certificate files changed: reloaded; new connections use them"
                    );
                    "ok"
                }
                Refresh::Refused(e) => {
                    tracing::error!(listener, error = %e, "serving certificate files changed but do not load; keeping the running certificate");
                    "error"
                }
            };
            metrics
                .certificate_reloads
                .get_or_create(&ListenerResultLabel { listener, result })
                .inc();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may unwrap
mod tests {
    use super::*;

    struct Files {
        dir: tempfile::TempDir,
        settings: ServingTls,
    }

    fn pem_pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn files(with_ca: bool) -> Files {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pem_pair("one.test");
        std::fs::write(dir.path().join("tls.crt"), cert).unwrap();
        std::fs::write(dir.path().join("tls.key"), key).unwrap();
        let ca_path = dir.path().join("ca.crt");
        if with_ca {
            std::fs::write(&ca_path, pem_pair("ca.test").0).unwrap();
        }
        let settings = ServingTls {
            cert_file: Some(dir.path().join("tls.crt")),
            key_file: Some(dir.path().join("tls.key")),
            client_ca_file: with_ca.then_some(ca_path),
        };
        Files { dir, settings }
    }

    #[test]
    fn new_files_are_loaded_once_and_a_bad_pair_is_refused_once() {
        let f = files(true);
        let certs = ServingCerts::load("client", &f.settings).unwrap().unwrap();
        let first = certs.current();
        assert!(first.clients.is_some());
        assert!(matches!(certs.refresh(), Refresh::Unchanged));

        // A new certificate whose key is not written yet: refused, the old one stays.
        let (cert, key) = pem_pair("two.test");
        std::fs::write(f.dir.path().join("tls.crt"), &cert).unwrap();
        assert!(matches!(certs.refresh(), Refresh::Refused(_)));
        assert!(Arc::ptr_eq(&certs.current().config, &first.config));
        assert!(
            matches!(certs.refresh(), Refresh::Unchanged),
            "refused once"
        );

        // The key follows: loaded.
        std::fs::write(f.dir.path().join("tls.key"), &key).unwrap();
        assert!(matches!(certs.refresh(), Refresh::Reloaded));
        assert!(!Arc::ptr_eq(&certs.current().config, &first.config));
        assert!(matches!(certs.refresh(), Refresh::Unchanged));

        // A new client CA alone is a change too; a garbled one is refused.
        std::fs::write(f.dir.path().join("ca.crt"), pem_pair("ca2.test").0).unwrap();
        assert!(matches!(certs.refresh(), Refresh::Reloaded));
        std::fs::write(f.dir.path().join("ca.crt"), "not a certificate").unwrap();
        assert!(matches!(certs.refresh(), Refresh::Refused(_)));
        // A file gone (mid-rotation) is refused once, and its return reloads.
        std::fs::remove_file(f.dir.path().join("ca.crt")).unwrap();
        assert!(matches!(certs.refresh(), Refresh::Refused(_)));
        assert!(matches!(certs.refresh(), Refresh::Unchanged));
        std::fs::write(f.dir.path().join("ca.crt"), pem_pair("ca3.test").0).unwrap();
        assert!(matches!(certs.refresh(), Refresh::Reloaded));
    }

    #[test]
    fn no_certificate_is_plain_http_and_a_bad_one_fails_the_start() {
        let none = ServingTls::default();
        assert!(ServingCerts::load("admin", &none).unwrap().is_none());
        let f = files(false);
        std::fs::write(f.dir.path().join("tls.key"), pem_pair("other.test").1).unwrap();
        assert!(
            ServingCerts::load("admin", &f.settings).is_err(),
            "key of another certificate"
        );
    }
}
