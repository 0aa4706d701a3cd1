//! The heavy lane's budget as admission holds it: the in-flight budget,
//! the signal and the controller together, with what they learn between
//! two controller steps. Pure: time is passed in; admission keeps it
//! behind its lock, the control loop calls [`ByteBudget::step`].
//!
//! The signal is the protected lanes' latency (heartbeats, leases, system
//! and exempt requests); where too few of those pass through tollgate (the
//! kubelets talk to the apiserver directly, a small cluster's heartbeats
//! are sparse, the nodes have not reconnected after a restart), the light
//! requests of the `workload` lane stand in, and where those are too few
//! as well, tollgate's own probes ([`crate::signal_probe`]), each against
//! its own baseline. With none, the controller holds.
//!
//! In `static` mode the rate and in-flight budget are the configured ones
//! and the controller does not move; the signal and the target are still
//! measured and shown, so an operator can see what `adaptive` would do.

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::adaptive::{Controller, ControllerView, Decision, Observation, Reason};
use super::inflight::InflightBudget;
use super::signal::{Signal, SignalView, Source};
use crate::config::settings::budget::{
    Adaptive, Bounds, QuotaMode, DEFAULT_BURST_BYTES, DEFAULT_BYTES_PER_SECOND,
    DEFAULT_INFLIGHT_BYTES,
};

/// The static values (after cluster-size scaling): `quota.bytesPerSecond`,
/// `quota.burstBytes`, `quota.inflightBytes`, where set (in the file, by a
/// flag, or by scaling; `None`: not set). Static mode uses their defaults
/// where not set; only the values set cap the adaptive budget.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Ceilings {
    pub rate: Option<f64>,
    pub burst: Option<f64>,
    pub inflight: Option<f64>,
}

impl Ceilings {
    /// The adaptive budget's bounds under the values set.
    fn bounds(&self, adaptive: &Adaptive) -> Bounds {
        adaptive.bounds(self.rate, self.inflight)
    }

    /// Static mode's budget: the values set, or their defaults.
    pub fn static_limits(&self) -> Limits {
        Limits {
            rate: self.rate.unwrap_or(DEFAULT_BYTES_PER_SECOND),
            burst: self.burst.unwrap_or(DEFAULT_BURST_BYTES),
            inflight: self.inflight.unwrap_or(DEFAULT_INFLIGHT_BYTES),
        }
    }
}

/// What the pool and the in-flight budget are set to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub rate: f64,
    pub burst: f64,
    pub inflight: f64,
}

/// The byte budget: how many bytes per second, in a burst and in flight the
/// heavy lane may spend, and the controller that moves them (what differs
/// from [`crate::enforce::heavy::HeavyAdmission`]: that one queues and admits
/// requests against these figures).
#[derive(Debug, Clone)]
pub struct ByteBudget {
    mode: QuotaMode,
    adaptive: Adaptive,
    ceilings: Ceilings,
    inflight: InflightBudget,
    /// One per [`Source`], in its order.
    signals: [Signal; Source::ALL.len()],
    controller: Controller,
    /// Since the last step.
    admitted: f64,
    /// The largest predicted cost that waited (0: none).
    waiting: f64,
    upstream_errors: u64,
    last: Option<(Option<Duration>, Duration)>,
    /// Decisions taken so far, by reason ([`Reason::ALL`]'s order).
    decisions: [u64; Reason::ALL.len()],
}

/// `/debug/budget`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetView {
    pub mode: &'static str,
    /// The rate the budget sets (before the relist guard's ramp).
    pub bytes_per_second: f64,
    pub burst_bytes: f64,
    /// The in-flight budget in force (the relist guard's ramp applied).
    pub inflight_bytes: f64,
    /// Predicted bytes of the heavy requests in flight.
    pub inflight_used_bytes: f64,
    pub inflight_requests: usize,
    /// Unlearned heavy-looking patterns with their one request in flight.
    pub unlearned_inflight: usize,
    /// Latency samples dropped so far: more than
    /// [`super::latencies::CAPACITY`] waited between two steps.
    pub dropped_samples: u64,
    /// The largest lateness any worker's ticker saw in its last ticks, seconds: what a light
    /// request waited for its worker, each way, beyond its measured latency
    /// ([`crate::wake_lag`]; counted twice in each sample).
    pub worker_lag_seconds: f64,
    pub target_seconds: f64,
    /// `protected`, `workload` or `probe`: whose latency steers the budget
    /// now.
    pub signal_source: &'static str,
    /// That signal's p99, seconds (`None`: too few samples).
    pub p99_seconds: Option<f64>,
    /// That signal's last minute against the target (`None`: too few
    /// samples for a 1% tail).
    pub tail: Option<TailView>,
    pub signal: SignalView,
    pub workload_signal: SignalView,
    pub probe_signal: SignalView,
    pub controller: ControllerView,
    /// Decisions so far by reason (the `tollgate_budget_decisions_total`
    /// metric's labels).
    pub decisions: std::collections::BTreeMap<&'static str, u64>,
}

