//! One SLO experiment: start the system under test for one (load, resource) cell, run loadgen
//! against it, check the SLOs on its `summary.json`, stop everything.
//!
//! The programs are the workspace's own binaries, run as child processes (each killed when
//! its handle drops, so an error or Ctrl-C leaves nothing behind): `tollgate-bench sim`,
//! `tollgate` and `loadgen`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::execution::{number, substitute, Execution};
use super::results::{Record, SloOutcome};
use super::search::Cell;
use super::slo::Summary;

/// Where the three programs are.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub bench: PathBuf,
    pub tollgate: PathBuf,
    pub loadgen: PathBuf,
}

impl Binaries {
    /// This executable, and `tollgate` and `loadgen` beside it (as cargo builds them), unless
    /// `TOLLGATE_BIN` / `LOADGEN_BIN` say otherwise.
    pub fn beside_current_exe() -> anyhow::Result<Binaries> {
        let bench = std::env::current_exe().context("locating tollgate-bench")?;
        let dir = bench
            .parent()
            .context("tollgate-bench has no directory")?
            .to_owned();
        let pick = |var: &str, name: &str| {
            std::env::var_os(var)
                .map(PathBuf::from)
                .unwrap_or_else(|| dir.join(name))
        };
        let b = Binaries {
            tollgate: pick("TOLLGATE_BIN", "tollgate"),
            loadgen: pick("LOADGEN_BIN", "loadgen"),
            bench,
        };
        for p in [&b.tollgate, &b.loadgen] {
            if !p.exists() {
                bail!(
                    "{} is missing: build it (cargo build --release -p tollgate -p loadgen) or point {} at it",
                    p.display(),
                    if p == &b.tollgate { "TOLLGATE_BIN" } else { "LOADGEN_BIN" }
                );
            }
        }
        Ok(b)
    }
}

/// How long a child may take to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// A started child and the URL it printed. Its stdin stays open while this lives: the sim,
/// started with `--exit-with-stdin`, also exits when this process dies without cleaning up.
struct Started {
    _child: Child,
    _stdin: Option<tokio::process::ChildStdin>,
    url: String,
}

/// Starts `program args`, its stderr to `log`, and waits for a stdout line containing
/// `marker` followed by a URL.
async fn start(
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
            if let Some(rest) = line.split(marker).nth(1) {
                let url = rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                return Ok::<_, std::io::Error>(Some(url));
            }
        }
        Ok(None)
    })
    .await;
    let url = match found {
        Ok(Ok(Some(url))) if !url.is_empty() => url,
        Ok(Ok(_)) => bail!(
            "{} exited before it was ready; see {}",
            program.display(),
            log.display()
        ),
        Ok(Err(e)) => bail!("reading {}'s output: {e}", program.display()),
        Err(_) => bail!(
            "{} printed no address within {START_TIMEOUT:?}; see {}",
            program.display(),
            log.display()
        ),
    };
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Started {
        _child: child,
        _stdin: stdin,
        url,
    })
}

async fn run_to_end(
    program: &Path,
    args: &[String],
    log: &Path,
    limit: Duration,
) -> anyhow::Result<()> {
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
    let status = tokio::time::timeout(limit, child.wait())
        .await
        .with_context(|| {
            format!(
                "{} ran longer than {limit:?}; see {}",
                program.display(),
                log.display()
            )
        })??;
    if !status.success() {
        bail!(
            "{} failed ({status}); see {}",
            program.display(),
            log.display()
        );
    }
    Ok(())
}

/// The directory of one experiment's files, under the run's output.
pub fn experiment_dir(output: &Path, exec: &Execution, cell: Cell, repetition: u32) -> PathBuf {
    output.join("experiments").join(format!(
        "load-{}_resource-{}_rep-{}",
        number(exec.load.values[cell.load]),
        number(exec.resource.values[cell.resource]),
        repetition + 1
    ))
}

