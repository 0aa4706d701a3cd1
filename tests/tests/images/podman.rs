//! buildah and podman for the image tests: images built by scripts/build-images.sh and removed
//! on drop, containers run under runc with host networking and removed on drop, every command
//! bounded by a deadline.
//!
//! How a container runs on a host like the test machine, and why (deploy/README.md, "Images"):
//! - `--runtime runc`: crun 1.8 refuses hosts whose cgroups are hybrid (v1 controllers, and a
//!   v2 hierarchy with a controller of its own), with or without `--cgroups=disabled`; runc
//!   uses the v1 controllers.
//! - `--ulimit nofile=…,nproc=…` no higher than podman's own hard limits: as root podman asks
//!   for 1048576 of each, and a runtime without CAP_SYS_RESOURCE cannot raise a hard limit
//!   (`setrlimit RLIMIT_NOFILE: Operation not permitted`); podman 4.3 has no `--ulimit host`.
//! - `--network host`: the simulator and tollgate listen on the host's 127.0.0.1.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use tempfile::TempDir;
use tests::LineReader;

/// How long building the images (copying the binaries into container storage) may take.
const BUILD_TIMEOUT: Duration = Duration::from_secs(180);
/// How long one podman or buildah command other than a build may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// Processes the container's user may run: tokio's threads count, so a few per core.
const CONTAINER_NPROC: u64 = 4096;
/// The most open files podman asks for as root; the container gets less if we have less.
const PODMAN_DEFAULT_NOFILE: u64 = 1_048_576;

