//! kubeio: what tollgate, loadgen and the bench share when they talk to a
//! cluster, beyond the pure API model in `apimodel`: reading a kubeconfig,
//! running its exec credential plugins, the in-cluster configuration, reading Prometheus `/metrics` text,
//! and writing an error with its causes on one line.
//!
//! # Layout
//! - [`kubeconfig`]: our own kubeconfig reader (no `kube` crate: build cost);
//!   `KUBECONFIG` lists, contexts, certificates, `token`/`tokenFile`, exec.
//! - [`exec`]: exec credential plugins (`ExecCredential` v1 / v1beta1), run synchronously.
//! - [`incluster`]: a pod's service account (client-go's `InClusterConfig`), and
//!   [`incluster::resolve`]: kubeconfig, else in-cluster.
//! - [`promtext`]: the Prometheus text-format parser and the questions asked of it.
//! - [`error_chain`]: `error: cause: cause` for logs and Status messages.
#![forbid(unsafe_code)]

mod chain;
pub mod exec;
pub mod incluster;
pub mod kubeconfig;
pub mod process;
pub mod promtext;

pub use chain::error_chain;