/// Runs one repetition of one experiment and returns its record (SLO failures are a record
/// with `ok: false`; only a failure to run at all is an error).
pub async fn run(
    exec: &Execution,
    bins: &Binaries,
    output: &Path,
    cell: Cell,
    repetition: u32,
) -> anyhow::Result<Record> {
    let load = exec.load.values[cell.load];
    let resource = exec.resource.values[cell.resource];
    let dir = experiment_dir(output, exec, cell, repetition);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let started_at = time::OffsetDateTime::now_utc();
    let t0 = Instant::now();

    // The target loadgen talks to: the sim's URL, or the cluster's kubeconfig.
    let mut _sim = None;
    let mut target: Vec<String> = Vec::new();
    let mut upstream: Vec<String> = Vec::new();
    if let Some(sim) = &exec.sut.sim {
        let mut args = vec![
            "sim".to_owned(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--exit-with-stdin".into(),
        ];
        args.extend(substitute(&sim.args, load, resource));
        let s = start(
            &bins.bench,
            &args,
            &dir.join("sim.log"),
            "serving the Kubernetes API at ",
        )
        .await?;
        target = vec!["--server".into(), s.url.clone()];
        upstream = vec!["--upstream".into(), s.url.clone()];
        _sim = Some(s);
    } else if let Some(k) = &exec.sut.kubeconfig {
        target = vec!["--kubeconfig".into(), k.display().to_string()];
        upstream = vec!["--upstream-kubeconfig".into(), k.display().to_string()];
    }
    let mut _tollgate = None;
    if let Some(tg) = &exec.sut.tollgate {
        let mut args = vec![
            "--listen".to_owned(),
            "127.0.0.1:0".into(),
            "--admin-listen".into(),
            "127.0.0.1:0".into(),
        ];
        args.extend(upstream.iter().cloned());
        args.extend(substitute(&tg.args, load, resource));
        let t = start(
            &bins.tollgate,
            &args,
            &dir.join("tollgate.log"),
            "tollgate serving at ",
        )
        .await?;
        target = vec!["--server".into(), t.url.clone()];
        if let Some(k) = &exec.sut.kubeconfig {
            // Credentials stay the cluster's; only the address is tollgate's.
            target.extend(["--kubeconfig".into(), k.display().to_string()]);
        }
        _tollgate = Some(t);
    }

    if !exec.loadgen.seed.is_empty() {
        let mut args = vec!["seed".to_owned()];
        args.extend(target.iter().cloned());
        args.extend(substitute(&exec.loadgen.seed, load, resource));
        run_to_end(
            &bins.loadgen,
            &args,
            &dir.join("seed.log"),
            Duration::from_secs(600),
        )
        .await?;
    }

    let out = dir.join("loadgen");
    let mut args = target.clone();
    args.extend(substitute(&exec.loadgen.args, load, resource));
    args.extend([
        "--duration".into(),
        exec.duration.clone(),
        "--output".into(),
        out.display().to_string(),
        "--no-progress".into(),
    ]);
    let limit = humantime_secs(&exec.duration).unwrap_or(600.0) * 2.0 + 180.0;
    run_to_end(
        &bins.loadgen,
        &args,
        &dir.join("loadgen.log"),
        Duration::from_secs_f64(limit),
    )
    .await?;
    let summary_path = out.join("summary.json");
    let text = std::fs::read_to_string(&summary_path)
        .with_context(|| format!("reading {}", summary_path.display()))?;
    let summary: Summary = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a loadgen summary", summary_path.display()))?;

    let slos: Vec<SloOutcome> = exec
        .slos
        .iter()
        .map(|s| {
            let v = s.check(&summary.operations, summary.duration_s);
            SloOutcome {
                name: v.name,
                value: v.value.filter(|x| x.is_finite()),
                limit: v.limit,
                ok: v.ok,
            }
        })
        .collect();
    let ok = slos.iter().all(|s| s.ok);
    Ok(Record {
        load,
        load_index: cell.load,
        resource,
        resource_index: cell.resource,
        repetition,
        ok,
        slos,
        output: dir
            .strip_prefix(output)
            .ok()
            .map(|p| p.display().to_string()),
        started: started_at
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Seconds in a loadgen-style duration ("90s", "2m", "1h", "500ms").
fn humantime_secs(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().ok()?;
    Some(match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations() {
        assert_eq!(super::humantime_secs("90s"), Some(90.0));
        assert_eq!(super::humantime_secs("2m"), Some(120.0));
        assert_eq!(super::humantime_secs("500ms"), Some(0.5));
        assert_eq!(super::humantime_secs("abc"), None);
    }
}
