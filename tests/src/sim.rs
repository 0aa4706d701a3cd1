//! `tollgate-bench sim` as a child process: an ephemeral port, its own temp dir, killed on drop.

use crate::child::ServerChild;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use bench::sim::auth::kubeconfig::{write_kubeconfig, KubeUser};
use bench::sim::etcd_server::EtcdServer;
use tempfile::TempDir;

use crate::binary::fresh_workspace_binary;
use crate::kubectl::Kubectl;
use crate::lines::{LineReader, Next};

/// How long the simulator may take to bind, seed and print its URL.
pub const SIM_START_TIMEOUT: Duration = Duration::from_secs(90);

/// What the simulator prints on stdout once it serves.
const READY_PREFIX: &str = "serving the Kubernetes API at ";

/// Plain HTTP or HTTPS (`--tls`): most tests run over both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Tls,
}

impl Scheme {
    /// The simulator flags that select this scheme.
    pub fn sim_args(self) -> &'static [&'static str] {
        match self {
            Scheme::Http => &[],
            Scheme::Tls => &["--tls"],
        }
    }

    /// The URL scheme the simulator must then serve.
    pub fn url_scheme(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Tls => "https",
        }
    }
}

/// Where the simulator keeps objects: in memory, or (`--store etcd`) in a real etcd of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Memory,
    Etcd,
}

/// A running `tollgate-bench sim` child process.
pub struct SimProcess {
    /// `http://127.0.0.1:PORT` or `https://127.0.0.1:PORT`, as the simulator printed it.
    pub url: String,
    /// The kubeconfig the simulator wrote (`--kubeconfig-out`): no credentials.
    pub kubeconfig: PathBuf,
    /// With `--tls`: the CA that signed the serving certificate (`--cert-dir`/ca.crt).
    pub server_ca_pem: Option<String>,
    // First: killed before the rest is dropped.
    process: ServerChild,
    // Keeps draining stdout so the simulator never blocks on a full pipe.
    _stdout: LineReader,
    /// With [`Store::Etcd`]: the simulator's etcd, stopped after it.
    etcd: Option<EtcdServer>,
    // Last: removed after the child is killed.
    dir: TempDir,
}

impl SimProcess {
    /// Starts `tollgate-bench sim --listen 127.0.0.1:0 --kubeconfig-out DIR/kubeconfig ARGS`
    /// (plus `--cert-dir DIR/pki` with `--tls`) in a new temp dir and waits until it prints
    /// its URL. `args` must not repeat `--listen` or `--kubeconfig-out`.
    pub fn start(args: &[&str]) -> anyhow::Result<Self> {
        Self::start_on(Store::Memory, args)
    }

    /// [`SimProcess::start`] on `store`: with [`Store::Etcd`], first starts a real etcd on
    /// loopback (`/usr/bin/etcd`, its own ports and data dir) and adds
    /// `--store etcd --etcd-endpoints URL`.
    pub fn start_on(store: Store, args: &[&str]) -> anyhow::Result<Self> {
        let etcd = match store {
            Store::Memory => None,
            Store::Etcd => Some(EtcdServer::start().context("starting etcd for the simulator")?),
        };
        let mut all: Vec<&str> = Vec::new();
        if let Some(e) = &etcd {
            all.extend(["--store", "etcd", "--etcd-endpoints", e.url.as_str()]);
        }
        all.extend_from_slice(args);
        let mut sim = Self::spawn(&all)?;
        sim.etcd = etcd;
        Ok(sim)
    }

    fn spawn(args: &[&str]) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("tollgate-e2e-sim-")
            .tempdir()
            .context("creating the simulator's temp dir")?;
        let kubeconfig = dir.path().join("kubeconfig");
        let stderr_log = dir.path().join("sim.stderr.log");
        let tls = args.contains(&"--tls");
        let own_certs = args
            .iter()
            .any(|a| a.starts_with("--cert-dir") || a.starts_with("--tls-cert-file"));
        let pki = dir.path().join("pki");

