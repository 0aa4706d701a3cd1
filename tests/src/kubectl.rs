//! The real `kubectl`, run with a request timeout and a process timeout.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::lines::LineReader;

/// `--request-timeout` given to every kubectl command.
pub const KUBECTL_REQUEST_TIMEOUT: &str = "20s";

/// How long one kubectl command may run before it is killed and the test fails.
pub const KUBECTL_PROCESS_TIMEOUT: Duration = Duration::from_secs(60);

/// The kubectl to run: `$KUBECTL` if set, else `kubectl` from `PATH`.
fn program() -> OsString {
    std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into())
}

/// A kubectl command line for `kubeconfig`: its own HTTP/discovery cache beside the
/// kubeconfig (ports are reused between runs, so a shared `~/.kube/cache` could be stale).
fn command(kubeconfig: &Path, request_timeout: &str, args: &[&str]) -> (Command, String) {
    let mut cmd = Command::new(program());
    let cache = kubeconfig
        .parent()
        .unwrap_or(Path::new("."))
        .join("kube-cache");
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(&cache)
        .arg(format!("--request-timeout={request_timeout}"))
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null());
    let shown = format!("kubectl {}", args.join(" "));
    (cmd, shown)
}

fn spawn(mut cmd: Command, shown: &str) -> anyhow::Result<Child> {
    cmd.spawn().map_err(|e| {
        anyhow::anyhow!(
            "cannot run `{shown}`: {e}. The end-to-end tests need kubectl (v1.32 is installed \
             at /usr/bin/kubectl on the dev machine): put it on PATH or set KUBECTL"
        )
    })
}

/// Collects a stream on a thread, into a buffer the caller can read at any time.
fn collect<R: Read + Send + 'static>(mut stream: R) -> Arc<Mutex<Vec<u8>>> {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let out = buf.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => match out.lock() {
                    Ok(mut b) => b.extend_from_slice(&chunk[..n]),
                    Err(_) => break,
                },
            }
        }
    });
    buf
}

fn text(buf: &Mutex<Vec<u8>>) -> String {
    match buf.lock() {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) => String::new(),
    }
}