/// The tail as `/debug/budget` shows it.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TailView {
    pub samples: usize,
    /// Samples over the target.
    pub slow: usize,
    /// Their share of a whole minute's samples (the 1% budget's measure).
    pub slow_share: f64,
}

impl ByteBudget {
    pub fn new(mode: QuotaMode, adaptive: Adaptive, ceilings: Ceilings, now: Instant) -> Self {
        let controller = Controller::new(ceilings.bounds(&adaptive), now);
        let mut b = ByteBudget {
            mode,
            adaptive,
            ceilings,
            inflight: InflightBudget::new(0.0),
            signals: Default::default(),
            controller,
            admitted: 0.0,
            waiting: 0.0,
            upstream_errors: 0,
            last: None,
            decisions: [0; Reason::ALL.len()],
        };
        b.inflight.set_budget(b.limits().inflight);
        b
    }

    /// New settings or ceilings (a reload, cluster-size scaling): the
    /// controller keeps its level, clamped to the new bounds.
    pub fn set_settings(&mut self, mode: QuotaMode, adaptive: &Adaptive, ceilings: Ceilings) {
        if (mode, adaptive, ceilings) == (self.mode, &self.adaptive, self.ceilings) {
            return;
        }
        self.mode = mode;
        self.adaptive = adaptive.clone();
        self.ceilings = ceilings;
        self.controller.set_bounds(ceilings.bounds(adaptive));
        let inflight = self.limits().inflight;
        self.inflight.set_budget(inflight);
    }

    pub fn mode(&self) -> QuotaMode {
        self.mode
    }

    /// The pool's rate and burst and the in-flight budget, before the
    /// relist guard's factor. Adaptive: no burst, pacing: each heavy
    /// request waits until the one before it is paid for at the rate, so
    /// heavy requests start evenly spaced, never several at once after a
    /// pause. On the real kube-apiserver two LISTs of all pods starting
    /// together, more than the rate, slow the heartbeats (bench/RESULTS.md,
    /// the scenario matrix: evenly sent at 180/min, p99 22 ms; through a
    /// pool whose burst was a second of the rate, 195/min with two at
    /// once, 82 ms).
    pub fn limits(&self) -> Limits {
        match self.mode {
            QuotaMode::Static => self.ceilings.static_limits(),
            QuotaMode::Adaptive => {
                let rate = self.controller.rate();
                Limits {
                    rate,
                    burst: 0.0,
                    inflight: self.controller.inflight(),
                }
            }
        }
    }

    /// Scale the in-flight budget by the relist guard's factor; in
    /// adaptive mode never below `minInflightBytes` (the controller starts
    /// there already: the guard's ramp on top of it would leave every
    /// relist alone in flight).
    pub fn apply_guard(&mut self, factor: f64) {
        let mut inflight = self.limits().inflight * factor;
        if self.mode == QuotaMode::Adaptive {
            let b = self.ceilings.bounds(&self.adaptive);
            inflight = inflight.max(b.min_inflight);
        }
        self.inflight.set_budget(inflight);
    }

    pub fn inflight(&self) -> &InflightBudget {
        &self.inflight
    }

    /// Would `bytes` fit in the in-flight budget now?
    pub fn fits(&self, bytes: f64) -> bool {
        self.inflight.fits(bytes)
    }

    /// Take `bytes` of the in-flight budget for an admitted request (dry
    /// run: `force`).
    pub fn acquire(&mut self, bytes: f64, force: bool, now: Instant) -> bool {
        let ok = if force {
            self.inflight.force_acquire(bytes);
            true
        } else {
            self.inflight.try_acquire(bytes)
        };
        if ok {
            self.admitted += bytes;
            for s in &mut self.signals {
                s.set_heavy_busy(true, now);
            }
        }
        ok
    }

    /// A heavy request predicted at `cost` waited (for the in-flight
    /// budget or the pool).
    pub fn note_waited(&mut self, cost: f64) {
        self.waiting = self.waiting.max(cost.max(f64::MIN_POSITIVE));
    }

