//! `tollgate-bench sim` flags, named after kube-apiserver's where they mean the same, and
//! their translation into the simulator's [`SimConfig`].

use crate::sim::auth::authn::AuthnConfig;
use crate::sim::model::{Constants, ModelConfig};
use crate::sim::storage::seed_objects::SeedSpec;
use crate::sim::{read_file, CostModel, ServingCert, SimConfig, SimError, StoreKind};
use clap::Parser;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// `"8Gi"` → `("8", "Gi")`: the leading number and the unit after it.
fn number_and_unit(s: &str) -> (&str, &str) {
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    s.split_at(split)
}

/// A duration flag: `500ms`, `10s`, `5m`, `1h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationArg(pub Duration);

impl FromStr for DurationArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (num, unit) = number_and_unit(s);
        let n: f64 = num
            .parse()
            .map_err(|_| format!("{s:?} is not a duration (e.g. 500ms, 10s, 5m, 1h)"))?;
        let secs = match unit {
            "ms" => n / 1000.0,
            "s" | "" => n,
            "m" => n * 60.0,
            "h" => n * 3600.0,
            _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
        };
        Duration::try_from_secs_f64(secs)
            .map(DurationArg)
            .map_err(|e| format!("{s:?}: {e}"))
    }
}

/// A byte count flag: `8Gi`, `512Mi`, `4G`, `1500000`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (num, unit) = number_and_unit(s);
        let n: f64 = num
            .parse()
            .map_err(|_| format!("{s:?} is not a size (e.g. 8Gi, 512Mi, 4G)"))?;
        let mult = match unit {
            "" => 1.0,
            "K" | "k" => 1e3,
            "M" => 1e6,
            "G" => 1e9,
            "T" => 1e12,
            "Ki" => 1024.0,
            "Mi" => 1024.0 * 1024.0,
            "Gi" => 1024.0 * 1024.0 * 1024.0,
            "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            _ => {
                return Err(format!(
                    "{s:?}: unknown unit {unit:?} (use K, M, G, Ki, Mi, Gi)"
                ))
            }
        };
        Ok(ByteSize((n * mult) as u64))
    }
}

