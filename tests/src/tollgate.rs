//! The real `tollgate` binary as a child process in front of an upstream (usually a
//! [`SimProcess`](crate::SimProcess)): ephemeral client and admin ports, its own temp dir with
//! the certificates it is given, killed by pid on drop.

use crate::child::ServerChild;
use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use bench::sim::auth::kubeconfig::{write_kubeconfig, KubeUser};
use bench::sim::auth::pki::{CertAuthority, CertKeyPem};
use tempfile::TempDir;

use crate::binary::fresh_workspace_binary;
use crate::kubectl::Kubectl;
use crate::lines::{eventually, LineReader, Next};
use crate::sim::SimProcess;

/// How long tollgate may take to load its certificates, bind and become ready.
pub const TOLLGATE_START_TIMEOUT: Duration = Duration::from_secs(30);

/// What tollgate prints on stdout once it serves:
/// `tollgate serving at URL (admin http://ADDR)` (or `(admin off)`).
const READY_PREFIX: &str = "tollgate serving at ";

/// How tollgate is started: the upstream, the certificates, extra flags.
#[derive(Debug, Clone, Default)]
pub struct TollgateOptions {
    /// `--upstream URL`.
    pub upstream_url: String,
    /// `--upstream-ca`: the CA of the upstream's serving certificate (for `https://`).
    pub upstream_ca_pem: Option<String>,
    /// Serve clients over TLS (`--tls-cert-file`/`--tls-private-key-file`) with a serving
    /// certificate for `127.0.0.1` and `localhost` from a CA generated for this process
    /// ([`TollgateProcess::serving_ca_pem`]), written to [`TollgateProcess::pki_file`]
    /// `serving.crt` and `serving.key`.
    pub tls: bool,
    /// `--client-ca-file`: verify client certificates against this CA (needs `tls`), written
    /// to [`TollgateProcess::pki_file`] `client-ca.crt`.
    pub client_ca_pem: Option<String>,
    /// `--front-proxy-cert`/`--front-proxy-key`: presented to the upstream.
    pub front_proxy: Option<CertKeyPem>,
    /// More flags, e.g. `--config FILE`. Must not repeat `--listen` or `--admin-listen`.
    pub args: Vec<String>,
    /// Start under `prlimit --nofile=N` (util-linux): at most N open file descriptors.
    pub nofile: Option<u64>,
}

impl TollgateOptions {
    /// In front of `sim`: its URL, and its CA when it serves TLS.
    pub fn in_front_of(sim: &SimProcess) -> Self {
        Self {
            upstream_url: sim.url.clone(),
            upstream_ca_pem: sim.server_ca_pem.clone(),
            ..Self::default()
        }
    }
}

/// A running `tollgate` child process.
pub struct TollgateProcess {
    /// `http://127.0.0.1:PORT` or `https://127.0.0.1:PORT`, as tollgate printed it.
    pub url: String,
    /// `127.0.0.1:PORT` of the admin listener (plain HTTP).
    pub admin_addr: String,
    /// With [`TollgateOptions::tls`]: the CA that signed tollgate's serving certificate.
    pub serving_ca_pem: Option<String>,
    // First: killed before the rest is dropped.
    process: ServerChild,
    // Keeps draining stdout so tollgate never blocks on a full pipe.
    _stdout: LineReader,
    // Last: removed after the child is killed.
    dir: TempDir,
}

impl TollgateProcess {
    /// Writes the certificates of `options` into a new temp dir, starts
    /// `tollgate --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 …`, waits until it prints
    /// its address and its admin `/readyz` answers 200.
    pub fn start(options: &TollgateOptions) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("tollgate-e2e-proxy-")
            .tempdir()
            .context("creating tollgate's temp dir")?;
        let (args, serving_ca_pem) = flags(options, &dir.path().join("pki"))?;
        let stderr_log = dir.path().join("tollgate.stderr.log");
        let shown = format!("tollgate {}", args.join(" "));
        let (mut child, mut stdout) = spawn(&args, options.nofile, &stderr_log, &shown)?;
        let deadline = Instant::now() + TOLLGATE_START_TIMEOUT;
        let mut this = match read_address(&mut stdout, deadline) {
            Ok((url, admin_addr)) => Self {
                url,
                admin_addr,
                serving_ca_pem,
                process: ServerChild::new(child, stderr_log),
                _stdout: stdout,
                dir,
            },
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
        let left = deadline.saturating_duration_since(Instant::now());
        let readyz = eventually(left, "tollgate's /readyz answers 200", || {
            if !this.is_running() {
                anyhow::bail!("tollgate exited; its log:\n{}", this.log());
            }
            Ok(matches!(this.admin_get("/readyz"), Ok((200, _))).then_some(()))
        });
        readyz.map(|()| this)
    }

