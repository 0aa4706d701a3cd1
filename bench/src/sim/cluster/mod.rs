//! What runs beside the apiserver in a cluster, simulated: the kubelet (`--kubelet`: kwok's
//! default Stages, run by loadgen's Stage engine) and a scheduler (`--scheduler`). Both are
//! clients of the simulator, as kwok and kube-scheduler are of kube-apiserver: they list,
//! watch and write through its own listener over HTTP, so every request they send is
//! authenticated, counted in the metrics and charged by the cost model as any client's is.
//! They authenticate as the loopback user ([`LOOPBACK_USER`], in `system:masters`, as
//! kube-apiserver's own loopback client and kwok's admin kubeconfig are), so like them they
//! are never refused by max-in-flight.
//!
//! - [`kubelet`]: Pending → Running (containers, conditions, IPs), Job pods → Succeeded.
//! - [`scheduler`]: pods without a node bound to Ready nodes, round robin.
//! - [`controllers`]: `--controllers`: Deployments, ReplicaSets, ReplicationControllers,
//!   Jobs, StatefulSets and DaemonSets make and count their pods; owners' dependents are
//!   garbage collected.

pub mod controllers;
pub mod kubelet;
pub mod scheduler;

pub use crate::sim::auth::authn::LOOPBACK_USER;

use loadgen::target::{ApiClient, TargetOptions};
use std::net::SocketAddr;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Per request of the kubelet and the scheduler (a watch's response head included).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Which of them to run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterConfig {
    pub kubelet: bool,
    pub scheduler: bool,
    pub controllers: bool,
}

impl ClusterConfig {
    pub fn any(&self) -> bool {
        self.kubelet || self.scheduler || self.controllers
    }
}

/// A new loopback bearer token: random, never written anywhere.
pub fn loopback_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where the simulator's own clients dial: the bound address, or loopback if it listens on
/// every address.
fn loopback_url(scheme: &str, addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(v4) if v4.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(v6) if v6.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("{scheme}://{}", SocketAddr::new(ip, addr.port()))
}

/// Starts what `config` asks for on `tracker`, until `stop`.
pub fn start(
    config: ClusterConfig,
    scheme: &str,
    addr: SocketAddr,
    token: &str,
    tracker: &TaskTracker,
    stop: &CancellationToken,
) -> Result<(), String> {
    if !config.any() {
        return Ok(());
    }
    let target = TargetOptions {
        server: Some(loopback_url(scheme, addr)),
        token: Some(token.to_string()),
        // This process dialing its own listener: there is no server identity to check.
        insecure_skip_tls_verify: scheme == "https",
        ..Default::default()
    }
    .resolve()
    .map_err(|e| format!("the simulator's own client: {e}"))?;
    let client = ApiClient::new(&target);
    if config.kubelet {
        kubelet::start(client.clone(), REQUEST_TIMEOUT, tracker, stop)?;
    }
    if config.controllers {
        controllers::start(client.clone(), REQUEST_TIMEOUT, tracker, stop);
    }
    if config.scheduler {
        scheduler::start(client, REQUEST_TIMEOUT, tracker, stop);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_clients_dial_loopback_when_listening_everywhere() {
        let any: SocketAddr = "0.0.0.0:8001".parse().unwrap();
        assert_eq!(loopback_url("http", any), "http://127.0.0.1:8001");
        let v6: SocketAddr = "[::]:6443".parse().unwrap();
        assert_eq!(loopback_url("https", v6), "https://[::1]:6443");
        let one: SocketAddr = "127.0.0.2:1".parse().unwrap();
        assert_eq!(loopback_url("http", one), "http://127.0.0.2:1");
        assert_eq!(loopback_token().len(), 64);
        assert_ne!(loopback_token(), loopback_token());
    }
}
