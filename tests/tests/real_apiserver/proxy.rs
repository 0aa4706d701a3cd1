//! tollgate in front of the real kube-apiserver, with the front-proxy client certificate
//! start.sh made: certificate clients authenticated by tollgate (`--client-ca-file`, the cluster
//! CA) and forwarded as `X-Remote-User`/`X-Remote-Group`, token clients forwarded as they
//! are, and everything the apiserver says passed back as it said it.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use tests::{CertAuthority, KubeUser, KubeVersion};

use super::stack::{forbidden_as, forbidden_reply, Stack, TOKEN};
use super::{item_names, Http, Reply};

/// How long a test waits for a watcher to print an expected line.
const WATCH_WAIT: Duration = Duration::from_secs(30);

per_version!(
    identities_reach_the_real_apiserver_through_tollgate,
    encodings_watches_and_paging_pass_through,
    the_apiservers_own_429_passes_through_unchanged,
);

fn identities_reach_the_real_apiserver_through_tollgate(
    version: KubeVersion,
) -> anyhow::Result<()> {
    let s = Stack::start(version, &[])?;
    let admin = s.kubectl("admin", &s.kube.admin_user()?)?;
    let user = s.kubectl("test-user", &s.kube.test_user()?)?;
    let token = s.kubectl("token", &KubeUser::Token(TOKEN.into()))?;

    // The admin (system:masters) may do anything; the unprivileged users are who they are.
    assert_eq!(
        admin
            .ok(&["auth", "can-i", "list", "secrets", "-A"])?
            .trim(),
        "yes"
    );
    admin.ok(&["get", "secrets", "-A"])?;
    for (who, k) in [
        ("test-user (certificate)", &user),
        ("test-user (token)", &token),
    ] {
        let out = k.run(&["auth", "can-i", "list", "secrets"])?;
        assert_eq!(out.stdout.trim(), "no", "{who} may list secrets");
        assert_eq!(
            k.ok(&["auth", "can-i", "list", "pods"])?.trim(),
            "yes",
            "{who}"
        );
        forbidden_as(k, &["get", "secrets", "-n", "default"], "test-user")?;
        k.ok(&["get", "pods", "-n", "default"])?;
    }
    // (kubectl cannot even discover the API anonymously on 1.20: curl asks directly.)
    forbidden_reply(
        &s.via_tollgate()?.get("/api/v1/namespaces/default/pods")?,
        "system:anonymous",
        "anonymous",
    )?;

    // Spoofed X-Remote-* from clients never reach the apiserver: test-user's request goes out
    // with tollgate's front-proxy certificate, so headers that got through would make it admin.
    let spoof = ["X-Remote-User: admin", "X-Remote-Group: system:masters"];
    let secrets = "/api/v1/namespaces/default/secrets";
    for (who, h, seen_as) in [
        ("certificate", s.user_cert(s.via_tollgate()?)?, "test-user"),
        ("token", s.via_tollgate()?.with_token(TOKEN), "test-user"),
        ("anonymous", s.via_tollgate()?, "system:anonymous"),
    ] {
        for http2 in [false, true] {
            let h = if http2 {
                h.clone().with_http2()
            } else {
                h.clone()
            };
            let r = h.send("GET", secrets, None, &spoof)?;
            forbidden_reply(&r, seen_as, &format!("{who} with spoofed X-Remote-*"))?;
        }
    }

    // Impersonate-* reach the apiserver, which decides: the admin may, test-user may not.
    forbidden_as(
        &admin,
        &["get", "secrets", "--as", "test-user"],
        "test-user",
    )?;
    admin.ok(&[
        "get",
        "secrets",
        "--as",
        "someone",
        "--as-group",
        "system:masters",
    ])?;
    let err = user.fails(&["get", "pods", "--as", "admin"])?;
    // The current release checks constrained impersonation (KEP-5284) first and names that verb
    // on the resource asked for; 1.20 names the legacy `impersonate` on users.
    let refusal = match version {
        KubeVersion::V1_20 => "cannot impersonate resource \"users\"",
        KubeVersion::Current => "cannot impersonate-on:user-info:list resource \"pods\"",
    };
    assert!(
        err.contains(refusal) && err.contains("User \"test-user\""),
        "test-user impersonating: {err}"
    );

    // A client certificate from a CA nobody trusts: the handshake completes and the request
    // gets the apiserver's own 401, through tollgate as directly; with a token it is the token.
    let stranger =
        CertAuthority::generate("stranger-ca")?.issue_client("admin", &["system:masters"])?;
    let (cert, key) = stranger.write_to_dir(s.inputs.path(), "stranger")?;
    let through = s.via_tollgate()?.with_cert(cert.clone(), key.clone());
    let direct = s.direct()?.with_cert(cert, key);
    let (a, b) = (
        through.get("/api/v1/namespaces")?,
        direct.get("/api/v1/namespaces")?,
    );
    assert_eq!((a.code, b.code), (401, 401), "{} / {}", a.text(), b.text());
    assert_eq!(
        a.json()?,
        b.json()?,
        "the 401 Status through tollgate and directly"
    );
    for h in [through.with_token(TOKEN), direct.with_token(TOKEN)] {
        forbidden_reply(
            &h.get(secrets)?,
            "test-user",
            "stranger certificate + token",
        )?;
        h.get("/api/v1/namespaces/default/pods")?
            .expect(200, "pods with the token")?;
    }

    // tollgate's own identity served its health checks, never a forwarded request (anonymous
    // above was refused as system:anonymous).
    s.still_running()
}

