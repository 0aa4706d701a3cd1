//! The sim's authentication, end to end: every branch of `Authenticator::authenticate` with
//! real certificates, and a TLS server on loopback that real `kubectl` reaches through the
//! kubeconfigs we write — over the negotiated protocol, with a client certificate, a token, or
//! nothing.

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use bench::sim::auth::authn::{Authenticator, AuthnConfig, AuthnConfigError, AuthnFailure};
use bench::sim::auth::kubeconfig::{write_kubeconfig, KubeUser};
use bench::sim::auth::pki::{CertAuthority, CertKeyPem};
use bench::sim::auth::tls::{parse_certs, peer_certificates, server_config};
use bench::sim::auth::user::{is_admin, UserInfo};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use rustls_pki_types::CertificateDer;

const TOKENS: &str = "tok-bob,bob,uid-bob,\"dev,ops\"\n";

struct Pki {
    client_ca: CertAuthority,
    front_proxy_ca: CertAuthority,
    tokens: tempfile::NamedTempFile,
}

impl Pki {
    fn new() -> Self {
        let tokens = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(tokens.path(), TOKENS).unwrap();
        Self {
            client_ca: CertAuthority::generate("client-ca").unwrap(),
            front_proxy_ca: CertAuthority::generate("front-proxy-ca").unwrap(),
            tokens,
        }
    }

    fn config(&self) -> AuthnConfig {
        AuthnConfig {
            token_auth_file: Some(self.tokens.path().to_path_buf()),
            client_ca_pem: Some(self.client_ca.cert_pem().into()),
            requestheader_client_ca_pem: Some(self.front_proxy_ca.cert_pem().into()),
            requestheader_allowed_names: vec!["front-proxy".into()],
            requestheader_uid_headers: vec!["X-Remote-Uid".into()],
            ..AuthnConfig::default()
        }
    }
}

fn chain(identity: &CertKeyPem) -> Vec<CertificateDer<'static>> {
    parse_certs(&identity.cert_pem, "test").unwrap()
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    map
}

fn groups(user: &UserInfo) -> Vec<&str> {
    user.groups.iter().map(String::as_str).collect()
}

#[test]
fn without_authentication_everyone_is_admin() {
    let authn = Authenticator::new(AuthnConfig::default()).unwrap();
    let user = authn
        .authenticate(&headers(&[("authorization", "Bearer x")]), None)
        .unwrap();
    assert_eq!(user.name, "system:admin");
    assert_eq!(groups(&user), ["system:masters", "system:authenticated"]);
    assert!(is_admin(&user));
}

#[test]
fn tokens_and_anonymous() {
    let pki = Pki::new();
    let authn = Authenticator::new(pki.config()).unwrap();
    let bob = authn
        .authenticate(&headers(&[("authorization", "Bearer tok-bob")]), None)
        .unwrap();
    assert_eq!((bob.name.as_str(), bob.uid.as_str()), ("bob", "uid-bob"));
    assert_eq!(groups(&bob), ["dev", "ops", "system:authenticated"]);
    assert!(!is_admin(&bob));

    let err = authn
        .authenticate(&headers(&[("authorization", "Bearer nope")]), None)
        .unwrap_err();
    assert_eq!(err.failures, [AuthnFailure::InvalidBearerToken]);
    assert_eq!(err.to_string(), "Unauthorized: invalid bearer token");

    let anonymous = authn.authenticate(&HeaderMap::new(), None).unwrap();
    assert_eq!(anonymous.name, "system:anonymous");
    assert_eq!(groups(&anonymous), ["system:unauthenticated"]);

    let strict = AuthnConfig {
        anonymous_auth: false,
        ..pki.config()
    };
    let err = Authenticator::new(strict)
        .unwrap()
        .authenticate(&HeaderMap::new(), None);
    assert!(err.unwrap_err().failures.is_empty());
}

#[test]
fn bad_token_file_is_refused_with_its_line() {
    let pki = Pki::new();
    std::fs::write(pki.tokens.path(), "t1,alice,u1\nt2,bob\n").unwrap();
    let err = Authenticator::new(pki.config()).unwrap_err();
    assert!(matches!(err, AuthnConfigError::TokenFile(_)));
    let text = format!("{err}");
    assert!(
        text.contains("line 2") && text.contains("at least 3 columns"),
        "{text}"
    );
}

