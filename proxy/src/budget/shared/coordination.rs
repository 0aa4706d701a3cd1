//! The etcd side of the shared budget: each tollgate is a member that
//! registers under a lease with its demand, reads the allocation every
//! [`RENEW`](super::RENEW) and whenever another member wrote under the prefix (a watch,
//! paced by [`Pace`]), applies its grant to its [`EtcdGate`], and stands
//! for coordinator; the coordinator steps the [`Allocator`] and writes the
//! grants. One loop per tollgate, [`SharedBudget::run`]; no request ever
//! waits on it.
//!
//! Keys under the prefix (`quota.global.prefix`):
//! - `<prefix>/members/<id>`: `{"demandBytesPerSecond", "applied"}`, on the
//!   member's lease: it vanishes [`LEASE_TTL`] after the member stops
//!   renewing.
//! - `<prefix>/coordinator`: the coordinator's id, on its lease; taken by
//!   a transaction that succeeds only if the key does not exist.
//! - `<prefix>/grants`: `{"coordinator", "seq", "budgetBytesPerSecond",
//!   "grants": {id: {"bytesPerSecond", "seq"}}}`, no lease (it outlives a
//!   coordinator: members keep spending their grants, and the next
//!   coordinator starts from them); written in a transaction that succeeds
//!   only while the writer holds the coordinator key.
//!
//! Faults: etcd out of reach or the lease lost, the member stops spending
//! its grant [`GRANT_TTL`] after its last read (never past its lease) and
//! spends the fallback share; it reconnects and registers again. The
//! coordinator gone, members keep their grants (still in etcd) and the
//! first to take the key starts with a learning period ([`Allocator`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::alloc::{Allocator, Demand, Grant, Params};
use super::gate::{EtcdGate, GateView};
use super::member::MemberState;
use super::metrics::SharedMetrics;
use super::pace::Pace;
use super::session::{within, Session};
use super::{GRANT_HYSTERESIS, GRANT_TTL};
use crate::config;
use crate::config::settings::shared::Global;

pub use super::session::CoordinationError;

/// A member's registration as stored.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MemberDoc {
    demand_bytes_per_second: f64,
    applied: u64,
}

/// One grant as stored.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GrantDoc {
    bytes_per_second: f64,
    seq: u64,
}

/// The allocation as stored.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GrantsDoc {
    coordinator: String,
    seq: u64,
    budget_bytes_per_second: f64,
    grants: BTreeMap<String, GrantDoc>,
}

/// One member in `/debug/budget`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberView {
    pub id: String,
    pub demand_bytes_per_second: f64,
    pub applied: u64,
    /// Its grant in the allocation read from etcd.
    pub grant_bytes_per_second: Option<f64>,
    pub grant_seq: Option<u64>,
}

/// The shared budget for `/debug/budget`: this member, and the cluster's
/// allocation as last read from etcd.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SharedView {
    pub id: String,
    pub prefix: String,
    /// `coordinator` or `member`.
    pub role: &'static str,
    pub coordinator: Option<String>,
    pub budget_bytes_per_second: f64,
    pub reserve_bytes_per_second: f64,
    /// Sum of the grants in the allocation.
    pub granted_sum_bytes_per_second: f64,
    pub grants_seq: u64,
    pub members: Vec<MemberView>,
    /// This member's grant as last read.
    pub granted_bytes_per_second: Option<f64>,
    pub demand_bytes_per_second: f64,
    /// The share in force and the gate's counters.
    pub gate: GateView,
    pub last_renewal_age_seconds: Option<f64>,
    pub coordination_writes: u64,
    /// The last renewal's error, if it failed.
    pub error: Option<String>,
}