fn encodings_watches_and_paging_pass_through(version: KubeVersion) -> anyhow::Result<()> {
    const OBJECTS: usize = 150;
    let s = Stack::start(version, &[])?;
    let admin = s.kubectl("admin", &s.kube.admin_user()?)?;
    let user = s.kubectl("test-user", &s.kube.test_user()?)?;

    // 150 ConfigMaps of ~1.5 KB: a LIST of ~250 KB, over the apiserver's 128 KB gzip threshold.
    admin.ok(&["create", "namespace", "load"])?;
    let manifest = s.inputs.path().join("configmaps.json");
    let filler = "x".repeat(1500);
    let items: Vec<serde_json::Value> = (0..OBJECTS)
        .map(|i| {
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("cm-{i:03}"), "namespace": "load",
                             "labels": {"batch": (i % 3).to_string()}},
                "data": {"filler": filler}})
        })
        .collect();
    std::fs::write(
        &manifest,
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string(),
    )?;
    user.ok(&["create", "-f", &manifest.display().to_string()])?;

    let list = "/api/v1/namespaces/load/configmaps";
    let via = s.user_cert(s.via_tollgate()?)?;
    let direct = s.admin_cert(s.direct()?)?;
    // A fixed revision, so both sides must answer byte for byte the same.
    let rv = via.get(list)?.expect(200, "list")?.json()?["metadata"]["resourceVersion"]
        .as_str()
        .context("list resourceVersion")?
        .to_string();
    let exact = format!("{list}?resourceVersion={rv}&resourceVersionMatch=Exact");

    // JSON, over HTTP/1.1 and HTTP/2.
    for h in [via.clone(), via.clone().with_http2()] {
        let r = h.send("GET", &exact, None, &["Accept: application/json"])?;
        let r = r.expect(200, "JSON list")?;
        assert_eq!(r.version, if h.http2 { "2" } else { "1.1" });
        assert_eq!(r.header("content-type"), Some("application/json"));
        let d = direct.send("GET", &exact, None, &["Accept: application/json"])?;
        assert!(r.body == d.body, "JSON list differs from the apiserver's");
        assert_eq!(item_names(&r.json()?).len(), OBJECTS);
    }

    // Protobuf.
    let accept_pb = "Accept: application/vnd.kubernetes.protobuf";
    let r = via
        .send("GET", &exact, None, &[accept_pb])?
        .expect(200, "protobuf list")?;
    assert_eq!(
        r.header("content-type"),
        Some("application/vnd.kubernetes.protobuf")
    );
    assert!(r.body.starts_with(b"k8s\0"), "protobuf magic");
    let d = direct.send("GET", &exact, None, &[accept_pb])?;
    assert!(
        r.body == d.body,
        "protobuf list differs from the apiserver's"
    );

    // gzip: compressed by the apiserver, passed through compressed, inflating to the same bytes.
    for h in [via.clone(), via.clone().with_http2()] {
        let r = h.send(
            "GET",
            &exact,
            None,
            &["Accept-Encoding: gzip", "Accept: application/json"],
        )?;
        let r = r.expect(200, "gzip list")?;
        assert_eq!(
            r.header("content-encoding"),
            Some("gzip"),
            "{:?}",
            r.headers
        );
        assert!(r.body.starts_with(&[0x1f, 0x8b]), "a gzip stream");
        let plain = gunzip(&r.body)?;
        assert!(plain.len() > 128 * 1024, "{} bytes", plain.len());
        let d = direct.send("GET", &exact, None, &["Accept: application/json"])?;
        assert!(
            plain == d.body,
            "inflated list differs from the apiserver's"
        );
        assert!(
            r.body.len() * 4 < plain.len(),
            "compressed {} of {}",
            r.body.len(),
            plain.len()
        );
    }

    // A watch over HTTP/2: every change after `rv`, in order, then the apiserver ends it.
    user.ok(&["label", "configmap", "cm-000", "-n", "load", "watched=yes"])?;
    user.ok(&["delete", "configmap", "cm-001", "-n", "load"])?;
    let watch = format!("{list}?watch=1&resourceVersion={rv}&timeoutSeconds=2");
    let r = via.clone().with_http2().get(&watch)?.expect(200, "watch")?;
    assert_eq!(r.version, "2");
    let events: Vec<(String, String)> = r
        .events()?
        .iter()
        .map(|e| {
            let name = e["object"]["metadata"]["name"].as_str().unwrap_or("");
            (
                e["type"].as_str().unwrap_or("").to_string(),
                name.to_string(),
            )
        })
        .collect();
    assert_eq!(
        events,
        [
            ("MODIFIED".into(), "cm-000".into()),
            ("DELETED".into(), "cm-001".into())
        ]
    );

    // kubectl get -w (HTTP/2 through tollgate) sees another client's changes.
    let mut watcher = user.background(
        "120s",
        &[
            "get",
            "configmaps",
            "-n",
            "load",
            "-w",
            "--output-watch-events",
        ],
    )?;
    watcher.wait_for_line(WATCH_WAIT, "ADDED cm-149", |l| {
        l.starts_with("ADDED") && l.contains("cm-149")
    })?;
    admin.ok(&[
        "create",
        "configmap",
        "late",
        "-n",
        "load",
        "--from-literal=k=v",
    ])?;
    watcher.wait_for_line(WATCH_WAIT, "ADDED late", |l| {
        l.starts_with("ADDED") && l.contains(" late ")
    })?;
    admin.ok(&["delete", "configmap", "late", "-n", "load"])?;
    watcher.wait_for_line(WATCH_WAIT, "DELETED late", |l| {
        l.starts_with("DELETED") && l.contains(" late ")
    })?;
    assert!(watcher.is_running(), "the watch is still open");
    drop(watcher);

    // Paging: kubectl's --chunk-size becomes limit/continue, followed through tollgate.
    let paged = user.run(&[
        "get",
        "configmaps",
        "-n",
        "load",
        "--chunk-size=40",
        "-o",
        "name",
        "-v=6",
    ])?;
    let pages = paged
        .stderr
        .lines()
        .filter(|l| l.contains("limit=40"))
        .count();
    let continued = paged
        .stderr
        .lines()
        .filter(|l| l.contains("continue="))
        .count();
    let names = paged.ok()?;
    assert_eq!(
        names.lines().count(),
        OBJECTS - 1,
        "every object once (150 - cm-001 + late - late)"
    );
    assert_eq!((pages, continued), (4, 3), "4 pages of 40");

    s.still_running()
}

