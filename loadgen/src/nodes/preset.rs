//! `--preset`: cluster shapes with the numbers they come from (a preset
//! gives the `--nodes` flags' defaults, see [`crate::cli::nodes`]; a flag given wins).
//!
//! - Tess.IO (eBay, ../shared/seeds/002): 5,000 nodes, 150k pods (30 per
//!   node), each kubelet PATCHes its node status every 10 s ("5000/10 = 500
//!   patch requests per second"), five daemons per node LIST (rv=0) then
//!   WATCH the node's pods. Node leases did not exist yet (Kubernetes 1.10
//!   era; NodeLease went beta in 1.14): no lease renewals.
//! - Modern kubelet (and kwok's `node-heartbeat-with-lease` stage): the lease
//!   (`leaseDurationSeconds` 40) is renewed every 40 × 0.25 = 10 s, and the
//!   node status is sent every `nodeStatusReportFrequency` = 5 min when
//!   nothing changed. Same cluster shape as Tess.IO's otherwise.

use std::time::Duration;

use clap::ValueEnum;

/// A cluster shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// 5,000 nodes, status every 10 s (500 PATCH/s), no leases, 5 daemons and 30 pods per node.
    #[value(name = "tess-5k")]
    Tess5k,
    /// 5,000 nodes, leases every 10 s (500/s), status every 5 min, 5 daemons and 30 pods per node.
    #[value(name = "modern-5k")]
    Modern5k,
    /// tess-5k scaled to 1,000 nodes (100 PATCH/s).
    #[value(name = "tess-1k")]
    Tess1k,
    /// modern-5k scaled to 1,000 nodes (100 lease renewals/s).
    #[value(name = "modern-1k")]
    Modern1k,
}

/// The numbers of a preset.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    pub nodes: u64,
    pub heartbeat: Duration,
    /// Zero: no leases.
    pub lease_renew: Duration,
    pub daemons_per_node: u64,
    pub pods_per_node: u64,
}

/// Tess.IO's kubelet status interval (also the default without a preset).
pub const TESS_HEARTBEAT: Duration = Duration::from_secs(10);
/// kubelet `nodeStatusReportFrequency`.
const MODERN_STATUS: Duration = Duration::from_secs(300);
/// kubelet: 0.25 × `nodeLeaseDurationSeconds` (40 s).
pub const MODERN_LEASE: Duration = Duration::from_secs(10);

impl Preset {
    pub fn shape(self) -> Shape {
        let (nodes, modern) = match self {
            Preset::Tess5k => (5_000, false),
            Preset::Modern5k => (5_000, true),
            Preset::Tess1k => (1_000, false),
            Preset::Modern1k => (1_000, true),
        };
        Shape {
            nodes,
            heartbeat: if modern {
                MODERN_STATUS
            } else {
                TESS_HEARTBEAT
            },
            lease_renew: if modern { MODERN_LEASE } else { Duration::ZERO },
            daemons_per_node: 5,
            pods_per_node: 30,
        }
    }
}

impl Shape {
    /// Node status PATCHes per second.
    pub fn heartbeats_per_s(&self) -> f64 {
        per_s(self.nodes, self.heartbeat)
    }
    /// Lease renewals per second.
    pub fn lease_renewals_per_s(&self) -> f64 {
        per_s(self.nodes, self.lease_renew)
    }
}

fn per_s(nodes: u64, every: Duration) -> f64 {
    if every.is_zero() {
        0.0
    } else {
        nodes as f64 / every.as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn presets_have_the_documented_numbers() {
        let tess = Preset::Tess5k.shape();
        assert_eq!(
            (tess.nodes, tess.daemons_per_node, tess.pods_per_node),
            (5_000, 5, 30)
        );
        assert_eq!(tess.heartbeats_per_s(), 500.0);
        assert_eq!(tess.lease_renewals_per_s(), 0.0);
        let modern = Preset::Modern5k.shape();
        assert_eq!(modern.lease_renewals_per_s(), 500.0);
        assert_eq!(modern.heartbeat, Duration::from_secs(300));
        assert!((modern.heartbeats_per_s() - 5_000.0 / 300.0).abs() < 1e-9);
        assert_eq!(Preset::Tess1k.shape().heartbeats_per_s(), 100.0);
        assert_eq!(Preset::Modern1k.shape().lease_renewals_per_s(), 100.0);
        assert_eq!(Preset::Modern1k.shape().daemons_per_node, 5);
    }
}
