//! loadgen against the real kube-apiserver: what loadgen reports in `summary.json` is held
//! against what the apiserver itself counted (`/metrics`, scraped by the admin, whom the
//! max-in-flight filter never refuses) and what it stores (kubectl).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;
use tests::{fresh_workspace_binary, KubeVersion, Kubectl, RealApiserver};

/// How long a loadgen command may take beyond its `--duration`.
pub(super) const LOADGEN_GRACE: Duration = Duration::from_secs(60);
const NODES: u64 = 5;
const PODS: u64 = 200;
const NAMESPACES: u64 = 2;

/// Runs loadgen to completion (killed after `timeout`); its stdout.
pub(super) fn loadgen(args: &[String], timeout: Duration, dir: &Path) -> anyhow::Result<String> {
    let binary = fresh_workspace_binary("loadgen", &["loadgen", "kubeio", "apimodel"]);
    let (out, err) = (dir.join("loadgen.stdout"), dir.join("loadgen.stderr"));
    let shown = format!("loadgen {}", args.join(" "));
    let mut child = Command::new(binary)
        .args(args)
        .env_remove("KUBECONFIG")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(File::create(&out)?)
        .stderr(File::create(&err)?)
        .spawn()
        .with_context(|| format!("starting `{shown}`"))?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("`{shown}` did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    anyhow::ensure!(
        status.success(),
        "`{shown}` failed ({status}):\nstderr: {}\nstdout: {stdout}",
        std::fs::read_to_string(&err).unwrap_or_default().trim()
    );
    Ok(stdout)
}

/// `--server` and the TLS flags for the apiserver as `who` (`ADMIN` or `USER`).
pub(super) fn target(kube: &RealApiserver, who: &str) -> anyhow::Result<Vec<String>> {
    target_at(kube, who, &kube.url, &kube.file("KUBE_CA_CERT")?)
}

/// The same credentials sent to `server` (e.g. tollgate in front of the apiserver), whose serving
/// certificate `ca` signs.
pub(super) fn target_at(
    kube: &RealApiserver,
    who: &str,
    server: &str,
    ca: &Path,
) -> anyhow::Result<Vec<String>> {
    Ok(vec![
        "--server".into(),
        server.to_string(),
        "--certificate-authority".into(),
        ca.display().to_string(),
        "--client-certificate".into(),
        kube.var(&format!("KUBE_{who}_CERT"))?.into(),
        "--client-key".into(),
        kube.var(&format!("KUBE_{who}_KEY"))?.into(),
    ])
}

fn args(base: Vec<String>, more: &[&str]) -> Vec<String> {
    let mut all = base;
    all.extend(more.iter().map(|s| s.to_string()));
    all
}

// === the apiserver's own counters ===

/// Every sample of the apiserver's `/metrics`: (name, labels) → value.
struct Samples(BTreeMap<(String, BTreeMap<String, String>), f64>);

impl Samples {
    fn scrape(admin: &Kubectl) -> anyhow::Result<Samples> {
        let text = admin.ok(&["get", "--raw", "/metrics"])?;
        let out = kubeio::promtext::samples(&text)
            .map(|sample| {
                let labels = sample
                    .labels()
                    .map(|(k, v)| (k.to_string(), v.into_owned()))
                    .collect();
                ((sample.name.to_string(), labels), sample.value)
            })
            .collect();
        Ok(Samples(out))
    }

    /// Whether any series is called `name`.
    fn has(&self, name: &str) -> bool {
        self.0.keys().any(|(n, _)| n == name)
    }

    /// The sum of `name` over the series whose labels include every `(label, value)`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.0
            .iter()
            .filter(|((n, l), _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, v)| *v)
            .sum::<f64>() as u64
    }
}

/// How much `name{labels}` grew from `before` to `after`.
fn grew(before: &Samples, after: &Samples, name: &str, labels: &[(&str, &str)]) -> u64 {
    after
        .sum(name, labels)
        .saturating_sub(before.sum(name, labels))
}

// === summary.json ===

