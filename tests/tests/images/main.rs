//! The container images, built and run on this machine: scripts/build-images.sh makes them from
//! the binaries the other tests run (`buildah from scratch`, the binary, the libraries `ldd`
//! lists, CA certificates, the non-root user 65532), pulling nothing; podman runs them against
//! the simulator (`tollgate-bench sim`) on 127.0.0.1.
//!
//! - tollgate's image: the entrypoint, user and working directory deploy/images/Containerfile
//!   gives; `--version` as the binary says it; then tollgate from the image, in front of the
//!   simulator over TLS (its CA mounted read-only) and started as the kubeadm static pod
//!   starts it (command `tollgate`, read-only root, no capabilities), runs as uid 65532 and
//!   proxies a real `kubectl get pods`, which lists what the simulator lists.
//! - loadgen's image: a run against the simulator writes `summary.json` into a mounted host
//!   directory, with LISTs made and answered 200.
//!
//! Each test builds its own images (tagged with its pid) and starts its own simulator, so they
//! run in parallel; images and containers are removed on drop.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;
use tempfile::TempDir;
use tests::{
    eventually, fresh_workspace_binary, http_get, parse_ready_line, KubeUser, Kubectl, SimProcess,
    TOLLGATE_START_TIMEOUT,
};

mod containerfile;
mod kubeadm;
mod podman;

use podman::{repo_root, require_tools, run_ok, Container, Images};

/// The uid and gid the images run as (distroless' `nonroot`).
const NONROOT: u32 = 65532;
/// How long a container may take to start and print its first line, or to finish a short run.
const CONTAINER_TIMEOUT: Duration = Duration::from_secs(60);

/// The fresh binary `name` (built from `packages`) and the directory the images are built from.
fn binary(name: &str, packages: &[&str]) -> (PathBuf, PathBuf) {
    let bin = fresh_workspace_binary(name, packages);
    let dir = bin.parent().unwrap_or(Path::new(".")).to_path_buf();
    (bin, dir)
}

/// A directory the container's user may read (and, with `writable`, write), which a `TempDir`
/// (mode 0700, root's) is not.
fn shared_dir(writable: bool) -> anyhow::Result<TempDir> {
    let dir = tempfile::Builder::new()
        .prefix("tollgate-e2e-image-")
        .tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    if writable {
        std::os::unix::fs::chown(dir.path(), Some(NONROOT), Some(NONROOT))
            .with_context(|| format!("giving {} to uid {NONROOT}", dir.path().display()))?;
    }
    Ok(dir)
}

/// A name for a container of this test process.
fn container_name(what: &str) -> String {
    format!("tollgate-e2e-{what}-{}", std::process::id())
}

