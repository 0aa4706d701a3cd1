//! The etcd-read budget shared by the tollgates of three masters, end to end: one real etcd
//! (Debian's `etcd-server`), three simulated apiservers on it (`tollgate-bench sim --store
//! etcd`: three masters over one etcd), three tollgates with the same
//! `--global-etcd-bytes-per-second` coordinating through that etcd, and loadgen sending
//! consistent LISTs of all pods unevenly (70/20/10%) through them.
//!
//! Functional assertions (the figures are the benchmark's, bench/scripts/shared-budget.sh):
//! in steady state the grants sum to at most the budget less its reserve and follow the
//! demand; a tollgate killed (by pid), the others' grants grow within the lease TTL plus a
//! margin; the coordinator killed, another is elected, and at no sample do the shares in force
//! of the live tollgates sum to more than the budget.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use bench::sim::etcd_server::EtcdServer;
use serde_json::Value;
use tests::{eventually, fresh_workspace_binary, SimProcess, TollgateOptions, TollgateProcess};

/// The cluster-wide etcd-read budget, bytes/s.
const BUDGET: f64 = 6_000_000.0;
/// Its default reserve (`quota.global.reserveFraction`).
const RESERVE: f64 = 0.1 * BUDGET;
/// Pods each simulator seeds (the same objects: one etcd) and their size: a LIST of all
/// pods is about 1.2 MB, a heavy request.
const PODS: &str = "600";
const POD_BYTES: &str = "1000";
/// LISTs per second sent through each tollgate: 70/20/10%.
const RATES: [&str; 3] = ["7/s", "2/s", "1/s"];
/// The members' lease TTL (budget/shared: LEASE_TTL) and a margin for a renewal, the
/// coordinator's step and this machine being busy.
const LEASE_TTL: Duration = Duration::from_secs(10);
const MARGIN: Duration = Duration::from_secs(8);
/// Numbers written as JSON floats: within a byte.
const EPSILON: f64 = 1.0;

/// loadgen as a child, killed by its pid on drop.
struct Load(Child);