/// A simulated kube-apiserver: kubectl, loadgen and tollgate talk to it as to a real one.
#[derive(Debug, Clone, Parser)]
#[command(name = "sim")]
pub struct SimArgs {
    /// Address to serve the Kubernetes API on; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8001")]
    pub listen: String,
    /// Serve HTTPS with a generated CA and serving certificate (or --tls-cert-file/--tls-private-key-file).
    #[arg(long)]
    pub tls: bool,
    /// Serving certificate (PEM) to use with --tls instead of a generated one (needs --tls).
    #[arg(long, requires = "tls_private_key_file", requires = "tls")]
    pub tls_cert_file: Option<PathBuf>,
    /// Key of --tls-cert-file (PEM) (needs --tls).
    #[arg(long, requires = "tls_cert_file", requires = "tls")]
    pub tls_private_key_file: Option<PathBuf>,
    /// Directory to write the generated CA and serving certificate into (ca.crt, apiserver.crt, apiserver.key) (needs --tls).
    #[arg(long, requires = "tls")]
    pub cert_dir: Option<PathBuf>,
    /// Write a kubeconfig that kubectl can use as is to this path.
    #[arg(long)]
    pub kubeconfig_out: Option<PathBuf>,
    /// Nodes to seed (each with its Lease in kube-node-lease); with --kubelet, 0 seeds one
    /// (pods need a Ready node to run on).
    #[arg(long, default_value_t = 0)]
    pub nodes: usize,
    /// Pods to seed, spread over the nodes and namespaces.
    #[arg(long, default_value_t = 0)]
    pub pods: usize,
    /// Workload namespaces to seed (ns-1 … ns-N), besides default, kube-system, kube-public and kube-node-lease.
    #[arg(long, default_value_t = 1)]
    pub namespaces: usize,
    /// Approximate JSON size of each seeded pod, in bytes.
    #[arg(long, default_value_t = 2048)]
    pub pod_bytes: usize,
    /// Random seed for the seeded objects: the same seed gives the same objects.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Non-mutating requests served at once before 429 (0: no limit), as kube-apiserver's flag.
    #[arg(long, default_value_t = 400)]
    pub max_requests_inflight: usize,
    /// Mutating requests served at once before 429 (0: no limit), as kube-apiserver's flag.
    #[arg(long, default_value_t = 200)]
    pub max_mutating_requests_inflight: usize,
    /// Revisions of history kept (etcd compaction): continue tokens and watches older than this get 410 Gone
    /// (with --store etcd, etcd is compacted to the same revision).
    #[arg(long, default_value_t = 50_000)]
    pub history_window: usize,
    /// Where objects are kept: `memory`, or `etcd` as kube-apiserver keeps them
    /// (under /registry/…, resourceVersion = etcd revision; the memory store becomes the watch cache).
    #[arg(long, value_enum, default_value = "memory")]
    pub store: StoreKind,
    /// etcd client URLs for --store etcd, comma-separated (kube-apiserver's --etcd-servers).
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:2379")]
    pub etcd_endpoints: Vec<String>,
    /// With --store etcd: how long a write waits for the watch cache to reach its
    /// revision before 504 (kube-apiserver's watch cache waits up to 3s to be fresh).
    #[arg(long, default_value = "3s")]
    pub watch_cache_wait_timeout: DurationArg,
    /// Largest request body accepted; larger bodies get 413 (kube-apiserver's limit is 3 MiB).
    #[arg(long, default_value_t = 3 * 1024 * 1024)]
    pub max_request_body_bytes: usize,
    /// How often a watch with allowWatchBookmarks=true gets a BOOKMARK event.
    #[arg(long, default_value = "60s")]
    pub bookmark_interval: DurationArg,
    /// How often the stored-object counts on /metrics (apiserver_storage_objects) are
    /// taken; until the first, they are 0, as kube-apiserver's (its default: 1m, the
    /// 1.20 flag of the same name). 0s: counted at every scrape, the simulator's default.
    #[arg(long, default_value = "0s")]
    pub etcd_count_metric_poll_period: DurationArg,
    /// How long the simulated kubelet takes to stop a pod once its graceful delete starts
    /// (capped by the pod's grace period; a real kubelet takes up to the grace period).
    #[arg(long, default_value = "1s")]
    pub kubelet_delete_delay: DurationArg,
    /// Run a simulated kubelet for every node: kwok's default Stages (loadgen's `--stages
    /// fast`) make pods bound to a node Running (container statuses, Ready, podIP,
    /// startTime), Job-owned pods Succeeded, not-Ready nodes Ready, and delete pods whose
    /// deletion started. Its requests go through this simulator's listener, cost model
    /// included (default: off).
    #[arg(long)]
    pub kubelet: bool,
    /// Bind pods without spec.nodeName to Ready, schedulable nodes matching their
    /// nodeSelector, round robin, through pods/binding; `--scheduler=false` turns it off
    /// (default: on with --kubelet, off without).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub scheduler: Option<bool>,
    /// Run the workload controllers kube-controller-manager runs: Deployments make
    /// ReplicaSets (rolling updates included), ReplicaSets, ReplicationControllers, Jobs,
    /// StatefulSets and DaemonSets make their pods and report their status, and the garbage
    /// collector deletes what a deleted owner owned (background, foreground, orphan). They
    /// are clients of this simulator like the kubelet (a watch on pods among them);
    /// `--controllers=false` turns them off (default: on with --kubelet, off without).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub controllers: Option<bool>,
    /// Static bearer tokens, kube-apiserver's CSV format: token,user,uid,"group1,group2".
    #[arg(long)]
    pub token_auth_file: Option<PathBuf>,
    /// CA bundle (PEM) that verifies client certificates: CN is the user, O the groups (needs --tls).
    #[arg(long = "client-ca-file", requires = "tls")]
    pub client_ca_file: Option<PathBuf>,
    /// CA bundle (PEM) of front proxies whose X-Remote-User/X-Remote-Group headers are trusted (needs --tls).
    #[arg(long = "requestheader-client-ca-file", requires = "tls")]
    pub requestheader_client_ca_file: Option<PathBuf>,
    /// Front-proxy certificate CNs accepted, comma-separated; empty accepts any CN signed by the CA.
    #[arg(long, value_delimiter = ',')]
    pub requestheader_allowed_names: Vec<String>,
    /// Headers carrying the user name from a front proxy.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-User")]
    pub requestheader_username_headers: Vec<String>,
    /// Headers carrying groups from a front proxy.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Group")]
    pub requestheader_group_headers: Vec<String>,
    /// Header prefixes carrying extra user attributes from a front proxy.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Extra-")]
    pub requestheader_extra_headers_prefix: Vec<String>,
    /// Exit when standard input closes: a test harness that dies (even by SIGKILL)
    /// then never leaves a simulator running.
    #[arg(long)]
    pub exit_with_stdin: bool,
    /// Serve requests without credentials as system:anonymous (false: 401).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub anonymous_auth: bool,
    /// `none` (default): serve as fast as possible; `modeled`: charge each request what a
    /// real apiserver and etcd would spend, wait for it, hold memory and crash at --memory-limit.
    #[arg(long, value_enum, default_value = "none")]
    pub cost_model: CostModel,
    /// With --cost-model modeled: the apiserver's cores (default 2, the machine the model was
    /// calibrated on; an m5.large-sized control-plane node).
    #[arg(long, default_value_t = 2.0)]
    pub virtual_cpus: f64,
    /// With --cost-model modeled: modeled apiserver memory beyond which it is OOM-killed and
    /// restarts (default 8Gi, the memory of a 2-vCPU control-plane node).
    #[arg(long, default_value = "8Gi")]
    pub memory_limit: ByteSize,
    /// After a modeled restart, answer resourceVersion=0 LISTs with 503 until the watch cache
    /// is ready instead of sending them to storage (Tess.IO's patch; default off: stock behaviour).
    #[arg(long)]
    pub reject_until_cache_ready: bool,
    /// Serve consistent LISTs from the watch cache (Kubernetes 1.31+ with etcd progress
    /// notifications); default off: they read etcd, as before 1.34 and in Tess.IO's clusters.
    #[arg(long)]
    pub consistent_reads_from_cache: bool,
    /// The Kubernetes release the sim answers as: `1.20` (default) or `1.37`, the current
    /// release. 1.37 serves consistent LISTs from the watch cache (KEP-2340), exact-revision
    /// LISTs and continue tokens from cache snapshots while the cache still holds the revision
    /// (KEP-4988), counts both stores in apiserver_storage_list_total, and serves 1.37.2's
    /// discovery documents and /version. The default stays 1.20 because the cost model's
    /// constants were calibrated against kube-apiserver 1.20.2 (bench/MODEL.md) and every
    /// recorded capacity figure used it.
    #[arg(long, value_enum, default_value = "1.20")]
    pub kube_version: crate::sim::KubeVersion,
    /// Override one model constant, NAME=VALUE (repeatable); names and defaults in bench/MODEL.md.
    #[arg(long = "model-set", value_name = "NAME=VALUE")]
    pub model_set: Vec<String>,
}

