//! deploy/kubeadm/tollgate.yaml's identity: with a kubeadm-layout PKI (keys owned by root, mode
//! 0600, as kubeadm writes them) mounted read-only where the static pod mounts it, tollgate from
//! the image, run as the manifest's `runAsUser`/`runAsGroup` with the pod's confinement (no
//! capabilities, read-only root, no privilege escalation), passes `check-config` with the
//! manifest's own flags; the image's default user (65532) cannot read the keys.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::Context;
use tests::CertAuthority;

use crate::podman::{repo_root, require_tools, Container, Images};
use crate::{binary, container_name, shared_dir, CONTAINER_TIMEOUT, NONROOT};

/// The static pod's container command and its `runAsUser`, `runAsGroup` (read from the
/// manifest's text: one `- ARG` a line under `command:`).
fn static_pod() -> anyhow::Result<(Vec<String>, u32, u32)> {
    let text = std::fs::read_to_string(repo_root().join("deploy/kubeadm/tollgate.yaml"))?;
    let command: Vec<String> = text
        .lines()
        .skip_while(|l| l.trim() != "command:")
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .map_while(|l| l.strip_prefix("- "))
        .map(str::to_string)
        .collect();
    anyhow::ensure!(command.len() > 1, "no command in the manifest");
    let field = |name: &str| -> anyhow::Result<u32> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{name}: ")))
            .with_context(|| format!("no {name} in the manifest"))?
            .trim()
            .parse()
            .with_context(|| format!("{name} is not a number"))
    };
    Ok((command, field("runAsUser")?, field("runAsGroup")?))
}

/// kubeadm's /etc/kubernetes/pki, the files the static pod names: certificates 0644, keys
/// 0600, all owned by this (root) process as kubeadm's are.
fn kubeadm_pki(dir: &Path) -> anyhow::Result<()> {
    let ca = CertAuthority::generate("kubernetes")?;
    std::fs::write(dir.join("ca.crt"), ca.cert_pem())?;
    std::fs::set_permissions(dir.join("ca.crt"), std::fs::Permissions::from_mode(0o644))?;
    ca.issue_server(&["192.0.2.10", "kubernetes.default"])?
        .write_to_dir(dir, "apiserver")?;
    let front = CertAuthority::generate("front-proxy-ca")?;
    front
        .issue_client("front-proxy-client", &[])?
        .write_to_dir(dir, "front-proxy-client")?;
    ca.issue_client("kube-apiserver-kubelet-client", &["system:masters"])?
        .write_to_dir(dir, "apiserver-kubelet-client")?;
    let key = std::fs::metadata(dir.join("apiserver.key"))?;
    anyhow::ensure!(key.permissions().mode() & 0o777 == 0o600);
    Ok(())
}

/// `tollgate check-config FLAGS…` from the image as `user`, confined as the static pod is:
/// exit success and what it printed.
fn check_config_as(
    image: &str,
    user: &str,
    pki: &Path,
    config: &Path,
    flags: &[String],
) -> anyhow::Result<(bool, String)> {
    let extra: Vec<String> = [
        "--user",
        user,
        "--volume",
        &format!("{}:/etc/kubernetes/pki:ro", pki.display()),
        "--volume",
        &format!("{}:/etc/tollgate:ro", config.display()),
        "--entrypoint",
        "tollgate",
        "--read-only",
        "--cap-drop",
        "all",
        "--security-opt",
        "no-new-privileges",
    ]
    .map(str::to_string)
    .to_vec();
    let mut args = vec!["check-config".to_string()];
    args.extend_from_slice(flags);
    let mut c = Container::start(
        &container_name(&format!("check-{}", user.replace(':', "-"))),
        &extra,
        image,
        &args,
    )?;
    let ok = c.wait(CONTAINER_TIMEOUT)?.success();
    Ok((ok, c.log()))
}

#[test]
fn kubeadm_static_pod_identity_reads_the_keys_it_mounts() -> anyhow::Result<()> {
    require_tools();
    let (command, uid, gid) = static_pod()?;
    assert_eq!(command[0], "tollgate");
    let (_, bin_dir) = binary("tollgate", &["proxy", "kubeio", "apimodel"]);
    let images = Images::build(&bin_dir, &["tollgate"])?;
    let image = images.of("tollgate");

    let pki = shared_dir(false)?;
    kubeadm_pki(pki.path())?;
    let config = shared_dir(false)?;
    let file = config.path().join("tollgate.yaml");
    std::fs::copy(repo_root().join("deploy/tollgate.yaml"), &file)?;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644))?;

    let (ok, log) = check_config_as(
        image,
        &format!("{uid}:{gid}"),
        pki.path(),
        config.path(),
        &command[1..],
    )?;
    assert!(ok, "check-config as the manifest's {uid}:{gid}:\n{log}");
    // The image's own user is refused the keys: the reason the manifest names another.
    let (ok, log) = check_config_as(
        image,
        &format!("{NONROOT}:{NONROOT}"),
        pki.path(),
        config.path(),
        &command[1..],
    )?;
    assert!(!ok, "check-config as {NONROOT} passed:\n{log}");
    assert!(log.contains("ermission denied"), "{log}");
    Ok(())
}
