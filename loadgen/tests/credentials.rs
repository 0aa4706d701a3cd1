//! Credentials from a kubeconfig that change during a run: exec credential
//! plugins (a small shell script written by each test) fetched again on
//! expiry and after a 401, and a rotated `tokenFile` picked up.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::{full, serve};
use hyper::Response;
use tokio_util::sync::CancellationToken;

/// `Authorization` headers of the GETs the server saw, in order.
type Seen = Arc<Mutex<Vec<String>>>;

/// A server that records each GET's token and answers 401 to the tokens in `refused`.
async fn token_server(refused: &'static [&'static str]) -> (common::TestServer, Seen) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let server = serve(move |req| {
        let s = s.clone();
        async move {
            let auth = req
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let refuse = refused.iter().any(|r| auth == format!("Bearer {r}"));
            if req.uri().path() != "/version" {
                s.lock().expect("lock").push(auth);
            }
            let mut resp = Response::new(full("{}"));
            if refuse {
                *resp.status_mut() = hyper::StatusCode::UNAUTHORIZED;
            }
            resp
        }
    })
    .await;
    (server, seen)
}

/// Writes an executable `/bin/sh` script.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\nset -eu\n{body}\n")).expect("write script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// A plugin that counts its runs in `count` and answers `tok-N` (N = run
/// number), valid for `ttl_s` seconds if given; it saves its args, `GREETING`
/// and `KUBERNETES_EXEC_INFO` for the test to look at.
fn counting_plugin(dir: &Path, api_version: &str, ttl_s: Option<u32>) -> PathBuf {
    let expiry = match ttl_s {
        Some(s) => format!(
            r#","expirationTimestamp":"'"$(date -u -d "@$(( $(date +%s) + {s} ))" +%Y-%m-%dT%H:%M:%SZ)"'""#
        ),
        None => String::new(),
    };
    let d = dir.display();
    script(
        dir,
        "plugin.sh",
        &format!(
            r#"n=$(cat "{d}/count" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "{d}/count"
echo "$*" > "{d}/args"; echo "${{GREETING:-}}" > "{d}/greeting"; echo "$KUBERNETES_EXEC_INFO" > "{d}/exec-info"
echo '{{"apiVersion":"{api_version}","kind":"ExecCredential","status":{{"token":"tok-'"$n"'"{expiry}}}}}'"#
        ),
    )
}

/// A kubeconfig for `server` whose user runs `plugin` with args and env.
fn exec_kubeconfig(dir: &Path, server: &str, plugin: &Path, api_version: &str) -> PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        r#"apiVersion: v1
kind: Config
current-context: test
clusters:
- name: c
  cluster: {{server: "{server}"}}
contexts:
- name: test
  context: {{cluster: c, user: plugin-user}}
users:
- name: plugin-user
  user:
    exec:
      apiVersion: {api_version}
      command: {plugin}
      args: [--flag, value]
      env: [{{name: GREETING, value: hello}}]
      provideClusterInfo: true
      interactiveMode: Never
"#,
        plugin = plugin.display()
    );
    std::fs::write(&path, text).expect("write kubeconfig");
    path
}

fn kubeconfig_config(kubeconfig: &Path, args: &[&str]) -> loadgen::Config {
    let path = kubeconfig.to_str().expect("utf-8 path");
    let mut argv = vec!["loadgen", "--kubeconfig", path, "--no-progress"];
    argv.extend_from_slice(args);
    let cli = <loadgen::cli::Cli as clap::Parser>::try_parse_from(argv).expect("flags");
    cli.into_config().expect("config")
}