/// What one finished kubectl command printed.
#[derive(Debug, Clone)]
pub struct KubectlOutput {
    /// `kubectl ARGS` as given (without the flags every command gets), for messages.
    pub command: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl KubectlOutput {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// The stdout of a command that succeeded; an error quoting stderr otherwise.
    pub fn ok(self) -> anyhow::Result<String> {
        anyhow::ensure!(
            self.success(),
            "`{}` failed ({}):\nstderr: {}\nstdout: {}",
            self.command,
            self.status,
            self.stderr.trim(),
            self.stdout.trim()
        );
        Ok(self.stdout)
    }

    /// The stderr of a command that failed; an error if it succeeded.
    pub fn failed(self) -> anyhow::Result<String> {
        anyhow::ensure!(
            !self.success(),
            "`{}` succeeded but should have failed; stdout:\n{}",
            self.command,
            self.stdout.trim()
        );
        Ok(self.stderr)
    }
}

/// Runs `kubectl --kubeconfig KUBECONFIG --request-timeout=20s ARGS` to completion, killing
/// it after [`KUBECTL_PROCESS_TIMEOUT`]. A command that exits non-zero is still `Ok`: look
/// at [`KubectlOutput::success`], or use [`KubectlOutput::ok`].
pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<KubectlOutput> {
    let (mut cmd, shown) = command(kubeconfig, KUBECTL_REQUEST_TIMEOUT, args);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = spawn(cmd, &shown)?;
    let stdout = child.stdout.take().map(collect).unwrap_or_default();
    let stderr = child.stderr.take().map(collect).unwrap_or_default();
    let deadline = Instant::now() + KUBECTL_PROCESS_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!(
                "`{shown}` did not finish within {KUBECTL_PROCESS_TIMEOUT:?} and was killed;\n\
                 stderr: {}\nstdout so far: {}",
                text(&stderr).trim(),
                text(&stdout).trim()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // The pipes close when kubectl exits; give the reader threads a moment to see EOF.
    let _ = read_to_eof(&stdout, &stderr);
    Ok(KubectlOutput {
        command: shown,
        status,
        stdout: text(&stdout),
        stderr: text(&stderr),
    })
}

/// Waits (briefly, bounded) until both collector threads have dropped their buffer clones,
/// i.e. have read to EOF.
fn read_to_eof(a: &Arc<Mutex<Vec<u8>>>, b: &Arc<Mutex<Vec<u8>>>) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Arc::strong_count(a) > 1 || Arc::strong_count(b) > 1 {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}

/// kubectl bound to one kubeconfig, for tests that run many commands.
#[derive(Debug, Clone)]
pub struct Kubectl {
    pub kubeconfig: PathBuf,
}

impl Kubectl {
    pub fn new(kubeconfig: impl Into<PathBuf>) -> Self {
        Self {
            kubeconfig: kubeconfig.into(),
        }
    }

    /// [`kubectl`] with this kubeconfig.
    pub fn run(&self, args: &[&str]) -> anyhow::Result<KubectlOutput> {
        kubectl(&self.kubeconfig, args)
    }

    /// Stdout of a command that must succeed.
    pub fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        self.run(args)?.ok()
    }

    /// Stderr of a command that must fail.
    pub fn fails(&self, args: &[&str]) -> anyhow::Result<String> {
        self.run(args)?.failed()
    }

    /// The stdout of a command that must succeed, parsed as JSON (`-o json`).
    pub fn json(&self, args: &[&str]) -> anyhow::Result<serde_json::Value> {
        let out = self.ok(args)?;
        serde_json::from_str(&out)
            .map_err(|e| anyhow::anyhow!("`kubectl {}` printed no JSON: {e}", args.join(" ")))
    }

    /// A long-running command (e.g. `get -w`) in the background; see [`KubectlBackground`].
    pub fn background(
        &self,
        request_timeout: &str,
        args: &[&str],
    ) -> anyhow::Result<KubectlBackground> {
        KubectlBackground::spawn(&self.kubeconfig, request_timeout, args)
    }
}

/// A kubectl running in the background whose stdout is read line by line (`get -w`);
/// killed when dropped.
pub struct KubectlBackground {
    command: String,
    child: Child,
    stdout: LineReader,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl KubectlBackground {
    /// Starts `kubectl ARGS` with `--request-timeout=REQUEST_TIMEOUT` (for a watch, how long
    /// kubectl keeps it open: `0` is forever; the test's own deadlines still bound it).
    pub fn spawn(kubeconfig: &Path, request_timeout: &str, args: &[&str]) -> anyhow::Result<Self> {
        let (mut cmd, shown) = command(kubeconfig, request_timeout, args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = spawn(cmd, &shown)?;
        let stdout = child
            .stdout
            .take()
            .map(|s| LineReader::spawn(format!("`{shown}` stdout"), s));
        let stderr = child.stderr.take().map(collect).unwrap_or_default();
        let Some(stdout) = stdout else {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("`{shown}`: no stdout pipe");
        };
        Ok(Self {
            command: shown,
            child,
            stdout,
            stderr,
        })
    }

    /// Waits for a stdout line that satisfies `matches` (lines already read are skipped).
    pub fn wait_for_line(
        &mut self,
        timeout: Duration,
        description: &str,
        matches: impl FnMut(&str) -> bool,
    ) -> anyhow::Result<String> {
        self.stdout
            .wait_for(timeout, description, matches)
            .map_err(|e| {
                let exited = match self.child.try_wait() {
                    Ok(Some(status)) => format!("exited: {status}"),
                    _ => "still running".to_string(),
                };
                e.context(format!(
                    "`{}` ({exited}); stderr: {}",
                    self.command,
                    text(&self.stderr).trim()
                ))
            })
    }

    /// Every stdout line read so far.
    pub fn lines(&self) -> &[String] {
        self.stdout.seen()
    }

    /// Whether kubectl is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// What kubectl printed on stderr so far.
    pub fn stderr(&self) -> String {
        text(&self.stderr)
    }
}

impl Drop for KubectlBackground {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
