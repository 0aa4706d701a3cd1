//! Ctrl-C stops a run early, drains it and still writes the results.

use super::*;

/// Ctrl-C (SIGINT to loadgen's pid) stops a long run early and still writes the results.
#[test]
fn ctrl_c_still_writes_the_results() -> anyhow::Result<()> {
    let sim = SimProcess::start(&["--nodes", "3", "--pods", "30", "--namespaces", "1"])?;
    let k = sim.kubectl();
    let out = TempDir::new()?;
    let output = out.path().display().to_string();
    let args = target_args(
        &sim,
        &[
            "--duration",
            "10m",
            "--lists",
            "20/s",
            "-A",
            "--watches",
            "2",
            "--no-progress",
            "--output",
            &output,
        ],
    )?;
    let started = Instant::now();
    let run = Loadgen::spawn(&strs(&args))?;
    // Wait until the load is flowing: the simulator has served 20 of its LISTs.
    let before = RequestCounts::scrape(&k)?;
    eventually(
        Duration::from_secs(60),
        "20 LISTs served to loadgen",
        || {
            let now = RequestCounts::scrape(&k)?;
            Ok((served(
                &before,
                &now,
                &[("verb", "LIST"), ("resource", "pods"), ("scope", "cluster")],
            ) >= 20)
                .then_some(()))
        },
    )?;
    let pid = run.pid().to_string();
    let kill = Command::new("kill").args(["-INT", &pid]).status()?;
    anyhow::ensure!(kill.success(), "kill -INT {pid}: {kill}");
    let finished = run.wait(Duration::from_secs(60))?;
    anyhow::ensure!(
        finished.status.code() == Some(130),
        "exit status after SIGINT: {} (want 130); stderr: {}",
        finished.status,
        finished.stderr
    );
    anyhow::ensure!(
        started.elapsed() < Duration::from_secs(120),
        "loadgen ran {:?} of its 10 minutes",
        started.elapsed()
    );
    anyhow::ensure!(
        finished.stderr.contains("interrupted"),
        "stderr: {}",
        finished.stderr
    );
    let s = read_summary(out.path())?;
    anyhow::ensure!(s["interrupted"] == true, "summary: {s:#}");
    let duration = s["duration_s"].as_f64().unwrap_or(f64::MAX);
    anyhow::ensure!(duration < 100.0, "duration_s {duration}");
    let l = op(&s, "list")?;
    let requests = num(l, "requests");
    anyhow::ensure!(
        requests >= 20 && num(l, "errors") == 0,
        "list after Ctrl-C: {l:#}"
    );
    // The requests made match the run's real length at 20/s (in-flight ones cancelled).
    let intended = 20.0 * duration;
    anyhow::ensure!(
        (requests + num(l, "cancelled")) as f64 >= intended - 2.0
            && (requests as f64) <= intended + 2.0,
        "{requests} LISTs in {duration} s at 20/s: {l:#}"
    );
    anyhow::ensure!(num(&s["watches"], "watchers") == 2, "{s:#}");
    check_output_files(out.path(), &s)?;
    still_running(sim)
}
