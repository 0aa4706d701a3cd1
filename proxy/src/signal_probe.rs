//! Tollgate's own probes of the apiserver, for the budget's signal when the
//! requests passing through carry too few latencies to steer by.
//!
//! The adaptive budget steers by the p99 of the protected lanes' latency
//! (heartbeats, leases), or the `workload` lane's where those are too few
//! ([`crate::budget::heavy`]). Both can be missing: a node renews its lease
//! every 10 s, so a cluster of under ~100 nodes does not fill the signal's
//! window ([`MIN_SAMPLES`] within [`MAX_WINDOW`]); kubelets may reach the
//! apiserver directly; after an apiserver restart the informers relist at
//! once while the nodes have not reconnected yet (on kube-apiserver 1.37.2
//! the controller held its floor for the first 24 s of such a storm, with
//! 184 LISTs refused). Without a signal the controller holds, so the LISTs
//! starve exactly when the cluster recovers.
//!
//! So while [`ByteBudget::wants_probe`](crate::budget::heavy::ByteBudget::wants_probe)
//! says neither lane has a signal, tollgate sends a GET of its own every
//! [`INTERVAL`] and hands each one's time to its response, body included,
//! to the signal as the `probe` source, against its own baseline. What it
//! reads is the ConfigMap `kube-system/extension-apiserver-authentication`:
//! tollgate's identity reads it already (the identity headers the apiserver
//! trusts), so probing needs no new permission, and a single-object GET
//! without a `resourceVersion` is a quorum read through the whole apiserver
//! and etcd on every release, as a heartbeat's write is.
//!
//! The probes are sent on a fixed schedule, not one after another: a probe
//! that waits for the one before it would send fewer as the apiserver
//! slows, and the signal would go blank when it matters. A probe not
//! answered within [`TIMEOUT`] is given up and recorded as taking
//! [`TIMEOUT`] (its time is at least that, far over any target); at most
//! [`MAX_IN_FLIGHT`] are in flight, so an apiserver that stops answering
//! is never sent more than that at once. An answer other than 2xx (403
//! without the permission, 429 from the apiserver's own fairness) is not a
//! sample: it did not measure the way a heartbeat goes; after one, the
//! next probe waits [`RETRY`], so an identity without the permission or an
//! apiserver that is down is asked once a second, not twenty times. Every
//! probe is counted by result (`tollgate_signal_probes_total`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::admit::Admission;
use crate::budget::signal::{MAX_WINDOW, MIN_SAMPLES};
use crate::config;
use crate::forward::{Upstream, UpstreamPool};
use crate::metrics::{Metrics, ResultLabel};
use crate::requestheader::CONFIGMAP_PATH;

/// Between two probes: twenty a second, which fill the signal's window
/// ([`MIN_SAMPLES`] in [`MIN_WINDOW`](crate::budget::signal::MIN_WINDOW))
/// as heartbeats at that rate do. In the closed-loop harness, over three
/// plants and three storm rates with the heartbeats unseen, probes at five
/// a second (windows of 20 then, whose p99 is the 90th percentile) held
/// them at a p99 of 48-50 ms against 50 (114 of 180 runs within); twenty a
/// second held them as the heartbeats themselves do (180 of 180; see
/// `harness_tests.rs`). Twenty GETs a second of one small object is a
/// small load next to what keeps a cluster's nodes alive, and it runs only
/// while the cluster's own requests give no signal.
pub const INTERVAL: Duration = Duration::from_millis(50);
/// A probe not answered by then is given up and read as this slow: twenty
/// times the target's floor (50 ms), so it reads as congestion whatever
/// the target.
pub const TIMEOUT: Duration = Duration::from_secs(1);
/// Probes in flight at once: as many as the schedule starts within one
/// [`TIMEOUT`], so the bound only bites if the clock stalls.
pub const MAX_IN_FLIGHT: usize = (TIMEOUT.as_millis() / INTERVAL.as_millis()) as usize;
/// After a failed probe, the next one: as often as tollgate's other reads
/// of its own retry.
pub const RETRY: Duration = Duration::from_secs(1);
/// Most bytes read of one answer: a ConfigMap holds at most 1 MiB of data.
const MAX_BODY: usize = 2 << 20;

const _: () = assert!(INTERVAL.as_millis() * MIN_SAMPLES as u128 <= MAX_WINDOW.as_millis());

/// The `result` values of `tollgate_signal_probes_total`.
pub const RESULTS: [&str; 4] = ["ok", "timeout", "error", "busy"];

/// What the probes read from and feed.
pub struct SignalProbe {
    pub pool: Arc<UpstreamPool>,
    pub admission: Arc<Admission>,
    pub config: Arc<config::Current>,
    pub metrics: Arc<Metrics>,
}

/// The schedule: [`INTERVAL`], [`TIMEOUT`], [`MAX_IN_FLIGHT`], [`RETRY`]
/// in service; tests shorten it.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub interval: Duration,
    pub timeout: Duration,
    pub max_in_flight: usize,
    pub retry: Duration,
}

