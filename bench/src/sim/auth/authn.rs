//! Who a request is, decided as kube-apiserver decides it, so the proxy's identity-based
//! lanes can be tested against the sim: front-proxy (request-header) identities, client
//! certificates, static bearer tokens, then anonymous.
//!
//! Order and outcomes follow kube-apiserver's union authenticator: each method either
//! succeeds (first success wins), does not apply, or fails; failures are collected and only
//! matter when nothing succeeded — then the request is a 401, never anonymous. With no method
//! configured at all, everyone is an admin (the sim's out-of-the-box mode).
//!
//! Both CAs sit in the TLS layer's root union, so the handshake alone does not say which one
//! signed a certificate; each CA therefore gets its own webpki verifier here, and a
//! certificate is trusted for a role only if *its* CA's signature verifies — a matching issuer
//! name proves nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use http::HeaderMap;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::{CertificateDer, UnixTime};
use x509_parser::prelude::{AttributeTypeAndValue, FromDer, X509Certificate};

use super::tls::{client_cert_verifier, ClientAuth, TlsError};
use super::token_file::TokenFile;
pub use super::token_file::TokenFileError;
use super::user::{UserInfo, MASTERS_GROUP};

pub const ADMIN_USER: &str = "system:admin";
pub const ANONYMOUS_USER: &str = "system:anonymous";
/// Who the simulator's own kubelet and scheduler are (kube-apiserver's loopback user).
pub const LOOPBACK_USER: &str = "system:apiserver";
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";

/// The authentication flags of kube-apiserver that the sim supports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthnConfig {
    /// `--token-auth-file`: CSV `token,user,uid[,"group1,group2"]`.
    pub token_auth_file: Option<PathBuf>,
    /// `--client-ca-file` contents: client certificates identify CN as user, O as groups.
    pub client_ca_pem: Option<String>,
    /// `--requestheader-client-ca-file` contents: the front proxies' CA.
    pub requestheader_client_ca_pem: Option<String>,
    /// `--requestheader-allowed-names`: front-proxy CNs accepted; empty means any.
    pub requestheader_allowed_names: Vec<String>,
    /// `--requestheader-username-headers` (default `X-Remote-User`).
    pub requestheader_username_headers: Vec<String>,
    /// `--requestheader-uid-headers` (default none, as in kube-apiserver).
    pub requestheader_uid_headers: Vec<String>,
    /// `--requestheader-group-headers` (default `X-Remote-Group`).
    pub requestheader_group_headers: Vec<String>,
    /// `--requestheader-extra-headers-prefix` (default `X-Remote-Extra-`).
    pub requestheader_extra_headers_prefix: Vec<String>,
    /// `--anonymous-auth` (default true): requests with no credentials are anonymous rather
    /// than 401.
    pub anonymous_auth: bool,
}

impl Default for AuthnConfig {
    fn default() -> Self {
        Self {
            token_auth_file: None,
            client_ca_pem: None,
            requestheader_client_ca_pem: None,
            requestheader_allowed_names: Vec::new(),
            requestheader_username_headers: vec!["X-Remote-User".into()],
            requestheader_uid_headers: Vec::new(),
            requestheader_group_headers: vec!["X-Remote-Group".into()],
            requestheader_extra_headers_prefix: vec!["X-Remote-Extra-".into()],
            anonymous_auth: true,
        }
    }
}

impl AuthnConfig {
    /// What the TLS server must ask of clients for this configuration.
    pub fn tls_client_auth(&self) -> ClientAuth {
        ClientAuth::optional([
            self.client_ca_pem.as_deref(),
            self.requestheader_client_ca_pem.as_deref(),
        ])
    }
}