        // The packages tollgate-bench is built from.
        let binary = fresh_workspace_binary(
            "tollgate-bench",
            &["bench", "loadgen", "kubeio", "apimodel"],
        );
        let mut cmd = Command::new(&binary);
        // --exit-with-stdin: the pipe stays open in `child.stdin` while we live; if this
        // process dies, even by SIGKILL, the pipe closes and the simulator exits.
        cmd.args([
            "sim",
            "--exit-with-stdin",
            "--listen",
            "127.0.0.1:0",
            "--kubeconfig-out",
        ])
        .arg(&kubeconfig);
        if tls && !own_certs {
            cmd.arg("--cert-dir").arg(&pki);
        }
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr_log).context("creating the simulator's log")?);
        let shown = format!("tollgate-bench sim {}", args.join(" "));
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("`{shown}`: no stdout pipe");
        };
        let mut stdout = LineReader::spawn(format!("`{shown}` stdout"), stdout);

        let deadline = Instant::now() + SIM_START_TIMEOUT;
        let url = loop {
            match stdout.next_before(deadline) {
                Next::Line(line) => {
                    if let Some((_, url)) = line.split_once(READY_PREFIX) {
                        break Ok(url.trim().to_string());
                    }
                }
                Next::Timeout => {
                    break Err(format!(
                        "did not print its URL within {SIM_START_TIMEOUT:?}"
                    ))
                }
                Next::Closed => break Err("exited before printing its URL".to_string()),
            }
        };
        let url = match url {
            Ok(url) => url,
            Err(why) => {
                let _ = child.kill();
                let status = child.wait();
                let log = std::fs::read_to_string(&stderr_log).unwrap_or_default();
                anyhow::bail!(
                    "`{shown}` {why} ({status:?}); stdout: {}\nstderr:\n{}",
                    stdout.tail(),
                    log.trim()
                );
            }
        };
        let server_ca_pem = if tls && !own_certs {
            Some(
                std::fs::read_to_string(pki.join("ca.crt"))
                    .context("reading the simulator's CA (--cert-dir)")?,
            )
        } else {
            None
        };
        Ok(Self {
            url,
            kubeconfig,
            server_ca_pem,
            process: ServerChild::new(child, stderr_log),
            _stdout: stdout,
            etcd: None,
            dir,
        })
    }

    /// The simulator's temp dir (removed when this is dropped).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// kubectl with the simulator's own kubeconfig.
    pub fn kubectl(&self) -> Kubectl {
        Kubectl::new(&self.kubeconfig)
    }

    /// Writes a kubeconfig for the simulator with `user`'s credentials into its own
    /// subdirectory `DIR/users/NAME/` (so each has its own kubectl cache) and returns kubectl
    /// bound to it.
    pub fn kubectl_as(&self, name: &str, user: &KubeUser) -> anyhow::Result<Kubectl> {
        let dir = self.dir.path().join("users").join(name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("kubeconfig");
        write_kubeconfig(&path, &self.url, self.server_ca_pem.as_deref(), user)?;
        Ok(Kubectl::new(path))
    }

    /// What the simulator has logged on stderr so far.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// The simulator's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Whether the simulator is still running (it must be, at the end of every test).
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may unwrap
mod tests {
    use super::*;

    #[test]
    fn a_simulator_that_cannot_start_is_reported_with_its_error() {
        let Err(err) = SimProcess::start(&["--nodes", "many"]) else {
            panic!("the simulator started with --nodes many");
        };
        let err = format!("{err:#}");
        assert!(err.contains("exited before printing its URL"), "{err}");
        assert!(err.contains("invalid value 'many'"), "{err}");
    }

    #[test]
    fn serves_on_an_ephemeral_port_and_is_killed_on_drop() {
        let mut a = SimProcess::start(&["--nodes", "2"]).unwrap();
        let b = SimProcess::start(&["--tls"]).unwrap();
        assert!(a.url.starts_with("http://127.0.0.1:"), "{}", a.url);
        assert!(b.url.starts_with("https://127.0.0.1:"), "{}", b.url);
        assert_ne!(a.url.rsplit(':').next(), b.url.rsplit(':').next());
        assert!(b
            .server_ca_pem
            .as_deref()
            .unwrap()
            .contains("BEGIN CERTIFICATE"));
        assert!(a.kubeconfig.is_file() && a.is_running());
        let nodes = a.kubectl().ok(&["get", "nodes", "-o", "name"]).unwrap();
        assert_eq!(
            nodes.lines().collect::<Vec<_>>(),
            ["node/node-1", "node/node-2"]
        );

        let (pid, dir) = (a.pid(), a.dir().to_path_buf());
        drop(a);
        // Killed and reaped: its pid no longer names a process; its temp dir is gone.
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} still runs"
        );
        assert!(!dir.exists(), "{} is left behind", dir.display());
    }
}