    /// The temp dir holding tollgate's certificates, log and users' kubeconfigs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The path of `name` in tollgate's certificate dir (the files of [`TollgateOptions`]):
    /// rewrite one to rotate it under the running tollgate.
    pub fn pki_file(&self, name: &str) -> PathBuf {
        self.dir.path().join("pki").join(name)
    }

    /// Writes a kubeconfig for tollgate's client URL with `user`'s credentials (trusting
    /// tollgate's serving CA) into `DIR/users/NAME/` and returns kubectl bound to it.
    pub fn kubectl_as(&self, name: &str, user: &KubeUser) -> anyhow::Result<Kubectl> {
        let dir = self.dir.path().join("users").join(name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("kubeconfig");
        write_kubeconfig(&path, &self.url, self.serving_ca_pem.as_deref(), user)?;
        Ok(Kubectl::new(path))
    }

    /// Writes tollgate's serving CA (with TLS) to `DIR/serving-ca.crt` and returns its path.
    pub fn serving_ca_file(&self) -> anyhow::Result<Option<PathBuf>> {
        let Some(pem) = &self.serving_ca_pem else {
            return Ok(None);
        };
        let path = self.dir.path().join("serving-ca.crt");
        std::fs::write(&path, pem).with_context(|| format!("writing {}", path.display()))?;
        Ok(Some(path))
    }

    /// `GET PATH` on the admin listener: status code and body.
    pub fn admin_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        http_get(&self.admin_addr, path, Duration::from_secs(10))
    }

    /// The body of `GET PATH` on the admin listener, which must answer 200.
    pub fn admin_ok(&self, path: &str) -> anyhow::Result<String> {
        let (status, body) = self.admin_get(path)?;
        anyhow::ensure!(
            status == 200,
            "GET {path} on tollgate's admin listener: {status}: {body}"
        );
        Ok(body)
    }

    /// What tollgate has logged on stderr so far.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// tollgate's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Whether tollgate is still running (it must be, at the end of every test).
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }
}

/// tollgate's command line for `options`, with the certificates it names written into `pki`;
/// and with [`TollgateOptions::tls`], the CA of the serving certificate generated for it.
fn flags(options: &TollgateOptions, pki: &Path) -> anyhow::Result<(Vec<String>, Option<String>)> {
    std::fs::create_dir_all(pki).context("creating tollgate's pki dir")?;
    let write = |name: &str, pem: &str| -> anyhow::Result<PathBuf> {
        let path = pki.join(name);
        std::fs::write(&path, pem).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    };
    let mut args: Vec<String> = vec![
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--admin-listen".into(),
        "127.0.0.1:0".into(),
        "--upstream".into(),
        options.upstream_url.clone(),
    ];
    let path_arg = |flag: &str, p: &Path| [flag.to_string(), p.display().to_string()];
    if let Some(ca) = &options.upstream_ca_pem {
        args.extend(path_arg("--upstream-ca", &write("upstream-ca.crt", ca)?));
    }
    let mut serving_ca_pem = None;
    if options.tls {
        let ca = CertAuthority::generate("tollgate-e2e-serving-ca")?;
        let serving = ca.issue_server(&["127.0.0.1", "localhost"])?;
        let (cert, key) = serving.write_to_dir(pki, "serving")?;
        args.extend(path_arg("--tls-cert-file", &cert));
        args.extend(path_arg("--tls-private-key-file", &key));
        serving_ca_pem = Some(ca.cert_pem().to_string());
    }
    if let Some(ca) = &options.client_ca_pem {
        args.extend(path_arg("--client-ca-file", &write("client-ca.crt", ca)?));
    }
    if let Some(fp) = &options.front_proxy {
        let (cert, key) = fp.write_to_dir(pki, "front-proxy-client")?;
        args.extend(path_arg("--front-proxy-cert", &cert));
        args.extend(path_arg("--front-proxy-key", &key));
    }
    args.extend(options.args.iter().cloned());
    Ok((args, serving_ca_pem))
}

