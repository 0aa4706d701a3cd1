//! tollgate out of file descriptors (issue 20): the real binary under `prlimit --nofile=64`
//! in front of the simulator, with more connections opened to both listeners than it has
//! descriptors for (the client listener's first, the admin listener's once the client
//! listener has run out). Its accepts fail with EMFILE; each listener backs off (10 ms doubling to
//! 1 s) and logs at most a line a second — the admin listener used to retry at once and log
//! 1.9 million lines in 4 s on a full core — and once the connections close, both listeners
//! serve again and `/metrics` counts the failures.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::Context;
use tests::{eventually, http_get, SimProcess, TollgateOptions, TollgateProcess};

/// tollgate's open-file limit in this test.
const NOFILE: u64 = 64;
/// Connections opened to each listener: more than NOFILE together.
const CLIENT_CONNECTIONS: usize = 80;
const ADMIN_CONNECTIONS: usize = 20;
/// How long the listeners are watched while out of descriptors.
const WATCH: Duration = Duration::from_secs(3);

/// Seconds of CPU (user + system) process `pid` has used.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): state is the 3rd field of
    // stat, utime and stime the 14th and 15th.
    let rest = stat.rsplit_once(')').context("no ')' in /proc/PID/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields
            .get(i)
            .context("short /proc/PID/stat")?
            .parse::<f64>()?)
    };
    // Clock ticks are 100 a second on Linux (USER_HZ), whatever the kernel's HZ.
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

fn accept_failures(log: &str, listener: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("accept failed") && l.contains(&format!("listener=\"{listener}\"")))
        .count()
}

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn out_of_file_descriptors_both_listeners_back_off_and_recover() -> anyhow::Result<()> {
    let sim = SimProcess::start(&[])?;
    let options = TollgateOptions {
        nofile: Some(NOFILE),
        ..TollgateOptions::in_front_of(&sim)
    };
    let tg = TollgateProcess::start(&options)?;
    let client = tg
        .url
        .strip_prefix("http://")
        .context("tollgate serves plain HTTP here")?
        .to_string();

    // The client listener first, until it runs out of descriptors; only then the admin
    // listener's connections, so that it too has connections waiting while none are left.
    // Opened together, the admin listener could accept all of its few before the client
    // listener's took the last descriptor, and then it never failed an accept at all.
    let mut open = Vec::new();
    for _ in 0..CLIENT_CONNECTIONS {
        open.push(TcpStream::connect(&client)?);
    }
    let failed = |listener: &str| accept_failures(&tg.log(), listener) > 0;
    eventually(
        Duration::from_secs(20),
        "the client listener logs a failed accept",
        || Ok(failed("client").then_some(())),
    )
    .with_context(|| format!("tollgate's log:\n{}", tg.log()))?;
    for _ in 0..ADMIN_CONNECTIONS {
        open.push(TcpStream::connect(&tg.admin_addr)?);
    }
    eventually(
        Duration::from_secs(20),
        "the admin listener logs a failed accept",
        || Ok(failed("admin").then_some(())),
    )
    .with_context(|| format!("tollgate's log:\n{}", tg.log()))?;

    // Out of descriptors for a while: a line a second per listener at most, and no spinning.
    let (log, cpu, start) = (tg.log(), cpu_seconds(tg.pid())?, Instant::now());
    std::thread::sleep(WATCH);
    let (later, used, watched) = (
        tg.log(),
        cpu_seconds(tg.pid())? - cpu,
        start.elapsed().as_secs_f64(),
    );
    for listener in ["client", "admin"] {
        let lines = accept_failures(&later, listener) - accept_failures(&log, listener);
        let most = watched.ceil() as usize + 1;
        assert!(
            lines <= most,
            "{listener}: {lines} accept-failure lines in {watched:.1} s (at most {most})"
        );
    }
    assert!(
        used < 0.3 * watched,
        "tollgate used {used:.2} s of CPU in {watched:.1} s while out of descriptors"
    );

    // The connections close: both listeners serve again.
    drop(open);
    eventually(
        Duration::from_secs(20),
        "the admin listener answers",
        || Ok(matches!(tg.admin_get("/healthz"), Ok((200, _))).then_some(())),
    )?;
    eventually(
        Duration::from_secs(20),
        "a request through tollgate is served",
        || {
            Ok(matches!(
                http_get(&client, "/api/v1/namespaces", Duration::from_secs(5)),
                Ok((200, _))
            )
            .then_some(()))
        },
    )?;
    let metrics = tg.admin_ok("/metrics")?;
    for listener in ["client", "admin"] {
        let series = format!("tollgate_accept_errors_total{{listener=\"{listener}\"}}");
        let errors = metric(&metrics, &series).unwrap_or(0.0);
        assert!(errors >= 1.0, "{series} = {errors}");
    }
    Ok(())
}