pub(super) fn summary(out: &Path) -> anyhow::Result<Value> {
    let path = out.join("summary.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

pub(super) fn op<'a>(s: &'a Value, name: &str) -> anyhow::Result<&'a Value> {
    s["operations"]
        .as_array()
        .and_then(|ops| ops.iter().find(|o| o["name"] == name))
        .with_context(|| format!("no operation {name} in {s:#}"))
}

fn num(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(u64::MAX)
}

pub(super) fn code(o: &Value, code: &str) -> u64 {
    o["status_codes"][code].as_u64().unwrap_or(0)
}

/// Names kubectl prints for `args` (`-o name`), counted.
fn count(admin: &Kubectl, args: &[&str]) -> anyhow::Result<usize> {
    let mut all = args.to_vec();
    all.extend(["-o", "name"]);
    Ok(admin
        .ok(&all)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count())
}

per_version!(loadgens_counts_agree_with_the_real_apiserver);

fn loadgens_counts_agree_with_the_real_apiserver(version: KubeVersion) -> anyhow::Result<()> {
    // Without API Priority and Fairness the classic max-in-flight filter refuses at once.
    let kube = RealApiserver::start_version(
        version,
        &[
            "--max-requests-inflight=1",
            "--max-mutating-requests-inflight=1",
            "--enable-priority-and-fairness=false",
        ],
    )?;
    let admin = kube.kubectl()?;
    let work = tempfile::tempdir()?;
    let out_dir = |name: &str| -> PathBuf { work.path().join(name) };

    // 1. Seeding (as the admin: system:masters is never refused): exactly what was asked for.
    let seeded = loadgen(
        &args(
            {
                let mut a = vec!["seed".to_string()];
                a.extend(target(&kube, "ADMIN")?);
                a
            },
            &[
                "--nodes",
                &NODES.to_string(),
                "--pods",
                &PODS.to_string(),
                "--namespaces",
                &NAMESPACES.to_string(),
            ],
        ),
        LOADGEN_GRACE,
        work.path(),
    )?;
    // Nothing else makes nodes or pods here (no kubelet, no controllers).
    let nodes = count(&admin, &["get", "nodes"])? as u64;
    let pods = count(&admin, &["get", "pods", "-A"])? as u64;
    let namespaces = count(
        &admin,
        &[
            "get",
            "namespaces",
            "-l",
            "app.kubernetes.io/managed-by=loadgen",
        ],
    )? as u64;
    assert_eq!(
        (nodes, pods, namespaces),
        (NODES, PODS, NAMESPACES),
        "seed printed: {seeded}"
    );

    // 2. Lists, node-status patches and node watches as the admin: every request loadgen
    //    counts is one the apiserver served, and every patch reaches every watcher.
    let out = out_dir("admin");
    let before = Samples::scrape(&admin)?;
    loadgen(
        &args(
            target(&kube, "ADMIN")?,
            &[
                "--duration",
                "5s",
                "--no-progress",
                "--output",
                &out.display().to_string(),
                "--lists",
                "4/s",
                "--list-resource",
                "pods",
                "-A",
                "--list-rv",
                "consistent",
                "--patches",
                "4/s",
                "--patch-target",
                "node-status",
                "--objects",
                &NODES.to_string(),
                "--watches",
                "2",
                "--watch-resource",
                "nodes",
            ],
        ),
        Duration::from_secs(5) + LOADGEN_GRACE,
        work.path(),
    )?;
    let after = Samples::scrape(&admin)?;
    let s = summary(&out)?;
    let (list, patch) = (op(&s, "list")?, op(&s, "patch")?);
    assert_eq!(num(list, "requests"), 20, "{list:#}");
    assert_eq!(code(list, "200"), 20, "{list:#}");
    let served_lists = grew(
        &before,
        &after,
        "apiserver_request_total",
        &[
            ("verb", "LIST"),
            ("resource", "pods"),
            ("scope", "cluster"),
            ("code", "200"),
        ],
    );
    assert_eq!(
        served_lists, 20,
        "the apiserver served {served_lists} pod LISTs"
    );
    assert_eq!(code(patch, "200"), 20, "{patch:#}");
    let served_patches = grew(
        &before,
        &after,
        "apiserver_request_total",
        &[
            ("verb", "PATCH"),
            ("resource", "nodes"),
            ("subresource", "status"),
            ("code", "200"),
        ],
    );
    assert_eq!(
        served_patches, 20,
        "the apiserver served {served_patches} node status PATCHes"
    );
    // The list bytes are the apiserver's response sizes (200 pods, each list the same size
    // within the resource versions' digits).
    let per_list = num(list, "bytes") / 20;
    let direct = admin.ok(&["get", "--raw", "/api/v1/pods"])?.len() as u64;
    assert!(
        per_list.abs_diff(direct) * 100 < direct,
        "loadgen {per_list} B per LIST, kubectl {direct} B"
    );
    let w = &s["watches"];
    assert_eq!(num(w, "watchers"), 2, "{w:#}");
    assert_eq!((num(w, "errors"), num(w, "gone_410")), (0, 0), "{w:#}");
    // Each watcher saw each patch as one MODIFIED event, and nothing else changed nodes; a
    // patch sent before a watcher's initial LIST is in the LIST instead, and one sent in the
    // last moment may not be delivered before the run ends: a few fewer, never more.
    let events = num(w, "events");
    assert!(
        (2 * 20 - 6..=2 * 20).contains(&events),
        "{events} watch events for 2 watchers × 20 patches: {w:#}"
    );

    // 3. The unprivileged user against --max-requests-inflight=1: loadgen's 429s are the
    //    apiserver's refusals, request for request.
    let out = out_dir("user");
    let before = Samples::scrape(&admin)?;
    loadgen(
        &args(
            target(&kube, "USER")?,
            &[
                "--duration",
                "5s",
                "--no-progress",
                "--output",
                &out.display().to_string(),
                "--lists",
                "40/s",
                "-A",
                "--list-rv",
                "cache",
                "--gets",
                "40/s",
                "--get-resource",
                "nodes",
                "--objects",
                "1",
            ],
        ),
        Duration::from_secs(5) + LOADGEN_GRACE,
        work.path(),
    )?;
    let after = Samples::scrape(&admin)?;
    let s = summary(&out)?;
    let mut refused_total = 0;
    for (name, verb, resource, scope) in [
        ("list", "LIST", "pods", "cluster"),
        ("get", "GET", "nodes", "resource"),
    ] {
        let o = op(&s, name)?;
        let (requests, ok, refused) = (num(o, "requests"), code(o, "200"), code(o, "429"));
        assert_eq!(requests, 200, "{name}: {o:#}");
        assert_eq!(ok + refused, requests, "{name}: only 200s and 429s: {o:#}");
        assert_eq!(
            num(&o["rejections_429_body"], "plain_text"),
            refused,
            "{name}: {o:#}"
        );
        let labels = [("verb", verb), ("resource", resource), ("scope", scope)];
        let served = grew(
            &before,
            &after,
            "apiserver_request_total",
            &[labels[0], labels[1], labels[2], ("code", "200")],
        );
        // Max-in-flight refusals count as terminations, not in apiserver_request_total (1.20
        // and the current release alike).
        let terminated = grew(
            &before,
            &after,
            "apiserver_request_terminations_total",
            &[labels[0], labels[1], labels[2], ("code", "429")],
        );
        assert_eq!(
            (ok, refused),
            (served, terminated),
            "{name}: loadgen (200, 429) vs the apiserver's"
        );
        refused_total += refused;
    }
    // 1.20 also counts them in apiserver_dropped_requests_total; the current release has no such
    // metric (apiserver_request_terminations_total above is where it counts them).
    match version {
        KubeVersion::V1_20 => {
            let dropped = grew(
                &before,
                &after,
                "apiserver_dropped_requests_total",
                &[("request_kind", "readOnly")],
            );
            assert_eq!(
                refused_total, dropped,
                "apiserver_dropped_requests_total{{request_kind=readOnly}}"
            );
        }
        KubeVersion::Current => assert!(
            !after.has("apiserver_dropped_requests_total"),
            "the current release exports apiserver_dropped_requests_total again"
        ),
    }
    assert!(
        refused_total > 0,
        "no 429 at 80 requests/s against --max-requests-inflight=1: {s:#}"
    );
    Ok(())
}
