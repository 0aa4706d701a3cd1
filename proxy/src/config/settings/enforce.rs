//! The enforcement settings (`lanes`, `quota`, `relistGuard` in the YAML
//! file), their defaults for a 5,000-node cluster, and their validation.
//! Every setting is hot-reloadable; the pool's state survives a reload.

use serde::Deserialize;

use super::budget::{
    Adaptive, QuotaMode, DEFAULT_BURST_BYTES, DEFAULT_BYTES_PER_SECOND, DEFAULT_INFLIGHT_BYTES,
};

/// A lane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Lane {
    /// Never limited: `system:masters`, health probes.
    Exempt,
    /// Node heartbeats and leases, the control plane, kube-system.
    System,
    /// Everything else that is light.
    #[default]
    Workload,
    /// Requests whose predicted cost passes the threshold: the quota pool.
    Heavy,
    /// tollgate's own requests (health checks, scrapes, cluster size).
    #[serde(rename = "self")]
    SelfLane,
}

impl Lane {
    pub const ALL: [Lane; 5] = [
        Lane::Exempt,
        Lane::System,
        Lane::Workload,
        Lane::Heavy,
        Lane::SelfLane,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Exempt => "exempt",
            Lane::System => "system",
            Lane::Workload => "workload",
            Lane::Heavy => "heavy",
            Lane::SelfLane => "self",
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            Lane::Exempt => 0,
            Lane::System => 1,
            Lane::Workload => 2,
            Lane::Heavy => 3,
            Lane::SelfLane => 4,
        }
    }

    /// The configured in-flight limit (`0`: none).
    pub fn limit(self, lanes: &Lanes) -> usize {
        let l = &lanes.max_inflight;
        match self {
            Lane::Exempt => l.exempt,
            Lane::System => l.system,
            Lane::Workload => l.workload,
            Lane::Heavy => l.heavy,
            Lane::SelfLane => l.self_,
        }
    }
}

/// Admission's own settings: the `lanes`, `quota` and `relistGuard`
/// sections of one configuration (see [`crate::config::Config::admission`]).
#[derive(Debug, Clone, Copy)]
pub struct AdmissionSettings<'a> {
    pub lanes: &'a Lanes,
    pub quota: &'a Quota,
    pub relist_guard: &'a RelistGuard,
}

/// Lanes: who goes where, and how many requests each lane serves at once.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Lanes {
    /// A LIST (or watch starting with the full state) predicted to cost at
    /// least this many bytes goes to the `heavy` lane. Default `1048576`.
    pub heavy_threshold_bytes: f64,
    /// Requests in flight per lane; `0` is no limit.
    pub max_inflight: LaneLimits,
    /// Seconds a request of a light lane (system, workload, self) waits for
    /// an in-flight slot before a 429. Default `5`.
    pub max_wait_seconds: f64,
    /// Fairness inside a light lane: per-flow shares and queues.
    pub queue: LaneQueue,
    /// First matching rule wins; a request no rule matches is `workload`.
    /// Giving the list replaces the defaults (see [`default_rules`]).
    pub rules: Vec<LaneRule>,
}

/// Fairness inside a limited light lane (see [`crate::enforce::slots`]): a flow is
/// a client as `quota.queue.flowBy` says for verified identities, one per
/// source address for anything unverified.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct LaneQueue {
    /// Fraction of a lane's in-flight slots one flow may hold when it is
    /// alone (at least one slot); with `n` flows holding or waiting, each
    /// may hold `⌊limit / (n + 1)⌋` if less (see [`crate::enforce::share`]). Further
    /// requests wait in the flow's queue. Default `0.5`: one flow can never
    /// take the whole lane, nor can N flows.
    pub max_flow_share: f64,
    /// Requests waiting per flow; past it, 429 at once. Default `50` (the
    /// apiserver's default queue length limit).
    pub per_flow_depth: usize,
    /// Flows waiting at once per lane; past it, 429 at once. Default `10000`.
    pub max_flows: usize,
}

