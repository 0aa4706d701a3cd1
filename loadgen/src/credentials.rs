//! The credentials requests carry, kept fresh for long runs: a static bearer
//! token; a `tokenFile` re-read every minute (as client-go's cached file token
//! source does), so a rotated service-account token is picked up; or an exec
//! plugin's credential (see [`kubeio::exec`]), cached until its
//! `expirationTimestamp` and fetched again then, or after a 401.
//!
//! Requests only read the current value (a lock held for a clone). A
//! background thread does the re-reading and re-running, so a slow plugin
//! never stalls a driver's schedule; the first credential is fetched before
//! the run starts, so a broken plugin fails the run up front.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use http::HeaderValue;
use kubeio::exec::{ExecError, ExecOutput, ExecPlugin};
use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// How often a `tokenFile` is read again (client-go: once a minute).
pub const TOKEN_FILE_PERIOD: Duration = Duration::from_secs(60);
/// After a 401, the credential is fetched again, but not more often than this.
const MIN_REFRESH_GAP: Duration = Duration::from_secs(1);
/// After a failed refresh, the next attempt waits this long.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);
/// The refresh thread checks at least this often whether it is still needed.
const MAX_IDLE_WAIT: Duration = Duration::from_secs(1);

/// Why credentials could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("kubeconfig user `{user}`: reading tokenFile {path}")]
    TokenFile {
        user: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{user}: the bearer token is not a valid header value")]
    Token { user: String },
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("kubeconfig user `{user}`: the client certificate from exec plugin `{command}` is unusable: {reason}")]
    ExecCert {
        user: String,
        command: String,
        reason: String,
    },
}

/// Where the bearer token or client certificate comes from.
#[derive(Debug, Clone)]
pub enum Source {
    None,
    /// `--token` or the kubeconfig's `token`.
    Static(String),
    /// The kubeconfig's `tokenFile` (resolved path) and user.
    TokenFile {
        user: String,
        path: PathBuf,
    },
    /// The kubeconfig's `exec` plugin (boxed: it is much larger than the rest).
    Exec(Box<ExecPlugin>),
}

/// The current credentials of a target; cheap to clone, shared by every
/// client of the run.
#[derive(Debug, Clone)]
pub struct Credentials {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    source: Source,
    /// How often a token file is read again.
    period: Duration,
    current: RwLock<Current>,
    /// The exec plugin's client certificate, for new TLS connections.
    cert: Arc<ExecCert>,
    control: Mutex<Control>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct Current {
    header: Option<HeaderValue>,
    expires: Option<SystemTime>,
}

#[derive(Debug)]
struct Control {
    /// When the credential was last fetched (or a fetch failed).
    fetched: Instant,
    /// The next periodic fetch; `None`: only on request.
    next: Option<Instant>,
    /// A 401 or an expired credential asks for a fetch.
    requested: bool,
}

impl Credentials {
    /// No credentials (anonymous, or client certificates from files only).
    pub fn none() -> Credentials {
        Credentials::with(Source::None, Current::default(), None, TOKEN_FILE_PERIOD)
    }

    /// Reads the token file or runs the plugin once (failing with the user
    /// and the command), then keeps the credential fresh in the background.
    pub fn start(source: Source) -> Result<Credentials, CredentialsError> {
        Credentials::start_with(source, TOKEN_FILE_PERIOD)
    }

    fn start_with(source: Source, period: Duration) -> Result<Credentials, CredentialsError> {
        let (current, next, cert) = match &source {
            Source::None => (Current::default(), None, None),
            Source::Static(token) => (
                Current {
                    header: Some(bearer(token, "the bearer token")?),
                    expires: None,
                },
                None,
                None,
            ),
            Source::TokenFile { user, path } => (
                Current {
                    header: Some(read_token_file(user, path)?),
                    expires: None,
                },
                Some(Instant::now() + period),
                None,
            ),
            Source::Exec(plugin) => {
                let out = plugin.run()?;
                let (current, cert) = exec_current(plugin, out)?;
                (current, None, cert)
            }
        };
        let creds = Credentials::with(source, current, next, period);
        if let Some(cert) = cert {
            creds.inner.cert.set(cert);
        }
        if matches!(
            creds.inner.source,
            Source::TokenFile { .. } | Source::Exec(_)
        ) {
            let weak = Arc::downgrade(&creds.inner);
            std::thread::Builder::new()
                .name("loadgen-credentials".into())
                .spawn(move || refresh_loop(weak))
                .map_err(|e| match &creds.inner.source {
                    Source::Exec(p) => CredentialsError::Exec(ExecError::Spawn {
                        user: p.user.clone(),
                        command: p.command_line(),
                        hint: " (no thread to refresh it)".into(),
                        source: e,
                    }),
                    _ => CredentialsError::Token {
                        user: "tokenFile".into(),
                    },
                })?;
        }
        Ok(creds)
    }

