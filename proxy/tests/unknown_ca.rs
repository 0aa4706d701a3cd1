//! A client certificate from a CA tollgate does not trust, as kube-apiserver
//! treats one: the TLS handshake completes, the certificate is no identity,
//! and the request either authenticates with its bearer token (forwarded,
//! the apiserver decides) or gets a 401 `Status` from tollgate — never
//! anonymous, never the certificate's CN as `X-Remote-User`.
#![allow(clippy::unwrap_used)]

mod common;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;

struct Setup {
    pki: Pki,
    up: Upstream,
    tg: Running,
}

async fn setup() -> Setup {
    tollgate::install_crypto_provider();
    let pki = Pki::new();
    let up = front_proxy_upstream(&pki, None).await;

    let (tg_cert, tg_key) = pki.leaf(&pki.serving_ca, "tollgate", "tollgate", None, true);
    let (fp_cert, fp_key) = pki.leaf(
        &pki.front_ca,
        "front-proxy",
        "front-proxy-client",
        None,
        false,
    );
    let mut c = config(&[&up.url]);
    c.tls.cert_file = Some(tg_cert);
    c.tls.key_file = Some(tg_key);
    c.tls.client_ca_file = Some(pki.write("client-ca.crt", &pki.client_ca.pem));
    c.upstream.ca_file = Some(pki.write("serving-ca.crt", &pki.serving_ca.pem));
    c.upstream.front_proxy_cert_file = Some(fp_cert);
    c.upstream.front_proxy_key_file = Some(fp_key);
    let tg = start(c).await;
    Setup { pki, up, tg }
}

/// Status and body of a GET with `headers`.
async fn get(client: &TlsClient, url: &str, headers: &[(&str, &str)]) -> (StatusCode, String) {
    let mut req = Request::get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .request(req.body(body(Bytes::new())).unwrap())
        .await
        .expect("the handshake with an unknown client CA completes");
    let status = resp.status();
    let b = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&b).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_an_unknown_ca_is_no_identity() {
    let s = setup().await;
    // Same CN and O as a real admin, but signed by a CA tollgate does not trust.
    let stranger_ca = Ca::new("stranger-ca");
    let (c, k) = stranger_ca.issue("admin", Some("system:masters"), false);
    let (cert, key) = (
        s.pki.write("stranger.crt", &c),
        s.pki.write("stranger.key", &k),
    );
    for h2 in [false, true] {
        let client = tls_client(&s.pki.serving_ca.pem, Some((&cert, &key)), h2);

        // No token: 401 from tollgate itself, as kube-apiserver's body; nothing forwarded.
        let path = format!("/api/v1/namespaces/a/pods?unknown-ca-no-token-h2={h2}");
        let (code, body) = get(&client, &s.tg.url("https", &path), &[]).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED, "{body}");
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["apiVersion"], "v1");
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["reason"], "Unauthorized");
        assert_eq!(status["message"], "Unauthorized");
        assert_eq!(status["code"], 401);
        assert!(
            !s.up.seen().iter().any(|x| x.path.contains(&path)),
            "a request without identity reached the upstream"
        );

        // Spoofed identity headers do not help either.
        let (code, _) = get(
            &client,
            &s.tg.url("https", &format!("{path}&spoofed")),
            &[("x-remote-user", "admin")],
        )
        .await;
        assert_eq!(code, StatusCode::UNAUTHORIZED);

        // With a bearer token the token is the identity: forwarded as is, without the
        // front-proxy certificate and without X-Remote-* from the certificate.
        let path = format!("/api/v1/namespaces/a/pods?unknown-ca-token-h2={h2}");
        let (code, _) = get(
            &client,
            &s.tg.url("https", &path),
            &[("authorization", "Bearer t0ken")],
        )
        .await;
        assert_eq!(code, StatusCode::OK);
        let seen = s.up.last_for(&path);
        assert_eq!(seen.headers["authorization"], "Bearer t0ken");
        assert_eq!(seen.peer_cn, None, "no front-proxy certificate for a token");
        assert!(!seen.headers.contains_key("x-remote-user"));
        assert!(!seen.headers.contains_key("x-remote-group"));
    }

    // The same connection setup with a trusted certificate still works (control).
    let (cert, key) = s
        .pki
        .leaf(&s.pki.client_ca, "dana", "dana", Some("dev"), false);
    let client = tls_client(&s.pki.serving_ca.pem, Some((&cert, &key)), true);
    let path = "/api/v1/namespaces/a/pods?trusted";
    let (code, _) = get(&client, &s.tg.url("https", path), &[]).await;
    assert_eq!(code, StatusCode::OK);
    let seen = s.up.last_for(path);
    assert_eq!(seen.peer_cn.as_deref(), Some("front-proxy-client"));
    assert_eq!(seen.headers["x-remote-user"], "dana");
    s.tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_client_certificate_nothing_changes() {
    let s = setup().await;
    let client = tls_client(&s.pki.serving_ca.pem, None, false);
    let path = "/api/v1/namespaces/a/pods?no-cert";
    let (code, _) = get(&client, &s.tg.url("https", path), &[]).await;
    assert_eq!(code, StatusCode::OK, "anonymous is the apiserver's call");
    let seen = s.up.last_for(path);
    assert_eq!(seen.peer_cn, None);
    assert!(!seen.headers.contains_key("authorization"));
    s.tg.stop().await;
}
