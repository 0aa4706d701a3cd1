//! Reaching the server: TLS with a CA or without verification, HTTP/2 or
//! HTTP/1.1, bearer tokens, a kubeconfig, and failing fast when unreachable.

mod common;

use std::sync::{Arc, Mutex};

use base64::Engine;
use common::{config, full, serve_with, tls_server};
use hyper::Response;
use tokio_util::sync::CancellationToken;

type Seen = Arc<Mutex<Vec<(hyper::Version, Option<String>)>>>;

async fn recording_tls_server() -> (common::TestServer, Seen, String) {
    let (cert_pem, _key, cfg) = tls_server();
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let server = serve_with(
        move |req| {
            let s = s.clone();
            async move {
                let auth = req
                    .headers()
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                s.lock().expect("lock").push((req.version(), auth));
                Response::new(full("{}"))
            }
        },
        Some(cfg),
    )
    .await;
    (server, seen, cert_pem)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_ca_speaks_http2_by_default_and_sends_the_token() {
    let (server, seen, ca) = recording_tls_server().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_path = dir.path().join("ca.crt");
    std::fs::write(&ca_path, ca).expect("write");
    let url = format!("https://localhost:{}", server.addr.port());
    let cfg = config(
        &url,
        &[
            "--gets",
            "20/s",
            "--duration",
            "500ms",
            "--certificate-authority",
            ca_path.to_str().expect("p"),
            "--token",
            "abc",
        ],
    );
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("run");
    assert_eq!(report.operation("get").expect("get").ok, 10);
    let seen = seen.lock().expect("lock");
    assert!(seen
        .iter()
        .all(|(v, a)| *v == hyper::Version::HTTP_2 && a.as_deref() == Some("Bearer abc")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_skip_verify_and_http1() {
    let (server, seen, _) = recording_tls_server().await;
    let url = format!("https://127.0.0.1:{}", server.addr.port());
    let cfg = config(
        &url,
        &[
            "--gets",
            "20/s",
            "--duration",
            "500ms",
            "--insecure-skip-tls-verify",
            "--http-version",
            "1.1",
        ],
    );
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("run");
    assert_eq!(report.operation("get").expect("get").ok, 10);
    assert!(seen
        .lock()
        .expect("lock")
        .iter()
        .all(|(v, _)| *v == hyper::Version::HTTP_11));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_certificate_fails_fast() {
    let (server, _, _) = recording_tls_server().await;
    let other_ca = tls_server().0;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_path = dir.path().join("other.crt");
    std::fs::write(&ca_path, other_ca).expect("write");
    let url = format!("https://localhost:{}", server.addr.port());
    let cfg = config(
        &url,
        &[
            "--gets",
            "20/s",
            "--duration",
            "1s",
            "--certificate-authority",
            ca_path.to_str().expect("p"),
        ],
    );
    let err = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect_err("untrusted");
    let text = err.to_string();
    assert!(text.starts_with(&format!("cannot reach {url}")), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_with_ca_data_and_token() {
    let (server, seen, ca) = recording_tls_server().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let b64 = base64::engine::general_purpose::STANDARD.encode(ca);
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: test\nclusters:\n- name: c\n  cluster:\n    server: https://localhost:{}\n    certificate-authority-data: {b64}\nusers:\n- name: u\n  user:\n    token: from-kubeconfig\ncontexts:\n- name: test\n  context:\n    cluster: c\n    user: u\n    namespace: team-a\n",
        server.addr.port()
    );
    let path = dir.path().join("config");
    std::fs::write(&path, kubeconfig).expect("write");
    let cli = <loadgen::cli::Cli as clap::Parser>::try_parse_from([
        "loadgen",
        "--kubeconfig",
        path.to_str().expect("p"),
        "--gets",
        "20/s",
        "--duration",
        "500ms",
        "--no-progress",
    ])
    .expect("flags");
    let report = loadgen::run(cli.into_config().expect("config"), CancellationToken::new())
        .await
        .expect("run");
    assert_eq!(report.operation("get").expect("get").ok, 10);
    assert!(seen
        .lock()
        .expect("lock")
        .iter()
        .all(|(_, a)| a.as_deref() == Some("Bearer from-kubeconfig")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_fails_fast_with_address() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let url = format!("http://{addr}");
    let cfg = config(&url, &["--gets", "1/s", "--duration", "1s"]);
    let started = std::time::Instant::now();
    let err = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect_err("unreachable");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    let text = err.to_string();
    assert!(
        text.contains(&addr.to_string()) && text.contains("cannot reach"),
        "{text}"
    );
}