    fn with(
        source: Source,
        current: Current,
        next: Option<Instant>,
        period: Duration,
    ) -> Credentials {
        Credentials {
            inner: Arc::new(Inner {
                source,
                period,
                current: RwLock::new(current),
                cert: Arc::new(ExecCert::default()),
                control: Mutex::new(Control {
                    fetched: Instant::now(),
                    next,
                    requested: false,
                }),
                wake: Condvar::new(),
            }),
        }
    }

    /// The `Authorization` header for the next request, if any. An expired
    /// exec credential is still returned (the server decides) while a fresh
    /// one is fetched.
    pub fn authorization(&self) -> Option<HeaderValue> {
        // The read lock is released before asking for a refresh: locks are
        // never held together (no order to get wrong).
        let (header, expired) = {
            let cur = self.inner.current.read().unwrap_or_else(|p| p.into_inner());
            let expired = cur.expires.is_some_and(|e| SystemTime::now() >= e);
            (cur.header.clone(), expired)
        };
        if expired {
            self.request_refresh();
        }
        header
    }

    /// A request was answered 401: fetch the credential again (at most once a
    /// second), as client-go does for exec plugins; also re-reads a token file.
    pub fn unauthorized(&self) {
        if matches!(
            self.inner.source,
            Source::TokenFile { .. } | Source::Exec(_)
        ) {
            self.request_refresh();
        }
    }

    fn request_refresh(&self) {
        let mut ctl = self.inner.control.lock().unwrap_or_else(|p| p.into_inner());
        if !ctl.requested {
            ctl.requested = true;
            self.inner.wake.notify_one();
        }
    }

    /// For TLS: the exec plugin's client certificate, current at each handshake.
    pub fn client_cert_resolver(&self) -> Option<Arc<dyn ResolvesClientCert>> {
        matches!(self.inner.source, Source::Exec(_))
            .then(|| self.inner.cert.clone() as Arc<dyn ResolvesClientCert>)
    }

    /// Whether the plugin returned a client certificate.
    pub fn has_exec_cert(&self) -> bool {
        self.inner.cert.has_certs()
    }
}

fn bearer(token: &str, user: &str) -> Result<HeaderValue, CredentialsError> {
    let mut v = HeaderValue::from_str(&format!("Bearer {}", token.trim())).map_err(|_| {
        CredentialsError::Token {
            user: user.to_string(),
        }
    })?;
    v.set_sensitive(true);
    Ok(v)
}

fn read_token_file(user: &str, path: &PathBuf) -> Result<HeaderValue, CredentialsError> {
    let token = std::fs::read_to_string(path).map_err(|source| CredentialsError::TokenFile {
        user: user.to_string(),
        path: path.clone(),
        source,
    })?;
    bearer(&token, &format!("kubeconfig user `{user}`: tokenFile"))
}

fn exec_current(
    plugin: &ExecPlugin,
    out: ExecOutput,
) -> Result<(Current, Option<Arc<CertifiedKey>>), CredentialsError> {
    let who = format!("kubeconfig user `{}`: exec plugin token", plugin.user);
    let header = out.token.as_deref().map(|t| bearer(t, &who)).transpose()?;
    let cert = out
        .client_cert
        .map(|(cert, key)| certified_key(&cert, &key))
        .transpose()
        .map_err(|reason| CredentialsError::ExecCert {
            user: plugin.user.clone(),
            command: plugin.command_line(),
            reason,
        })?;
    Ok((
        Current {
            header,
            expires: out.expires,
        },
        cert,
    ))
}

fn certified_key(cert: &[u8], key: &[u8]) -> Result<Arc<CertifiedKey>, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("certificate: {e}"))?;
    if chain.is_empty() {
        return Err("no PEM certificate in clientCertificateData".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("key: {e}"))?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key, &provider)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