/// Fails loudly, saying how to install them, unless podman, buildah and runc are on the PATH.
pub fn require_tools() {
    let missing: Vec<&str> = ["podman", "buildah", "runc"]
        .into_iter()
        .filter(|tool| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    assert!(
        missing.is_empty(),
        "the image tests need {}: install Debian's podman, buildah and runc \
         (scripts/deps.sh --tests does)",
        missing.join(", ")
    );
}

/// Runs `cmd` to completion with stdout and stderr captured; kills it after `timeout`.
pub fn run(mut cmd: Command, timeout: Duration) -> anyhow::Result<Output> {
    let shown = format!("{cmd:?}");
    let dir = TempDir::new()?;
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(File::create(&out)?)
        .stderr(File::create(&err)?)
        .spawn()
        .with_context(|| format!("starting {shown}"))?;
    let status = wait_until(&mut child, Instant::now() + timeout)
        .with_context(|| format!("{shown} did not finish within {timeout:?} and was killed"))?;
    Ok(Output {
        status,
        stdout: std::fs::read(&out)?,
        stderr: std::fs::read(&err)?,
    })
}

/// [`run`], and its stdout if it exited 0; else fails quoting its stderr.
pub fn run_ok(cmd: Command, timeout: Duration) -> anyhow::Result<String> {
    let shown = format!("{cmd:?}");
    let out = run(cmd, timeout)?;
    anyhow::ensure!(
        out.status.success(),
        "{shown} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Our own child's exit status, or after `deadline` kills it (by its handle) and fails.
fn wait_until(child: &mut Child, deadline: Instant) -> anyhow::Result<std::process::ExitStatus> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("still running at its deadline");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Images built for one test, named `tollgate/NAME:e2e-PID`, removed on drop.
pub struct Images {
    names: Vec<String>,
}

impl Images {
    /// `scripts/build-images.sh --bin-dir DIR --tag e2e-PID NAMES…`, from the binaries in
    /// `bin_dir` (the ones the other tests run).
    pub fn build(bin_dir: &Path, names: &[&str]) -> anyhow::Result<Self> {
        let script = repo_root().join("scripts/build-images.sh");
        let tag = format!("e2e-{}", std::process::id());
        let mut cmd = Command::new("bash");
        cmd.arg(&script)
            .arg("--bin-dir")
            .arg(bin_dir)
            .args(["--tag", &tag])
            .args(names);
        // Removed on drop even when the build fails half-way.
        let built = Self {
            names: names
                .iter()
                .map(|n| format!("tollgate/{n}:{tag}"))
                .collect(),
        };
        let printed = run_ok(cmd, BUILD_TIMEOUT)?;
        let printed: Vec<String> = printed.lines().map(str::to_string).collect();
        anyhow::ensure!(
            printed == built.names,
            "build-images.sh printed {printed:?}, not the images asked for, {:?}",
            built.names
        );
        Ok(built)
    }

    /// The image of program `name` (`tollgate`, `loadgen`).
    pub fn of(&self, name: &str) -> &str {
        let prefix = format!("tollgate/{name}:");
        self.names
            .iter()
            .find(|n| n.starts_with(&prefix))
            .map(String::as_str)
            .unwrap_or_else(|| panic!("no image of {name} was built: {:?}", self.names))
    }

    /// `podman image inspect`'s `.Config` of `image`.
    pub fn config(&self, image: &str) -> anyhow::Result<serde_json::Value> {
        let mut cmd = Command::new("podman");
        cmd.args(["image", "inspect", "--format", "{{json .Config}}", image]);
        let text = run_ok(cmd, COMMAND_TIMEOUT)?;
        serde_json::from_str(&text).with_context(|| format!("parsing {image}'s config: {text}"))
    }
}

impl Drop for Images {
    fn drop(&mut self) {
        for name in &self.names {
            let mut cmd = Command::new("podman");
            cmd.args(["rmi", "--force", "--ignore", name]);
            if let Err(e) = run_ok(cmd, COMMAND_TIMEOUT) {
                eprintln!("removing image {name}: {e:#}");
            }
        }
    }
}

/// The repository's root: the tests crate's parent.
pub fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// `podman run --rm --name NAME` with the settings this kind of host needs (module doc):
/// the arguments up to, not including, the image.
pub fn run_args(name: &str) -> anyhow::Result<Vec<String>> {
    let nofile = own_hard_nofile()?.min(PODMAN_DEFAULT_NOFILE);
    Ok([
        "run",
        "--rm",
        "--pull=never",
        "--name",
        name,
        "--runtime",
        "runc",
        "--network",
        "host",
        "--env",
        "RUST_LOG=info",
        "--ulimit",
        &format!("nofile={nofile}:{nofile}"),
        "--ulimit",
        &format!("nproc={CONTAINER_NPROC}:{CONTAINER_NPROC}"),
    ]
    .map(str::to_string)
    .to_vec())
}

/// This process's hard limit of open files (`/proc/self/limits`), which podman inherits.
fn own_hard_nofile() -> anyhow::Result<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits")?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .context("no `Max open files` in /proc/self/limits")?;
    let hard = line
        .split_whitespace()
        .nth(4)
        .with_context(|| format!("no hard limit in {line:?}"))?;
    Ok(hard.parse().unwrap_or(PODMAN_DEFAULT_NOFILE))
}

/// A container started with `podman run` (attached: its stdout is ours to read), removed by
/// name and its podman process killed by pid on drop.
pub struct Container {
    pub name: String,
    pub stdout: LineReader,
    child: Child,
    stderr_log: PathBuf,
    _dir: TempDir,
}

impl Container {
    /// `podman run [run_args] EXTRA… IMAGE ARGS…`, in the background.
    pub fn start(
        name: &str,
        extra: &[String],
        image: &str,
        args: &[String],
    ) -> anyhow::Result<Self> {
        let dir = TempDir::new()?;
        let stderr_log = dir.path().join("podman.stderr.log");
        let mut cmd = Command::new("podman");
        cmd.args(run_args(name)?).args(extra).arg(image).args(args);
        let shown = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr_log)?)
            .spawn()
            .with_context(|| format!("starting {shown}"))?;
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("{shown}: no stdout pipe");
        };
        Ok(Self {
            name: name.to_string(),
            stdout: LineReader::spawn(format!("container {name} stdout"), stdout),
            child,
            stderr_log,
            _dir: dir,
        })
    }

    /// What podman and the program in the container wrote on stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    /// Waits for the container to exit, within `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> anyhow::Result<std::process::ExitStatus> {
        wait_until(&mut self.child, Instant::now() + timeout).with_context(|| {
            format!(
                "container {} did not exit within {timeout:?}; its log:\n{}",
                self.name,
                self.log()
            )
        })
    }

    /// The host pid of the container's program (`podman inspect .State.Pid`).
    pub fn pid(&self) -> anyhow::Result<u32> {
        let mut cmd = Command::new("podman");
        cmd.args(["inspect", "--format", "{{.State.Pid}}", &self.name]);
        let pid = run_ok(cmd, COMMAND_TIMEOUT)?;
        pid.trim()
            .parse()
            .with_context(|| format!("podman inspect {}: pid {pid:?}", self.name))
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let mut cmd = Command::new("podman");
        cmd.args(["rm", "--force", "--ignore", "--time", "0", &self.name]);
        if let Err(e) = run_ok(cmd, COMMAND_TIMEOUT) {
            eprintln!("removing container {}: {e:#}", self.name);
        }
        // Our own `podman run`, by its handle; a no-op once it has exited and been reaped.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
