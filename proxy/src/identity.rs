//! Who the client is, and what identity the apiserver gets.
//!
//! - A verified client certificate: user = CN, groups = O, as kube-apiserver
//!   reads them. Forwarded through the front-proxy mechanism: tollgate's
//!   front-proxy certificate plus the identity headers the apiserver reads
//!   (`X-Remote-User` / `X-Remote-Group` unless it says otherwise: see
//!   [`crate::requestheader`]).
//! - A bearer token: forwarded as is; known to tollgate only by a hash (never
//!   the token in logs or metrics) and, for service-account JWTs, by the
//!   unverified `sub` claim (classification only, never authorization).
//! - Nothing: forwarded without credentials, so the apiserver sees anonymous.
//!
//! Identity headers sent by clients (`X-Remote-*` and every name the apiserver
//! trusts) are always stripped ([`crate::requestheader`]); `Impersonate-*`
//! headers are forwarded (the apiserver authorizes impersonation itself).

use std::net::{IpAddr, Ipv6Addr};

use base64::Engine;
use http::header::{AUTHORIZATION, USER_AGENT};
use http::HeaderMap;
use rustls::pki_types::CertificateDer;
use sha2::{Digest, Sha256};

/// How the client authenticated, as far as tollgate can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A client certificate verified against the client CA.
    Certificate { user: String, groups: Vec<String> },
    /// A bearer token: first 16 hex digits of its SHA-256, and who it
    /// belongs to if known: the service account its unverified JWT claims
    /// name, or (verified) what a TokenReview said.
    Token {
        hash: String,
        user: Option<String>,
        groups: Vec<String>,
        /// `user` and `groups` come from a TokenReview (not unverified JWT claims).
        verified: bool,
    },
    /// No certificate, no token.
    Anonymous,
}

/// A bounded classification of clients, part of the pattern key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ClientClass {
    /// Kubelets: `system:node:*` or group `system:nodes`.
    Node,
    /// Control-plane components: controller-manager, scheduler, apiserver.
    ControlPlane,
    /// `system:serviceaccount:*`.
    ServiceAccount,
    /// Anyone else who presented credentials.
    User,
    /// No credentials.
    Anonymous,
}

/// How much of the user agent is kept (it is only shown, as the product name).
const MAX_USER_AGENT_CHARS: usize = 128;

/// The client as seen by the handler.
#[derive(Debug, Clone)]
pub struct Client {
    pub identity: Identity,
    /// Boxed, not a `String`: every request's context holds it.
    pub user_agent: Box<str>,
    /// The address the connection came from (IPv4 mapped into IPv6: 16
    /// bytes, where `IpAddr` takes 17 and, padded, 24 in every request's
    /// context): the flow of an identity tollgate cannot verify (see
    /// [`crate::admit::Flow`]).
    pub source: Ipv6Addr,
}

impl ClientClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientClass::Node => "node",
            ClientClass::ControlPlane => "controlPlane",
            ClientClass::ServiceAccount => "serviceAccount",
            ClientClass::User => "user",
            ClientClass::Anonymous => "anonymous",
        }
    }
}

impl Identity {
    /// Identity of a request: the verified peer certificate wins, then a bearer token.
    pub fn of(peer_cert: Option<&PeerCertificate>, headers: &HeaderMap) -> Identity {
        if let Some(cert) = peer_cert {
            return Identity::Certificate {
                user: cert.user.clone(),
                groups: cert.groups.clone(),
            };
        }
        match bearer_token(headers) {
            Some(token) => Identity::Token {
                hash: token_hash(token),
                user: service_account_claim(token),
                groups: Vec::new(),
                verified: false,
            },
            None => Identity::Anonymous,
        }
    }

    /// A name safe for logs and debug output (never a token).
    pub fn display_name(&self) -> String {
        let mut name = String::new();
        self.push_display_name(&mut name, 0);
        name
    }

