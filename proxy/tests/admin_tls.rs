//! The admin listener over TLS with a client CA (issue 20): `/metrics` and `/debug/*` answer
//! only a client certificate the CA signed (401 without one, or with one from another CA);
//! `/healthz`, `/livez` and `/readyz` stay open to probes without a certificate; plain HTTP
//! gets no answer at all. Real TLS on loopback, over HTTP/1.1 and HTTP/2.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;

/// Status and body of `GET url`, or why the request failed.
async fn get(client: &TlsClient, url: &str) -> Result<(StatusCode, String), String> {
    let req = Request::get(url).body(body(Bytes::new())).unwrap();
    let resp = client.request(req).await.map_err(|e| format!("{e:?}"))?;
    let status = resp.status();
    let b = resp.into_body().collect().await.unwrap().to_bytes();
    Ok((status, String::from_utf8_lossy(&b).into_owned()))
}

const PROTECTED: [&str; 3] = ["/metrics", "/debug/patterns", "/debug/budget"];
const HEALTH: [&str; 3] = ["/healthz", "/livez", "/readyz"];

/// tollgate whose admin listener serves TLS (a certificate from `pki`'s serving CA), with
/// `pki`'s client CA as its client CA if `client_ca`.
async fn start_admin_tls(pki: &Pki, up: &Upstream, client_ca: bool) -> Running {
    tollgate::install_crypto_provider();
    let (cert, key) = pki.leaf(&pki.serving_ca, "admin", "tollgate", None, true);
    let mut c = config(&[&up.url]);
    c.admin.tls.cert_file = Some(cert);
    c.admin.tls.key_file = Some(key);
    if client_ca {
        c.admin.tls.client_ca_file = Some(pki.write("admin-ca.crt", &pki.client_ca.pem));
    }
    start(c).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_debug_need_a_client_certificate_the_admin_ca_signed() {
    let pki = Pki::new();
    let up = Upstream::start(None).await;
    let tg = start_admin_tls(&pki, &up, true).await;
    let url = |path: &str| format!("https://{}{path}", tg.admin);
    let g = tg.gateway.clone();
    eventually("an upstream is healthy", Duration::from_secs(10), || {
        g.ready()
    })
    .await;

    let scraper = pki.leaf(&pki.client_ca, "prometheus", "prometheus", None, false);
    let stranger_ca = Ca::new("stranger-ca");
    let stranger = pki.leaf(&stranger_ca, "stranger", "prometheus", None, false);
    for h2 in [false, true] {
        let none = tls_client(&pki.serving_ca.pem, None, h2);
        let signed = tls_client(&pki.serving_ca.pem, Some((&scraper.0, &scraper.1)), h2);
        let other = tls_client(&pki.serving_ca.pem, Some((&stranger.0, &stranger.1)), h2);
        for path in PROTECTED {
            for (who, client) in [("no certificate", &none), ("another CA's", &other)] {
                let (code, text) = get(client, &url(path)).await.unwrap();
                assert_eq!(
                    code,
                    StatusCode::UNAUTHORIZED,
                    "{path}, {who}, h2 {h2}: {text}"
                );
                assert!(text.contains("admin.tls.clientCaFile"), "{text}");
            }
            let (code, text) = get(&signed, &url(path)).await.unwrap();
            assert_eq!(code, StatusCode::OK, "{path}, signed, h2 {h2}: {text}");
        }
        let (_, metrics) = get(&signed, &url("/metrics")).await.unwrap();
        assert!(metrics.contains("tollgate_"), "{metrics}");
        for path in HEALTH {
            for client in [&none, &other, &signed] {
                let (code, text) = get(client, &url(path)).await.unwrap();
                assert_eq!(code, StatusCode::OK, "{path}, h2 {h2}: {text}");
            }
        }
    }

    // Plain HTTP to the TLS listener: no HTTP answer.
    let plain = h1_client()
        .request(
            Request::get(format!("http://{}/metrics", tg.admin))
                .body(body(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert!(
        plain.is_err(),
        "plain HTTP answered: {:?}",
        plain.map(|r| r.status())
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_without_a_client_ca_serves_everything() {
    let pki = Pki::new();
    let up = Upstream::start(None).await;
    let tg = start_admin_tls(&pki, &up, false).await;
    let client = tls_client(&pki.serving_ca.pem, None, false);
    for path in PROTECTED {
        let (code, text) = get(&client, &format!("https://{}{path}", tg.admin))
            .await
            .unwrap();
        assert_eq!(code, StatusCode::OK, "{path}: {text}");
    }
    tg.stop().await;
}

#[test]
fn a_client_ca_without_tls_and_half_a_pair_are_refused() {
    let mut c = config(&["http://127.0.0.1:1"]);
    c.admin.tls.client_ca_file = Some("ca.crt".into());
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("admin.tls.clientCaFile"), "{e}");
    let mut c = config(&["http://127.0.0.1:1"]);
    c.admin.tls.cert_file = Some("admin.crt".into());
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("admin.tls.certFile/keyFile"), "{e}");
    // Files that do not exist: refused before anything is bound.
    let mut c = config(&["http://127.0.0.1:1"]);
    c.admin.tls.cert_file = Some("/nonexistent/admin.crt".into());
    c.admin.tls.key_file = Some("/nonexistent/admin.key".into());
    assert!(tollgate::Gateway::new(c).is_err());
}