/// A configuration the authenticator cannot start with.
#[derive(Debug, thiserror::Error)]
pub enum AuthnConfigError {
    #[error(transparent)]
    TokenFile(#[from] TokenFileError),
    #[error("the --client-ca-file bundle is not usable")]
    ClientCa(#[source] TlsError),
    #[error("the --requestheader-client-ca-file bundle is not usable")]
    RequestHeaderCa(#[source] TlsError),
}

/// One reason a request's credentials were refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthnFailure {
    #[error("invalid bearer token")]
    InvalidBearerToken,
    #[error("verifying certificate {subject} against the {ca} failed: {reason}")]
    UntrustedCertificate {
        subject: String,
        ca: &'static str,
        reason: String,
    },
    #[error("front-proxy certificate with CN {common_name:?} is not in the allowed names")]
    FrontProxyNotAllowed { common_name: String },
}

/// The request is unauthenticated (HTTP 401, a `Status` with reason `Unauthorized`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Unauthorized{}", describe(.failures))]
pub struct AuthnError {
    /// Why each applicable method failed; empty when no credentials were presented and
    /// anonymous requests are disabled.
    pub failures: Vec<AuthnFailure>,
}

fn describe(failures: &[AuthnFailure]) -> String {
    let reasons: Vec<String> = failures.iter().map(ToString::to_string).collect();
    match reasons.is_empty() {
        true => String::new(),
        false => format!(": {}", reasons.join("; ")),
    }
}

struct FrontProxy {
    verifier: Arc<dyn ClientCertVerifier>,
    allowed_names: Vec<String>,
    username_headers: Vec<String>,
    uid_headers: Vec<String>,
    group_headers: Vec<String>,
    /// Lowercased, as `http` stores header names.
    extra_prefixes: Vec<String>,
}

/// Authenticates requests; built once from [`AuthnConfig`], shared by all connections.
pub struct Authenticator {
    front_proxy: Option<FrontProxy>,
    client_ca: Option<Arc<dyn ClientCertVerifier>>,
    tokens: Option<TokenFile>,
    anonymous: bool,
    /// The bearer token of the simulator's own clients (`--kubelet`, `--scheduler`).
    loopback: Option<String>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("front_proxy", &self.front_proxy.is_some())
            .field("client_ca", &self.client_ca.is_some())
            .field("tokens", &self.tokens.as_ref().map(TokenFile::len))
            .field("anonymous", &self.anonymous)
            .finish()
    }
}

// === impl Authenticator ===

impl Authenticator {
    /// Reads the token file and builds one certificate verifier per CA.
    pub fn new(config: AuthnConfig) -> Result<Self, AuthnConfigError> {
        let tokens = match &config.token_auth_file {
            Some(path) => Some(TokenFile::read(path)?),
            None => None,
        };
        let client_ca = match &config.client_ca_pem {
            Some(pem) => Some(
                client_cert_verifier([pem.as_str()], "client CA", false)
                    .map_err(AuthnConfigError::ClientCa)?,
            ),
            None => None,
        };
        let front_proxy = match &config.requestheader_client_ca_pem {
            Some(pem) => Some(FrontProxy {
                verifier: client_cert_verifier([pem.as_str()], "requestheader client CA", false)
                    .map_err(AuthnConfigError::RequestHeaderCa)?,
                allowed_names: config.requestheader_allowed_names.clone(),
                username_headers: config.requestheader_username_headers.clone(),
                uid_headers: config.requestheader_uid_headers.clone(),
                group_headers: config.requestheader_group_headers.clone(),
                extra_prefixes: (config.requestheader_extra_headers_prefix.iter())
                    .map(|p| p.to_ascii_lowercase())
                    .collect(),
            }),
            None => None,
        };
        Ok(Self {
            front_proxy,
            client_ca,
            tokens,
            anonymous: config.anonymous_auth,
            loopback: None,
        })
    }

    /// Accepts `token` as the simulator's own clients, admins (`system:masters`), as
    /// kube-apiserver's loopback client is: they must work whatever the flags let others do.
    pub fn with_loopback_token(mut self, token: String) -> Self {
        self.loopback = Some(token);
        self
    }

    /// Whether any authentication method is configured (if not, everyone is admin).
    pub fn is_enabled(&self) -> bool {
        self.front_proxy.is_some() || self.client_ca.is_some() || self.tokens.is_some()
    }