/// In-flight limits per lane (`0`: unlimited).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct LaneLimits {
    /// Default `0` (unlimited).
    pub exempt: usize,
    /// Default `600`: node heartbeats and controllers never wait behind LISTs.
    pub system: usize,
    /// Default `400`.
    pub workload: usize,
    /// Default `32`: heavy requests also wait for the quota pool.
    pub heavy: usize,
    /// Default `4`: tollgate's own requests.
    #[serde(rename = "self")]
    pub self_: usize,
}

/// One lane rule. Every condition given must match; an empty list matches
/// anything. Identity conditions (`users`, `groups`) match only verified
/// identities (a client certificate, a TokenReview), except in rules for
/// the `workload` and `heavy` lanes, where an unverified service-account
/// JWT claim may choose too.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct LaneRule {
    /// `exempt`, `system`, `workload` or `heavy` (`self` is tollgate's own).
    pub lane: Lane,
    /// User names; a trailing `*` matches a prefix (`system:serviceaccount:kube-system:*`).
    pub users: Vec<String>,
    /// Group names (any of them).
    pub groups: Vec<String>,
    /// Verbs (`get`, `list`, `watch`, `patch`, …).
    pub verbs: Vec<String>,
    /// Pattern resources (`pods`, `apps/deployments`, `coordination.k8s.io/leases`).
    pub resources: Vec<String>,
    /// Non-resource paths (`/healthz`); a trailing `*` matches a prefix.
    pub non_resource_urls: Vec<String>,
}

/// The byte-cost quota pool, its queues and its per-client limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Quota {
    /// `static`: the pool's rate and burst and the in-flight budget as
    /// given; `adaptive` (default): steered by the protected lanes'
    /// latency within `adaptive`'s bounds, these values as ceilings where
    /// set (see [`crate::budget`]).
    pub mode: QuotaMode,
    /// Predicted bytes of heavy requests in flight at once (static mode;
    /// in adaptive mode a hard ceiling when set). Default `1073741824`
    /// (1 GiB).
    pub inflight_bytes: Option<f64>,
    /// The adaptive budget's target and bounds.
    pub adaptive: Adaptive,
    /// Refill rate of the pool, bytes/s (the base when scaling; in
    /// adaptive mode a hard ceiling when set). Default `268435456`
    /// (256 MiB/s).
    pub bytes_per_second: Option<f64>,
    /// Most bytes the pool holds (the base when scaling; in adaptive mode
    /// a hard ceiling when set). Default `1073741824` (1 GiB: a full LIST
    /// of 150,000 pods fits).
    pub burst_bytes: Option<f64>,
    /// Weight of bytes read from etcd against bytes sent. Default `2`.
    pub etcd_read_weight: f64,
    /// Seconds a heavy request waits in its queue before a 429. Default `10`.
    pub max_wait_seconds: f64,
    /// Per-flow fair queues.
    pub queue: Queue,
    /// Heavy requests per second per client, whatever their size.
    pub per_client: PerClient,
    /// `Retry-After` of rejections.
    pub retry_after: RetryAfter,
    /// Pool size by cluster size.
    pub scaling: Scaling,
    /// Rejections logged per second at most (the rest are counted). Default `5`.
    pub log_per_second: f64,
    /// The etcd-bound budget shared by the tollgates of all masters
    /// (see [`crate::budget::shared`]). Off by default.
    pub global: super::shared::Global,
}

/// What a flow (one fair queue, one per-client rate) is for a verified
/// identity; anything tollgate could not verify (anonymous, a token not
/// confirmed by a TokenReview) is one flow per source address, whatever
/// this says (see [`crate::admit::Flow`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FlowBy {
    /// The client identity (certificate user, or reviewed token). Default.
    #[default]
    User,
    /// The User-Agent product (`kubectl`, `prometheus`).
    UserAgent,
    /// Both.
    UserAndUserAgent,
}

