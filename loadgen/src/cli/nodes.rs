//! The simulated-node flags of a run ([`NodeArgs`]) → [`NodeSimSpec`]; a
//! `--preset` gives the defaults, a flag given wins.

use std::time::Duration;

use super::parse_duration;
use crate::nodes::preset::{Preset, MODERN_LEASE, TESS_HEARTBEAT};
use crate::nodes::NodeSimSpec;

/// The simulated-node flags of a run (`loadgen --nodes N …`, `loadgen nodes --count N …`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NodeArgs {
    /// Simulate N nodes: register them ({prefix}node-K), heartbeat, renew leases, run daemons [default: none, or the preset's].
    #[arg(long, help_heading = "Nodes")]
    pub nodes: Option<u64>,
    /// A cluster shape: tess-5k, modern-5k, tess-1k, modern-1k (flags given explicitly win).
    #[arg(long, value_enum, help_heading = "Nodes")]
    pub preset: Option<Preset>,
    /// Node status heartbeat (PATCH nodes/NAME/status) interval per node; 0 turns it off [default: 10s; modern presets 5m].
    #[arg(long, value_parser = parse_duration, help_heading = "Nodes")]
    pub heartbeat: Option<Duration>,
    /// Lease renewal interval per node (kube-node-lease); 0: no leases [default: 10s; tess presets 0].
    #[arg(long, value_parser = parse_duration, help_heading = "Nodes")]
    pub lease_renew: Option<Duration>,
    /// Informer-like daemons per node that LIST (rv=0) then WATCH the node's pods [default: 0; presets 5].
    #[arg(long, help_heading = "Nodes")]
    pub daemons_per_node: Option<u64>,
    /// Pods created per node at registration, bound to it ({node}-pod-J in --namespace) [default: 0; presets 30].
    #[arg(long, help_heading = "Nodes")]
    pub pods_per_node: Option<u64>,
    /// Adopt existing nodes matching this label selector (up to --nodes) instead of creating them.
    #[arg(long, help_heading = "Nodes")]
    pub adopt_nodes: Option<String>,
    /// Bind pending pods of --namespace to the simulated nodes, round robin [default: false].
    #[arg(long, help_heading = "Nodes")]
    pub bind: bool,
    /// How often --bind looks for pending pods.
    #[arg(long, default_value = "1s", value_parser = parse_duration, help_heading = "Nodes")]
    pub bind_interval: Duration,
    /// Daemon watches per HTTP/2 connection; keep it under the server's max concurrent streams (Go's default 250).
    #[arg(long, default_value_t = 250, help_heading = "Nodes")]
    pub daemon_watches_per_connection: u64,
    /// Server-side timeout of each daemon watch, after which it re-watches [default: 5-10 min at random, as client-go].
    #[arg(long, value_parser = parse_duration, help_heading = "Nodes")]
    pub daemon_watch_timeout: Option<Duration>,
    /// kwok Stage files (YAML, kwok.x-k8s.io/v1alpha1 Stage) driving the simulated nodes' and their pods' lifecycles; `fast` is the built-in set (kwok's fast node and pod Stages); repeatable [default: none, no Stages].
    #[arg(long, num_args = 1.., value_name = "FILE|fast", help_heading = "Nodes")]
    pub stages: Vec<String>,
    /// Divide every Stage delay by this: 10 runs kwok's 20-25 s heartbeat Stage every 2-2.5 s.
    #[arg(long, default_value_t = 1.0, help_heading = "Nodes")]
    pub time_scale: f64,
}