impl Default for SimArgs {
    fn default() -> Self {
        SimArgs::parse_from(["sim", "--listen", "127.0.0.1:0"])
    }
}

impl SimArgs {
    /// The simulator's settings: files named by flags are read here, so a missing one is
    /// reported before any port is bound.
    pub fn into_config(self) -> Result<SimConfig, SimError> {
        let authn = self.authn_config()?;
        let model = self.model_config()?;
        let seed = self.seed_spec();
        let serving = match (self.tls_cert_file, self.tls_private_key_file) {
            (Some(cert), Some(key)) => ServingCert::Files { cert, key },
            _ => ServingCert::Generated {
                cert_dir: self.cert_dir,
            },
        };
        let tls = if self.tls { Some(serving) } else { None };
        Ok(SimConfig {
            listen: self.listen,
            tls,
            kubeconfig_out: self.kubeconfig_out,
            seed,
            max_requests_inflight: self.max_requests_inflight,
            max_mutating_requests_inflight: self.max_mutating_requests_inflight,
            history_window: self.history_window,
            store: self.store,
            etcd_endpoints: self.etcd_endpoints,
            watch_cache_wait_timeout: self.watch_cache_wait_timeout.0,
            max_request_body_bytes: self.max_request_body_bytes,
            bookmark_interval: self.bookmark_interval.0,
            count_poll_period: self.etcd_count_metric_poll_period.0,
            kubelet_delete_delay: self.kubelet_delete_delay.0,
            cluster: crate::sim::cluster::ClusterConfig {
                kubelet: self.kubelet,
                scheduler: self.scheduler.unwrap_or(self.kubelet),
                controllers: self.controllers.unwrap_or(self.kubelet),
            },
            exit_with_stdin: self.exit_with_stdin,
            authn,
            model,
            kube_version: self.kube_version,
        })
    }