/// Fair queuing of heavy requests.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Queue {
    /// Requests waiting per flow; past it, 429 at once. Default `16`.
    pub per_flow_depth: usize,
    /// Flows waiting at once; past it, 429 at once. Default `1024`.
    pub max_flows: usize,
    /// Deficit-round-robin quantum, bytes a flow earns per round. Default
    /// `16777216` (16 MiB).
    pub quantum_bytes: f64,
    /// What a flow is. Default `user`.
    pub flow_by: FlowBy,
}

/// Per-client heavy-request rate limit (GCRA).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PerClient {
    /// Heavy requests per second per client; `0` turns it off. Default `0`
    /// (off): the adaptive budget protects the apiserver and the fair
    /// queues share it between clients by bytes, so with one client the
    /// storm, a request-count limit would only decide goodput against the
    /// apiserver's health (budget/harness_tests.rs,
    /// `one_client_storm_is_bound_by_…`). A cap an operator sets still binds.
    pub requests_per_second: f64,
    /// Heavy requests a client may send at once. Default `10`.
    pub burst: u32,
    /// Clients remembered; idle ones are dropped first. Default `10000`.
    pub max_clients: usize,
}

/// How `Retry-After` is spread.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct RetryAfter {
    /// Fewest seconds. Default `1`.
    pub min_seconds: u64,
    /// Most seconds. Default `60`.
    pub max_seconds: u64,
    /// The refill time is stretched by a random 0..jitter fraction, so
    /// clients do not return as one wave. Default `0.5`.
    pub jitter: f64,
}

/// How the pool scales with the cluster (KEP-5546's addon-resizer idea).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ScalingMode {
    /// `quota.bytesPerSecond` and `quota.burstBytes` as given. Default.
    #[default]
    Fixed,
    /// Plus per node (node count from the apiserver's object-count metric).
    NodeProportional,
    /// Plus per container of non-terminal pods (a paged cache LIST).
    ContainerProportional,
}

/// Pool rate and burst = base + per unit × cluster size.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Scaling {
    /// Default `fixed`.
    pub mode: ScalingMode,
    /// Bytes/s added per node or container. Default `51200` (50 KiB/s per node).
    pub bytes_per_second_per_unit: f64,
    /// Burst bytes added per node or container. Default `204800`.
    pub burst_bytes_per_unit: f64,
    /// Seconds between container counts (a paged `resourceVersion=0` LIST
    /// of pods in the `self` lane). Default `300`.
    pub refresh_seconds: f64,
}

/// The relist-storm guard.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct RelistGuard {
    /// Default `true`.
    pub enabled: bool,
    /// Seconds over which heavy admission ramps back to full. Default `60`.
    pub warmup_seconds: f64,
    /// Fraction of the pool's rate, burst and heavy in-flight limit at the
    /// start of the warm-up. Default `0.1`.
    pub start_fraction: f64,
    /// Consistent LISTs (no `resourceVersion`, no `limit`) of matching
    /// clients are rewritten to `resourceVersion=0` (served from the watch
    /// cache, possibly stale): a consistency trade-off, off by default.
    pub rewrite_to_cache: Vec<RewriteRule>,
}

/// Whose consistent LISTs are rewritten to `resourceVersion=0`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct RewriteRule {
    /// As in lane rules (verified identities only); empty: anyone.
    pub users: Vec<String>,
    pub groups: Vec<String>,
    /// Pattern resources; empty: any.
    pub resources: Vec<String>,
    /// Only during a warm-up (`true`, default) or always.
    pub during_warmup_only: bool,
}

// === defaults ===

impl Default for Lanes {
    fn default() -> Self {
        Lanes {
            heavy_threshold_bytes: 1_048_576.0,
            max_inflight: LaneLimits::default(),
            max_wait_seconds: 5.0,
            queue: LaneQueue::default(),
            rules: default_rules(),
        }
    }
}

