//! The real binary: `check-config`, SIGHUP reload (a bad file keeps the
//! running config), SIGTERM drain and exit.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use http::StatusCode;

const EXE: &str = env!("CARGO_BIN_EXE_tollgate");

#[test]
fn check_config_refuses_a_bad_file_with_exit_64() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "upstream:\n  urls: [\"http://127.0.0.1:1\"]\nlisen: x\n",
    )
    .unwrap();
    let out = Command::new(EXE)
        .args(["check-config", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lisen"), "{err}");

    let out = Command::new(EXE)
        .args(["check-config", "--upstream", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("configuration OK"));

    let out = Command::new(EXE)
        .args([
            "check-config",
            "--upstream",
            "http://127.0.0.1:1",
            "--tls-cert",
            "/nonexistent.crt",
            "--tls-key",
            "/nonexistent.key",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.crt"));
}

/// Wait for a stderr line containing `needle`.
fn wait_line(rx: &mpsc::Receiver<String>, needle: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return line,
            Ok(_) => {}
            Err(e) => panic!("no line with {needle:?}: {e}"),
        }
    }
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let start = line.find(key).unwrap() + key.len();
    let rest = &line[start..];
    let rest = rest.trim_start_matches("Some(");
    let end = rest.find([' ', ')']).unwrap_or(rest.len());
    &rest[..end]
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_and_sigterm_drains() {
    let up = Upstream::start(None).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.yaml");
    std::fs::write(
        &file,
        format!(
            "upstream:\n  urls: [\"{}\"]\ndrain:\n  windowSeconds: 0\n",
            up.url
        ),
    )
    .unwrap();
    let mut child = Command::new(EXE)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(&file)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let started = tokio::task::spawn_blocking({
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        let rx2 = rx.clone();
        move || (wait_line(&rx2.lock().unwrap(), "tollgate started"), rx)
    });
    let (line, rx) = started.await.unwrap();
    let listen = field(&line, "listen=").to_string();
    let admin = field(&line, "admin=").to_string();
    let client = h1_client();
    let (code, _) = get_text(
        &client,
        &format!("http://{listen}/api/v1/namespaces/a/pods/x"),
    )
    .await;
    assert_eq!(code, StatusCode::OK);

    std::fs::write(&file, "upstream:\n  urlz: []\n").unwrap();
    signal(child.id(), "-HUP");
    let rx2 = rx.clone();
    tokio::task::spawn_blocking(move || wait_line(&rx2.lock().unwrap(), "reload refused"))
        .await
        .unwrap();
    let (code, _) = get_text(
        &client,
        &format!("http://{listen}/api/v1/namespaces/a/pods/y"),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "still serving with the old config");
    let (code, metrics) = get_text(&client, &format!("http://{admin}/metrics")).await;
    assert_eq!(code, StatusCode::OK);
    assert!(metrics.contains("tollgate_requests_total"));

    // A good file is picked up without a signal.
    std::fs::write(
        &file,
        format!(
            "upstream:\n  urls: [\"{}\"]\ndrain:\n  windowSeconds: 0\npatterns:\n  capacity: 5\n",
            up.url
        ),
    )
    .unwrap();
    let rx2 = rx.clone();
    let line = tokio::task::spawn_blocking(move || {
        wait_line(&rx2.lock().unwrap(), "configuration reloaded")
    })
    .await
    .unwrap();
    // The line says what changed, and only that.
    assert!(line.contains("patterns: "), "{line}");
    assert!(line.contains("capacity: 10000"), "{line}");
    assert!(line.contains("capacity: 5"), "{line}");
    assert!(!line.contains("mode: "), "{line}");
    let (_, metrics) = get_text(&client, &format!("http://{admin}/metrics")).await;
    assert!(
        metrics.contains("tollgate_config_reloads_total{result=\"ok\"} 1"),
        "{metrics}"
    );

    signal(child.id(), "-TERM");
    let status = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                return s;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap();
    assert!(status.success(), "{status}");
}

/// SIGTERM with only idle connections open (clients' kept-alive pools) ends at once, not at
/// the end of the drain window (30 s by default): spreading closes over the window is for
/// requests in flight, such as watches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_no_request_in_flight_exits_at_once() {
    let up = Upstream::start(None).await;
    let mut child = Command::new(EXE)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--upstream",
            &up.url,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = tokio::task::spawn_blocking(move || wait_line(&rx, "tollgate started"))
        .await
        .unwrap();
    let listen = field(&line, "listen=").to_string();
    // Several clients, each with its own kept-alive connection: the drain gives each
    // connection its own moment in the window (the second one's is ~18 s in).
    let clients: Vec<HttpClient> = (0..4).map(|_| h1_client()).collect();
    for (i, c) in clients.iter().enumerate() {
        let url = format!("http://{listen}/api/v1/namespaces/a/pods/p{i}");
        let (code, _) = get_text(c, &url).await;
        assert_eq!(code, StatusCode::OK);
    }
    let sent = std::time::Instant::now();
    signal(child.id(), "-TERM");
    let status = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(40);
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                return s;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap();
    let took = sent.elapsed();
    assert!(status.success(), "{status}");
    assert!(
        took < Duration::from_secs(5),
        "idle connections kept the drain going for {took:?} (window 30 s)"
    );
    drop(clients);
}