    /// An admitted request that reserved `reserved` bytes (its prediction)
    /// ended, costing `cost`; `completed` if its response was sent whole
    /// (evidence for the controller). Its service time is taken per byte
    /// of what it cost, not of what was predicted: an unlearned pattern's
    /// first request is predicted from a prior that may be far off (a
    /// streaming list of 38 MB predicted at 1 MB read as a pipe of 0.8 MB/s
    /// on kube-apiserver 1.37.2).
    pub fn release(
        &mut self,
        reserved: f64,
        cost: f64,
        admitted_at: Instant,
        completed: bool,
        now: Instant,
    ) {
        self.inflight.release(reserved);
        if completed {
            self.controller.note_completion(admitted_at);
            self.controller
                .note_service(cost, now.saturating_duration_since(admitted_at), now);
        }
        if self.inflight.count() == 0 {
            for s in &mut self.signals {
                s.set_heavy_busy(false, now);
            }
        }
    }

    /// A request of `source` took `latency`.
    pub fn record(&mut self, source: Source, latency: Duration, started: Instant, now: Instant) {
        self.signals[source as usize].record(latency, started, now);
    }

    /// Would a probe help now: the adaptive controller steers and neither
    /// the protected lanes nor the workload lane has enough samples in its
    /// window for a p99.
    pub fn wants_probe(&mut self, now: Instant) -> bool {
        self.mode == QuotaMode::Adaptive
            && self.signals[..Source::Probe as usize]
                .iter_mut()
                .all(|s| !s.has_p99(now))
    }

    /// The apiserver answered 429 or 5xx.
    pub fn note_upstream_error(&mut self) {
        self.upstream_errors += 1;
    }

    /// The signal at `now`: `(source, p99, target)`, of the first
    /// [`Source`] with enough samples for a p99, each against its own
    /// baseline; with none, the protected lanes' target and no p99.
    pub fn signal(&mut self, now: Instant) -> (Source, Option<Duration>, Duration) {
        for source in Source::ALL {
            let s = &mut self.signals[source as usize];
            if let Some((p99, _, _)) = s.p99(now) {
                let target = self.adaptive.target(s.baseline(now));
                return (source, Some(p99), target);
            }
        }
        let baseline = self.signals[Source::Protected as usize].baseline(now);
        (Source::Protected, None, self.adaptive.target(baseline))
    }

    /// One controller step: the decision, if an epoch ended (static mode:
    /// none), and the new limits to apply. Each decision is logged at info
    /// level with its reason and explanation, and counted by reason.
    pub fn step(&mut self, now: Instant) -> (Option<Decision>, Limits) {
        let (source, p99, target) = self.signal(now);
        let window = self.inflight.take_window();
        let tail = self.signals[source as usize].tail(target, now);
        let o = Observation {
            tail,
            p99,
            target,
            inflight_used: self.inflight.used(),
            inflight_peak: window.peak,
            inflight_count: self.inflight.count(),
            admitted: std::mem::take(&mut self.admitted),
            waiting: std::mem::take(&mut self.waiting).max(window.blocked),
            upstream_errors: std::mem::take(&mut self.upstream_errors),
        };
        let decision = match self.mode {
            QuotaMode::Adaptive => self.controller.step(&o, now),
            QuotaMode::Static => None,
        };
        if let Some(d) = decision {
            if let Some(i) = Reason::ALL.iter().position(|r| *r == d.reason) {
                self.decisions[i] += 1;
            }
            tracing::info!(
                action = ?d.action,
                reason = d.reason.as_str(),
                state = ?d.state,
                signal = source.as_str(),
                p99_ms = d.p99_seconds.map(|p| p * 1e3),
                target_ms = d.target_seconds * 1e3,
                bytes_per_second = d.rate_after as u64,
                inflight_bytes = self.controller.inflight() as u64,
                "adaptive budget: {}",
                self.controller.explain()
            );
        }
        self.last = Some((p99, target));
        let limits = self.limits();
        (decision, limits)
    }