#[test]
fn client_certificate_names_user_and_groups_and_ignores_remote_headers() {
    let pki = Pki::new();
    let authn = Authenticator::new(pki.config()).unwrap();
    let alice = chain(
        &pki.client_ca
            .issue_client("alice", &["system:masters", "dev"])
            .unwrap(),
    );
    let spoof = headers(&[
        ("x-remote-user", "root"),
        ("x-remote-group", "system:masters"),
    ]);
    let user = authn.authenticate(&spoof, Some(&alice)).unwrap();
    assert_eq!(user.name, "alice");
    assert_eq!(
        groups(&user),
        ["system:masters", "dev", "system:authenticated"]
    );
    assert!(is_admin(&user));
    // A certificate beats a token, as in kube-apiserver's order.
    let both = headers(&[("authorization", "Bearer tok-bob")]);
    assert_eq!(
        authn.authenticate(&both, Some(&alice)).unwrap().name,
        "alice"
    );
}

#[test]
fn front_proxy_identity_comes_from_headers() {
    let pki = Pki::new();
    let authn = Authenticator::new(pki.config()).unwrap();
    let proxy = chain(&pki.front_proxy_ca.issue_client("front-proxy", &[]).unwrap());
    let request = headers(&[
        ("x-remote-user", "carol"),
        ("x-remote-uid", "uid-carol"),
        ("x-remote-group", "dev"),
        ("x-remote-group", "ops"),
        ("x-remote-extra-Acme.com%2Fproject", "tollgate"),
        ("x-remote-extra-scopes", "a"),
        ("x-remote-extra-scopes", "b"),
        ("authorization", "Bearer nope"),
    ]);
    let user = authn.authenticate(&request, Some(&proxy)).unwrap();
    assert_eq!(
        (user.name.as_str(), user.uid.as_str()),
        ("carol", "uid-carol")
    );
    assert_eq!(groups(&user), ["dev", "ops", "system:authenticated"]);
    assert_eq!(user.extra["acme.com/project"], ["tollgate"]);
    assert_eq!(user.extra["scopes"], ["a", "b"]);
    let json = serde_json::to_value(&user).unwrap();
    assert_eq!(json["username"], "carol");

    // No user header: falls through; the proxy cert is no client-CA cert, so it is a 401.
    let err = authn
        .authenticate(&HeaderMap::new(), Some(&proxy))
        .unwrap_err();
    assert!(matches!(
        err.failures.as_slice(),
        [AuthnFailure::UntrustedCertificate {
            ca: "client CA",
            ..
        }]
    ));
}

#[test]
fn front_proxy_not_in_allowed_names_is_rejected() {
    let pki = Pki::new();
    let authn = Authenticator::new(pki.config()).unwrap();
    let other = chain(
        &pki.front_proxy_ca
            .issue_client("someone-else", &[])
            .unwrap(),
    );
    let spoof = headers(&[
        ("x-remote-user", "root"),
        ("x-remote-group", "system:masters"),
    ]);
    let err = authn.authenticate(&spoof, Some(&other)).unwrap_err();
    assert!(err.failures.contains(&AuthnFailure::FrontProxyNotAllowed {
        common_name: "someone-else".into()
    }));
    // Any CN is allowed when the list is empty.
    let any = AuthnConfig {
        requestheader_allowed_names: vec![],
        ..pki.config()
    };
    let user = Authenticator::new(any)
        .unwrap()
        .authenticate(&spoof, Some(&other))
        .unwrap();
    assert_eq!(user.name, "root");
}

