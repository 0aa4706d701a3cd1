//! Identity over real TLS on both sides: certificate clients are forwarded
//! with the front-proxy certificate and X-Remote-* headers; token and
//! anonymous clients never get tollgate's credentials; spoofed X-Remote-*
//! never reaches the upstream; health checks use tollgate's own identity.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

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
    setup_with(None, |_| {}).await
}

async fn setup_with(
    max_streams: Option<u32>,
    configure: impl FnOnce(&mut tollgate::Config),
) -> Setup {
    tollgate::install_crypto_provider();
    let pki = Pki::new();
    let up = front_proxy_upstream(&pki, max_streams).await;

    let (tg_cert, tg_key) = pki.leaf(&pki.serving_ca, "tollgate", "tollgate", None, true);
    let (fp_cert, fp_key) = pki.leaf(
        &pki.front_ca,
        "front-proxy",
        "front-proxy-client",
        None,
        false,
    );
    let (own_cert, own_key) = pki.leaf(&pki.front_ca, "own", "tollgate-health", None, false);
    let mut c = config(&[&up.url]);
    c.tls.cert_file = Some(tg_cert);
    c.tls.key_file = Some(tg_key);
    c.tls.client_ca_file = Some(pki.write("client-ca.crt", &pki.client_ca.pem));
    c.upstream.ca_file = Some(pki.write("serving-ca.crt", &pki.serving_ca.pem));
    c.upstream.front_proxy_cert_file = Some(fp_cert);
    c.upstream.front_proxy_key_file = Some(fp_key);
    c.upstream.client_cert_file = Some(own_cert);
    c.upstream.client_key_file = Some(own_key);
    configure(&mut c);
    let tg = start(c).await;
    Setup { pki, up, tg }
}