fn runs(dir: &Path) -> u32 {
    std::fs::read_to_string(dir.join("count"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_plugin_token_is_fetched_again_when_it_expires() {
    let (server, seen) = token_server(&[]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let v1 = "client.authentication.k8s.io/v1";
    let plugin = counting_plugin(dir.path(), v1, Some(1));
    let kubeconfig = exec_kubeconfig(dir.path(), &server.url(), &plugin, v1);
    let cfg = kubeconfig_config(&kubeconfig, &["--gets", "20/s", "--duration", "3500ms"]);
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("run");
    let get = report.operation("get").expect("get");
    assert_eq!((get.requests, get.ok), (70, 70), "{:?}", get.status_codes);
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.first().map(String::as_str), Some("Bearer tok-1"));
    // Valid for a second (to the second): fetched again about every second.
    let distinct: std::collections::BTreeSet<&String> = seen.iter().collect();
    assert!(distinct.len() >= 2, "tokens used: {distinct:?}");
    assert!(
        runs(dir.path()) >= 2,
        "the plugin ran {} times",
        runs(dir.path())
    );
    // As client-go runs it: args, env, and KUBERNETES_EXEC_INFO with the cluster.
    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).expect("plugin output");
    assert_eq!(read("args").trim(), "--flag value");
    assert_eq!(read("greeting").trim(), "hello");
    let info: serde_json::Value = serde_json::from_str(&read("exec-info")).expect("exec info");
    assert_eq!(info["apiVersion"], v1);
    assert_eq!(info["kind"], "ExecCredential");
    assert_eq!(info["spec"]["interactive"], false);
    assert_eq!(info["spec"]["cluster"]["server"], server.url());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_runs_the_plugin_again() {
    // tok-1 is refused: the first requests get 401, the plugin runs again,
    // and the rest go out with tok-2.
    let (server, seen) = token_server(&["tok-1"]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let beta = "client.authentication.k8s.io/v1beta1";
    let plugin = counting_plugin(dir.path(), beta, None);
    let kubeconfig = exec_kubeconfig(dir.path(), &server.url(), &plugin, beta);
    let cfg = kubeconfig_config(&kubeconfig, &["--gets", "20/s", "--duration", "3s"]);
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("run");
    let get = report.operation("get").expect("get");
    let unauthorized = get.status_codes.get("401").copied().unwrap_or(0);
    assert!(unauthorized >= 1, "{:?}", get.status_codes);
    assert!(get.ok >= 30, "{:?}", get.status_codes);
    // One run at the start, one after the 401s (another if a request still
    // carrying tok-1 was answered after that).
    let runs = runs(dir.path());
    assert!((2..=3).contains(&runs), "{runs} runs");
    // The rest go out with the token of the last run (tok-2, or tok-3 after
    // the extra run above).
    let seen = seen.lock().expect("lock");
    assert_eq!(
        seen.last().map(String::as_str),
        Some(format!("Bearer tok-{runs}").as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_plugin_fails_the_run_naming_the_user_and_the_command() {
    let (server, _) = token_server(&[]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = script(
        dir.path(),
        "broken.sh",
        "echo 'no credentials for you' >&2; exit 3",
    );
    let v1 = "client.authentication.k8s.io/v1";
    let kubeconfig = exec_kubeconfig(dir.path(), &server.url(), &plugin, v1);
    let cfg = kubeconfig_config(&kubeconfig, &["--gets", "1/s", "--duration", "1s"]);
    let err = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect_err("the plugin fails")
        .to_string();
    assert!(err.contains("kubeconfig user `plugin-user`"), "{err}");
    assert!(err.contains("broken.sh --flag value"), "{err}");
    assert!(err.contains("no credentials for you"), "{err}");

    let missing = dir.path().join("no-such-plugin");
    let kubeconfig = exec_kubeconfig(dir.path(), &server.url(), &missing, v1);
    let cfg = kubeconfig_config(&kubeconfig, &["--gets", "1/s", "--duration", "1s"]);
    let err = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect_err("no plugin");
    let chain = format!(
        "{err}: {}",
        std::error::Error::source(&err)
            .map(|s| s.to_string())
            .unwrap_or_default()
    );
    assert!(chain.contains("cannot run exec plugin"), "{chain}");
    assert!(chain.contains("no-such-plugin"), "{chain}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_token_file_is_read_again() {
    // The server refuses the old token once the file has been rotated; the
    // 401 makes loadgen read the file again (besides its once-a-minute re-read).
    let (server, seen) = token_server(&["old"]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "old\n").expect("write token");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: t\nclusters:\n- name: c\n  cluster: {{server: \"{}\"}}\ncontexts:\n- name: t\n  context: {{cluster: c, user: sa}}\nusers:\n- name: sa\n  user: {{tokenFile: token}}\n",
            server.url()
        ),
    )
    .expect("write kubeconfig");
    let cfg = kubeconfig_config(&kubeconfig, &["--gets", "20/s", "--duration", "3s"]);
    let run = tokio::spawn(loadgen::run(cfg, CancellationToken::new()));
    // Rotate once the first requests went out.
    assert!(
        common::eventually(std::time::Duration::from_secs(10), || !seen
            .lock()
            .expect("lock")
            .is_empty())
        .await
    );
    std::fs::write(&token_file, "new\n").expect("rotate token");
    let report = run.await.expect("join").expect("run");
    let get = report.operation("get").expect("get");
    assert!(get.ok >= 30, "{:?}", get.status_codes);
    let seen = seen.lock().expect("lock");
    assert_eq!(seen.first().map(String::as_str), Some("Bearer old"));
    assert_eq!(seen.last().map(String::as_str), Some("Bearer new"));
}