#[test]
fn forged_certificates_with_the_right_issuer_name_are_not_trusted() {
    let pki = Pki::new();
    let authn = Authenticator::new(pki.config()).unwrap();
    let spoof = headers(&[
        ("x-remote-user", "root"),
        ("x-remote-group", "system:masters"),
    ]);
    for (name, cn) in [("client-ca", "mallory"), ("front-proxy-ca", "front-proxy")] {
        let forger = CertAuthority::generate(name).unwrap();
        let forged = chain(&forger.issue_client(cn, &["system:masters"]).unwrap());
        let err = authn.authenticate(&spoof, Some(&forged)).unwrap_err();
        assert_eq!(err.failures.len(), 2, "{err}");
        assert!(err
            .failures
            .iter()
            .all(|f| matches!(f, AuthnFailure::UntrustedCertificate { .. })));
    }
}

// === a TLS server that kubectl talks to ===

type Body = Full<bytes::Bytes>;

async fn whoami(
    authn: Arc<Authenticator>,
    peer: Option<Vec<CertificateDer<'static>>>,
    request: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, std::convert::Infallible> {
    let protocol = format!("{:?}", request.version());
    let response = match authn.authenticate(request.headers(), peer.as_deref()) {
        Ok(user) => {
            let body = serde_json::json!({ "user": user, "protocol": protocol });
            Response::new(Body::from(body.to_string()))
        }
        Err(err) => {
            let status = serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": err.to_string(), "reason": "Unauthorized", "code": 401,
            });
            let mut response = Response::new(Body::from(status.to_string()));
            *response.status_mut() = StatusCode::UNAUTHORIZED;
            response
        }
    };
    Ok(response)
}

/// Serves `whoami` over TLS on 127.0.0.1:0 until the test ends; returns the URL.
async fn start_server(pki: &Pki, authn: Authenticator) -> String {
    let serving_ca = &pki.client_ca; // any CA will do for serving; kubectl trusts it below
    let serving = serving_ca
        .issue_server(&["localhost", "127.0.0.1", "::1"])
        .unwrap();
    let config = pki.config();
    let tls = server_config(
        &serving.cert_pem,
        &serving.key_pem,
        &config.tls_client_auth(),
    );
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let authn = Arc::new(authn);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, authn) = (acceptor.clone(), authn.clone());
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let peer = peer_certificates(&stream);
                let service = hyper::service::service_fn(move |request| {
                    whoami(authn.clone(), peer.clone(), request)
                });
                let builder = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                );
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = builder.serve_connection(io, service).await;
            });
        }
    });
    url
}

async fn kubectl(kubeconfig: &Path, path: &str) -> (bool, String) {
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["get", "--raw", path])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("kubectl must be installed (/usr/bin/kubectl)");
    let text = [out.stdout, out.stderr].concat();
    (
        out.status.success(),
        String::from_utf8_lossy(&text).into_owned(),
    )
}

#[tokio::test]
async fn kubectl_authenticates_over_tls_with_each_kind_of_kubeconfig() {
    assert!(Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_ok());
    let pki = Pki::new();
    let url = start_server(&pki, Authenticator::new(pki.config()).unwrap()).await;
    let dir = tempfile::tempdir().unwrap();
    let alice = pki.client_ca.issue_client("alice", &["dev"]).unwrap();
    let users = [
        (
            KubeUser::ClientCert {
                cert_pem: alice.cert_pem,
                key_pem: alice.key_pem,
            },
            "alice",
        ),
        (KubeUser::Token("tok-bob".into()), "bob"),
        (KubeUser::None, "system:anonymous"),
    ];
    for (user, expected) in users {
        let path = dir.path().join(expected.replace(':', "-"));
        write_kubeconfig(&path, &url, Some(pki.client_ca.cert_pem()), &user).unwrap();
        let (ok, out) = kubectl(&path, "/whoami").await;
        assert!(ok, "{expected}: {out}");
        let seen: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(seen["user"]["username"], expected, "{out}");
        assert_eq!(
            seen["protocol"], "HTTP/2.0",
            "kubectl negotiates h2 via ALPN: {out}"
        );
    }
    // A wrong token is a 401 that kubectl reports as such.
    let path = dir.path().join("wrong");
    let wrong = KubeUser::Token("wrong".into());
    write_kubeconfig(&path, &url, Some(pki.client_ca.cert_pem()), &wrong).unwrap();
    let (ok, out) = kubectl(&path, "/whoami").await;
    assert!(!ok && out.contains("Unauthorized"), "{out}");
}