impl Default for LaneQueue {
    fn default() -> Self {
        LaneQueue {
            max_flow_share: 0.5,
            per_flow_depth: 50,
            max_flows: 10_000,
        }
    }
}

impl Default for LaneLimits {
    fn default() -> Self {
        LaneLimits {
            exempt: 0,
            system: 600,
            workload: 400,
            heavy: 32,
            self_: 4,
        }
    }
}

/// The default lane rules: `system:masters` and health probes exempt;
/// kubelets, the control plane and kube-system service accounts `system`.
pub fn default_rules() -> Vec<LaneRule> {
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        LaneRule {
            lane: Lane::Exempt,
            groups: strings(&["system:masters"]),
            ..LaneRule::default()
        },
        LaneRule {
            lane: Lane::Exempt,
            non_resource_urls: strings(&["/healthz", "/livez", "/readyz"]),
            ..LaneRule::default()
        },
        LaneRule {
            lane: Lane::System,
            groups: strings(&["system:nodes"]),
            ..LaneRule::default()
        },
        LaneRule {
            lane: Lane::System,
            users: strings(&[
                "system:node:*",
                "system:kube-controller-manager",
                "system:kube-scheduler",
                "system:apiserver",
                "system:serviceaccount:kube-system:*",
            ]),
            ..LaneRule::default()
        },
    ]
}

impl Default for Quota {
    fn default() -> Self {
        Quota {
            mode: QuotaMode::Adaptive,
            inflight_bytes: None,
            adaptive: Adaptive::default(),
            bytes_per_second: None,
            burst_bytes: None,
            etcd_read_weight: 2.0,
            max_wait_seconds: 10.0,
            queue: Queue::default(),
            per_client: PerClient::default(),
            retry_after: RetryAfter::default(),
            scaling: Scaling::default(),
            log_per_second: 5.0,
            global: Default::default(),
        }
    }
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            per_flow_depth: 16,
            max_flows: 1024,
            quantum_bytes: 16_777_216.0,
            flow_by: FlowBy::User,
        }
    }
}

impl Default for PerClient {
    fn default() -> Self {
        PerClient {
            requests_per_second: 0.0,
            burst: 10,
            max_clients: 10_000,
        }
    }
}

impl Default for RetryAfter {
    fn default() -> Self {
        RetryAfter {
            min_seconds: 1,
            max_seconds: 60,
            jitter: 0.5,
        }
    }
}

impl Default for Scaling {
    fn default() -> Self {
        Scaling {
            mode: ScalingMode::Fixed,
            bytes_per_second_per_unit: 51_200.0,
            burst_bytes_per_unit: 204_800.0,
            refresh_seconds: 300.0,
        }
    }
}

impl Default for RelistGuard {
    fn default() -> Self {
        RelistGuard {
            enabled: true,
            warmup_seconds: 60.0,
            start_fraction: 0.1,
            rewrite_to_cache: Vec::new(),
        }
    }
}

impl Default for RewriteRule {
    fn default() -> Self {
        RewriteRule {
            users: Vec::new(),
            groups: Vec::new(),
            resources: Vec::new(),
            during_warmup_only: true,
        }
    }
}

// === validation ===

/// A setting out of range: the field's path and why.
pub type Invalid = (&'static str, String);

pub(crate) fn positive(field: &'static str, v: f64) -> Result<(), Invalid> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err((field, format!("must be a positive number, got {v}")))
    }
}

fn non_negative(field: &'static str, v: f64) -> Result<(), Invalid> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err((field, format!("must be zero or positive, got {v}")))
    }
}