#[test]
fn tollgate_image_proxies_kubectl_to_the_simulator() -> anyhow::Result<()> {
    require_tools();
    let (bin, bin_dir) = binary("tollgate", &["proxy", "kubeio", "apimodel"]);
    let images = Images::build(&bin_dir, &["tollgate"])?;
    let image = images.of("tollgate");

    // The image is shaped as the Containerfile's target: a registry build makes the same.
    let config = images.config(image)?;
    let expected = containerfile_target("tollgate")?;
    assert_eq!(config["User"], expected.user, "{config:#}");
    assert_eq!(config["WorkingDir"], expected.workdir, "{config:#}");
    assert_eq!(config["Entrypoint"], expected.entrypoint, "{config:#}");

    // `--version`, as the binary it was built from says it.
    let mut host = Command::new(&bin);
    host.arg("--version");
    let host_version = run_ok(host, CONTAINER_TIMEOUT)?;
    let mut version = Container::start(
        &container_name("version"),
        &[],
        image,
        &["--version".to_string()],
    )?;
    let line = version
        .stdout
        .wait_for(CONTAINER_TIMEOUT, "a version line", |l| !l.is_empty())?;
    assert!(
        version.wait(CONTAINER_TIMEOUT)?.success(),
        "{}",
        version.log()
    );
    assert_eq!(line, host_version.trim());
    assert!(line.starts_with("tollgate "), "{line}");

    // tollgate from the image in front of the simulator (TLS, its CA mounted read-only), started
    // as deploy/kubeadm/tollgate.yaml starts it: `command: [tollgate, …]` (found on the image's
    // PATH), a read-only root filesystem, every capability dropped, no privilege escalation.
    let sim = SimProcess::start(&["--tls", "--nodes", "3", "--pods", "30", "--namespaces", "2"])?;
    let pki = shared_dir(false)?;
    let ca = pki.path().join("upstream-ca.crt");
    std::fs::write(&ca, sim.server_ca_pem.as_deref().context("the sim's CA")?)?;
    std::fs::set_permissions(&ca, std::fs::Permissions::from_mode(0o644))?;
    let args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--upstream",
        &sim.url,
        "--upstream-ca",
        "/pki/upstream-ca.crt",
    ]
    .map(str::to_string)
    .to_vec();
    let pod_like = [
        "--volume".to_string(),
        format!("{}:/pki:ro", pki.path().display()),
        "--entrypoint".to_string(),
        "tollgate".to_string(),
        "--read-only".to_string(),
        "--cap-drop".to_string(),
        "all".to_string(),
        "--security-opt".to_string(),
        "no-new-privileges".to_string(),
    ];
    let mut proxy = Container::start(&container_name("proxy"), &pod_like, image, &args)?;
    let ready = proxy
        .stdout
        .wait_for(TOLLGATE_START_TIMEOUT, "tollgate's ready line", |l| {
            parse_ready_line(l).is_some()
        })
        .with_context(|| format!("tollgate in a container; its log:\n{}", proxy.log()))?;
    let (url, admin) = parse_ready_line(&ready).with_context(|| format!("ready line {ready:?}"))?;
    eventually(
        TOLLGATE_START_TIMEOUT,
        "tollgate's /readyz answers 200",
        || {
            Ok(matches!(
                http_get(&admin, "/readyz", Duration::from_secs(5)),
                Ok((200, _))
            )
            .then_some(()))
        },
    )
    .with_context(|| format!("its log:\n{}", proxy.log()))?;

    // It runs as the image's user, not root.
    let status = std::fs::read_to_string(format!("/proc/{}/status", proxy.pid()?))?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .context("no Uid: in /proc/PID/status")?;
    assert_eq!(
        uid.split_whitespace().collect::<Vec<_>>(),
        vec![NONROOT.to_string(); 4],
        "tollgate's uids (real, effective, saved, fs) in the container"
    );

    // A real kubectl through it lists what the simulator lists.
    let kubeconfig = pki.path().join("kubeconfig");
    bench::sim::auth::kubeconfig::write_kubeconfig(&kubeconfig, &url, None, &KubeUser::None)?;
    let through = pod_names(&Kubectl::new(&kubeconfig).json(&["get", "pods", "-A", "-o", "json"])?);
    let direct = pod_names(&sim.kubectl().json(&["get", "pods", "-A", "-o", "json"])?);
    assert_eq!(through.len(), 30, "{through:?}");
    assert_eq!(through, direct);
    let metrics = http_get(&admin, "/metrics", Duration::from_secs(10))?.1;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tollgate_requests_total{") && l.contains("verb=\"list\"")),
        "tollgate counted no LIST:\n{metrics}"
    );
    Ok(())
}