fn the_apiservers_own_429_passes_through_unchanged(version: KubeVersion) -> anyhow::Result<()> {
    // Without API Priority and Fairness the classic max-in-flight filter answers 429 at once.
    let s = Stack::start(
        version,
        &[
            "--max-requests-inflight=1",
            "--max-mutating-requests-inflight=1",
            "--enable-priority-and-fairness=false",
        ],
    )?;
    let admin = s.kubectl("admin", &s.kube.admin_user()?)?;
    admin.ok(&["create", "namespace", "load"])?;
    let filler = "y".repeat(4000);
    for i in 0..30 {
        admin.ok(&[
            "create",
            "configmap",
            &format!("cm-{i}"),
            "-n",
            "load",
            &format!("--from-literal=f={filler}"),
        ])?;
    }
    let path = "/api/v1/namespaces/load/configmaps";
    // test-user is not system:masters, so the limit applies; many LISTs at once overlap.
    let via = s.user_cert(s.via_tollgate()?)?.with_http2();
    let direct = s.user_cert(s.direct()?)?.with_http2();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (through, straight) = loop {
        let through = burst(&via, path, 60, s.inputs.path())?;
        let straight = burst(&direct, path, 60, s.inputs.path())?;
        let first = |rs: &[Reply]| rs.iter().find(|r| r.code == 429).cloned();
        if let (Some(a), Some(b)) = (first(&through), first(&straight)) {
            break (a, b);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no 429 from 60 concurrent LISTs within 60 s"
        );
    };
    assert_eq!(
        through.text(),
        "Too many requests, please try again later.\n"
    );
    assert_eq!(
        through.body, straight.body,
        "the 429 body, through tollgate and directly"
    );
    for h in ["retry-after", "content-type"] {
        assert_eq!(through.header(h), straight.header(h), "{h}");
    }
    assert_eq!(through.header("retry-after"), Some("1"));
    // tollgate counted it as the apiserver's, not its own.
    let metrics = s.tollgate.admin_ok("/metrics")?;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tollgate_requests_total") && l.contains("code=\"429\"")),
        "no 429 in tollgate_requests_total"
    );
    s.still_running()
}