    /// The cost model's settings, with the --model-set overrides applied.
    pub fn model_config(&self) -> Result<ModelConfig, SimError> {
        let mut constants = Constants::default();
        for kv in &self.model_set {
            let (k, v) = kv.split_once('=').ok_or_else(|| {
                SimError::Config(format!("--model-set {kv:?}: expected NAME=VALUE"))
            })?;
            let v: f64 = v.trim().parse().map_err(|_| {
                SimError::Config(format!("--model-set {kv:?}: {v:?} is not a number"))
            })?;
            constants
                .set(k.trim(), v)
                .map_err(|e| SimError::Config(format!("--model-set: {e}")))?;
        }
        if !(self.virtual_cpus.is_finite() && self.virtual_cpus > 0.0) {
            return Err(SimError::Config(format!(
                "--virtual-cpus {}: must be a positive number",
                self.virtual_cpus
            )));
        }
        Ok(ModelConfig {
            enabled: self.cost_model == CostModel::Modeled,
            virtual_cpus: self.virtual_cpus,
            memory_limit: self.memory_limit.0,
            reject_until_cache_ready: self.reject_until_cache_ready,
            consistent_reads_from_cache: self.consistent_reads_from_cache,
            constants,
        })
    }

    pub fn seed_spec(&self) -> SeedSpec {
        SeedSpec {
            nodes: if self.kubelet {
                self.nodes.max(1)
            } else {
                self.nodes
            },
            pods: self.pods,
            namespaces: self.namespaces,
            pod_bytes: self.pod_bytes,
            seed: self.seed,
        }
    }

    pub fn authn_config(&self) -> Result<AuthnConfig, SimError> {
        Ok(AuthnConfig {
            token_auth_file: self.token_auth_file.clone(),
            client_ca_pem: self.client_ca_file.as_deref().map(read_file).transpose()?,
            requestheader_client_ca_pem: self
                .requestheader_client_ca_file
                .as_deref()
                .map(read_file)
                .transpose()?,
            requestheader_allowed_names: self.requestheader_allowed_names.clone(),
            requestheader_username_headers: self.requestheader_username_headers.clone(),
            requestheader_uid_headers: Vec::new(),
            requestheader_group_headers: self.requestheader_group_headers.clone(),
            requestheader_extra_headers_prefix: self.requestheader_extra_headers_prefix.clone(),
            anonymous_auth: self.anonymous_auth,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_nonsense() {
        assert_eq!(
            "500ms".parse::<DurationArg>().unwrap().0,
            Duration::from_millis(500)
        );
        assert_eq!(
            "2m".parse::<DurationArg>().unwrap().0,
            Duration::from_secs(120)
        );
        assert_eq!(
            "3".parse::<DurationArg>().unwrap().0,
            Duration::from_secs(3)
        );
        assert!("3 parsecs".parse::<DurationArg>().is_err());
        assert!("-1s".parse::<DurationArg>().is_err());
    }

    /// Without --tls these were ignored: plain HTTP served, client certificates never asked.
    #[test]
    fn certificate_flags_without_tls_are_refused() {
        for flags in [
            &[
                "--tls-cert-file",
                "c.pem",
                "--tls-private-key-file",
                "k.pem",
            ][..],
            &["--client-ca-file", "ca.pem"],
            &["--requestheader-client-ca-file", "ca.pem"],
            &["--cert-dir", "pki"],
        ] {
            let err = SimArgs::try_parse_from(["sim"].iter().chain(flags))
                .expect_err("refused without --tls");
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::MissingRequiredArgument,
                "{flags:?}: {err}"
            );
            assert!(err.to_string().contains("--tls"), "{flags:?}: {err}");
            let tls = SimArgs::try_parse_from(["sim", "--tls"].iter().chain(flags));
            assert!(tls.is_ok(), "{flags:?} with --tls");
        }
    }

    #[test]
    fn defaults_match_kube_apiserver() {
        let a = SimArgs::default();
        assert_eq!(a.max_requests_inflight, 400);
        assert_eq!(a.max_mutating_requests_inflight, 200);
        assert!(a.anonymous_auth);
        assert_eq!(a.cost_model, CostModel::None);
    }

    #[test]
    fn sizes_and_model_overrides_parse() {
        assert_eq!("8Gi".parse::<ByteSize>().unwrap().0, 8 << 30);
        assert_eq!("1.5G".parse::<ByteSize>().unwrap().0, 1_500_000_000);
        assert!("8 bananas".parse::<ByteSize>().is_err());
        let a = SimArgs::parse_from([
            "sim",
            "--cost-model",
            "modeled",
            "--model-set",
            "quantum=0.02",
        ]);
        let m = a.model_config().unwrap();
        assert!(m.enabled);
        assert_eq!(m.constants.quantum, 0.02);
        let bad = SimArgs::parse_from(["sim", "--model-set", "quantun=1"]);
        assert!(bad.model_config().is_err());
    }
}
