//! Watchers on a prefix. Each event whose value carries loadgen's stamp
//! ([`super::value`]) is recorded as `etcd-watch` with latency = arrival − the
//! put's send time (one clock: the same machine, often the same process);
//! other events are counted only. A broken stream resumes after the last
//! revision seen (no event lost); a watch whose revision was compacted starts
//! again from now and counts as `gone_410`, as the apiserver's 410 Gone would.
//!
//! At the end of the load each watcher asks etcd for a progress notification
//! and stops once one reports the store's final revision: etcd sends it only
//! when the watcher has been sent everything up to it, so the last puts'
//! events are counted without a guessed grace period.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use etcd_client::{Client, EventType, WatchOptions};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::WatchSpec;
use crate::record::OpRecorder;
use crate::watch::WatchStats;

/// Pause before re-establishing a broken watch, doubled up to [`MAX_BACKOFF`].
const BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Starts `spec.count` watchers on `client`'s connection; the returned future
/// completes once every one of them is established (or has given up).
pub(crate) fn start(
    spec: &WatchSpec,
    client: Client,
    rec: Arc<OnceLock<Arc<OpRecorder>>>,
    stats: Arc<WatchStats>,
    tracker: &TaskTracker,
    end: &End,
) -> impl std::future::Future<Output = ()> {
    let mut ready = Vec::new();
    for _ in 0..spec.count {
        let (tx, rx) = tokio::sync::oneshot::channel();
        ready.push(rx);
        let w = Watcher {
            prefix: spec.prefix.clone(),
            client: client.clone(),
            rec: rec.clone(),
            stats: stats.clone(),
        };
        tracker.spawn(w.run(tx, end.clone()));
    }
    async move {
        for r in ready {
            let _ = r.await;
        }
    }
}

/// How watchers are told to finish.
#[derive(Debug, Clone, Default)]
pub(crate) struct End {
    /// Finish once everything up to [`End::revision`] was delivered.
    pub(crate) drain: CancellationToken,
    /// The store's revision when the load ended (set before `drain`).
    pub(crate) revision: Arc<AtomicI64>,
    /// Stop at once.
    pub(crate) stop: CancellationToken,
}

/// How a watch stream ended.
enum Ended {
    /// Drained: everything up to the final revision was seen.
    Drained,
    /// Closed or compacted: resume.
    Resume,
}

struct Watcher {
    prefix: String,
    client: Client,
    rec: Arc<OnceLock<Arc<OpRecorder>>>,
    stats: Arc<WatchStats>,
}

impl Watcher {
    async fn run(mut self, ready: tokio::sync::oneshot::Sender<()>, end: End) {
        let mut ready = Some(ready);
        // 0 = from now; else the revision after the last one seen.
        let mut from: i64 = 0;
        let mut backoff = BACKOFF;
        loop {
            let attempt = tokio::select! {
                r = self.follow(&mut from, &mut ready, &end) => r,
                _ = end.stop.cancelled() => return,
            };
            match attempt {
                Ok(Ended::Drained) => return,
                Ok(Ended::Resume) => backoff = BACKOFF,
                Err(e) => {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(prefix = %self.prefix, error = %e, "etcd watch broke; resuming");
                }
            }
            self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = end.stop.cancelled() => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Follows one watch stream until it ends; `Ok` if it ended cleanly.
    async fn follow(
        &mut self,
        from: &mut i64,
        ready: &mut Option<tokio::sync::oneshot::Sender<()>>,
        end: &End,
    ) -> Result<Ended, String> {
        let mut opts = WatchOptions::new().with_prefix();
        if *from > 0 {
            opts = opts.with_start_revision(*from);
        }
        let (mut requests, mut stream) = self
            .client
            .watch(self.prefix.as_bytes(), Some(opts))
            .await
            .map_err(|e| super::connect::chain(&e))?
            .split();
        let mut active = false;
        let mut draining = false;
        let result = loop {
            let next = tokio::select! {
                m = stream.message() => m,
                _ = end.drain.cancelled(), if !draining => {
                    draining = true;
                    if let Err(e) = requests.request_progress().await {
                        break Err(super::connect::chain(&e));
                    }
                    continue;
                }
            };
            let msg = match next {
                Ok(Some(m)) => m,
                Ok(None) => break Ok(Ended::Resume),
                Err(e) => break Err(super::connect::chain(&e)),
            };
            if msg.created() && !active {
                active = true;
                if let Some(h) = msg.header().filter(|_| *from == 0) {
                    // A resumed stream starts after what this one began at.
                    *from = h.revision() + 1;
                }
                self.stats.active.fetch_add(1, Ordering::Relaxed);
                if let Some(tx) = ready.take() {
                    let _ = tx.send(());
                }
            }
            if msg.canceled() {
                if msg.compact_revision() > 0 {
                    // Events were compacted away: go on from now.
                    self.stats.gone.fetch_add(1, Ordering::Relaxed);
                    *from = 0;
                    break Ok(Ended::Resume);
                }
                break Err(format!("watch canceled: {}", msg.cancel_reason()));
            }
            let progress = !msg.created() && msg.events().is_empty();
            if draining && progress {
                let at = msg.header().map_or(0, |h| h.revision());
                if at >= end.revision.load(Ordering::Relaxed) {
                    break Ok(Ended::Drained);
                }
                // Not there yet: ask again shortly.
                tokio::time::sleep(Duration::from_millis(20)).await;
                if let Err(e) = requests.request_progress().await {
                    break Err(super::connect::chain(&e));
                }
                continue;
            }
            let arrived = crate::ops::unix_nanos();
            for event in msg.events() {
                let Some(kv) = event.kv() else { continue };
                self.stats.events.fetch_add(1, Ordering::Relaxed);
                *from = (*from).max(kv.mod_revision() + 1);
                if event.event_type() != EventType::Put {
                    continue;
                }
                let (Some(sent), Some(rec)) = (super::value::stamp(kv.value()), self.rec.get())
                else {
                    continue;
                };
                let nanos = u64::try_from(arrived.saturating_sub(sent)).unwrap_or(u64::MAX);
                rec.record(
                    &super::connect::ok((kv.key().len() + kv.value().len()) as u64),
                    Duration::from_nanos(nanos),
                    false,
                );
            }
        };
        if active {
            self.stats.active.fetch_sub(1, Ordering::Relaxed);
        }
        result
    }
}
