//! Child processes and metric scrapes of the demo and the capacity experiments: the workspace's own binaries started with
//! their output to log files, each killed when its handle drops (an error or Ctrl-C leaves
//! nothing behind), and Prometheus text read over plain HTTP on loopback.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a child may take to print its address: seeding 30,000 pods takes seconds on a
/// busy 2-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// A started child and the line it printed when ready.
pub struct Started {
    _child: Child,
    // Kept open: the sim, started with `--exit-with-stdin`, exits when this process dies
    // without cleaning up.
    _stdin: Option<tokio::process::ChildStdin>,
    pub line: String,
}

/// The first whitespace-separated word after `marker` in `line`.
pub fn word_after<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    line.split(marker)
        .nth(1)?
        .split(|c: char| c.is_whitespace() || c == ')')
        .find(|w| !w.is_empty())
}

/// Starts `program args` (stderr to `log`) and waits for a stdout line containing `marker`.
pub async fn start(
    program: &Path,
    args: &[String],
    log: &Path,
    marker: &str,
) -> anyhow::Result<Started> {
    let stderr =
        std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().context("child stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let found = tokio::time::timeout(START_TIMEOUT, async {
        while let Some(line) = lines.next_line().await? {
            if line.contains(marker) {
                return Ok::<_, std::io::Error>(Some(line));
            }
        }
        Ok(None)
    })
    .await;
    let line = match found {
        Ok(Ok(Some(line))) => line,
        Ok(Ok(None)) => bail!(
            "{} exited before it was ready; see {}",
            program.display(),
            log.display()
        ),
        Ok(Err(e)) => bail!("reading {}'s output: {e}", program.display()),
        Err(_) => bail!(
            "{} was not ready within {START_TIMEOUT:?}; see {}",
            program.display(),
            log.display()
        ),
    };
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Started {
        _child: child,
        _stdin: stdin,
        line,
    })
}

/// [`run_to_end`], and an error naming the log unless it exited successfully.
pub async fn run_ok(
    program: &Path,
    args: &[String],
    log: &Path,
    limit: Duration,
) -> anyhow::Result<()> {
    let status = run_to_end(program, args, log, limit).await?;
    if !status.success() {
        bail!(
            "{} failed ({status}); see {}",
            program.display(),
            log.display()
        );
    }
    Ok(())
}

/// Runs `program args` to its end within `limit`, stdout and stderr to `log`.
pub async fn run_to_end(
    program: &Path,
    args: &[String],
    log: &Path,
    limit: Duration,
) -> anyhow::Result<std::process::ExitStatus> {
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    tokio::time::timeout(limit, child.wait())
        .await
        .with_context(|| {
            format!(
                "{} ran longer than {limit:?}; see {}",
                program.display(),
                log.display()
            )
        })?
        .with_context(|| format!("waiting for {}", program.display()))
}

/// A client for `/metrics` scrapes, with a short timeout: a restarting apiserver refuses
/// connections, an overloaded one may answer late, and a sample is skipped, never waited for.
#[derive(Clone)]
pub struct Scraper {
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Scraper {
    pub fn new() -> Scraper {
        Scraper {
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// The Prometheus text at `url`, or None (unreachable, slow, not 200).
    pub async fn text(&self, url: &str) -> Option<String> {
        let uri: hyper::Uri = url.parse().ok()?;
        let get = async {
            let resp = self.client.get(uri).await.ok()?;
            if !resp.status().is_success() {
                return None;
            }
            let body = resp.into_body().collect().await.ok()?.to_bytes();
            String::from_utf8(body.to_vec()).ok()
        };
        tokio::time::timeout(Duration::from_secs(2), get)
            .await
            .ok()
            .flatten()
    }
}

impl Default for Scraper {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_samples_and_addresses() {
        let text = "# HELP x\ntollgate_quota_available_bytes_total 9\n\
                    tollgate_quota_available_bytes -12.5\n";
        assert_eq!(
            kubeio::promtext::unlabelled(text, "tollgate_quota_available_bytes"),
            Some(-12.5)
        );
        assert_eq!(kubeio::promtext::unlabelled(text, "missing"), None);
        let line = "tollgate serving at http://127.0.0.1:5 (admin http://127.0.0.1:6)";
        assert_eq!(word_after(line, "serving at "), Some("http://127.0.0.1:5"));
        assert_eq!(word_after(line, "(admin "), Some("http://127.0.0.1:6"));
    }
}