/// `n` GETs of `path` at once (curl --parallel, one multiplexed connection), every reply.
fn burst(h: &Http, path: &str, n: usize, dir: &std::path::Path) -> anyhow::Result<Vec<Reply>> {
    let burst_dir = dir.join(format!("burst-{}", std::process::id()));
    std::fs::create_dir_all(&burst_dir)?;
    let mut config = String::new();
    let q = |s: &str| serde_json::Value::from(s).to_string();
    for i in 0..n {
        if i > 0 {
            config.push_str("next\n");
        }
        config.push_str(&format!("url = {}\n", q(&format!("{}{path}", h.base))));
        config.push_str(&format!(
            "output = {}\n",
            q(&burst_dir.join(format!("{i}.body")).display().to_string())
        ));
        config.push_str(&format!(
            "dump-header = {}\n",
            q(&burst_dir.join(format!("{i}.head")).display().to_string())
        ));
        if let Some(ca) = &h.cacert {
            config.push_str(&format!("cacert = {}\n", q(&ca.display().to_string())));
        }
        if let Some((cert, key)) = &h.cert {
            config.push_str(&format!(
                "cert = {}\nkey = {}\n",
                q(&cert.display().to_string()),
                q(&key.display().to_string())
            ));
        }
        if h.http2 {
            config.push_str("http2\n");
        }
    }
    let file = burst_dir.join("curl.conf");
    std::fs::write(&file, config)?;
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "60",
            "--parallel",
            "--parallel-immediate",
            "--parallel-max",
            "60",
            "-K",
        ])
        .arg(&file)
        .output()
        .context("running curl --parallel")?;
    anyhow::ensure!(
        out.status.success(),
        "curl --parallel: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut replies = Vec::new();
    for i in 0..n {
        let head = std::fs::read_to_string(burst_dir.join(format!("{i}.head")))?;
        let mut lines = head.lines();
        let status = lines.next().unwrap_or("");
        let code = status
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        replies.push(Reply {
            code,
            version: status
                .split_whitespace()
                .next()
                .unwrap_or("")
                .trim_start_matches("HTTP/")
                .to_string(),
            headers,
            body: std::fs::read(burst_dir.join(format!("{i}.body"))).unwrap_or_default(),
        });
    }
    std::fs::remove_dir_all(&burst_dir)?;
    Ok(replies)
}

/// Inflates a gzip stream with `gzip -dc` (no compression crate in this package).
fn gunzip(data: &[u8]) -> anyhow::Result<Vec<u8>> {
    use std::io::Write;
    let mut child = Command::new("gzip")
        .arg("-dc")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("running gzip -dc")?;
    let mut stdin = child.stdin.take().context("gzip stdin")?;
    let data = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output()?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("gzip writer panicked"))??;
    anyhow::ensure!(out.status.success(), "gzip -dc failed");
    Ok(out.stdout)
}
