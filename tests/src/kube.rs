//! A real kube-apiserver with its own etcd for the real-apiserver tier, in one of two versions
//! ([`KubeVersion`]), started in a temp dir and stopped on drop:
//!
//! - v1.20.2 on Debian's etcd 3.4: the shared tools' `start.sh` and `stop.sh`. They live beside
//!   the checkout, never at a path the repo hard-codes: `$KUBE_APISERVER_TOOLS` if set, else
//!   `../shared/tools/kube-apiserver` next to the repo root (the layout of the dev machine and
//!   CI), else `/work/shared/tools/kube-apiserver` (the dev machine, for a checkout elsewhere).
//! - the current release pinned in `scripts/kube-current/` on the etcd it ships with:
//!   `scripts/kube-current-start.sh` and `scripts/kube-current-stop.sh` (the same PKI, RBAC and
//!   `env` file as the shared tools', without the flags removed since 1.20).
//!
//! `scripts/deps.sh --tests` builds both (once per machine) the same way.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::Context;
use bench::sim::auth::kubeconfig::{write_kubeconfig, KubeUser};
use bench::sim::auth::pki::CertKeyPem;
use tempfile::TempDir;

use crate::kubectl::Kubectl;

/// Where the kube-apiserver tools are; an error naming what is missing and how to get it.
pub fn kube_apiserver_tools() -> anyhow::Result<PathBuf> {
    let usable = |dir: &Path| {
        ["install.sh", "start.sh", "stop.sh"]
            .iter()
            .all(|f| dir.join(f).is_file())
    };
    if let Some(dir) = std::env::var_os("KUBE_APISERVER_TOOLS") {
        let dir = PathBuf::from(dir);
        anyhow::ensure!(
            usable(&dir),
            "KUBE_APISERVER_TOOLS={} has no install.sh, start.sh and stop.sh",
            dir.display()
        );
        return Ok(dir);
    }
    // tests/ is one level below the repo root.
    let beside_repo =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/tools/kube-apiserver");
    let dev_machine = PathBuf::from("/work/shared/tools/kube-apiserver");
    for dir in [beside_repo.clone(), dev_machine.clone()] {
        if usable(&dir) {
            return Ok(dir);
        }
    }
    anyhow::bail!(
        "the real-apiserver tests need the kube-apiserver tools (install.sh, start.sh, stop.sh); \
         none in {} or {}: set KUBE_APISERVER_TOOLS to their directory, then run \
         `bash scripts/deps.sh --tests` (builds kube-apiserver once, ~7 min)",
        beside_repo.display(),
        dev_machine.display()
    )
}

/// Which kube-apiserver the real-apiserver tier runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeVersion {
    /// v1.20.2 on Debian's etcd 3.4 (the shared tools).
    V1_20,
    /// The release pinned in `scripts/kube-current/apiserver/go.mod` on the etcd it ships with
    /// (`scripts/kube-current.sh`).
    Current,
}

impl KubeVersion {
    /// Every version the tier runs on.
    pub const ALL: [KubeVersion; 2] = [KubeVersion::V1_20, KubeVersion::Current];

    /// `v1_20` or `current`: as the per-version test modules are named.
    pub fn name(self) -> &'static str {
        match self {
            KubeVersion::V1_20 => "v1_20",
            KubeVersion::Current => "current",
        }
    }

    /// The start and stop scripts: (start, stop).
    fn scripts(self) -> anyhow::Result<(PathBuf, PathBuf)> {
        match self {
            KubeVersion::V1_20 => {
                let tools = kube_apiserver_tools()?;
                Ok((tools.join("start.sh"), tools.join("stop.sh")))
            }
            KubeVersion::Current => {
                // tests/ is one level below the repo root.
                let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts");
                let (start, stop) = (
                    scripts.join("kube-current-start.sh"),
                    scripts.join("kube-current-stop.sh"),
                );
                anyhow::ensure!(
                    start.is_file() && stop.is_file(),
                    "no {} and {}",
                    start.display(),
                    stop.display()
                );
                Ok((start, stop))
            }
        }
    }
}