impl Default for Schedule {
    fn default() -> Self {
        Schedule {
            interval: INTERVAL,
            timeout: TIMEOUT,
            max_in_flight: MAX_IN_FLIGHT,
            retry: RETRY,
        }
    }
}

/// When the last probe failed (`None`: it did not), so a run of failures
/// is logged once and probed at [`RETRY`].
#[derive(Default)]
struct Failing(Mutex<Option<Instant>>);

impl Failing {
    fn get(&self) -> Option<Instant> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record the outcome; whether it changed (a first failure, a recovery).
    fn set(&self, failed: bool) -> bool {
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let was = last.is_some();
        *last = failed.then(Instant::now);
        was != failed
    }
}

impl SignalProbe {
    /// Probe while wanted, until `stop`.
    pub async fn run(self, schedule: Schedule, stop: CancellationToken) {
        let this = Arc::new(self);
        let in_flight = Arc::new(Semaphore::new(schedule.max_in_flight));
        let failing = Arc::new(Failing::default());
        let mut next = 0usize;
        let mut tick = tokio::time::interval(schedule.interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            if !this.config.get().quota.adaptive.probe || !this.admission.wants_probe() {
                continue;
            }
            if failing
                .get()
                .is_some_and(|at| at.elapsed() < schedule.retry)
            {
                continue;
            }
            let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                this.count("busy");
                continue;
            };
            let upstreams = this.pool.upstreams();
            let start = next;
            next = next.wrapping_add(1);
            let healthy = (0..upstreams.len())
                .map(|i| &upstreams[(start + i) % upstreams.len()])
                .find(|u| u.is_healthy());
            let Some(upstream) = healthy.cloned() else {
                continue;
            };
            let (this, failing, stop) = (this.clone(), failing.clone(), stop.clone());
            tokio::spawn(async move {
                let _permit = permit;
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = this.probe(&upstream, schedule.timeout, &failing) => {}
                }
            });
        }
    }

    /// One probe of `upstream`, recorded and counted.
    async fn probe(&self, upstream: &Upstream, timeout: Duration, failing: &Failing) {
        let started = Instant::now();
        // own_get's own deadline is longer: the one that fires is ours.
        let read = self
            .pool
            .own_get(upstream, CONFIGMAP_PATH, MAX_BODY, timeout * 2);
        let result = match tokio::time::timeout(timeout, read).await {
            Ok(Ok(_)) => {
                self.admission.record_probe(started, Instant::now());
                "ok"
            }
            Err(_) => {
                self.admission.record_probe(started, started + timeout);
                "timeout"
            }
            Ok(Err(e)) => {
                if failing.set(true) {
                    tracing::warn!(upstream = %upstream.url, error = %e, path = CONFIGMAP_PATH, "the budget's probe failed: with too few protected or workload requests, the adaptive budget has no signal while this lasts (tollgate's own identity needs get on that ConfigMap: the extension-apiserver-authentication-reader role)");
                }
                self.count("error");
                return;
            }
        };
        if failing.set(false) {
            tracing::info!(upstream = %upstream.url, "the budget's probe is answered again");
        }
        self.count(result);
    }

    fn count(&self, result: &'static str) {
        self.metrics
            .signal_probes
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::settings::budget::QuotaMode;
    use crate::config::Config;
    use crate::snapshot::Snapshot;
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::net::TcpListener;

    /// An upstream on a loopback port that answers each request after
    /// `delay` (`None`: never) and counts the requests it got.
    async fn upstream(delay: Option<Duration>) -> (String, Arc<AtomicU64>) {
        upstream_answering(delay, hyper::StatusCode::OK).await
    }

    /// [`upstream`], answering `status`.
    async fn upstream_answering(
        delay: Option<Duration>,
        status: hyper::StatusCode,
    ) -> (String, Arc<AtomicU64>) {
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let url = format!("http://{}", tcp.local_addr().expect("addr"));
        let got = Arc::new(AtomicU64::new(0));
        let counted = got.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = tcp.accept().await {
                let got = counted.clone();
                let service = service_fn(move |_req| {
                    got.fetch_add(1, Ordering::Relaxed);
                    async move {
                        match delay {
                            Some(d) => tokio::time::sleep(d).await,
                            None => std::future::pending().await,
                        }
                        let mut resp = hyper::Response::new(crate::status::full(
                            bytes::Bytes::from_static(b"{}"),
                        ));
                        *resp.status_mut() = status;
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
                tokio::spawn(async move {
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let _ = builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (url, got)
    }

    struct Running {
        admission: Arc<Admission>,
        metrics: Arc<Metrics>,
        config: Config,
        stop: CancellationToken,
    }

    impl Running {
        fn count(&self, result: &'static str) -> u64 {
            self.metrics
                .signal_probes
                .get_or_create(&ResultLabel {
                    result: result.into(),
                })
                .get()
        }
    }

    impl Drop for Running {
        fn drop(&mut self) {
            self.stop.cancel();
        }
    }

    fn start(url: &str, schedule: Schedule, edit: impl FnOnce(&mut Config)) -> Running {
        let mut config = Config::default();
        config.upstream.urls = vec![url.to_string()];
        edit(&mut config);
        let pool = Arc::new(UpstreamPool::new(&config).expect("pool"));
        let admission = Arc::new(Admission::new(config.admission(), Box::new(|_| {})));
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(Metrics::register(&mut registry));
        let stop = CancellationToken::new();
        let probe = SignalProbe {
            pool,
            admission: admission.clone(),
            config: Arc::new(Snapshot::new(config.clone())),
            metrics: metrics.clone(),
        };
        tokio::spawn(probe.run(schedule, stop.clone()));
        Running {
            admission,
            metrics,
            config,
            stop,
        }
    }

    /// Poll `done` every 10 ms until it holds, for at most 10 s.
    async fn until(mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "not within 10 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn fast(timeout: Duration, max_in_flight: usize) -> Schedule {
        Schedule {
            interval: Duration::from_millis(10),
            timeout,
            max_in_flight,
            retry: Duration::from_millis(100),
        }
    }

    #[tokio::test]
    async fn probes_give_the_signal_when_no_request_does() {
        let (url, got) = upstream(Some(Duration::from_millis(20))).await;
        let r = start(&url, fast(Duration::from_secs(5), 4), |_| {});
        let view = || r.admission.budget_view(r.config.admission());
        until(|| view().signal_source == "probe").await;
        let v = view();
        let p99 = v.p99_seconds.expect("a p99");
        assert!(p99 >= 0.02, "each answer took 20 ms at least: {p99}");
        assert!(v.probe_signal.window_samples >= MIN_SAMPLES);
        assert!(r.count("ok") >= MIN_SAMPLES as u64);
        assert!(got.load(Ordering::Relaxed) >= r.count("ok"));
    }

    /// An apiserver that stops answering is sent at most `max_in_flight`
    /// probes at once, and each one given up reads as `timeout` long.
    #[tokio::test]
    async fn an_unanswered_probe_is_bounded_and_reads_as_its_timeout() {
        let (url, got) = upstream(None).await;
        let r = start(&url, fast(Duration::from_millis(600), 12), |_| {});
        until(|| r.count("busy") >= 10).await;
        assert_eq!(
            got.load(Ordering::Relaxed),
            12,
            "twelve in flight, none given up yet"
        );
        until(|| r.count("timeout") >= 2 * MIN_SAMPLES as u64).await;
        let v = r.admission.budget_view(r.config.admission());
        assert_eq!(v.signal_source, "probe");
        let p99 = v.p99_seconds.expect("a p99");
        assert!((p99 - 0.6).abs() < 0.05, "given up at 600 ms: {p99}");
        assert_eq!(r.count("ok"), 0);
    }

    #[tokio::test]
    async fn no_probe_when_off_or_static() {
        let (url, got) = upstream(Some(Duration::ZERO)).await;
        let off = start(&url, fast(Duration::from_secs(1), 4), |c| {
            c.quota.adaptive.probe = false
        });
        let fixed = start(&url, fast(Duration::from_secs(1), 4), |c| {
            c.quota.mode = QuotaMode::Static
        });
        // A probe that is on, beside them, for the time they are given.
        let on = start(&url, fast(Duration::from_secs(1), 4), |_| {});
        until(|| on.count("ok") >= 30).await;
        // Every request the upstream got was one of its (at most 4 not yet counted).
        let got = got.load(Ordering::Relaxed);
        assert!(got <= on.count("ok") + 4, "{got}");
        for r in [&off, &fixed] {
            assert_eq!(RESULTS.map(|s| r.count(s)), [0; 4]);
        }
    }

    /// A refused probe (403: tollgate's identity may not read the
    /// ConfigMap) is no sample, and after one the next waits `retry` (here
    /// 400 ms, against probes every 10 ms).
    #[tokio::test]
    async fn a_refused_probe_is_no_sample_and_slows_the_probes() {
        let (url, got) =
            upstream_answering(Some(Duration::ZERO), hyper::StatusCode::FORBIDDEN).await;
        let started = Instant::now();
        let mut schedule = fast(Duration::from_secs(1), 4);
        schedule.retry = Duration::from_millis(400);
        let r = start(&url, schedule, |_| {});
        until(|| r.count("error") >= 3).await;
        let v = r.admission.budget_view(r.config.admission());
        assert_eq!(v.probe_signal.window_samples, 0);
        assert_eq!(v.p99_seconds, None);
        let sent = got.load(Ordering::Relaxed);
        let most = (started.elapsed().as_millis() / 400) as u64 + 2;
        assert!(sent <= most, "{sent} probes in {:?}", started.elapsed());
    }
}
