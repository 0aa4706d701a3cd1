//! Issue 34's probes on the wire, in-process against the loopback upstream: identity
//! fails closed in every mode and follows the apiserver's trusted names within seconds;
//! junk tokens cause a bounded number of TokenReviews; health probes are answered with
//! the admin listener's cap held; one address cannot lock another out of the client
//! listener; a chunk size past 64 bits is a 400 Status, not a 502.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate::config::Mode;

struct Setup {
    pki: Pki,
    up: Upstream,
    tg: Running,
}

/// tollgate over TLS with a front-proxy certificate and an identity of its own, in front
/// of a TLS upstream; `publish` is the upstream's extension-apiserver-authentication.
async fn with_front_proxy(
    publish: Option<serde_json::Value>,
    configure: impl FnOnce(&mut tollgate::Config),
) -> Setup {
    tollgate::install_crypto_provider();
    let pki = Pki::new();
    let up = front_proxy_upstream(&pki, None).await;
    *up.auth.data.lock().unwrap() = publish;
    let (tg_cert, tg_key) = pki.leaf(&pki.serving_ca, "tollgate", "tollgate", None, true);
    let (fp_cert, fp_key) = pki.leaf(&pki.front_ca, "fp", "front-proxy-client", None, false);
    let (own_cert, own_key) = pki.leaf(&pki.front_ca, "own", "tollgate-own", None, false);
    let mut c = config(&[&up.url]);
    c.tls.cert_file = Some(tg_cert);
    c.tls.key_file = Some(tg_key);
    c.tls.client_ca_file = Some(pki.write("client-ca.crt", &pki.client_ca.pem));
    c.upstream.ca_file = Some(pki.write("serving-ca.crt", &pki.serving_ca.pem));
    c.upstream.front_proxy_cert_file = Some(fp_cert);
    c.upstream.front_proxy_key_file = Some(fp_key);
    c.upstream.client_cert_file = Some(own_cert);
    c.upstream.client_key_file = Some(own_key);
    // A watch renewed every 30 s: the old 30 s poll could not pass the 5 s check below.
    // Failed reads are retried after 1 s, 2 s, 4 s...
    c.upstream.request_headers.refresh_seconds = 30.0;
    configure(&mut c);
    let tg = start(c).await;
    Setup { pki, up, tg }
}

/// What every client sends to become the admin, under names the apiserver may trust.
const SPOOF: [(&str, &str); 8] = [
    ("X-Forwarded-User", "admin"),
    ("X-Forwarded-Groups", "system:masters"),
    ("x-evil-group", "system:masters"),
    ("X-Later-Groups", "system:masters"),
    ("X-Forwarded-Extra-Scopes", "everything"),
    ("X-Forwarded-Uid", "0"),
    ("X-Remote-Group", "system:masters"),
    ("x-user", "admin"),
];