/// A running kube-apiserver + etcd from its version's start script, stopped by its stop script
/// (exactly the recorded pids) when dropped.
pub struct RealApiserver {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// Every variable of `RUN_DIR/env` (`KUBE_CA_CERT`, `KUBE_ADMIN_CERT`, …).
    pub env: HashMap<String, String>,
    /// Which one it is.
    pub version: KubeVersion,
    /// What its `/version` says, e.g. `v1.20.2`.
    pub git_version: String,
    stop_script: PathBuf,
    // Last: removed after the stop script.
    dir: TempDir,
}

impl RealApiserver {
    /// kube-apiserver 1.20.2: [`RealApiserver::start_version`] with [`KubeVersion::V1_20`].
    pub fn start(flags: &[&str]) -> anyhow::Result<Self> {
        Self::start_version(KubeVersion::V1_20, flags)
    }

    /// `START RUN_DIR FLAGS…` in a new temp dir: waits (the script's own 60 s deadline) until
    /// `/readyz` is ok and test-user's RBAC exists. Takes ~7 s.
    pub fn start_version(version: KubeVersion, flags: &[&str]) -> anyhow::Result<Self> {
        Self::start_version_in(version, flags, None)
    }

    /// As [`RealApiserver::start_version`], with the run dir (and so etcd's data) in `parent`
    /// rather than the system's temp dir.
    pub fn start_version_in(
        version: KubeVersion,
        flags: &[&str],
        parent: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let (start_script, stop_script) = version.scripts()?;
        let mut builder = tempfile::Builder::new();
        builder.prefix("tollgate-e2e-kube-");
        let dir = match parent {
            Some(p) => builder.tempdir_in(p),
            None => builder.tempdir(),
        }
        .context("creating the apiserver's run dir")?;
        let started = Instant::now();
        let out = Command::new("bash")
            .arg(&start_script)
            .arg(dir.path())
            .args(flags)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", start_script.display()))?;
        // From here on, whatever the script recorded is stopped on drop (also on errors below).
        let mut this = Self {
            url: String::new(),
            env: HashMap::new(),
            version,
            git_version: String::new(),
            stop_script,
            dir,
        };
        anyhow::ensure!(
            out.status.success(),
            "{} {} failed ({}) after {:?}; if there is no kube-apiserver binary, run \
             `bash scripts/deps.sh --tests` first.\nstderr:\n{}",
            start_script.display(),
            flags.join(" "),
            out.status,
            started.elapsed(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let env_file = this.dir.path().join("env");
        let text = std::fs::read_to_string(&env_file)
            .with_context(|| format!("reading {}", env_file.display()))?;
        this.env = parse_env(&text);
        this.url = this.var("KUBE_APISERVER_URL")?.to_string();
        let printed = String::from_utf8_lossy(&out.stdout);
        anyhow::ensure!(
            printed.trim() == this.url,
            "start.sh printed {printed:?}, its env says {}",
            this.url
        );
        this.git_version = this.fetch_git_version()?;
        Ok(this)
    }

    /// `gitVersion` of the apiserver's `/version`, asked as the admin.
    fn fetch_git_version(&self) -> anyhow::Result<String> {
        let text = self.kubectl()?.ok(&["get", "--raw", "/version"])?;
        let v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("/version: {text}"))?;
        v["gitVersion"]
            .as_str()
            .map(String::from)
            .with_context(|| format!("/version has no gitVersion: {text}"))
    }

    /// The minor version of its `/version` (20 for v1.20.2).
    pub fn minor(&self) -> anyhow::Result<u32> {
        let v = self.git_version.trim_start_matches('v');
        let minor = v.split('.').nth(1).unwrap_or("");
        minor
            .parse()
            .with_context(|| format!("gitVersion {}", self.git_version))
    }

    /// A variable of `RUN_DIR/env`.
    pub fn var(&self, name: &str) -> anyhow::Result<&str> {
        self.env
            .get(name)
            .map(String::as_str)
            .with_context(|| format!("start.sh's env has no {name}"))
    }

    /// A file named by a variable of `RUN_DIR/env`.
    pub fn file(&self, name: &str) -> anyhow::Result<PathBuf> {
        Ok(PathBuf::from(self.var(name)?))
    }

    /// The contents of a file named by a variable of `RUN_DIR/env`.
    pub fn read(&self, name: &str) -> anyhow::Result<String> {
        let path = self.file(name)?;
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    }

    /// The run dir (logs, pki, kubeconfig); removed when this is dropped.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The serving (and client) CA, PEM.
    pub fn ca_pem(&self) -> anyhow::Result<String> {
        self.read("KUBE_CA_CERT")
    }

    /// The front-proxy client certificate and key (CN=front-proxy-client), PEM.
    pub fn front_proxy(&self) -> anyhow::Result<CertKeyPem> {
        Ok(CertKeyPem {
            cert_pem: self.read("KUBE_FRONT_PROXY_CLIENT_CERT")?,
            key_pem: self.read("KUBE_FRONT_PROXY_CLIENT_KEY")?,
        })
    }

    /// The admin's (CN=admin, O=system:masters) client certificate, as a kubeconfig user.
    pub fn admin_user(&self) -> anyhow::Result<KubeUser> {
        Ok(KubeUser::ClientCert {
            cert_pem: self.read("KUBE_ADMIN_CERT")?,
            key_pem: self.read("KUBE_ADMIN_KEY")?,
        })
    }

    /// The unprivileged test-user's (CN=test-user, O=test-users) client certificate.
    pub fn test_user(&self) -> anyhow::Result<KubeUser> {
        Ok(KubeUser::ClientCert {
            cert_pem: self.read("KUBE_USER_CERT")?,
            key_pem: self.read("KUBE_USER_KEY")?,
        })
    }

    /// kubectl straight to the apiserver as the admin (start.sh's kubeconfig).
    pub fn kubectl(&self) -> anyhow::Result<Kubectl> {
        Ok(Kubectl::new(self.file("KUBECONFIG")?))
    }

    /// kubectl straight to the apiserver as `user`, with a kubeconfig of its own in
    /// `RUN_DIR/users/NAME/` (and so its own kubectl cache).
    pub fn kubectl_as(&self, name: &str, user: &KubeUser) -> anyhow::Result<Kubectl> {
        let dir = self.dir.path().join("users").join(name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("kubeconfig");
        write_kubeconfig(&path, &self.url, Some(&self.ca_pem()?), user)?;
        Ok(Kubectl::new(path))
    }

    /// The apiserver's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("logs/kube-apiserver.log")).unwrap_or_default()
    }

    /// Whether the recorded kube-apiserver pid still runs (not a zombie).
    pub fn is_running(&self) -> bool {
        let Some(pid) = self.env.get("KUBE_APISERVER_PID") else {
            return false;
        };
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.to_string()))
            .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
    }
}