    /// The identity a request is served as. `peer_certs`: the TLS client's chain, leaf first.
    pub fn authenticate(
        &self,
        headers: &HeaderMap,
        peer_certs: Option<&[CertificateDer<'static>]>,
    ) -> Result<UserInfo, AuthnError> {
        if !self.is_enabled() {
            return Ok(UserInfo {
                name: ADMIN_USER.into(),
                groups: vec![MASTERS_GROUP.into(), AUTHENTICATED_GROUP.into()],
                ..UserInfo::default()
            });
        }
        if self.loopback.is_some() && bearer_token(headers) == self.loopback.as_deref() {
            return Ok(authenticated(UserInfo {
                name: LOOPBACK_USER.into(),
                groups: vec![MASTERS_GROUP.into()],
                ..UserInfo::default()
            }));
        }
        let mut failures = Vec::new();
        if let Some((leaf, intermediates)) = peer_certs.and_then(<[_]>::split_first) {
            let now = UnixTime::now();
            if let Some(front_proxy) = &self.front_proxy {
                match front_proxy.authenticate(headers, leaf, intermediates, now) {
                    Ok(Some(user)) => return Ok(authenticated(user)),
                    Ok(None) => {}
                    Err(failure) => failures.push(failure),
                }
            }
            if let Some(verifier) = &self.client_ca {
                match verify(verifier.as_ref(), "client CA", leaf, intermediates, now) {
                    Ok(subject) if !subject.common_name.is_empty() => {
                        return Ok(authenticated(UserInfo {
                            name: subject.common_name,
                            groups: subject.organizations,
                            ..UserInfo::default()
                        }));
                    }
                    Ok(_) => {} // no CN: not an identity, as in kube-apiserver
                    Err(failure) => failures.push(failure),
                }
            }
        }
        if let (Some(tokens), Some(token)) = (&self.tokens, bearer_token(headers)) {
            match tokens.get(token) {
                Some(user) => return Ok(authenticated(user.clone())),
                None => failures.push(AuthnFailure::InvalidBearerToken),
            }
        }
        if failures.is_empty() && self.anonymous {
            return Ok(UserInfo {
                name: ANONYMOUS_USER.into(),
                groups: vec![UNAUTHENTICATED_GROUP.into()],
                ..UserInfo::default()
            });
        }
        Err(AuthnError { failures })
    }
}

// === impl FrontProxy ===

impl FrontProxy {
    /// `Ok(None)` when the certificate is a trusted front proxy's but no user header is set:
    /// the request falls through to the other methods, as in kube-apiserver.
    fn authenticate(
        &self,
        headers: &HeaderMap,
        leaf: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<Option<UserInfo>, AuthnFailure> {
        let subject = verify(
            self.verifier.as_ref(),
            "requestheader client CA",
            leaf,
            intermediates,
            now,
        )?;
        if !self.allowed_names.is_empty() && !self.allowed_names.contains(&subject.common_name) {
            return Err(AuthnFailure::FrontProxyNotAllowed {
                common_name: subject.common_name,
            });
        }
        let Some(name) = first_value(headers, &self.username_headers) else {
            return Ok(None);
        };
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (header, value) in headers {
            let header = header.as_str(); // already lowercase
            for prefix in &self.extra_prefixes {
                if let Some(key) = header.strip_prefix(prefix.as_str()) {
                    extra
                        .entry(percent_decode(key))
                        .or_default()
                        .push(String::from_utf8_lossy(value.as_bytes()).into_owned());
                }
            }
        }
        Ok(Some(UserInfo {
            name,
            uid: first_value(headers, &self.uid_headers).unwrap_or_default(),
            groups: all_values(headers, &self.group_headers),
            extra,
        }))
    }
}

struct Subject {
    common_name: String,
    organizations: Vec<String>,
}

/// Checks that `leaf` chains to the verifier's CA and returns its subject.
fn verify(
    verifier: &dyn ClientCertVerifier,
    ca: &'static str,
    leaf: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    now: UnixTime,
) -> Result<Subject, AuthnFailure> {
    let parsed = X509Certificate::from_der(leaf.as_ref()).map(|(_, cert)| cert);
    let untrusted = |subject: String, reason: String| AuthnFailure::UntrustedCertificate {
        subject,
        ca,
        reason,
    };
    let cert = parsed.map_err(|e| untrusted("(unparsable)".into(), e.to_string()))?;
    let subject = cert.subject();
    verifier
        .verify_client_cert(leaf, intermediates, now)
        .map_err(|e| untrusted(subject.to_string(), e.to_string()))?;
    Ok(Subject {
        // Several CNs: the last one counts, as in Go's pkix.Name.
        common_name: strings(subject.iter_common_name())
            .pop()
            .unwrap_or_default(),
        organizations: strings(subject.iter_organization()),
    })
}

fn strings<'a>(attrs: impl Iterator<Item = &'a AttributeTypeAndValue<'a>>) -> Vec<String> {
    attrs
        .filter_map(|a| a.as_str().ok().map(str::to_owned))
        .collect()
}

/// Adds `system:authenticated`, unless the user already is in it or unauthenticated.
fn authenticated(mut user: UserInfo) -> UserInfo {
    let marked = user
        .groups
        .iter()
        .any(|g| g == AUTHENTICATED_GROUP || g == UNAUTHENTICATED_GROUP);
    if !marked && user.name != ANONYMOUS_USER {
        user.groups.push(AUTHENTICATED_GROUP.into());
    }
    user
}

/// `Authorization: Bearer <token>` (scheme case-insensitive); `None` if absent or empty.
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let mut parts = value.trim().splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The first value of the first of `names` that has a non-empty one.
fn first_value(headers: &HeaderMap, names: &[String]) -> Option<String> {
    names
        .iter()
        .filter_map(|name| headers.get(name.as_str()))
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .find(|v| !v.is_empty())
}

/// Every non-empty value of every header in `names`, in order.
fn all_values(headers: &HeaderMap, names: &[String]) -> Vec<String> {
    names
        .iter()
        .flat_map(|name| headers.get_all(name.as_str()))
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .filter(|v| !v.is_empty())
        .collect()
}

/// Percent-decodes an extra key (`X-Remote-Extra-Acme.com%2Fproject`); an invalid escape or
/// non-UTF-8 result leaves the key as sent, as kube-apiserver does.
fn percent_decode(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .filter(|h| h.iter().all(u8::is_ascii_hexdigit));
            let hex = hex.and_then(|h| std::str::from_utf8(h).ok());
            match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                Some(b) => out.push(b),
                None => return key.to_owned(),
            }
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| key.to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may unwrap
mod tests {
    use super::*;
    use std::path::Path;

