//! A real etcd (Debian's `etcd-server`, `/usr/bin/etcd`) as a child process on
//! loopback, with its own temp data dir: what `--store etcd` tests and the demo
//! run against. etcd cannot bind port 0, so free ports are found by binding
//! `127.0.0.1:0` and releasing it; a start that loses that race is retried
//! with new ports. Ready once `/health` says so (polled, with a deadline);
//! killed by its own pid when dropped.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long etcd may take to become healthy.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Starts tried before giving up (each with fresh ports).
const START_TRIES: usize = 5;
/// Pause between health polls.
const POLL: Duration = Duration::from_millis(50);

/// Why etcd could not be started.
#[derive(Debug, thiserror::Error)]
pub enum EtcdServerError {
    #[error("cannot run {binary} (install Debian's etcd-server: scripts/deps.sh --tests)")]
    Spawn {
        binary: String,
        #[source]
        source: std::io::Error,
    },
    #[error("preparing etcd's data dir or ports")]
    Io(#[from] std::io::Error),
    #[error("etcd did not become healthy after {tries} tries; its last log:\n{log}")]
    NotHealthy { tries: usize, log: String },
}

/// A running etcd, killed (by pid) and its data dir removed on drop.
pub struct EtcdServer {
    /// `http://127.0.0.1:PORT`, for `--etcd-endpoints`.
    pub url: String,
    child: Child,
    log: PathBuf,
    // Last: removed after the child is killed.
    _dir: tempfile::TempDir,
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// One GET /health: true once etcd answers `"health":"true"`.
fn healthy(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET /health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}

impl EtcdServer {
    /// Starts `/usr/bin/etcd` (or `$ETCD_BIN`) on free loopback ports and waits until healthy.
    pub fn start() -> Result<EtcdServer, EtcdServerError> {
        let binary = std::env::var("ETCD_BIN").unwrap_or_else(|_| "/usr/bin/etcd".into());
        let mut last_log = String::new();
        for _ in 0..START_TRIES {
            let dir = tempfile::Builder::new()
                .prefix("tollgate-etcd-")
                .tempdir()?;
            let (client, peer) = (free_port()?, free_port()?);
            let log = dir.path().join("etcd.log");
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let mut child = Command::new(&binary)
                .arg("--name=tollgate-test")
                .arg(format!("--data-dir={}", dir.path().join("data").display()))
                .arg(format!("--listen-client-urls={client_url}"))
                .arg(format!("--advertise-client-urls={client_url}"))
                .arg(format!("--listen-peer-urls={peer_url}"))
                .arg(format!("--initial-advertise-peer-urls={peer_url}"))
                .arg(format!("--initial-cluster=tollgate-test={peer_url}"))
                .arg("--log-level=warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log)?)
                .spawn()
                .map_err(|source| EtcdServerError::Spawn {
                    binary: binary.clone(),
                    source,
                })?;
            let deadline = Instant::now() + START_TIMEOUT;
            let up = loop {
                if healthy(client) {
                    break true;
                }
                // Exited (a port taken since we picked it): retry with new ports.
                if !matches!(child.try_wait(), Ok(None)) || Instant::now() >= deadline {
                    break false;
                }
                std::thread::sleep(POLL);
            };
            if up {
                return Ok(EtcdServer {
                    url: client_url,
                    child,
                    log,
                    _dir: dir,
                });
            }
            let _ = child.kill();
            let _ = child.wait();
            last_log = std::fs::read_to_string(&log).unwrap_or_default();
        }
        Err(EtcdServerError::NotHealthy {
            tries: START_TRIES,
            log: last_log,
        })
    }

    /// What etcd has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// etcd's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        // Our own child, by its pid (the Child handle).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
