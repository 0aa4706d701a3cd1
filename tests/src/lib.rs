//! Helpers shared by the end-to-end tests: the real binaries started as child processes on
//! loopback, and the real `kubectl` run against them, every wait bounded by a deadline.
//!
//! - [`SimProcess`]: `tollgate-bench sim` on an ephemeral port in its own temp dir, killed on drop;
//!   with [`Store::Etcd`], on a real etcd of its own.
//! - [`TollgateProcess`]: the real `tollgate` in front of an upstream (a [`SimProcess`]), on
//!   ephemeral client and admin ports, with the certificates of [`TollgateOptions`], killed on drop.
//! - [`RealApiserver`]: a real kube-apiserver 1.20.2 with its own etcd (the shared tools'
//!   `start.sh`), stopped with `stop.sh` on drop.
//! - [`kubectl`] / [`Kubectl`]: one kubectl command with a request and a process timeout.
//! - [`KubectlBackground`]: a long-running kubectl (`get -w`) whose stdout is read line by line.
//! - [`LineReader`], [`eventually`]: the polling primitives the above are built on.
//! - [`workspace_binary`]: where the workspace's binaries are, next to the test executable.

mod binary;
mod child;
mod json;
mod kube;
mod kubectl;
mod lines;
mod sim;
mod tollgate;

pub use binary::{bench_command, fresh_workspace_binary, workspace_binary};
pub use json::{abbreviated, str_at, user_info, whoami};
pub use kube::{kube_apiserver_tools, KubeVersion, RealApiserver};
pub use kubectl::{
    kubectl, Kubectl, KubectlBackground, KubectlOutput, KUBECTL_PROCESS_TIMEOUT,
    KUBECTL_REQUEST_TIMEOUT,
};
pub use lines::{eventually, LineReader, Next};
pub use sim::{Scheme, SimProcess, Store, SIM_START_TIMEOUT};
pub use tollgate::{http_get, TollgateOptions, TollgateProcess, TOLLGATE_START_TIMEOUT};
// tollgate's ready line, for tollgate started by other means (a container in tests/images).
pub use tollgate::parse_ready_line;

pub use bench::sim::auth::kubeconfig::KubeUser;
pub use bench::sim::auth::pki::{CertAuthority, CertKeyPem};