    /// [`Identity::display_name`] appended to `out`, which is first sized for it plus
    /// `more` bytes: one allocation where `format!` and a `push_str` later made two or three.
    fn push_display_name(&self, out: &mut String, more: usize) {
        let parts: [&str; 4] = match self {
            Identity::Certificate { user, .. } => ["user:", user, "", ""],
            Identity::Token {
                user: Some(user),
                hash,
                ..
            } => [user, " (token ", hash, ")"],
            Identity::Token { hash, .. } => ["token:", hash, "", ""],
            Identity::Anonymous => ["anonymous", "", "", ""],
        };
        out.reserve(parts.iter().map(|p| p.len()).sum::<usize>() + more);
        for p in parts {
            out.push_str(p);
        }
    }

    /// The bounded class used in pattern keys and lanes.
    pub fn class(&self) -> ClientClass {
        let class_of_user = |user: &str, groups: &[String]| {
            if user.starts_with("system:node:") || groups.iter().any(|g| g == "system:nodes") {
                ClientClass::Node
            } else if user.starts_with("system:serviceaccount:") {
                ClientClass::ServiceAccount
            } else if matches!(
                user,
                "system:kube-controller-manager" | "system:kube-scheduler" | "system:apiserver"
            ) {
                ClientClass::ControlPlane
            } else {
                ClientClass::User
            }
        };
        match self {
            Identity::Certificate { user, groups } => class_of_user(user, groups),
            Identity::Token {
                user: Some(user),
                groups,
                ..
            } => class_of_user(user, groups),
            Identity::Token { .. } => ClientClass::User,
            Identity::Anonymous => ClientClass::Anonymous,
        }
    }

    /// Take what a TokenReview said about this token.
    pub fn set_reviewed(&mut self, reviewed_user: &str, reviewed_groups: &[String]) {
        if let Identity::Token {
            user,
            groups,
            verified,
            ..
        } = self
        {
            *user = Some(reviewed_user.to_string());
            *groups = reviewed_groups.to_vec();
            *verified = true;
        }
    }

    /// Verified by tollgate: a client certificate checked against the
    /// client CA, or a token a TokenReview confirmed. Only these reach the
    /// `exempt` and `system` lanes.
    pub fn is_verified(&self) -> bool {
        match self {
            Identity::Certificate { .. } => true,
            Identity::Token { verified, .. } => *verified,
            Identity::Anonymous => false,
        }
    }

    /// The user name, if any is known (verified or not).
    pub fn user(&self) -> Option<&str> {
        match self {
            Identity::Certificate { user, .. } => Some(user),
            Identity::Token { user, .. } => user.as_deref(),
            Identity::Anonymous => None,
        }
    }

    /// Whether the request must go through the front-proxy client.
    pub fn needs_front_proxy(&self) -> bool {
        matches!(self, Identity::Certificate { .. })
    }
}

impl Client {
    /// Identity and user-agent product (`kubectl`, `kubelet`), for debug
    /// output; never a token.
    pub fn display_name(&self) -> String {
        let product = self.product();
        let mut name = String::new();
        // Built in place, in one allocation: every request's outcome carries it.
        let more = if product.is_empty() {
            0
        } else {
            product.len() + 3
        };
        self.identity.push_display_name(&mut name, more);
        if !product.is_empty() {
            name.push_str(" (");
            name.push_str(product);
            name.push(')');
        }
        name
    }

    /// The User-Agent's product: `kubectl` of `kubectl/v1.34.0 (linux/amd64)`.
    pub fn product(&self) -> &str {
        self.user_agent.split(['/', ' ']).next().unwrap_or("")
    }

    pub fn of(peer_cert: Option<&PeerCertificate>, headers: &HeaderMap, source: IpAddr) -> Client {
        let user_agent = headers
            .get(USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        // At most 128 characters, cut at a character boundary and copied at once, not
        // collected char by char: every request does it.
        let end = if user_agent.len() <= MAX_USER_AGENT_CHARS {
            user_agent.len()
        } else {
            user_agent
                .char_indices()
                .nth(MAX_USER_AGENT_CHARS)
                .map_or(user_agent.len(), |(i, _)| i)
        };
        let user_agent = user_agent[..end].into();
        Client {
            identity: Identity::of(peer_cert, headers),
            user_agent,
            source: match source {
                IpAddr::V4(a) => a.to_ipv6_mapped(),
                IpAddr::V6(a) => a,
            },
        }
    }
}

/// User and groups read from a verified client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCertificate {
    pub user: String,
    pub groups: Vec<String>,
}

