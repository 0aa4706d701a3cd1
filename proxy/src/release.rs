//! Reading the upstream's Kubernetes release from its `/version`, so that
//! pricing follows the apiserver in front of it before anything is learned
//! (`patterns.consistentStore: auto`, see [`crate::predict::release`]).
//!
//! Read at start and again whenever the pool sees an upstream recover (an
//! apiserver back from an outage may be an upgraded one), with tollgate's
//! own identity, one bounded request per upstream with a timeout. The
//! oldest release among the upstreams that answered is taken: mid-upgrade,
//! the older masters still read consistent LISTs from etcd. A failed read is
//! logged, counted (`tollgate_upstream_version_reads_total`) and retried;
//! until one succeeds the release is unknown and `auto` prices consistent
//! LISTs as etcd reads; a release read before is kept.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::forward::UpstreamPool;
use crate::metrics::{Metrics, ResultLabel};
use crate::predict::{PatternStore, Release, Store};

/// Most bytes read from one `/version` (the apiserver's is ~300).
const MAX_VERSION_BYTES: usize = 64 << 10;
/// One read's deadline: connect, TLS, headers and body.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the pool's recoveries are looked at.
const POLL: Duration = Duration::from_secs(1);
/// After a failed round, the next one.
const RETRY: Duration = Duration::from_secs(10);

/// What the probe reads from and feeds: narrow handles, not the gateway.
pub struct ReleaseProbe {
    pub pool: Arc<UpstreamPool>,
    pub patterns: Arc<PatternStore>,
    pub metrics: Arc<Metrics>,
}

impl ReleaseProbe {
    /// Read at start and after each recovery, until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        // The pool's recovery count at the last round that read a release.
        let mut read_at: Option<u64> = None;
        loop {
            let recoveries = self.pool.recoveries();
            let wait = if read_at == Some(recoveries) {
                POLL
            } else {
                let round = tokio::select! {
                    _ = stop.cancelled() => return,
                    r = self.round() => r,
                };
                if round.is_some() {
                    read_at = Some(recoveries);
                    POLL
                } else {
                    RETRY
                }
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Every upstream's `/version`; the oldest release read, set as the prior.
    async fn round(&self) -> Option<Release> {
        let mut oldest: Option<Release> = None;
        for u in self.pool.upstreams() {
            let read = self
                .pool
                .own_get(u, "/version", MAX_VERSION_BYTES, READ_TIMEOUT)
                .await;
            let (result, release) = match read {
                Ok(body) => match Release::from_version_body(&body) {
                    Ok(r) => ("ok", Some(r)),
                    Err(e) => {
                        tracing::warn!(upstream = %u.url, error = %e, "the upstream's /version names no Kubernetes release");
                        ("unparsable", None)
                    }
                },
                Err(e) => {
                    tracing::warn!(upstream = %u.url, error = %e, "cannot read the upstream's /version");
                    ("error", None)
                }
            };
            self.metrics
                .version_reads
                .get_or_create(&ResultLabel {
                    result: result.into(),
                })
                .inc();
            oldest = match (oldest, release) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        let previous = self.patterns.release();
        match oldest {
            Some(r) => {
                self.patterns.set_release(Some(r));
                self.metrics.upstream_minor.set(i64::from(r.minor));
                if previous != Some(r) {
                    let consistent = match r.consistent_store() {
                        Store::WatchCache => "watch-cache reads",
                        Store::Etcd => "etcd reads",
                    };
                    tracing::info!(release = %r, "the upstream runs Kubernetes {r}: with consistentStore auto, consistent LISTs are priced as {consistent} until learned per resource");
                }
            }
            None => match previous {
                Some(p) => tracing::warn!(release = %p, "no upstream's /version was read: keeping the release read before"),
                None => tracing::warn!("no upstream's /version was read: with consistentStore auto, consistent LISTs are priced as etcd reads until it is (or until learned per resource); retrying"),
            },
        }
        oldest
    }
}