/// `alice`'s request through tollgate with [`SPOOF`], over HTTP/1.1 or HTTP/2: the
/// headers the upstream saw.
async fn spoofed(s: &Setup, h2: bool, tag: &str) -> http::HeaderMap {
    let (cert, key) = s
        .pki
        .leaf(&s.pki.client_ca, "alice", "alice", Some("dev"), false);
    let client = tls_client(&s.pki.serving_ca.pem, Some((&cert, &key)), h2);
    let path = format!("/api/v1/namespaces/a/pods/p?{tag}&h2={h2}");
    let mut req = Request::get(s.tg.url("https", &path));
    for (k, v) in SPOOF {
        req = req.header(k, v);
    }
    let resp = client
        .request(req.body(body(Bytes::new())).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let _ = resp.into_body().collect().await;
    s.up.last_for(&path).headers
}

async fn readyz(tg: &Running) -> (StatusCode, String) {
    get_text(&h1_client(), &tg.admin_url("/readyz")).await
}

/// Issue 34, items 1-3: with the apiserver's names unknown, tollgate in `off` and `dryRun`
/// (as in `enforce`) strips every header that could carry identity, over HTTP/1.1 and
/// HTTP/2, and is not ready, saying why; once the apiserver publishes its names it is
/// ready, and a name the apiserver starts to trust is stripped within seconds (watched,
/// not polled every 60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_fails_closed_in_every_mode_and_follows_the_apiservers_names() {
    for mode in [Mode::Off, Mode::DryRun] {
        let s = with_front_proxy(None, |c| c.mode = mode).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        let why = loop {
            let (code, why) = readyz(&s.tg).await;
            assert_ne!(code, StatusCode::OK, "{mode:?}: ready without the names");
            // Past the first read of the ConfigMap, which found none.
            if why.contains("publishes no such ConfigMap") || Instant::now() > deadline {
                break why;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        for what in [
            "not known",
            "usernameHeaders",
            "publishes no such ConfigMap",
        ] {
            assert!(why.contains(what), "{mode:?}: /readyz says {why}");
        }
        for h2 in [false, true] {
            let seen = spoofed(&s, h2, "blind").await;
            for (name, _) in SPOOF {
                let name = name.to_ascii_lowercase();
                if name == "x-remote-group" {
                    continue;
                }
                assert!(!seen.contains_key(&name), "{mode:?} h2={h2}: {name} passed");
            }
            assert_eq!(seen["x-remote-user"], "alice");
            let groups: Vec<_> = seen.get_all("x-remote-group").iter().collect();
            assert_eq!(groups, ["dev"], "{mode:?} h2={h2}: only alice's groups");
        }

        // The apiserver publishes its names, X-Evil-Group among them: ready.
        let mut names = AuthConfigMap::kubeadm();
        names["requestheader-group-headers"] = "[\"X-Remote-Group\",\"X-Evil-Group\"]".into();
        s.up.auth.publish(Some(names.clone()));
        let g = s.tg.gateway.clone();
        eventually(
            "ready once the names are known",
            Duration::from_secs(15),
            || g.ready(),
        )
        .await;
        assert_eq!(readyz(&s.tg).await.0, StatusCode::OK);
        // Learned, the wildcard is off: X-Forwarded-User is no name this apiserver trusts.
        let seen = spoofed(&s, false, "learned").await;
        assert!(!seen.contains_key("x-evil-group"));
        assert_eq!(seen["x-forwarded-user"], "admin");

        // It starts to trust X-Later-Groups: stripped within seconds.
        let changed = Instant::now();
        names["requestheader-group-headers"] =
            "[\"X-Remote-Group\",\"X-Evil-Group\",\"X-Later-Groups\"]".into();
        s.up.auth.publish(Some(names));
        let trusted = s.tg.gateway.pool().trusted_headers().clone();
        eventually("the new name stripped", Duration::from_secs(5), || {
            trusted
                .get()
                .strips(&http::HeaderName::from_static("x-later-groups"))
        })
        .await;
        let took = changed.elapsed();
        let seen = spoofed(&s, true, "later").await;
        assert!(!seen.contains_key("x-later-groups"), "{mode:?}");
        assert!(took < Duration::from_secs(5), "{mode:?}: {took:?}");
        s.tg.stop().await;
    }
}

/// Names configured by hand without the extra prefix and the uid (issue 34, item 3): the
/// missing kinds are stripped by the wildcard, and without the ConfigMap tollgate is not
/// ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incomplete_configured_names_strip_the_rest_and_are_not_ready() {
    let s = with_front_proxy(None, |c| {
        let names = &mut c.upstream.request_headers;
        names.username_headers = vec!["X-Forwarded-User".into()];
        names.group_headers = vec!["X-Forwarded-Groups".into()];
    })
    .await;
    let seen = spoofed(&s, false, "incomplete").await;
    assert!(!seen.contains_key("x-forwarded-extra-scopes"));
    assert!(!seen.contains_key("x-forwarded-uid"));
    assert_eq!(
        seen["x-forwarded-user"], "alice",
        "configured names carry alice"
    );
    let (code, why) = readyz(&s.tg).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(why.contains("extraHeadersPrefixes, uidHeaders"), "{why}");
    s.tg.stop().await;
}

/// Issue 34, item 4: 3,000 junk tokens from one address made 3,000 TokenReviews (each
/// with tollgate's own identity). Now the address's bucket bounds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_tokens_from_one_address_cause_few_reviews() {
    use futures_util::StreamExt;
    let up = Upstream::start(None).await;
    let mut c = config(&[&up.url]);
    c.token_review.enabled = true;
    let limits = (
        c.token_review.per_source_burst,
        c.token_review.per_source_per_second,
    );
    let tg = start(c).await;
    let client = h2_client();
    let started = Instant::now();
    let statuses: Vec<StatusCode> = futures_util::stream::iter(0..3000)
        .map(|i| {
            let req = Request::get(tg.url("http", &format!("/api/v1/namespaces/a/pods/p?i={i}")))
                .header("authorization", format!("Bearer junk-{i}"))
                .body(body(Bytes::new()))
                .unwrap();
            let client = client.clone();
            async move {
                let resp = client.request(req).await.unwrap();
                let status = resp.status();
                let _ = resp.into_body().collect().await;
                status
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    assert!(statuses.iter().all(|s| *s == StatusCode::OK));
    let reviews = || {
        up.seen()
            .iter()
            .filter(|s| s.path.ends_with("/tokenreviews"))
            .count()
    };
    // Reviews started are answered at once; give the last ones a moment.
    let g = tg.gateway.clone();
    eventually(
        "every review made is counted",
        Duration::from_secs(10),
        || {
            let m = g.encode_metrics().unwrap();
            let done: f64 = ["authenticated", "rejected", "error"]
                .iter()
                .map(|r| {
                    metric(
                        &m,
                        &format!("tollgate_token_reviews_total{{result=\"{r}\"}}"),
                    )
                })
                .sum();
            done as usize == reviews()
        },
    )
    .await;
    let made = reviews();
    let bound = limits.0 as f64 + limits.1 * (elapsed + 1.0);
    println!(
        "3000 junk tokens in {elapsed:.1} s (loaded machine): {made} reviews, bound {bound:.0}"
    );
    assert!(made >= 1, "reviews happen at all");
    assert!(
        (made as f64) <= bound,
        "{made} reviews for 3000 junk tokens in {elapsed:.1} s"
    );
    let m = g.encode_metrics().unwrap();
    let limited = metric(&m, "tollgate_token_reviews_total{result=\"limited\"}");
    assert!(limited >= 2000.0, "limited: {limited}");
    tg.stop().await;
}

/// Issue 34, item 7: holding every admin connection idle left `/healthz` and `/readyz`
/// unanswered for 60 s. Past the cap the reserve answers them (and only them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_probes_are_answered_with_the_admin_cap_held() {
    let up = Upstream::start(None).await;
    let mut c = config(&[&up.url]);
    c.admin.max_connections = 8;
    let tg = start(c).await;
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(TcpStream::connect(tg.admin).await.unwrap());
    }
    let g = tg.gateway.clone();
    eventually("the cap is held", Duration::from_secs(10), || {
        metric(
            &g.encode_metrics().unwrap(),
            "tollgate_open_connections{listener=\"admin\"}",
        ) == 8.0
    })
    .await;
    for (path, code) in [
        ("/healthz", StatusCode::OK),
        ("/readyz", StatusCode::OK),
        ("/metrics", StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            get_text(&h1_client(), &tg.admin_url(path)),
        )
        .await;
        let (got, _) = answer.unwrap_or_else(|_| panic!("{path} unanswered"));
        assert_eq!(got, code, "{path}");
    }
    drop(held);
    tg.stop().await;
}

/// Issue 34, item 8: with `maxConnections: 50`, 50 silent connections from one address
/// locked every other address out until the handshake timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holding_its_cap_does_not_lock_out_another() {
    let up = Upstream::start(None).await;
    let mut c = config(&[&up.url]);
    c.max_connections = 50;
    c.max_connections_per_source = 10;
    let tg = start(c).await;
    let mut silent = Vec::new();
    for _ in 0..50 {
        silent.push(TcpStream::connect(tg.addr).await.unwrap());
    }
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_local_address(Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))));
    let other: HttpClient =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(connector);
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        get_text(&other, &tg.url("http", "/api/v1/namespaces/a/pods/p")),
    )
    .await;
    assert_eq!(answer.expect("answered in time").0, StatusCode::OK);
    let m = tg.gateway.encode_metrics().unwrap();
    assert_eq!(
        metric(
            &m,
            "tollgate_connections_refused_total{listener=\"client\"}"
        ),
        40.0
    );
    drop(silent);
    tg.stop().await;
}

/// Issue 34, item 9: a chunk size past 64 bits got a 502 (the upstream blamed); it is
/// the client's error, a 400 Kubernetes Status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_size_overflow_is_a_400_status() {
    let up = Upstream::start(None).await;
    let tg = start(config(&[&up.url])).await;
    for path in ["/api/v1/namespaces/a/configmaps", "/echo"] {
        let mut tcp = TcpStream::connect(tg.addr).await.unwrap();
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Transfer-Encoding: chunked\r\n\r\n2\r\n{{}}\r\nfffffffffffffffffffff\r\nx\r\n0\r\n\r\n"
        );
        tcp.write_all(request.as_bytes()).await.unwrap();
        let answer = read_response(&mut tcp).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
        assert!(answer.contains("\"kind\":\"Status\""), "{path}: {answer}");
    }
    tg.stop().await;
}

/// What the server sent until it closed or went quiet.
async fn read_response(tcp: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(3), tcp.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if out.windows(4).any(|w| w == b"\r\n\r\n") && out.ends_with(b"}") {
            break;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