impl SharedView {
    /// A view of a lone member, for tests of what is exported.
    #[doc(hidden)]
    pub fn sample() -> SharedView {
        SharedView {
            id: "m".into(),
            prefix: "/tollgate/budget/default".into(),
            role: "coordinator",
            coordinator: Some("m".into()),
            budget_bytes_per_second: 1.0,
            reserve_bytes_per_second: 0.1,
            granted_sum_bytes_per_second: 0.9,
            grants_seq: 1,
            members: Vec::new(),
            granted_bytes_per_second: Some(0.9),
            demand_bytes_per_second: 0.0,
            gate: EtcdGate::new(0.1).view(),
            last_renewal_age_seconds: None,
            coordination_writes: 1,
            error: None,
        }
    }
}

#[derive(Debug, Default)]
struct Status {
    coordinator: bool,
    leader: Option<String>,
    members: Vec<MemberView>,
    grants: GrantsDoc,
    last_renewal: Option<Instant>,
    writes: u64,
    error: Option<String>,
    demand: f64,
    granted: Option<f64>,
}

/// The shared budget of one tollgate.
#[derive(Debug)]
pub struct SharedBudget {
    id: String,
    prefix: String,
    gate: Arc<EtcdGate>,
    status: Mutex<Status>,
    metrics: SharedMetrics,
}

/// A member id unique enough across restarts: host, process, start time.
fn member_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "tollgate".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{host}-{}-{nanos:08x}", std::process::id())
}