impl Drop for Load {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn storm(tollgate: &TollgateProcess, rate: &str, out: PathBuf) -> anyhow::Result<Load> {
    let loadgen = fresh_workspace_binary("loadgen", &["loadgen", "kubeio", "apimodel"]);
    let child = Command::new(loadgen)
        .args([
            "--server",
            &tollgate.url,
            "--lists",
            rate,
            "--list-resource",
            "pods",
            "-A",
        ])
        .args([
            "--list-rv",
            "consistent",
            "--duration",
            "120s",
            "--no-progress",
        ])
        .args(["--timeout", "20s", "--max-in-flight", "20"])
        .arg("--output")
        .arg(out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting loadgen")?;
    Ok(Load(child))
}

/// The shared section of a tollgate's `/debug/budget`.
fn shared(t: &TollgateProcess) -> anyhow::Result<Value> {
    let body = t.admin_ok("/debug/budget")?;
    let v: Value = serde_json::from_str(&body).context("parsing /debug/budget")?;
    let s = v.get("shared").cloned().unwrap_or(Value::Null);
    anyhow::ensure!(s.is_object(), "no shared budget in /debug/budget: {body}");
    Ok(s)
}

fn f(v: &Value, pointer: &str) -> f64 {
    v.pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or(f64::NAN)
}

/// Grants by member id in an allocation as one tollgate read it.
fn grants(s: &Value) -> Vec<(String, f64)> {
    s["members"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .filter_map(|m| {
                    let g = m["grantBytesPerSecond"].as_f64()?;
                    Some((m["id"].as_str()?.to_string(), g))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Checks what no sample may break, on every live tollgate: the allocation's grants sum to at
/// most the budget less the reserve, and the shares in force together to at most the budget.
fn check_bounds(live: &[&TollgateProcess]) -> anyhow::Result<Vec<Value>> {
    let views: Vec<Value> = live
        .iter()
        .map(|t| shared(t))
        .collect::<anyhow::Result<_>>()?;
    for v in &views {
        let sum: f64 = grants(v).iter().map(|(_, g)| g).sum();
        anyhow::ensure!(
            sum <= BUDGET - RESERVE + EPSILON,
            "grants sum to {sum} > budget − reserve: {v}"
        );
    }
    let in_force: f64 = views.iter().map(|v| f(v, "/gate/bytesPerSecond")).sum();
    anyhow::ensure!(
        in_force <= BUDGET + EPSILON,
        "shares in force sum to {in_force} > budget {BUDGET}: {views:?}"
    );
    Ok(views)
}

#[test]
fn three_masters_share_one_etcd_read_budget_through_etcd() -> anyhow::Result<()> {
    let etcd = EtcdServer::start().context("starting etcd")?;
    let sim_args = [
        "--store",
        "etcd",
        "--etcd-endpoints",
        etcd.url.as_str(),
        "--pods",
        PODS,
        "--pod-bytes",
        POD_BYTES,
        "--nodes",
        "10",
    ];
    let sims = (0..3)
        .map(|_| SimProcess::start(&sim_args))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let budget = format!("{BUDGET}");
    let mut tollgates = sims
        .iter()
        .map(|sim| {
            TollgateProcess::start(&TollgateOptions {
                args: [
                    "--mode",
                    "enforce",
                    "--global-etcd-bytes-per-second",
                    &budget,
                    "--global-cluster",
                    "e2e",
                    "--etcd-servers",
                    &etcd.url,
                ]
                .map(String::from)
                .to_vec(),
                ..TollgateOptions::in_front_of(sim)
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let out = tempfile::tempdir()?;
    let mut loads = Vec::new();
    for (i, (t, rate)) in tollgates.iter().zip(RATES).enumerate() {
        loads.push(Some(storm(t, rate, out.path().join(format!("load-{i}")))?));
    }

    // Steady state: three members, one coordinator, grants that follow the demand.
    let ids = eventually(
        Duration::from_secs(40),
        "three members with grants that follow demand",
        || {
            let all: Vec<&TollgateProcess> = tollgates.iter().collect();
            let views = check_bounds(&all)?;
            let v = &views[0];
            let g = grants(v);
            let ids: Vec<String> = views
                .iter()
                .map(|v| v["id"].as_str().unwrap_or("").to_string())
                .collect();
            let grant_of = |id: &str| g.iter().find(|(m, _)| m == id).map(|(_, x)| *x);
            let coordinators = views.iter().filter(|v| v["role"] == "coordinator").count();
            match (grant_of(&ids[0]), grant_of(&ids[2])) {
                (Some(a), Some(c)) if g.len() == 3 && coordinators == 1 && a > 1.5 * c => {
                    Ok(Some(ids))
                }
                _ => anyhow::bail!("not yet: {views:#?}"),
            }
        },
    )?;

    // A member (not the coordinator) killed: the other two absorb its share.
    let views = check_bounds(&tollgates.iter().collect::<Vec<_>>())?;
    let coordinator = views
        .iter()
        .position(|v| v["role"] == "coordinator")
        .context("no coordinator")?;
    let victim = (0..3).find(|i| *i != coordinator).context("a member")?;
    let before: f64 = grants(&views[coordinator])
        .iter()
        .filter(|(m, _)| *m != ids[victim])
        .map(|(_, g)| g)
        .sum();
    loads[victim] = None;
    let killed = tollgates.remove(victim);
    let pid = killed.pid();
    drop(killed);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "tollgate {pid} still runs"
    );
    let started = Instant::now();
    eventually(
        LEASE_TTL + MARGIN,
        "the two left absorb the dead member's share",
        || {
            let views = check_bounds(&tollgates.iter().collect::<Vec<_>>())?;
            let g = grants(&views[0]);
            let sum: f64 = g.iter().map(|(_, x)| x).sum();
            Ok((g.len() == 2 && sum > before + 0.1 * BUDGET).then_some(()))
        },
    )?;
    eprintln!("absorbed after {:?}", started.elapsed());

    // The coordinator killed: the last one takes over; no sample over the budget.
    let coordinator = tollgates
        .iter()
        .position(|t| {
            shared(t)
                .map(|v| v["role"] == "coordinator")
                .unwrap_or(false)
        })
        .context("no coordinator among the two left")?;
    let dead_id = shared(&tollgates[coordinator])?["id"]
        .as_str()
        .unwrap_or("")
        .to_string();
    drop(tollgates.remove(coordinator));
    let started = Instant::now();
    eventually(LEASE_TTL + MARGIN, "a new coordinator", || {
        let views = check_bounds(&tollgates.iter().collect::<Vec<_>>())?;
        let v = &views[0];
        let alone = grants(v).iter().all(|(m, _)| *m != dead_id);
        Ok((v["role"] == "coordinator" && alone).then_some(()))
    })?;
    eprintln!("new coordinator after {:?}", started.elapsed());
    // It grows into the whole capacity after its learning period, and not beyond.
    eventually(
        Duration::from_secs(10),
        "the last member gets the capacity",
        || {
            let views = check_bounds(&tollgates.iter().collect::<Vec<_>>())?;
            let g = grants(&views[0]);
            Ok((g.len() == 1 && g[0].1 > 0.9 * (BUDGET - RESERVE)).then_some(()))
        },
    )?;
    // Requests passed through the shared budget, and it refused some (demand > budget).
    let metrics = tollgates[0].admin_ok("/metrics")?;
    for name in [
        "tollgate_shared_budget_admitted_bytes_total",
        "tollgate_shared_budget_coordination_writes_total",
    ] {
        let v: f64 = metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|x| x.parse().ok())
            .unwrap_or(0.0);
        assert!(v > 0.0, "{name} is {v}:\n{metrics}");
    }
    drop(loads);
    drop(sims);
    drop(etcd);
    Ok(())
}