/// Starts the freshly built tollgate with `args` (under `prlimit` with `nofile`), stderr to
/// `stderr_log`, stdout read line by line.
fn spawn(
    args: &[String],
    nofile: Option<u64>,
    stderr_log: &Path,
    shown: &str,
) -> anyhow::Result<(std::process::Child, LineReader)> {
    // The packages tollgate is built from.
    let binary = fresh_workspace_binary("tollgate", &["proxy", "kubeio", "apimodel"]);
    let mut cmd = match nofile {
        // prlimit sets the limit and execs tollgate: the child's pid is tollgate's.
        Some(n) => {
            let mut c = Command::new("prlimit");
            c.arg(format!("--nofile={n}")).arg(&binary);
            c
        }
        None => Command::new(&binary),
    };
    cmd.args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(File::create(stderr_log).context("creating tollgate's log")?);
    let mut child = cmd.spawn().with_context(|| {
        format!(
            "starting {} (with `nofile`: under prlimit, from util-linux)",
            binary.display()
        )
    })?;
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        anyhow::bail!("`{shown}`: no stdout pipe");
    };
    let stdout = LineReader::spawn(format!("`{shown}` stdout"), stdout);
    Ok((child, stdout))
}

/// The client URL and admin address from tollgate's ready line, or why it never printed one.
fn read_address(stdout: &mut LineReader, deadline: Instant) -> Result<(String, String), String> {
    loop {
        match stdout.next_before(deadline) {
            Next::Line(line) => {
                if let Some(addrs) = parse_ready_line(&line) {
                    return Ok(addrs);
                }
            }
            Next::Timeout => {
                return Err(format!(
                    "did not print its address within {TOLLGATE_START_TIMEOUT:?}"
                ))
            }
            Next::Closed => return Err("exited before printing its address".to_string()),
        }
    }
}

/// `(url, admin_addr)` from `tollgate serving at URL (admin http://ADDR)`, the line tollgate
/// prints on stdout once it serves (also read from a container's output by the image tests).
pub fn parse_ready_line(line: &str) -> Option<(String, String)> {
    let rest = line.split_once(READY_PREFIX)?.1;
    let (url, admin) = rest.split_once(" (admin ")?;
    let admin = admin.trim_end_matches(')');
    let admin = admin.strip_prefix("http://").unwrap_or(admin);
    Some((url.trim().to_string(), admin.to_string()))
}

/// A plain HTTP/1.1 `GET` to `addr` (`127.0.0.1:PORT`) with `Connection: close`: status code
/// and body (fixed-length or chunked), bounded by `timeout` for each read and write.
pub fn http_get(addr: &str, path: &str, timeout: Duration) -> anyhow::Result<(u16, String)> {
    let mut tcp = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    tcp.set_read_timeout(Some(timeout))?;
    tcp.set_write_timeout(Some(timeout))?;
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw)
        .with_context(|| format!("reading GET {path} from {addr}"))?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .with_context(|| format!("GET {path} from {addr}: no end of headers"))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let body = &raw[split + 4..];
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("GET {path} from {addr}: bad status line in {head:?}"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// The payload of a chunked body.
fn dechunk(mut raw: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("chunked body: no chunk size line")?;
        let size_line = String::from_utf8_lossy(&raw[..eol]);
        let size_hex = size_line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_hex, 16)
            .with_context(|| format!("chunked body: bad chunk size {size_hex:?}"))?;
        raw = &raw[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        anyhow::ensure!(raw.len() >= size + 2, "chunked body: truncated chunk");
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may unwrap
mod tests {
    use super::*;

    #[test]
    fn parses_the_ready_line() {
        assert_eq!(
            parse_ready_line(
                "tollgate serving at https://127.0.0.1:4321 (admin http://127.0.0.1:9999)"
            ),
            Some(("https://127.0.0.1:4321".into(), "127.0.0.1:9999".into()))
        );
        assert_eq!(parse_ready_line("something else"), None);
    }

    #[test]
    fn dechunks() {
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n").unwrap(),
            b"abcde"
        );
        assert!(dechunk(b"5\r\nab").is_err());
    }
}
