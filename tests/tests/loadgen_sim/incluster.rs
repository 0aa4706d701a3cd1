//! loadgen as a pod runs it: no kubeconfig, no `--server`, the service variables and the
//! service-account files; SIGTERM ends it with its results; exit codes by the README's table.

use super::*;

/// The simulator over TLS, accepting two service-account tokens.
fn sim_with_tokens(dir: &Path) -> anyhow::Result<SimProcess> {
    let tokens = dir.join("tokens.csv");
    std::fs::write(
        &tokens,
        "first-token,system:serviceaccount:load:loadgen,1,\"system:serviceaccounts\"\n\
         second-token,system:serviceaccount:load:loadgen,1,\"system:serviceaccounts\"\n",
    )?;
    SimProcess::start(&[
        "--tls",
        "--token-auth-file",
        &tokens.display().to_string(),
        "--nodes",
        "3",
        "--pods",
        "30",
        "--namespaces",
        "1",
    ])
}

/// A service-account directory as the kubelet mounts it: token, ca.crt, namespace.
fn service_account(dir: &Path, sim: &SimProcess, token: &str) -> anyhow::Result<PathBuf> {
    let sa = dir.join("serviceaccount");
    std::fs::create_dir_all(&sa)?;
    std::fs::write(sa.join("token"), token)?;
    let ca = sim.server_ca_pem.as_deref().context("the simulator's CA")?;
    std::fs::write(sa.join("ca.crt"), ca)?;
    std::fs::write(sa.join("namespace"), "ns-0")?;
    Ok(sa)
}

/// Replaces the token as the kubelet does: a new file renamed over the old one.
fn rotate(sa: &Path, token: &str) -> anyhow::Result<()> {
    let tmp = sa.join("..token.tmp");
    std::fs::write(&tmp, token)?;
    std::fs::rename(&tmp, sa.join("token"))?;
    Ok(())
}

/// `KUBERNETES_SERVICE_HOST`/`PORT` for the simulator; `HOME` without a `.kube/config`.
fn pod_env(sim: &SimProcess, home: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let authority = sim
        .url
        .strip_prefix("https://")
        .context("the simulator serves https")?;
    let (host, port) = authority.rsplit_once(':').context("host:port")?;
    Ok(vec![
        ("KUBERNETES_SERVICE_HOST".into(), host.into()),
        ("KUBERNETES_SERVICE_PORT".into(), port.into()),
        ("HOME".into(), home.display().to_string()),
    ])
}

fn env_refs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// The cluster-wide pod LISTs the simulator has served.
fn lists_served(k: &Kubectl) -> anyhow::Result<u64> {
    Ok(RequestCounts::scrape(k)?.sum(&[
        ("verb", "LIST"),
        ("resource", "pods"),
        ("scope", "cluster"),
    ]))
}