    /// Decisions so far by reason.
    pub fn decisions(&self) -> impl Iterator<Item = (Reason, u64)> + '_ {
        Reason::ALL
            .iter()
            .copied()
            .zip(self.decisions.iter().copied())
    }

    /// The last step's p99 and target.
    pub fn last_signal(&self) -> Option<(Option<Duration>, Duration)> {
        self.last
    }

    pub fn view(&mut self, now: Instant) -> BudgetView {
        let limits = self.limits();
        let (source, p99, target) = self.signal(now);
        let tail = self.signals[source as usize]
            .tail(target, now)
            .map(|t| TailView {
                samples: t.samples,
                slow: t.slow,
                slow_share: t.share(),
            });
        BudgetView {
            p99_seconds: p99.map(|p| p.as_secs_f64()),
            tail,
            mode: self.mode.as_str(),
            bytes_per_second: limits.rate,
            burst_bytes: limits.burst,
            inflight_bytes: self.inflight.budget(),
            inflight_used_bytes: self.inflight.used(),
            inflight_requests: self.inflight.count(),
            unlearned_inflight: 0,
            dropped_samples: 0,
            worker_lag_seconds: 0.0,
            target_seconds: target.as_secs_f64(),
            signal_source: source.as_str(),
            signal: self.signals[Source::Protected as usize].view(now),
            workload_signal: self.signals[Source::Workload as usize].view(now),
            probe_signal: self.signals[Source::Probe as usize].view(now),
            controller: self.controller.view(now),
            decisions: self.decisions().map(|(r, n)| (r.as_str(), n)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::settings::budget::{
        ADAPTIVE_MAX_BYTES_PER_SECOND, ADAPTIVE_MAX_INFLIGHT_BYTES,
    };

    const MB: f64 = 1_000_000.0;

    /// Static values set in the file.
    fn ceilings() -> Ceilings {
        Ceilings {
            rate: Some(100.0 * MB),
            burst: Some(400.0 * MB),
            inflight: Some(1000.0 * MB),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn static_mode_uses_the_configured_values() {
        let t0 = Instant::now();
        let mut b = ByteBudget::new(QuotaMode::Static, Adaptive::default(), ceilings(), t0);
        assert_eq!(
            b.limits(),
            Limits {
                rate: 100.0 * MB,
                burst: 400.0 * MB,
                inflight: 1000.0 * MB
            }
        );
        assert_eq!(b.step(t0 + ms(500)).0, None);
        assert_eq!(b.inflight().budget(), 1000.0 * MB);
    }

    #[test]
    fn static_values_cap_the_adaptive_budget_only_when_set() {
        let t0 = Instant::now();
        let mut b = ByteBudget::new(QuotaMode::Adaptive, Adaptive::default(), ceilings(), t0);
        let top = |b: &ByteBudget| {
            let bounds = b.ceilings.bounds(&b.adaptive);
            (bounds.max_rate, bounds.max_inflight)
        };
        assert_eq!(
            top(&b),
            (100.0 * MB, 1000.0 * MB),
            "set: the static values are hard"
        );
        let defaults = Ceilings::default();
        b.set_settings(QuotaMode::Adaptive, &Adaptive::default(), defaults);
        assert_eq!(
            top(&b),
            (ADAPTIVE_MAX_BYTES_PER_SECOND, ADAPTIVE_MAX_INFLIGHT_BYTES),
            "not set: the adaptive maxima"
        );

        b.set_settings(QuotaMode::Static, &Adaptive::default(), defaults);
        assert_eq!(
            b.limits().rate,
            DEFAULT_BYTES_PER_SECOND,
            "static mode: the defaults"
        );
        b.set_settings(QuotaMode::Static, &Adaptive::default(), ceilings());
        assert_eq!(b.limits().rate, 100.0 * MB, "static mode: the values");
    }

    #[test]
    fn the_service_time_is_per_byte_of_what_a_request_cost_not_of_its_prediction() {
        let t0 = Instant::now();
        let mut b = ByteBudget::new(QuotaMode::Adaptive, Adaptive::default(), ceilings(), t0);
        // An unlearned pattern's first request: predicted 1 MB, it cost 38 MB in 1.24 s.
        assert!(b.acquire(1.0 * MB, false, t0));
        let end = t0 + ms(1240);
        b.release(1.0 * MB, 38.0 * MB, t0, true, end);
        // Another as large waits.
        b.note_waited(38.0 * MB);
        b.step(end);
        let pipe = b.view(end).controller.pipe_bytes_per_second;
        let pipe = pipe.expect("a completion as large as the waiting size");
        assert!((pipe - 38.0 * MB / 1.24).abs() < 0.01 * pipe, "{pipe}");
    }

    #[test]
    fn adaptive_starts_at_the_minimum_and_grows_while_lists_wait() {
        let t0 = Instant::now();
        let adaptive = Adaptive {
            min_bytes_per_second: 1.0 * MB,
            min_inflight_bytes: 8.0 * MB,
            ..Adaptive::default()
        };
        let mut b = ByteBudget::new(QuotaMode::Adaptive, adaptive, ceilings(), t0);
        assert_eq!(
            b.limits(),
            Limits {
                rate: 1.0 * MB,
                burst: 0.0,
                inflight: 8.0 * MB
            }
        );
        // A 33 MB LIST runs alone; a second waits.
        assert!(b.acquire(33.0 * MB, false, t0));
        assert!(!b.acquire(33.0 * MB, false, t0));
        let mut now = t0;
        // Heartbeats at 20/s, 10 ms, while the LIST runs for a second.
        for _ in 0..20 {
            now += ms(50);
            b.record(Source::Protected, ms(10), now - ms(10), now);
        }
        b.release(33.0 * MB, 33.0 * MB, t0, true, now);
        for _ in 0..20 {
            now += ms(50);
            b.record(Source::Protected, ms(10), now - ms(10), now);
        }
        b.note_waited(33.0 * MB);
        // The epoch (2 s + the 1 s service time) ends at 3 s.
        assert_eq!(b.step(now).0, None, "the epoch has not ended");
        for _ in 0..20 {
            now += ms(50);
            b.record(Source::Protected, ms(10), now - ms(10), now);
        }
        b.note_waited(33.0 * MB);
        let (decision, limits) = b.step(now);
        let d = decision.expect("an epoch ended");
        assert_eq!(
            (d.action, d.reason),
            (crate::budget::adaptive::Action::Increase, Reason::Clear),
            "a LIST waited and the heartbeats are clear: startup grows"
        );
        // The LIST's 33 MB in 1 s puts the pipe at 33 MB/s: the climb
        // starts at a quarter of it (over the waiting LIST's floor, 33 MB
        // per 30 s, grown); the in-flight budget twice what that rate
        // keeps in flight for 1 s.
        assert!((limits.rate - 33.0 * MB / 4.0).abs() < 1.0, "{limits:?}");
        assert!(
            (limits.inflight - 2.0 * 33.0 * MB / 4.0).abs() < 1.0,
            "{limits:?}"
        );
        assert_eq!(b.last_signal(), Some((Some(ms(10)), ms(50))));
        let v = b.view(now);
        assert_eq!((v.mode, v.controller.increases), ("adaptive", 1));
        assert_eq!(v.decisions["clear"], 1);
        assert!(v.controller.explanation.contains("grew"));
        let service = v.controller.service_seconds.expect("one LIST completed");
        assert!((service - 1.0).abs() < 1e-9, "{service}");
        assert_eq!((v.target_seconds, v.signal_source), (0.05, "protected"));
    }

    #[test]
    fn the_first_source_with_enough_samples_steers() {
        let t0 = Instant::now();
        let mut b = ByteBudget::new(QuotaMode::Adaptive, Adaptive::default(), ceilings(), t0);
        let mut now = t0;
        assert_eq!(
            b.signal(now),
            (Source::Protected, None, ms(50)),
            "no signal: the floor"
        );
        assert!(b.wants_probe(now), "nothing to steer by: probe");
        for _ in 0..40 {
            now += ms(50);
            b.record(Source::Probe, ms(20), now - ms(20), now);
        }
        // Their quiet runs give the probes' own baseline: the target is the floor.
        assert_eq!(b.signal(now), (Source::Probe, Some(ms(20)), ms(50)));
        assert!(b.wants_probe(now), "probes do not stop their own need");
        for _ in 0..40 {
            now += ms(50);
            b.record(Source::Workload, ms(80), now - ms(80), now);
        }
        // The workload lane's own baseline: the target is 2 × 80 ms.
        assert_eq!(b.signal(now), (Source::Workload, Some(ms(80)), ms(160)));
        assert!(!b.wants_probe(now), "light requests suffice");
        for _ in 0..40 {
            now += ms(50);
            b.record(Source::Protected, ms(7), now - ms(7), now);
        }
        assert_eq!(b.signal(now), (Source::Protected, Some(ms(7)), ms(50)));
        assert!(!b.wants_probe(now));
        let v = b.view(now);
        assert_eq!(v.signal_source, "protected");
        assert_eq!(v.probe_signal.quiet_samples, 40);
        // A minute on, every window is empty again: probe.
        assert!(b.wants_probe(now + Duration::from_secs(60)));
    }

    #[test]
    fn static_mode_never_probes() {
        let t0 = Instant::now();
        let mut b = ByteBudget::new(QuotaMode::Static, Adaptive::default(), ceilings(), t0);
        assert!(!b.wants_probe(t0), "its limits do not follow a signal");
    }
}