async fn get(client: &TlsClient, url: &str, headers: &[(&str, &str)]) -> StatusCode {
    let mut req = Request::get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .request(req.body(body(Bytes::new())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let _ = resp.into_body().collect().await;
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_clients_reach_the_apiserver_as_themselves() {
    let s = setup().await;
    let (cert, key) = s
        .pki
        .leaf(&s.pki.client_ca, "alice", "alice", Some("dev"), false);
    for h2 in [false, true] {
        let client = tls_client(&s.pki.serving_ca.pem, Some((&cert, &key)), h2);
        let path = format!("/api/v1/namespaces/a/pods?h2={h2}");
        let spoof = [
            ("x-remote-user", "system:admin"),
            ("x-remote-group", "system:masters"),
            ("impersonate-user", "bob"),
        ];
        assert_eq!(
            get(&client, &s.tg.url("https", &path), &spoof).await,
            StatusCode::OK
        );
        let seen = s.up.last_for(&path);
        assert_eq!(
            seen.peer_cn.as_deref(),
            Some("front-proxy-client"),
            "front-proxy cert presented"
        );
        assert_eq!(seen.headers["x-remote-user"], "alice");
        let groups: Vec<_> = seen.headers.get_all("x-remote-group").iter().collect();
        assert_eq!(groups, vec!["dev"]);
        assert_eq!(
            seen.headers["impersonate-user"], "bob",
            "impersonation is the apiserver's call"
        );
    }
    s.tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_and_anonymous_clients_never_carry_tollgate_credentials() {
    let s = setup().await;
    let client = tls_client(&s.pki.serving_ca.pem, None, false);
    let path = "/api/v1/namespaces/a/configmaps?token";
    let headers = [
        ("authorization", "Bearer sekret"),
        ("x-remote-user", "system:admin"),
    ];
    assert_eq!(
        get(&client, &s.tg.url("https", path), &headers).await,
        StatusCode::OK
    );
    let seen = s.up.last_for(path);
    assert_eq!(
        seen.peer_cn, None,
        "no client certificate toward the upstream"
    );
    assert_eq!(seen.headers["authorization"], "Bearer sekret");
    assert!(!seen.headers.contains_key("x-remote-user"));

    let path = "/api/v1/namespaces/a/configmaps?anonymous";
    assert_eq!(
        get(
            &client,
            &s.tg.url("https", path),
            &[("x-remote-group", "system:masters")]
        )
        .await,
        StatusCode::OK
    );
    let seen = s.up.last_for(path);
    assert_eq!(seen.peer_cn, None);
    assert!(!seen.headers.contains_key("authorization"));
    assert!(!seen.headers.contains_key("x-remote-group"));

    // The token is in no metric and no pattern.
    let metrics = s.tg.gateway.encode_metrics().unwrap();
    let patterns = serde_json::to_string(&s.tg.gateway.patterns()).unwrap();
    assert!(!metrics.contains("sekret") && !patterns.contains("sekret"));
    assert!(patterns.contains("token:"), "{patterns}");
    s.tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_use_tollgates_own_identity() {
    let s = setup().await;
    let up = &s.up;
    eventually("a health check", Duration::from_secs(10), || {
        up.seen().iter().any(|x| x.path.ends_with("/readyz"))
    })
    .await;
    let check = up.last_for("/readyz");
    assert_eq!(check.peer_cn.as_deref(), Some("tollgate-health"));
    // Ready once the upstream's identity header names are read too (with its own identity).
    let g = s.tg.gateway.clone();
    eventually("ready", Duration::from_secs(10), || g.ready()).await;
    let (code, _) = get_text(&h1_client(), &s.tg.admin_url("/readyz")).await;
    assert_eq!(code, StatusCode::OK);
    let list = up.last_for("/api/v1/namespaces/kube-system/configmaps?");
    assert_eq!(list.peer_cn.as_deref(), Some("tollgate-health"));
    s.tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_over_tls_keep_the_client_identity() {
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = setup().await;
    let (cert, key) = s
        .pki
        .leaf(&s.pki.client_ca, "bob", "bob", Some("ops"), false);
    let client = tls_client(&s.pki.serving_ca.pem, Some((&cert, &key)), false);
    let req = Request::get(s.tg.url("https", "/api/v1/namespaces/a/pods/p/portforward"))
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("x-remote-user", "mallory")
        .body(body(Bytes::new()))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    let mut io = TokioIo::new(hyper::upgrade::on(resp).await.unwrap());
    io.write_all(b"port-forward bytes").await.unwrap();
    let mut back = [0u8; 18];
    tokio::time::timeout(Duration::from_secs(5), io.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&back, b"port-forward bytes");
    let seen = s.up.last_for("/portforward");
    assert_eq!(
        seen.version,
        http::Version::HTTP_11,
        "upgrades go over HTTP/1.1"
    );
    assert_eq!(seen.peer_cn.as_deref(), Some("front-proxy-client"));
    assert_eq!(seen.headers["x-remote-user"], "bob");
    drop(io);
    s.tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_past_the_upstream_stream_cap_open_another_connection() {
    let s = setup_with(Some(3), |c| c.upstream.max_streams_per_connection = 3).await;
    let client = tls_client(&s.pki.serving_ca.pem, None, true);
    let mut watches = Vec::new();
    for i in 0..8 {
        let url = s.tg.url(
            "https",
            &format!("/api/v1/pods?watch=1&resourceVersion={}", 100 + i),
        );
        let resp = tokio::time::timeout(
            Duration::from_secs(5),
            client.request(Request::get(url).body(body(Bytes::new())).unwrap()),
        )
        .await
        .unwrap_or_else(|_| panic!("watch {i} waits for a stream"))
        .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        watches.push(resp);
    }
    let up = &s.up;
    eventually("8 watches upstream", Duration::from_secs(5), || {
        up.events.receiver_count() == 8
    })
    .await;
    up.events
        .send(Bytes::from_static(b"{\"type\":\"ADDED\"}\n"))
        .unwrap();
    for (i, w) in watches.iter_mut().enumerate() {
        let frame = tokio::time::timeout(Duration::from_secs(5), w.body_mut().frame()).await;
        assert!(matches!(frame, Ok(Some(Ok(_)))), "watch {i} got the event");
    }
    drop(watches);
    s.tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_gives_the_server_ca_and_own_identity_for_health_checks_only() {
    let s = setup().await;
    let (own_cert, own_key) = s.pki.leaf(
        &s.pki.front_ca,
        "kube-own",
        "tollgate-from-kubeconfig",
        None,
        false,
    );
    let ca = s.pki.write("kube-ca.crt", &s.pki.serving_ca.pem);
    let kubeconfig = s.pki.write(
        "kubeconfig",
        &format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: {}\n    certificate-authority: {}\n\
contexts:\n- name: c\n  context: {{cluster: k, user: u}}\nusers:\n- name: u\n  user:\n    client-certificate: {}\n    client-key: {}\n",
            s.up.url,
            ca.display(),
            own_cert.display(),
            own_key.display()
        ),
    );
    let flags = tollgate::Flags {
        upstream_kubeconfig: Some(kubeconfig),
        ..Default::default()
    };
    let mut c = tollgate::Config::load(&flags).unwrap();
    assert_eq!(c.upstream.urls, vec![s.up.url.clone()]);
    c.drain.window_seconds = 0.0;
    c.upstream.health_check.interval_seconds = 0.1;
    let tg = start(c).await;
    let up = &s.up;
    eventually(
        "a health check with the kubeconfig identity",
        Duration::from_secs(10),
        || {
            up.seen().iter().any(|x| {
                x.path.ends_with("/readyz")
                    && x.peer_cn.as_deref() == Some("tollgate-from-kubeconfig")
            })
        },
    )
    .await;
    let (code, _) = get_text(
        &h1_client(),
        &tg.url("http", "/api/v1/namespaces/k/pods/p?via=kubeconfig"),
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    let seen = up.last_for("via=kubeconfig");
    assert_eq!(
        seen.peer_cn, None,
        "forwarded requests never carry tollgate's own identity"
    );
    tg.stop().await;
    s.tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn light_requests_over_http1_upstream_bulk_ones_over_http2() {
    let s = setup_with(None, |c| {
        c.upstream.light_protocol = tollgate::config::LightProtocol::Http1;
        c.upstream.max_light_connections = 1;
    })
    .await;
    let (cert, key) = s
        .pki
        .leaf(&s.pki.client_ca, "carol", "carol", Some("dev"), false);
    let version = |needle: &str| s.up.last_for(needle).version;
    for h2 in [false, true] {
        let client = tls_client(&s.pki.serving_ca.pem, Some((&cert, &key)), h2);
        // A GET, a PATCH with a body: light, over HTTP/1.1 with the client's identity.
        let get = format!("/api/v1/namespaces/a/pods/p?light={h2}");
        assert_eq!(
            get_status(&client, &s.tg.url("https", &get)).await,
            StatusCode::OK
        );
        let patch = format!("/api/v1/nodes/n1/status?patch={h2}");
        let req = Request::patch(s.tg.url("https", &patch))
            .header("content-type", "application/strategic-merge-patch+json")
            .body(body(Bytes::from_static(b"{\"status\":{}}")))
            .unwrap();
        let resp = client.request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let _ = resp.into_body().collect().await;
        for path in [&get, &patch] {
            let seen = s.up.last_for(path);
            assert_eq!(seen.version, http::Version::HTTP_11, "{path}");
            assert_eq!(seen.peer_cn.as_deref(), Some("front-proxy-client"));
            assert_eq!(seen.headers["x-remote-user"], "carol");
            assert_eq!(seen.headers["x-remote-group"], "dev");
        }
        // A LIST and a watch: bulk, over HTTP/2 as before.
        let list = format!("/api/v1/namespaces/a/pods?bulk={h2}");
        assert_eq!(
            get_status(&client, &s.tg.url("https", &list)).await,
            StatusCode::OK
        );
        assert_eq!(version(&list), http::Version::HTTP_2, "a LIST");
        let watch = format!("/api/v1/pods?watch=1&resourceVersion=7&w={h2}");
        let resp = client
            .request(
                Request::get(s.tg.url("https", &watch))
                    .body(body(Bytes::new()))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(version(&watch), http::Version::HTTP_2, "a watch");
        drop(resp);
    }
    // Anonymous clients too, without tollgate's certificate.
    let anonymous = tls_client(&s.pki.serving_ca.pem, None, true);
    let get = "/api/v1/namespaces/a/configmaps/c?anonymous";
    assert_eq!(
        get_status(&anonymous, &s.tg.url("https", get)).await,
        StatusCode::OK
    );
    let seen = s.up.last_for(get);
    assert_eq!((seen.version, seen.peer_cn), (http::Version::HTTP_11, None));
    // One HTTP/1.1 request in flight at most (maxLightConnections: 1): while a
    // light response is unread, the next light request goes over HTTP/2.
    let client = tls_client(&s.pki.serving_ca.pem, Some((&cert, &key)), true);
    let held = client
        .request(
            Request::get(s.tg.url("https", "/stream/50000000?held"))
                .body(body(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(version("/stream/50000000?held"), http::Version::HTTP_11);
    let next = "/api/v1/namespaces/a/pods/p?past-the-cap";
    assert_eq!(
        get_status(&client, &s.tg.url("https", next)).await,
        StatusCode::OK
    );
    assert_eq!(version(next), http::Version::HTTP_2, "past the cap");
    // The held response's slot is freed once its body is dropped.
    drop(held);
    let again = "/api/v1/namespaces/a/pods/p?after";
    let mut back_on_h1 = false;
    for _ in 0..50 {
        assert_eq!(
            get_status(&client, &s.tg.url("https", again)).await,
            StatusCode::OK
        );
        if version(again) == http::Version::HTTP_11 {
            back_on_h1 = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        back_on_h1,
        "light requests return to HTTP/1.1 once the slot is free"
    );
    s.tg.stop().await;
}

async fn get_status(client: &TlsClient, url: &str) -> StatusCode {
    get(client, url, &[]).await
}
