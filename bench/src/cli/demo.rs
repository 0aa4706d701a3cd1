//! `tollgate-bench demo` flags.

use crate::demo::DemoConfig;
use std::path::PathBuf;

/// `tollgate-bench demo`: the runs' sizes, load and tollgate settings.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Directory for the report (report.html, summary.md, summary.json) and each run's files.
    #[arg(long, default_value = "report")]
    pub output: PathBuf,
    /// The ~2-minute version (CI): a smaller control plane (300 nodes, 10,000 pods), 10-second runs, 600 LISTs/min.
    #[arg(long)]
    pub quick: bool,
    /// Nodes the simulated control plane starts with [default: 1000; --quick: 300].
    #[arg(long)]
    pub nodes: Option<u64>,
    /// Pods it starts with (~2 KB of JSON each) [default: 30000; --quick: 10000].
    #[arg(long)]
    pub pods: Option<u64>,
    /// Length of each run, in seconds [default: 35; --quick: 10].
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Consistent LIST-all-pods per minute in the storm [default: 180; --quick: 600].
    #[arg(long)]
    pub lists_per_minute: Option<f64>,
    /// Heartbeating nodes (created by `loadgen seed`), each PATCHing its status.
    #[arg(long, default_value_t = 1000)]
    pub heartbeat_nodes: u64,
    /// Heartbeat status PATCHes per second, all nodes together.
    #[arg(long, default_value_t = 100.0)]
    pub patches_per_second: f64,
    /// A static pool for the protected run instead of tollgate's default adaptive budget:
    /// its refill rate, bytes/s (tollgate gets `--quota-mode static`) [default: none, the
    /// adaptive budget].
    #[arg(long)]
    pub quota_bytes_per_second: Option<u64>,
    /// The burst of the static pools (the searched ones, and the one set by hand), bytes
    /// [default: about one LIST of every pod: pods × 8400].
    #[arg(long)]
    pub quota_burst_bytes: Option<u64>,
    /// Static pools to run the storm through in the search for the best one (its goodput is
    /// the protected run's yardstick); 0: not measured [default: 2].
    #[arg(long)]
    pub static_pools: Option<usize>,
    /// The modeled apiserver's memory limit (the sim's --memory-limit).
    #[arg(long, default_value = "8Gi")]
    pub memory_limit: String,
}

impl DemoArgs {
    pub fn into_config(self) -> DemoConfig {
        DemoConfig {
            output: self.output,
            quick: self.quick,
            nodes: self.nodes,
            pods: self.pods,
            seconds: self.seconds,
            lists_per_minute: self.lists_per_minute,
            heartbeat_nodes: self.heartbeat_nodes,
            patches_per_second: self.patches_per_second,
            quota_bytes_per_second: self.quota_bytes_per_second,
            quota_burst_bytes: self.quota_burst_bytes,
            static_pools: self.static_pools,
            memory_limit: self.memory_limit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::plan;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        demo: DemoArgs,
    }

    #[test]
    fn quick_is_smaller_and_flags_win() {
        let full = plan(&Cli::parse_from(["x"]).demo.into_config());
        let quick = plan(&Cli::parse_from(["x", "--quick"]).demo.into_config());
        assert!(quick.setup.pods < full.setup.pods);
        assert!(quick.setup.duration_seconds < full.setup.duration_seconds);
        assert_eq!(full.setup.nodes, 1000);
        let custom = plan(
            &Cli::parse_from(["x", "--quick", "--seconds", "5", "--pods", "7"])
                .demo
                .into_config(),
        );
        assert_eq!(custom.setup.duration_seconds, 5.0);
        assert!(custom.setup.sim_args.contains(&"7".to_string()));
        assert!(custom
            .setup
            .tollgate_args
            .windows(2)
            .any(|w| w[0] == "--mode" && w[1] == "enforce"));
        // The protected run is tollgate's default: no pool set by hand, so adaptive.
        assert_eq!(full.setup.tollgate_args, ["--mode", "enforce"]);
        assert_eq!(full.setup.quota_bytes_per_second, None);
        assert_eq!(full.setup.static_pools, 2);
        // A pool set by hand is a static one.
        let hand = plan(
            &Cli::parse_from(["x", "--quota-bytes-per-second", "5000000"])
                .demo
                .into_config(),
        );
        let a = &hand.setup.tollgate_args;
        assert!(
            a.windows(2).any(|w| w == ["--quota-mode", "static"])
                && a.windows(2)
                    .any(|w| w == ["--quota-bytes-per-second", "5000000"]),
            "{a:?}"
        );
        let none = plan(
            &Cli::parse_from(["x", "--static-pools", "0"])
                .demo
                .into_config(),
        );
        assert_eq!(none.setup.static_pools, 0);
    }
}