impl PeerCertificate {
    /// CN as user, every O as a group. `None` if the certificate does not
    /// parse or has no CN (the apiserver rejects those too).
    pub fn from_der(der: &CertificateDer<'_>) -> Option<PeerCertificate> {
        let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
        let subject = cert.subject();
        let user = subject
            .iter_common_name()
            .next()?
            .as_str()
            .ok()?
            .to_string();
        let groups = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_string))
            .collect();
        Some(PeerCertificate { user, groups })
    }
}

/// The bearer token of an `Authorization: Bearer …` header.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// First 16 hex digits of the token's SHA-256.
pub fn token_hash(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The `sub` claim of a service-account JWT, read without verification.
pub fn service_account_claim(token: &str) -> Option<String> {
    let mut parts = token.split('.');
    let (_header, payload, _sig) = (parts.next()?, parts.next()?, parts.next()?);
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let sub = claims.get("sub")?.as_str()?;
    sub.starts_with("system:serviceaccount:")
        .then(|| sub.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).expect("value"));
        }
        h
    }

    #[test]
    fn token_is_hashed_never_kept() {
        let h = headers(&[("authorization", "Bearer secret-token")]);
        let id = Identity::of(None, &h);
        let Identity::Token { hash, user, .. } = &id else {
            panic!("{id:?}")
        };
        assert_eq!(hash.len(), 16);
        assert_eq!(user, &None);
        assert!(!id.display_name().contains("secret"));
        assert_eq!(id.class(), ClientClass::User);
    }

    #[test]
    fn service_account_jwt_is_classified() {
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"sub":"system:serviceaccount:kube-system:coredns"}"#);
        let token = format!("eyJhbGciOiJSUzI1NiJ9.{payload}.sig");
        let h = headers(&[("authorization", &format!("Bearer {token}"))]);
        let id = Identity::of(None, &h);
        assert_eq!(id.class(), ClientClass::ServiceAccount);
        assert!(id
            .display_name()
            .starts_with("system:serviceaccount:kube-system:coredns"));
    }

    #[test]
    fn display_name_adds_the_user_agent_product() {
        let h = headers(&[("user-agent", "kubectl/v1.34.0 (linux/amd64) kubernetes/abc")]);
        let source = std::net::Ipv4Addr::LOCALHOST.into();
        assert_eq!(
            Client::of(None, &h, source).display_name(),
            "anonymous (kubectl)"
        );
        assert_eq!(
            Client::of(None, &HeaderMap::new(), source).display_name(),
            "anonymous"
        );
    }

    #[test]
    fn a_token_review_names_the_user() {
        let mut id = Identity::of(None, &headers(&[("authorization", "Bearer opaque")]));
        assert_eq!(id.class(), ClientClass::User);
        assert!(!id.is_verified());
        id.set_reviewed("system:node:n1", &["system:nodes".to_string()]);
        assert!(id.is_verified());
        assert_eq!(id.class(), ClientClass::Node);
        assert!(id.display_name().starts_with("system:node:n1 (token "));
        let mut anon = Identity::Anonymous;
        anon.set_reviewed("x", &[]);
        assert_eq!(anon, Identity::Anonymous);
    }

    #[test]
    fn certificate_wins_and_classes() {
        let node = PeerCertificate {
            user: "system:node:n1".into(),
            groups: vec!["system:nodes".into()],
        };
        let id = Identity::of(Some(&node), &headers(&[("authorization", "Bearer t")]));
        assert_eq!(id.class(), ClientClass::Node);
        assert!(id.needs_front_proxy());
        assert_eq!(Identity::of(None, &HeaderMap::new()), Identity::Anonymous);
        assert_eq!(Identity::Anonymous.class(), ClientClass::Anonymous);
    }
}