impl SharedBudget {
    /// The shared budget for `g` (on), its metrics in `registry`. Nothing
    /// is connected until [`SharedBudget::run`].
    pub fn new(g: &Global, registry: &mut prometheus_client::registry::Registry) -> SharedBudget {
        SharedBudget {
            id: member_id(),
            prefix: g.prefix(),
            gate: Arc::new(EtcdGate::new(g.fallback(1))),
            status: Mutex::new(Status::default()),
            metrics: SharedMetrics::register(registry),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The gate admission passes heavy requests' etcd reads through.
    pub fn gate(&self) -> &Arc<EtcdGate> {
        &self.gate
    }

    fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn view(&self, g: &Global) -> SharedView {
        let s = self.status();
        let now = Instant::now();
        SharedView {
            id: self.id.clone(),
            prefix: self.prefix.clone(),
            role: if s.coordinator {
                "coordinator"
            } else {
                "member"
            },
            coordinator: s.leader.clone(),
            budget_bytes_per_second: g.etcd_bytes_per_second,
            reserve_bytes_per_second: g.reserve(),
            granted_sum_bytes_per_second: s
                .grants
                .grants
                .values()
                .map(|g| g.bytes_per_second)
                .sum(),
            grants_seq: s.grants.seq,
            members: s.members.clone(),
            granted_bytes_per_second: s.granted,
            demand_bytes_per_second: s.demand,
            gate: self.gate.view(),
            last_renewal_age_seconds: s
                .last_renewal
                .map(|t| now.saturating_duration_since(t).as_secs_f64()),
            coordination_writes: s.writes,
            error: s.error.clone(),
        }
    }

    /// Refresh the metrics (at a scrape).
    pub fn update_metrics(&self, g: &Global) {
        self.metrics.update(&self.view(g));
    }

    fn key(&self, rest: &str) -> String {
        format!("{}/{rest}", self.prefix)
    }

    /// Renew, read, apply, coordinate every [`RENEW`](super::RENEW) and when another
    /// member wrote, until `stop`; then give the lease back, so the share
    /// is freed at once.
    pub async fn run(self: Arc<Self>, config: Arc<config::Current>, stop: CancellationToken) {
        let mut session: Option<Session> = None;
        let mut member = MemberState::default();
        let mut alloc: Option<Allocator> = None;
        let mut pace = Pace::new(Instant::now());
        let mut warned = false;
        let own_key = self.key(&format!("members/{}", self.id));
        loop {
            let cfg = config.get();
            let g = &cfg.quota.global;
            let now = Instant::now();
            let renewal = pace.woke(now);
            if renewal {
                member.observe_wanted(self.gate.wanted(), now);
            }
            let result = self
                .renew(&mut session, &mut member, &mut alloc, &mut pace, g, renewal)
                .await;
            match result {
                Ok(()) => {
                    if warned {
                        tracing::info!(member = %self.id, "shared budget: etcd reachable again");
                    }
                    warned = false;
                    self.status().error = None;
                }
                Err(e) => {
                    if !warned {
                        tracing::warn!(member = %self.id, error = %e, "shared budget: renewal failed; the grant lapses, then the fallback share applies");
                    }
                    warned = true;
                    // Start over at the next renewal: a new connection and lease (the
                    // same member key, so the old registration is replaced, not left to
                    // expire beside it). The grant read last stays in force until
                    // GRANT_TTL after that read (never past the lease as last renewed):
                    // one slow renewal does not drop the member to its fallback.
                    session = None;
                    alloc = None;
                    let mut s = self.status();
                    s.coordinator = false;
                    s.error = Some(e.to_string());
                }
            }
            self.gate
                .set_share(member.share(g.fallback(member.members())));
            {
                let mut s = self.status();
                s.demand = member.demand();
                s.granted = member.grant().map(|g| g.bytes_per_second);
            }
            drop(cfg);
            let changed = async {
                match session.as_mut() {
                    Some(s) => s.changed(&own_key).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(pace.wake()) => {}
                // A watch that ended is taken up again at the next renewal.
                _ = changed => {}
            }
        }
        if let Some(s) = session {
            s.revoke().await;
        }
    }

    /// One wake: at a `renewal`, keep the lease alive (or connect), else
    /// only read; then acknowledge or report, stand for coordinator, and
    /// step if this member is the coordinator and `pace` lets it.
    async fn renew(
        &self,
        session: &mut Option<Session>,
        member: &mut MemberState,
        alloc: &mut Option<Allocator>,
        pace: &mut Pace,
        g: &Global,
        renewal: bool,
    ) -> Result<(), CoordinationError> {
        let s = match session {
            Some(s) if renewal => {
                s.keep_alive().await?;
                s.ensure_watch().await?;
                s
            }
            Some(s) => s,
            None if renewal => {
                let s = Session::connect(g, format!("{}/", self.prefix)).await?;
                member.lost_lease();
                session.insert(s)
            }
            // Out of touch: reconnect only at a renewal.
            None => return Ok(()),
        };
        let resp = within(s.client.get(
            format!("{}/", self.prefix),
            Some(GetOptions::new().with_prefix()),
        ))
        .await?;
        let now = Instant::now();
        let members_prefix = self.key("members/");
        let mut members: BTreeMap<String, MemberDoc> = BTreeMap::new();
        let mut leader = None;
        let mut grants = GrantsDoc::default();
        for kv in resp.kvs() {
            let key = kv.key_str().unwrap_or_default();
            if let Some(id) = key.strip_prefix(&members_prefix) {
                if let Ok(doc) = serde_json::from_slice::<MemberDoc>(kv.value()) {
                    members.insert(id.to_string(), doc);
                }
            } else if key == self.key("coordinator") {
                leader = kv.value_str().ok().map(str::to_string);
            } else if key == self.key("grants") {
                // An unreadable allocation counts as none: every member
                // falls back to its reserve share until it is rewritten.
                grants = serde_json::from_slice(kv.value()).unwrap_or_default();
            }
        }
        let mine = grants.grants.get(&self.id).map(|d| Grant {
            bytes_per_second: d.bytes_per_second,
            seq: d.seq,
        });
        let live = members.len().max(1);
        member.read(mine, live, s.lease_until, now);
        let mut writes = 0;
        if let Some(report) = member.report(g.etcd_bytes_per_second) {
            let doc = MemberDoc {
                demand_bytes_per_second: report.demand,
                applied: report.applied,
            };
            self.put_member(s, doc).await?;
            member.wrote(report);
            members.insert(self.id.clone(), doc);
            writes += 1;
        }
        // Stand for coordinator while nobody holds the key.
        if leader.is_none() {
            let key = self.key("coordinator");
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key,
                    self.id.clone(),
                    Some(PutOptions::new().with_lease(s.lease)),
                )]);
            if within(s.client.txn(txn)).await?.succeeded() {
                tracing::info!(member = %self.id, "shared budget: this member is the coordinator");
                leader = Some(self.id.clone());
                writes += 1;
            }
        }
        let coordinator = leader.as_deref() == Some(self.id.as_str());
        if !coordinator {
            *alloc = None;
        } else if pace.may_step(now) {
            let wrote = self
                .coordinate(s, alloc, &members, &mut grants, g, now)
                .await?;
            pace.stepped(wrote, now);
            writes += u64::from(wrote);
        }
        let mut st = self.status();
        st.coordinator = coordinator;
        st.leader = leader;
        st.members = members
            .iter()
            .map(|(id, d)| MemberView {
                id: id.clone(),
                demand_bytes_per_second: d.demand_bytes_per_second,
                applied: d.applied,
                grant_bytes_per_second: grants.grants.get(id).map(|g| g.bytes_per_second),
                grant_seq: grants.grants.get(id).map(|g| g.seq),
            })
            .collect();
        st.grants = grants;
        st.last_renewal = Some(now);
        st.writes += writes;
        Ok(())
    }