impl Drop for RealApiserver {
    fn drop(&mut self) {
        // The stop script signals only the pids start recorded, while they still run those binaries.
        let out = Command::new("bash")
            .arg(&self.stop_script)
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "{} {} failed ({}): {}",
                self.stop_script.display(),
                self.dir.path().display(),
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => eprintln!("cannot run {}: {e}", self.stop_script.display()),
        }
    }
}

/// `export NAME=VALUE` lines as bash's `printf %q` writes them (paths: no quoting, or
/// backslash escapes; `$'…'` for control characters, which start.sh never writes).
fn parse_env(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), unescape(v)))
        .collect()
}

fn unescape(v: &str) -> String {
    if let Some(quoted) = v.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
        return quoted.to_string();
    }
    let mut out = String::new();
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may unwrap
mod tests {
    use super::*;

    #[test]
    fn parses_start_sh_env() {
        let env = parse_env(
            "# written by start.sh\nexport KUBE_APISERVER_URL=https://127.0.0.1:1234\n\
             export KUBE_CA_CERT=/tmp/a\\ b/ca.crt\nexport KUBE_USER_NAME=test-user\n",
        );
        assert_eq!(env["KUBE_APISERVER_URL"], "https://127.0.0.1:1234");
        assert_eq!(env["KUBE_CA_CERT"], "/tmp/a b/ca.crt");
        assert_eq!(env["KUBE_USER_NAME"], "test-user");
        assert_eq!(env.len(), 3);
    }
}
