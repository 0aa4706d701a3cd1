//! `loadgen seed` and `loadgen cleanup` flags → [`SeedConfig`], [`CleanupConfig`].

use super::target::TargetArgs;
use crate::seed::{CleanupConfig, SeedConfig};

/// `loadgen seed`.
#[derive(Debug, clap::Args)]
pub struct SeedArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Fake nodes to create ({prefix}node-K).
    #[arg(long, default_value_t = 0)]
    pub nodes: u64,
    /// Pods to create ({prefix}pod-K), bound to the fake nodes.
    #[arg(long, default_value_t = 0)]
    pub pods: u64,
    /// Padding per pod, in bytes, in an annotation (to model large objects).
    #[arg(long, default_value_t = 0)]
    pub pod_bytes: usize,
    /// Namespaces to create and spread pods over ({prefix}ns-K); 0 puts pods in --namespace.
    #[arg(long, default_value_t = 0)]
    pub namespaces: u64,
    /// Namespace for pods when --namespaces is 0.
    #[arg(long, short = 'n', default_value = "default")]
    pub namespace: String,
    /// Name prefix of every object.
    #[arg(long, default_value = "loadgen-")]
    pub object_prefix: String,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
}

/// `loadgen cleanup`.
#[derive(Debug, clap::Args)]
pub struct CleanupArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
}

impl SeedArgs {
    /// The seed these flags ask for.
    pub fn into_config(self) -> SeedConfig {
        SeedConfig {
            target: self.target.options(),
            nodes: self.nodes,
            pods: self.pods,
            pod_bytes: self.pod_bytes,
            namespaces: self.namespaces,
            namespace: self.namespace,
            object_prefix: self.object_prefix,
            concurrency: self.concurrency,
        }
    }
}

impl CleanupArgs {
    /// The cleanup these flags ask for.
    pub fn into_config(self) -> CleanupConfig {
        CleanupConfig {
            target: self.target.options(),
            concurrency: self.concurrency,
        }
    }
}