#[test]
fn loadgen_image_writes_its_summary_to_a_mounted_directory() -> anyhow::Result<()> {
    require_tools();
    let (_, bin_dir) = binary("loadgen", &["loadgen", "kubeio", "apimodel"]);
    let images = Images::build(&bin_dir, &["loadgen"])?;
    let image = images.of("loadgen");
    let config = images.config(image)?;
    let expected = containerfile_target("loadgen")?;
    assert_eq!(config["User"], expected.user, "{config:#}");
    assert_eq!(config["Entrypoint"], expected.entrypoint, "{config:#}");

    let sim = SimProcess::start(&["--nodes", "3", "--pods", "30", "--namespaces", "2"])?;
    let results = shared_dir(true)?;
    let volume = vec![
        "--volume".to_string(),
        format!("{}:/results", results.path().display()),
    ];
    let args: Vec<String> = [
        "--server",
        &sim.url,
        "--lists",
        "10/s",
        "--duration",
        "3s",
        "--no-progress",
        "--output",
        "/results",
    ]
    .map(str::to_string)
    .to_vec();
    let mut run = Container::start(&container_name("loadgen"), &volume, image, &args)?;
    let status = run.wait(CONTAINER_TIMEOUT)?;
    assert!(
        status.success(),
        "loadgen in a container: {status}\n{}",
        run.log()
    );

    let path = results.path().join("summary.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {}; loadgen's log:\n{}", path.display(), run.log()))?;
    let summary: Value = serde_json::from_str(&text)?;
    let list = summary["operations"]
        .as_array()
        .and_then(|ops| ops.iter().find(|o| o["name"] == "list"))
        .with_context(|| format!("no `list` operation in {summary:#}"))?;
    let requests = list["requests"].as_u64().unwrap_or(0);
    let ok = list["status_codes"]["200"].as_u64().unwrap_or(0);
    assert!(requests > 0, "{list:#}");
    assert_eq!(ok, requests, "every LIST answered 200: {list:#}");
    assert!(results.path().join("perfdata.json").is_file());
    // Written by the image's user into the host directory.
    let meta = std::fs::metadata(&path)?;
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), NONROOT);
    Ok(())
}

/// `metadata.namespace/metadata.name` of each item of a List, sorted.
fn pod_names(list: &Value) -> Vec<String> {
    let mut names: Vec<String> = list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|p| {
                    let m = &p["metadata"];
                    format!(
                        "{}/{}",
                        m["namespace"].as_str().unwrap_or(""),
                        m["name"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// What deploy/images/Containerfile sets for one target, as `podman image inspect` shows it.
struct ContainerfileTarget {
    user: Value,
    workdir: Value,
    entrypoint: Value,
}

/// The `USER` and `WORKDIR` of the Containerfile's `runtime` stage and the `ENTRYPOINT` of its
/// stage `target` (`FROM runtime AS target`).
fn containerfile_target(target: &str) -> anyhow::Result<ContainerfileTarget> {
    let path = repo_root().join("deploy/images/Containerfile");
    let text = std::fs::read_to_string(&path)?;
    let stage = |name: &str| -> anyhow::Result<Vec<&str>> {
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .skip_while(|l| !(l.starts_with("FROM ") && l.ends_with(&format!(" AS {name}"))))
            .collect();
        anyhow::ensure!(!lines.is_empty(), "no stage `{name}` in {}", path.display());
        let end = lines[1..]
            .iter()
            .position(|l| l.starts_with("FROM "))
            .map_or(lines.len(), |i| i + 1);
        Ok(lines[..end].to_vec())
    };
    let value = |lines: &[&str], instruction: &str| -> anyhow::Result<String> {
        lines
            .iter()
            .find_map(|l| l.strip_prefix(instruction))
            .map(|v| v.trim().to_string())
            .with_context(|| format!("no {instruction} in {lines:?}"))
    };
    let runtime = stage("runtime")?;
    let own = stage(target)?;
    let entrypoint: Value = serde_json::from_str(&value(&own, "ENTRYPOINT ")?)?;
    Ok(ContainerfileTarget {
        user: Value::String(value(&runtime, "USER ")?),
        workdir: Value::String(value(&runtime, "WORKDIR ")?),
        entrypoint,
    })
}