/// Fetches the credential again whenever it is due or asked for, until the
/// last [`Credentials`] is dropped.
fn refresh_loop(weak: Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        // An expiring exec credential is fetched again when it expires.
        let expires = inner
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .expires;
        let now = Instant::now();
        let expiry = expires.map(|e| {
            now + e
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
        });
        let due = {
            let ctl = inner.control.lock().unwrap_or_else(|p| p.into_inner());
            let next = [ctl.next, expiry].into_iter().flatten().min();
            // Never more than once a second, even for a plugin whose
            // credential is expired when it arrives, or that keeps being refused.
            let earliest = ctl.fetched + MIN_REFRESH_GAP;
            let wanted = ctl.requested || next.is_some_and(|n| now >= n);
            if wanted && now >= earliest {
                true
            } else {
                let until = if wanted { Some(earliest) } else { next };
                let wait = until
                    .map_or(MAX_IDLE_WAIT, |t| t.saturating_duration_since(now))
                    .min(MAX_IDLE_WAIT);
                // Woken early by a request for a refresh; either way, look again.
                drop(inner.wake.wait_timeout(ctl, wait));
                false
            }
        };
        if due {
            refresh(&inner);
        }
    }
}

fn refresh(inner: &Inner) {
    let result = match &inner.source {
        Source::TokenFile { user, path } => read_token_file(user, path).map(|h| {
            (
                Current {
                    header: Some(h),
                    expires: None,
                },
                None,
            )
        }),
        Source::Exec(plugin) => plugin
            .run()
            .map_err(CredentialsError::from)
            .and_then(|out| exec_current(plugin, out)),
        Source::None | Source::Static(_) => return,
    };
    let now = Instant::now();
    let next = match result {
        Ok((current, cert)) => {
            if let Some(cert) = cert {
                inner.cert.set(cert);
            }
            *inner.current.write().unwrap_or_else(|p| p.into_inner()) = current;
            matches!(inner.source, Source::TokenFile { .. }).then_some(now + inner.period)
        }
        Err(e) => {
            // Keep using the last credential; the server will say if it is no good.
            tracing::warn!(error = %e, "refreshing credentials failed; keeping the previous ones");
            // An expired exec credential would be due again at once: wait first.
            let mut cur = inner.current.write().unwrap_or_else(|p| p.into_inner());
            cur.expires = cur.expires.map(|_| SystemTime::now() + RETRY_AFTER_FAILURE);
            Some(now + RETRY_AFTER_FAILURE)
        }
    };
    let mut ctl = inner.control.lock().unwrap_or_else(|p| p.into_inner());
    ctl.fetched = now;
    ctl.requested = false;
    ctl.next = next;
}

// === impl ExecCert ===

/// The exec plugin's client certificate, swapped when the plugin runs again;
/// rustls asks for it at each handshake, so new connections use the newest.
#[derive(Debug, Default)]
struct ExecCert(RwLock<Option<Arc<CertifiedKey>>>);

impl ExecCert {
    fn set(&self, key: Arc<CertifiedKey>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Some(key);
    }
}

impl ResolvesClientCert for ExecCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn has_certs(&self) -> bool {
        self.0.read().unwrap_or_else(|p| p.into_inner()).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_is_read_again_periodically() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        std::fs::write(&path, "one\n").expect("write");
        let source = Source::TokenFile {
            user: "sa".into(),
            path: path.clone(),
        };
        let creds = Credentials::start_with(source, Duration::from_millis(100)).expect("start");
        assert_eq!(
            creds.authorization(),
            Some(HeaderValue::from_static("Bearer one"))
        );
        std::fs::write(&path, "two\n").expect("rotate");
        // Re-read at most once a second: poll with a deadline.
        let deadline = Instant::now() + Duration::from_secs(10);
        while creds.authorization() != Some(HeaderValue::from_static("Bearer two")) {
            assert!(Instant::now() < deadline, "the rotated token was not read");
            std::thread::sleep(Duration::from_millis(20));
        }
        // A file that disappears keeps the last token.
        std::fs::remove_file(&path).expect("remove");
        assert_eq!(
            creds.authorization(),
            Some(HeaderValue::from_static("Bearer two"))
        );
        let err = Credentials::start(Source::TokenFile {
            user: "sa".into(),
            path,
        })
        .expect_err("missing file");
        assert!(
            err.to_string()
                .contains("kubeconfig user `sa`: reading tokenFile"),
            "{err}"
        );
    }

    #[test]
    fn exec_certificates_become_tls_client_certificates() {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["loadgen".to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let certified =
            certified_key(cert.pem().as_bytes(), key.serialize_pem().as_bytes()).expect("key");
        assert_eq!(certified.cert.len(), 1);
        let resolver = ExecCert::default();
        assert!(!resolver.has_certs());
        resolver.set(certified);
        assert!(resolver.has_certs());
        assert!(certified_key(b"no pem", b"no pem").is_err());
    }
}