/// In-cluster configuration end to end: the token comes from the mounted file (never the
/// command line), a rotated token is read again (after at most a minute, at once after a
/// 401), and SIGTERM drains the run and writes `summary.json` marked interrupted.
#[test]
fn in_cluster_token_rotation_and_sigterm() -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let sim = sim_with_tokens(dir.path())?;
    let k = sim.kubectl();
    let sa = service_account(dir.path(), &sim, "first-token\n")?;
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home)?;
    let env = pod_env(&sim, &home)?;
    let out = dir.path().join("out");
    let (sa_dir, output) = (sa.display().to_string(), out.display().to_string());
    let drain = Duration::from_secs(5);
    let run = Loadgen::spawn_env(
        &[
            "--service-account-dir",
            &sa_dir,
            "--duration",
            "10m",
            "--drain-timeout",
            "5s",
            "--lists",
            "20/s",
            "-A",
            "--no-progress",
            "--output",
            &output,
        ],
        &env_refs(&env),
    )?;
    let base = lists_served(&k)?;
    eventually(
        Duration::from_secs(60),
        "20 LISTs served with the first token",
        || Ok((lists_served(&k)? >= base + 20).then_some(())),
    )?;
    // A token the server does not know: once loadgen reads it (client-go: within a
    // minute), its LISTs are refused and the served count stops growing.
    rotate(&sa, "revoked-token\n")?;
    let mut last = (lists_served(&k)?, Instant::now());
    eventually(
        Duration::from_secs(90),
        "loadgen read the rotated (revoked) token: no LIST served for 2 s",
        || {
            let now = lists_served(&k)?;
            if now != last.0 {
                last = (now, Instant::now());
            }
            Ok((last.1.elapsed() >= Duration::from_secs(2)).then_some(()))
        },
    )?;
    // A valid token again: after a 401 the file is read again at once (at most once a second).
    rotate(&sa, "second-token\n")?;
    let refused_at = lists_served(&k)?;
    eventually(
        Duration::from_secs(20),
        "20 LISTs served with the second token",
        || Ok((lists_served(&k)? >= refused_at + 20).then_some(())),
    )?;
    let pid = run.pid().to_string();
    let signalled = Instant::now();
    let kill = Command::new("kill").args(["-TERM", &pid]).status()?;
    anyhow::ensure!(kill.success(), "kill -TERM {pid}: {kill}");
    let finished = run.wait(drain + Duration::from_secs(20))?;
    let took = signalled.elapsed();
    anyhow::ensure!(
        took < drain + Duration::from_secs(15),
        "loadgen took {took:?} to exit after SIGTERM (drain timeout {drain:?})"
    );
    anyhow::ensure!(
        finished.status.code() == Some(143),
        "exit status after SIGTERM: {} (want 143); stderr: {}",
        finished.status,
        finished.stderr
    );
    let s = read_summary(&out)?;
    anyhow::ensure!(s["interrupted"] == true, "summary: {s:#}");
    anyhow::ensure!(
        s["target"]
            .as_str()
            .is_some_and(|t| t.starts_with(&sim.url)),
        "target {} is not the service {}",
        s["target"],
        sim.url
    );
    let l = op(&s, "list")?;
    anyhow::ensure!(
        code(l, "200") >= 40 && code(l, "401") > 0,
        "LISTs with the first and second token, refused with the revoked one: {l:#}"
    );
    // Drained, not abandoned: a LIST of 30 pods finishes well within 5 s.
    anyhow::ensure!(num(l, "cancelled") == 0, "in-flight LISTs abandoned: {l:#}");
    let perf: Value = serde_json::from_str(&std::fs::read_to_string(out.join("perfdata.json"))?)?;
    anyhow::ensure!(perf["interrupted"] == true, "perfdata.json: {perf:#}");
    still_running(sim)
}

/// Without a kubeconfig, in a pod whose service-account files are missing, the error
/// names the file; exit codes follow the README's table (2 usage, 64 bad input, 1 failed).
#[test]
fn exit_codes_and_a_missing_service_account() -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let status = |args: &[&str], env: &[(&str, &str)]| -> anyhow::Result<Finished> {
        Loadgen::spawn_env(args, env)?.wait(LOADGEN_GRACE)
    };
    let usage = status(&["--no-such-flag"], &[])?;
    anyhow::ensure!(usage.status.code() == Some(2), "usage: {}", usage.status);
    let bad = status(&["--server", "http://127.0.0.1:1"], &[])?;
    anyhow::ensure!(
        bad.status.code() == Some(64) && bad.stderr.contains("nothing to do"),
        "no operations: {} {}",
        bad.status,
        bad.stderr
    );
    let missing = dir.path().join("missing.yaml");
    let scenario = status(&["run", &missing.display().to_string()], &[])?;
    anyhow::ensure!(
        scenario.status.code() == Some(64),
        "unreadable scenario: {} {}",
        scenario.status,
        scenario.stderr
    );
    let home = dir.path().display().to_string();
    let sa = dir.path().join("no-serviceaccount");
    let sa_dir = sa.display().to_string();
    let pod = [
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
        ("KUBERNETES_SERVICE_PORT", "1"),
        ("HOME", home.as_str()),
    ];
    let failed = status(&["--service-account-dir", &sa_dir, "--lists", "1/s"], &pod)?;
    let token = sa.join("token").display().to_string();
    anyhow::ensure!(
        failed.status.code() == Some(1)
            && failed.stderr.contains("in-cluster configuration: reading")
            && failed.stderr.contains(&token),
        "in a pod without its token: {} {}",
        failed.status,
        failed.stderr
    );
    // Not in a pod and no kubeconfig: the error says both were looked for.
    let nowhere = status(&["--lists", "1/s"], &[("HOME", home.as_str())])?;
    anyhow::ensure!(
        nowhere.status.code() == Some(1) && nowhere.stderr.contains("not in a cluster"),
        "no kubeconfig, not in a pod: {} {}",
        nowhere.status,
        nowhere.stderr
    );
    Ok(())
}