    async fn put_member(&self, s: &mut Session, doc: MemberDoc) -> Result<(), CoordinationError> {
        let value = serde_json::to_vec(&doc).unwrap_or_default();
        within(s.client.put(
            self.key(&format!("members/{}", self.id)),
            value,
            Some(PutOptions::new().with_lease(s.lease)),
        ))
        .await?;
        Ok(())
    }

    /// The coordinator's step: the allocation written if it changed
    /// enough. Returns whether it wrote.
    async fn coordinate(
        &self,
        s: &mut Session,
        alloc: &mut Option<Allocator>,
        members: &BTreeMap<String, MemberDoc>,
        grants: &mut GrantsDoc,
        g: &Global,
        now: Instant,
    ) -> Result<bool, CoordinationError> {
        let params = Params {
            budget: g.etcd_bytes_per_second,
            reserve: g.reserve(),
            floor: g.etcd_bytes_per_second * g.floor_fraction,
            grant_ttl: GRANT_TTL,
        };
        let a = alloc.get_or_insert_with(|| {
            let found = grants.grants.iter().map(|(m, d)| {
                (
                    m.clone(),
                    Grant {
                        bytes_per_second: d.bytes_per_second,
                        seq: d.seq,
                    },
                )
            });
            tracing::info!(member = %self.id, grants = grants.grants.len(), "shared budget: taking over the allocation; only shrinking for one grant TTL");
            Allocator::take_over(params, found.collect::<Vec<_>>(), grants.seq, now)
        });
        a.set_params(params);
        let demands: Vec<Demand> = members
            .iter()
            .map(|(id, d)| Demand {
                member: id.clone(),
                bytes_per_second: d.demand_bytes_per_second,
                applied: d.applied,
            })
            .collect();
        let changed = a.step(&demands, GRANT_HYSTERESIS * params.budget, now);
        let budget_moved = grants.budget_bytes_per_second != params.budget;
        if !(changed || budget_moved || grants.coordinator != self.id) {
            return Ok(false);
        }
        let doc = GrantsDoc {
            coordinator: self.id.clone(),
            seq: a.last_seq(),
            budget_bytes_per_second: params.budget,
            grants: a
                .grants()
                .into_iter()
                .map(|(m, g)| {
                    (
                        m,
                        GrantDoc {
                            bytes_per_second: g.bytes_per_second,
                            seq: g.seq,
                        },
                    )
                })
                .collect(),
        };
        let value = serde_json::to_vec(&doc).unwrap_or_default();
        let txn = Txn::new()
            .when([Compare::value(
                self.key("coordinator"),
                CompareOp::Equal,
                self.id.clone(),
            )])
            .and_then([TxnOp::put(self.key("grants"), value, None)]);
        if !within(s.client.txn(txn)).await?.succeeded() {
            // Another member holds the key now: it takes over from etcd.
            *alloc = None;
            return Ok(false);
        }
        *grants = doc;
        Ok(true)
    }
}