impl NodeArgs {
    /// The spec these flags ask for, `None` without `--nodes` or `--preset`.
    /// `namespace` empty means the run's; `object_prefix` names created nodes.
    pub fn spec(&self, namespace: &str, object_prefix: &str) -> Option<NodeSimSpec> {
        let shape = self.preset.map(Preset::shape);
        let count = self.nodes.or(shape.map(|s| s.nodes))?;
        if count == 0 {
            return None;
        }
        Some(NodeSimSpec {
            count,
            adopt_selector: self.adopt_nodes.clone(),
            object_prefix: object_prefix.to_string(),
            namespace: namespace.to_string(),
            heartbeat: self
                .heartbeat
                .or(shape.map(|s| s.heartbeat))
                .unwrap_or(TESS_HEARTBEAT),
            lease_renew: self
                .lease_renew
                .or(shape.map(|s| s.lease_renew))
                .unwrap_or(MODERN_LEASE),
            daemons_per_node: self
                .daemons_per_node
                .or(shape.map(|s| s.daemons_per_node))
                .unwrap_or(0),
            pods_per_node: self
                .pods_per_node
                .or(shape.map(|s| s.pods_per_node))
                .unwrap_or(0),
            bind: self.bind,
            bind_interval: self.bind_interval,
            watches_per_connection: self.daemon_watches_per_connection.max(1),
            daemon_watch_timeout: self.daemon_watch_timeout,
            shard: None,
            // Loaded (and checked) by `RunArgs::into_config`.
            stages: crate::stages::StagesSpec::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        nodes: NodeArgs,
    }

    fn spec(args: &[&str]) -> Option<NodeSimSpec> {
        let mut all = vec!["t"];
        all.extend_from_slice(args);
        Flags::try_parse_from(all)
            .expect("parse")
            .nodes
            .spec("ns", "lg-")
    }

    #[test]
    fn flags_override_the_preset() {
        let s = spec(&["--preset", "tess-5k"]).expect("spec");
        assert_eq!(
            (
                s.count,
                s.heartbeat,
                s.lease_renew,
                s.daemons_per_node,
                s.pods_per_node
            ),
            (5_000, Duration::from_secs(10), Duration::ZERO, 5, 30)
        );
        let s = spec(&[
            "--preset",
            "modern-1k",
            "--nodes",
            "10",
            "--lease-renew",
            "2s",
        ])
        .expect("spec");
        assert_eq!(
            (s.count, s.heartbeat, s.lease_renew),
            (10, Duration::from_secs(300), Duration::from_secs(2))
        );
        // Without a preset: 10 s status, 10 s leases, no daemons, no pods.
        let s = spec(&["--nodes", "3"]).expect("spec");
        assert_eq!(
            (
                s.heartbeat,
                s.lease_renew,
                s.daemons_per_node,
                s.pods_per_node
            ),
            (Duration::from_secs(10), Duration::from_secs(10), 0, 0)
        );
        assert_eq!(spec(&[]), None);
        assert_eq!(spec(&["--nodes", "0"]), None);
        assert!(Flags::try_parse_from(["t", "--preset", "tess-9k"]).is_err());
    }

    #[test]
    fn nodes_subcommand_and_run_flag_build_the_same_spec() {
        use crate::cli::{Cli, Command};
        let config = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).expect("parse");
            match cli.command {
                Some(Command::Nodes(n)) => (*n).into_config(),
                _ => cli.run.into_config(),
            }
        };
        let sub =
            config(&["loadgen", "nodes", "--count", "3", "--server", "http://x"]).expect("config");
        let flag = config(&["loadgen", "--nodes", "3", "--server", "http://x"]).expect("config");
        assert_eq!(sub.nodes, flag.nodes);
        assert_eq!(sub.nodes.as_ref().map(|n| n.count), Some(3));
        assert!(sub.operations.is_empty());
        assert!(config(&["loadgen", "nodes", "--server", "http://x"]).is_err());
        // Alongside other operations, and sharded: shard 1/4 of 10 nodes is K = 1, 5, 9.
        let both = config(&[
            "loadgen", "--preset", "tess-1k", "--nodes", "10", "--lists", "1/s", "--shard", "1/4",
        ])
        .expect("config");
        assert_eq!(both.operations.len(), 1);
        let nodes = both.nodes.expect("nodes");
        assert_eq!(nodes.indices().collect::<Vec<_>>(), [1, 5, 9]);
        assert_eq!(nodes.daemons_per_node, 5);
    }
}