    fn parse(contents: &str) -> Result<TokenFile, TokenFileError> {
        TokenFile::parse(contents, Path::new("tokens.csv"))
    }

    #[test]
    fn token_file_in_kube_apiserver_format() {
        let file = parse(
            "admin-token,admin,uid-1,\"system:masters,ops\"\r\n\n\
             t2, bob,uid-2\n\
             t3,\"carol \"\"c\"\"\",uid-3,dev,ignored\n\
             ,nobody,uid-4\n",
        )
        .unwrap();
        assert_eq!(file.len(), 3);
        let admin = file.get("admin-token").unwrap();
        assert_eq!(admin.name, "admin");
        assert_eq!(admin.uid, "uid-1");
        assert_eq!(admin.groups, ["system:masters", "ops"]);
        assert_eq!(file.get("t2").unwrap().name, "bob");
        assert!(file.get("t2").unwrap().groups.is_empty());
        assert_eq!(file.get("t3").unwrap().name, "carol \"c\"");
        assert_eq!(file.get("t3").unwrap().groups, ["dev"]);
        assert!(file.get("").is_none());
    }

    #[test]
    fn token_file_errors_name_the_line() {
        let cases = [
            ("t1,alice,u1\nt2,bob\n", 2, "at least 3 columns"),
            ("t1,alice,u1,\"dev\n", 1, "not closed"),
            ("t1,al\"ice,u1\n", 1, "quote inside"),
            ("\n\nt1,\"alice\"x,u1\n", 3, "after a closing quote"),
        ];
        for (contents, line, reason) in cases {
            let err = parse(contents).err().expect(contents);
            let text = err.to_string();
            assert!(
                matches!(err, TokenFileError::Line { line: l, .. } if l == line),
                "{text}"
            );
            assert!(
                text.contains("tokens.csv") && text.contains(reason),
                "{text}"
            );
        }
        let missing = TokenFile::read(Path::new("/nonexistent/tokens.csv"))
            .err()
            .unwrap();
        assert!(missing.to_string().contains("/nonexistent/tokens.csv"));
    }

    /// The simulator's own clients are admins whatever else is configured; the token is
    /// nobody else's, and without it a request is authenticated as before.
    #[test]
    fn loopback_token_is_the_simulators_own_admin() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens.csv");
        std::fs::write(&file, "t1,alice,u1\n").unwrap();
        let config = AuthnConfig {
            token_auth_file: Some(file),
            anonymous_auth: false,
            ..AuthnConfig::default()
        };
        let authn = Authenticator::new(config)
            .unwrap()
            .with_loopback_token("secret".into());
        let with = |token: &str| {
            let mut h = HeaderMap::new();
            h.insert("authorization", format!("Bearer {token}").parse().unwrap());
            authn.authenticate(&h, None)
        };
        let own = with("secret").unwrap();
        assert_eq!(own.name, LOOPBACK_USER);
        assert!(own.groups.iter().any(|g| g == MASTERS_GROUP));
        assert_eq!(with("t1").unwrap().name, "alice");
        assert!(with("secret2").is_err());
        assert!(authn.authenticate(&HeaderMap::new(), None).is_err());
    }

    #[test]
    fn helpers_follow_kube_apiserver() {
        assert_eq!(percent_decode("acme.com%2Fproject"), "acme.com/project");
        assert_eq!(percent_decode("bad%zzkey"), "bad%zzkey");
        assert_eq!(percent_decode("trunc%2"), "trunc%2");
        assert_eq!(percent_decode("plus%+1"), "plus%+1");
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "bearer abc".parse().unwrap());
        assert_eq!(bearer_token(&headers), Some("abc"));
        headers.insert("authorization", "Basic abc".parse().unwrap());
        assert_eq!(bearer_token(&headers), None);
        headers.insert("authorization", "Bearer ".parse().unwrap());
        assert_eq!(bearer_token(&headers), None);
    }
}