impl Lanes {
    pub fn validate(&self) -> Result<(), Invalid> {
        non_negative("lanes.heavyThresholdBytes", self.heavy_threshold_bytes)?;
        positive("lanes.maxWaitSeconds", self.max_wait_seconds)?;
        let share = self.queue.max_flow_share;
        if !(share > 0.0 && share <= 1.0) {
            return Err((
                "lanes.queue.maxFlowShare",
                format!("must be in (0, 1], got {share}"),
            ));
        }
        for (i, rule) in self.rules.iter().enumerate() {
            let identity = !rule.users.is_empty() || !rule.groups.is_empty();
            let probes_only = !rule.non_resource_urls.is_empty()
                && rule.resources.is_empty()
                && rule.verbs.is_empty();
            match rule.lane {
                Lane::SelfLane => {
                    return Err((
                        "lanes.rules[].lane",
                        format!("rule {i}: `self` is tollgate's own lane, not for clients"),
                    ))
                }
                // Only verified identities reach exempt and system: a rule
                // that names no identity would let anyone in.
                Lane::Exempt | Lane::System if !identity && !probes_only => {
                    return Err((
                        "lanes.rules[].users",
                        format!(
                            "rule {i}: a rule for lane {} must name users or groups (or only nonResourceUrls)",
                            rule.lane.as_str()
                        ),
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl Quota {
    /// `bytesPerSecond`, or its default.
    pub fn bytes_per_second(&self) -> f64 {
        self.bytes_per_second.unwrap_or(DEFAULT_BYTES_PER_SECOND)
    }

    /// `burstBytes`, or its default.
    pub fn burst_bytes(&self) -> f64 {
        self.burst_bytes.unwrap_or(DEFAULT_BURST_BYTES)
    }

    /// `inflightBytes`, or its default.
    pub fn inflight_bytes(&self) -> f64 {
        self.inflight_bytes.unwrap_or(DEFAULT_INFLIGHT_BYTES)
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        positive("quota.bytesPerSecond", self.bytes_per_second())?;
        positive("quota.burstBytes", self.burst_bytes())?;
        positive("quota.inflightBytes", self.inflight_bytes())?;
        self.adaptive.validate()?;
        non_negative("quota.etcdReadWeight", self.etcd_read_weight)?;
        positive("quota.maxWaitSeconds", self.max_wait_seconds)?;
        positive("quota.queue.quantumBytes", self.queue.quantum_bytes)?;
        if self.queue.per_flow_depth == 0 {
            return Err(("quota.queue.perFlowDepth", "must be at least 1".into()));
        }
        if self.queue.max_flows == 0 {
            return Err(("quota.queue.maxFlows", "must be at least 1".into()));
        }
        non_negative(
            "quota.perClient.requestsPerSecond",
            self.per_client.requests_per_second,
        )?;
        if self.per_client.requests_per_second > 0.0 && self.per_client.burst == 0 {
            return Err(("quota.perClient.burst", "must be at least 1".into()));
        }
        if self.per_client.max_clients == 0 {
            return Err(("quota.perClient.maxClients", "must be at least 1".into()));
        }
        let r = &self.retry_after;
        if r.min_seconds == 0 || r.max_seconds < r.min_seconds {
            return Err((
                "quota.retryAfter.minSeconds",
                format!(
                    "need 1 <= minSeconds <= maxSeconds, got {} and {}",
                    r.min_seconds, r.max_seconds
                ),
            ));
        }
        non_negative("quota.retryAfter.jitter", r.jitter)?;
        non_negative(
            "quota.scaling.bytesPerSecondPerUnit",
            self.scaling.bytes_per_second_per_unit,
        )?;
        non_negative(
            "quota.scaling.burstBytesPerUnit",
            self.scaling.burst_bytes_per_unit,
        )?;
        positive("quota.scaling.refreshSeconds", self.scaling.refresh_seconds)?;
        non_negative("quota.logPerSecond", self.log_per_second)?;
        self.global.validate()?;
        Ok(())
    }
}

impl RelistGuard {
    pub fn validate(&self) -> Result<(), Invalid> {
        positive("relistGuard.warmupSeconds", self.warmup_seconds)?;
        if !(self.start_fraction > 0.0 && self.start_fraction <= 1.0) {
            return Err((
                "relistGuard.startFraction",
                format!("must be in (0, 1], got {}", self.start_fraction),
            ));
        }
        Ok(())
    }
}
