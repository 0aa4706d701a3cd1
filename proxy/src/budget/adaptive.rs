#![doc = include_str!("adaptive.md")]

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::settings::Bounds;
use super::signal::{Tail, TAIL_WINDOW};

/// The rate lets the in-flight level turn over once in this time…
pub const TURNOVER: Duration = Duration::from_secs(4);
/// …or in this many of the heavy requests' service times, when that is
/// shorter (at one request at a time, the apiserver serves a heavy request
/// at most a quarter of the time, however fast it serves one)…
pub const SERVICE_TURNS: f64 = 4.0;
/// …but never faster than this: two controller steps.
pub const MIN_TURNOVER: Duration = Duration::from_secs(1);
/// Over this share of the target the level is cut…
pub const SET_POINT: f64 = 0.7;
/// …and under this share it may grow; between them it holds.
pub const HEADROOM: f64 = 0.6;
/// The least time a change is watched before the next increase: one
/// turnover of the level, the time the rate takes to admit what the level
/// holds. The real apiserver answers a step 3–5 s late (its heap grows
/// with what it holds): ×1.125 every 2 s stepped past its edge before the
/// first step's slow heartbeats came back, and so did slow start's ×1.3
/// every 2 s (from one LIST to 810 MB in 25 s, overloaded 2 s later, in
/// three runs of three).
pub const EVIDENCE: Duration = TURNOVER;
/// …and near the last edge (from `RECOVERY` of the level in use at the
/// last decrease to a slow-start step past it): two turnovers, as TCP CUBIC
/// dwells near the window where it last lost. On the real apiserver the
/// edge is a cliff, not a slope (the heartbeats' short-window p99 read
/// 15–23 ms right up to a 130–206 ms pause), and 4 s steps regained it
/// within 15 s of a cut: two overloads in one minute.
pub const EDGE_EVIDENCE: Duration = Duration::from_secs(8);
/// After a decrease has drained, the time before another may follow.
pub const HOLD_AFTER_DRAIN: Duration = super::signal::MIN_WINDOW;
/// The longest a decrease holds off the next, drained or not.
pub const MAX_HOLD: Duration = Duration::from_secs(30);
/// Growth per increase in slow start (and in recovery)…
pub const SLOW_START_GROWTH: f64 = 1.3;
/// …and after it.
pub const GROWTH: f64 = 1.125;
/// Slow start doubles while the protected p99 stays under this share of
/// the set point: the heartbeats do not feel the heavy lane at all.
pub const FAST_BELOW: f64 = 0.25;
/// Slow start's step far from any edge.
pub const FAST_GROWTH: f64 = 2.0;
/// After a decrease, growth is the slow-start step up to this share of the
/// level in use at the cut.
pub const RECOVERY: f64 = 0.8;
/// Admitted bytes are summed over this long to measure use.
pub const USE_WINDOW: Duration = Duration::from_secs(10);
/// The share of protected requests over the target the controller allows:
/// the 1% a p99 lets be slower. (0.8% was tried, for two real-apiserver
/// runs where tollgate, timing a request from its handler to the response
/// headers, counted 5 and 8 slow heartbeats where the clients' p99 put at
/// least 12 over; it cost the simulators a quarter of their LISTs, and
/// later runs counted as the clients did: 8 and 8, 45 and 49.)
pub const TAIL_BUDGET: f64 = 0.01;
/// Growth needs the tail's budget spent slower than this share of the rate
/// it allows, over the last [`super::signal::BURN_WINDOW`].
pub const GROW_BURN: f64 = 0.8;
/// A spike over the set point cuts once the tail's budget is spent faster
/// than this share of the rate it allows: under 1, as the set point is
/// under the target, for the same reason (the burn is read after the fact).
pub const CUT_BURN: f64 = 0.9;
/// The smallest and largest cut.
const CUT_RANGE: (f64, f64) = (0.5, 0.9);
/// How far over the target a 429/5xx from the apiserver counts.
const ERROR_RATIO: f64 = 1.5;
/// Per-step admission records kept (USE_WINDOW at the fastest interval).
const MAX_ADMISSIONS: usize = 256;
/// The in-flight budget holds this many times what the rate keeps in
/// flight (the rate times the heavy requests' service time), as BBR's
/// window holds twice its bandwidth-delay product.
pub const PACE_GAIN: f64 = 2.0;
/// Completed heavy requests the service time is measured over.
const SERVICE_SAMPLES: usize = 32;
/// Slow start's fast phase watches a step this long: an apiserver whose
/// heartbeats do not feel the heavy lane at all is far from its edge, and
/// 4 s per doubling left a fast one refusing LISTs for 20 s from a cold
/// start.
pub const FAST_EVIDENCE: Duration = Duration::from_secs(2);

/// What the heavy lane and the signal did since the last step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// The protected lanes' short-window p99; `None`: too few samples.
    pub p99: Option<Duration>,
    pub target: Duration,
    /// Predicted bytes in flight now.
    pub inflight_used: f64,
    /// Most bytes in flight since the last step.
    pub inflight_peak: f64,
    /// Heavy requests in flight now.
    pub inflight_count: usize,
    /// Bytes admitted since the last step.
    pub admitted: f64,
    /// The largest predicted cost that waited for the in-flight budget or
    /// the rate (0: nothing waited).
    pub waiting: f64,
    /// 429s and 5xx the apiserver answered since the last step.
    pub upstream_errors: u64,
    /// The protected requests of the last minute against the target;
    /// `None`: too few to speak of a 1% tail.
    pub tail: Option<Tail>,
}

/// Slow start until the first decrease, then proportional growth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    SlowStart,
    Steady,
}

/// What the last step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Action {
    Increase,
    Decrease,
    /// Over the target, but the last decrease has not taken effect yet.
    HoldDraining,
    /// Between `HEADROOM`·target and `SET_POINT`·target, or the tail's
    /// budget spent faster than `GROW_BURN` of what it allows.
    HoldBand,
    /// The short window over the set point, but the tail's budget neither
    /// spent nor being overspent: a pause the target's 1% absorbs.
    HoldSpike,
    /// Healthy, but nothing waited for the budget.
    HoldIdle,
    /// Healthy and wanted, but the last change has not shown yet.
    HoldEvidence,
    /// Too few protected requests to judge.
    HoldNoSignal,
    /// At the bound already.
    HoldBound,
}

/// The controller.
#[derive(Debug, Clone)]
pub struct Controller {
    bounds: Bounds,
    level: f64,
    phase: Phase,
    changed_at: Instant,
    /// The current stretch of healthy evidence began here.
    evidence_since: Instant,
    /// Requests admitted after the last change that have completed.
    completions: u64,
    last_decrease: Option<Instant>,
    /// The level is one request at a time (set by the step up to it).
    one_request: bool,
    /// The last change was a slow-start (or recovery) multiplication.
    multiplied: bool,
    /// After a decrease: `RECOVERY` of the level in use at the cut (0: none).
    recover_to: f64,
    /// The level before the last increase.
    before_step: f64,
    /// Where an undo goes: the level before the last multiplication, or
    /// before the one before it when the two came back to back.
    undo_to: f64,
    /// The level in use at the last decrease, or where slow start ended in
    /// the band (0: none yet).
    edge: f64,
    /// After a decrease: when the bytes in flight fell under the budget.
    drained_at: Option<Instant>,
    /// Peak bytes in flight since the last change.
    peak: f64,
    /// The largest cost that waited since the last change.
    waiting: f64,
    /// `(step time, bytes admitted)` over `USE_WINDOW`.
    admissions: VecDeque<(Instant, f64)>,
    /// `(bytes, seconds from admission to the whole response)` of the
    /// last completed heavy requests.
    services: VecDeque<(f64, f64)>,
    last_action: Action,
    increases: u64,
    decreases: u64,
}

/// The controller as `/debug/budget` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerView {
    pub level_bytes: f64,
    pub bytes_per_second: f64,
    pub inflight_bytes: f64,
    /// The heavy requests' service time the in-flight budget is paced by.
    pub service_seconds: Option<f64>,
    pub phase: Phase,
    pub last_action: Action,
    pub seconds_since_change: f64,
    pub seconds_since_decrease: Option<f64>,
    pub increases: u64,
    pub decreases: u64,
}

impl Controller {
    /// A cold start: the level at its minimum (a heavy request larger than
    /// the minimum in-flight budget runs alone), in slow start.
    pub fn new(bounds: Bounds, now: Instant) -> Controller {
        let mut c = Controller {
            bounds,
            level: 0.0,
            phase: Phase::SlowStart,
            changed_at: now,
            evidence_since: now,
            completions: 0,
            last_decrease: None,
            one_request: false,
            multiplied: false,
            recover_to: 0.0,
            before_step: 0.0,
            undo_to: 0.0,
            edge: 0.0,
            drained_at: None,
            peak: 0.0,
            waiting: 0.0,
            admissions: VecDeque::new(),
            services: VecDeque::new(),
            last_action: Action::HoldNoSignal,
            increases: 0,
            decreases: 0,
        };
        c.level = c.range().0;
        c
    }

    /// The level's range: what puts both outputs at their minimum, and at
    /// their maximum.
    fn range(&self) -> (f64, f64) {
        let b = &self.bounds;
        let turnover = TURNOVER.as_secs_f64();
        let lo = b.min_inflight.min(b.min_rate * turnover);
        let hi = b.max_inflight.max(b.max_rate * turnover).max(lo);
        (lo, hi)
    }

    pub fn level(&self) -> f64 {
        self.level
    }

    /// The pool's rate, bytes/s.
    pub fn rate(&self) -> f64 {
        let b = &self.bounds;
        (self.level / self.turnover()).clamp(b.min_rate, b.max_rate.max(b.min_rate))
    }

    /// Seconds the rate takes to admit the level: [`TURNOVER`], or
    /// [`SERVICE_TURNS`] service times where the heavy requests are served
    /// faster, down to [`MIN_TURNOVER`]. A level of one LIST of all pods
    /// was one LIST per 4 s wherever it ran; on an apiserver that served
    /// one in 0.2 s and took 240 a minute within the target, the cold start
    /// spent 20 s refusing LISTs to get past that.
    fn turnover(&self) -> f64 {
        let most = TURNOVER.as_secs_f64();
        self.service_seconds().map_or(most, |d| {
            (SERVICE_TURNS * d).clamp(MIN_TURNOVER.as_secs_f64(), most)
        })
    }

    /// The in-flight budget, bytes: the level, but no more than
    /// [`PACE_GAIN`] times what the rate keeps in flight once the service
    /// time is known. The level turns over in 4 s; LISTs served in 0.2 s
    /// would otherwise be let in twenty at once whenever a backlog built
    /// up (on a fast apiserver a level of 2 GB admitted six LISTs of all
    /// pods together, and the heartbeats' p99 reached 123 ms).
    pub fn inflight(&self) -> f64 {
        let b = &self.bounds;
        let paced = self
            .service_seconds()
            .map_or(self.level, |d| self.level.min(PACE_GAIN * self.rate() * d));
        paced.clamp(b.min_inflight, b.max_inflight.max(b.min_inflight))
    }

    /// The heavy requests' service time, seconds, as the apiserver serves
    /// them unloaded: the shortest time per byte of the last completions,
    /// at their byte-weighted mean size. The shortest, as BBR takes the
    /// minimum round trip for its bandwidth-delay product: a LIST slowed
    /// by the load must not widen the in-flight budget (with the mean, two
    /// real-apiserver runs stepped into two LISTs at once as the LISTs
    /// slowed, and missed the target by 1.3 and 1.6 ms). `None`: none
    /// completed yet.
    pub fn service_seconds(&self) -> Option<f64> {
        let (bytes, squares, per_byte) = self.services.iter().fold(
            (0.0, 0.0, f64::INFINITY),
            |(bytes, squares, per_byte), &(b, took)| {
                (bytes + b, squares + b * b, f64::min(per_byte, took / b))
            },
        );
        (bytes > 0.0).then(|| per_byte * squares / bytes)
    }

    /// A heavy request of predicted cost `bytes` was served whole in
    /// `took`, from admission.
    pub fn note_service(&mut self, bytes: f64, took: Duration) {
        if !(bytes.is_finite() && bytes > 0.0) {
            return;
        }
        if self.services.len() == SERVICE_SAMPLES {
            self.services.pop_front();
        }
        self.services.push_back((bytes, took.as_secs_f64()));
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// When the level was last cut (or a step undone).
    pub fn last_decrease(&self) -> Option<Instant> {
        self.last_decrease
    }

    pub fn last_action(&self) -> Action {
        self.last_action
    }

    /// New bounds (a reload, cluster-size scaling): the level is clamped.
    pub fn set_bounds(&mut self, bounds: Bounds) {
        self.bounds = bounds;
        let (lo, hi) = self.range();
        self.level = self.level.clamp(lo, hi);
    }

    /// A heavy request admitted at `admitted_at` completed (its response
    /// was sent whole): evidence that a change before it has shown.
    pub fn note_completion(&mut self, admitted_at: Instant) {
        if admitted_at >= self.changed_at {
            self.completions += 1;
        }
    }

    fn change(&mut self, level: f64, now: Instant) {
        self.one_request = false;
        self.multiplied = false;
        let (lo, hi) = self.range();
        self.level = level.clamp(lo, hi);
        self.changed_at = now;
        self.evidence_since = now;
        self.completions = 0;
        self.peak = 0.0;
        self.waiting = 0.0;
    }

    /// Bytes in use: the peak in flight, or the admitted rate turned into
    /// a level, whichever is larger.
    fn used(&self) -> f64 {
        let admitted: f64 = self.admissions.iter().map(|a| a.1).sum();
        let per_second = admitted / USE_WINDOW.as_secs_f64();
        self.peak.max(per_second * self.turnover())
    }

    /// One step at `now`.
    pub fn step(&mut self, o: &Observation, now: Instant) -> Action {
        self.admissions.push_back((now, o.admitted.max(0.0)));
        while self.admissions.len() > MAX_ADMISSIONS
            || self
                .admissions
                .front()
                .is_some_and(|a| now.saturating_duration_since(a.0) > USE_WINDOW)
        {
            self.admissions.pop_front();
        }
        self.peak = self.peak.max(o.inflight_peak).max(o.inflight_used);
        self.waiting = self.waiting.max(o.waiting);
        if self.last_decrease.is_some()
            && self.drained_at.is_none()
            && o.inflight_used <= self.inflight()
        {
            self.drained_at = Some(now);
        }
        let action = self.decide(o, now);
        self.last_action = action;
        action
    }

    fn decide(&mut self, o: &Observation, now: Instant) -> Action {
        let signal_ratio = o
            .p99
            .map(|p| p.as_secs_f64() / (o.target.as_secs_f64() * SET_POINT).max(1e-9));
        let error_ratio = (o.upstream_errors > 0).then_some(ERROR_RATIO);
        let ratio = match (signal_ratio, error_ratio) {
            (Some(s), Some(e)) => Some(s.max(e)),
            (s, e) => s.or(e),
        };
        let Some(ratio) = ratio else {
            self.evidence_since = now;
            return Action::HoldNoSignal;
        };
        let busy = self.peak > 0.0 || o.inflight_count > 0;
        // The tail's share of its budget; unknown counts as spent, so
        // that the short window decides alone.
        let spent = o.tail.map(|t| t.share() / TAIL_BUDGET);
        // How fast it is spent now, at the level in force.
        let burn = o.tail.map(|t| t.burn_share() / TAIL_BUDGET);
        if ratio > 1.0 {
            self.evidence_since = now;
            if !busy {
                // Not ours to fix: nothing heavy was running.
                return Action::HoldIdle;
            }
            // Within the budget, and spending it slower than it allows.
            let spike = o.upstream_errors == 0
                && spent.is_some_and(|s| s <= 1.0)
                && burn.is_some_and(|b| b <= CUT_BURN);
            // Just after a slow-start or recovery multiplication a spike is
            // the likeliest onset of what the step let in: the step is
            // undone (an overload that goes on overspends the budget within
            // a second or two, and is cut).
            if spike && self.multiplied {
                return self.undo_step(o, now);
            }
            if spike {
                return Action::HoldSpike;
            }
            return self.decrease((1.0 / ratio).clamp(CUT_RANGE.0, CUT_RANGE.1), o, now);
        }
        if let Some(spent) = spent.filter(|s| *s > 1.0) {
            self.evidence_since = now;
            let recent_cut = self
                .last_decrease
                .is_some_and(|d| now.saturating_duration_since(d) < TAIL_WINDOW / 2);
            if busy && !recent_cut {
                return self.decrease((1.0 / spent).clamp(CUT_RANGE.0, CUT_RANGE.1), o, now);
            }
            return Action::HoldBand;
        }
        let in_band = ratio > HEADROOM / SET_POINT;
        if o.upstream_errors > 0 || in_band || burn.is_some_and(|b| b > GROW_BURN) {
            self.evidence_since = now;
            // The heartbeats feel the level: slow start ends here, as
            // HyStart ends TCP's on a rising delay before any loss, and
            // the level is probed as near an edge. (Not at one request at
            // a time: that request is heavy, the edge is not found.)
            if in_band && busy && self.phase == Phase::SlowStart && !self.one_request {
                self.phase = Phase::Steady;
                self.edge = self.level;
            }
            return Action::HoldBand;
        }
        if self.waiting <= 0.0 {
            return Action::HoldIdle;
        }
        let (_, hi) = self.range();
        // Under one waiting request's size the level only slows that
        // request (it runs alone): the next step up is one request at a
        // time. (A tenth under it is near enough: predictions drift.)
        let one_request = self.level < 0.9 * self.waiting.min(hi);
        // A cold start to one request has nothing to watch yet. After a
        // cut it has: back to one request on evidence, as any increase (on
        // the simulator, each LIST's pause at one request at a time cut
        // the level, and an increase without evidence put it back two
        // seconds later, so the cut never slowed the LISTs).
        if !(one_request && self.phase == Phase::SlowStart && self.decreases == 0) {
            let near_edge = self.edge > 0.0
                && self.level >= self.edge * RECOVERY
                && self.level < self.edge * SLOW_START_GROWTH;
            let evidence = if self.phase == Phase::Steady && near_edge {
                EDGE_EVIDENCE
            } else if self.phase == Phase::SlowStart && ratio < FAST_BELOW {
                FAST_EVIDENCE
            } else {
                EVIDENCE
            };
            let watched = now.saturating_duration_since(self.evidence_since) >= evidence;
            // Only a request admitted under the new level can show what it
            // does; an idle lane shows nothing (a level doubled while nothing
            // could run opened the gate wide on the real apiserver).
            let shown =
                self.completions > 0 || now.saturating_duration_since(self.changed_at) >= MAX_HOLD;
            if !(watched && shown) {
                return Action::HoldEvidence;
            }
        }
        if one_request {
            self.change(self.waiting, now);
            self.one_request = true;
            self.increases += 1;
            return Action::Increase;
        }
        if self.level >= hi {
            return Action::HoldBound;
        }
        // One slow-start step past the last edge without a decrease: that
        // edge was not the apiserver's; probe fast again.
        if self.phase == Phase::Steady
            && self.edge > 0.0
            && self.level >= self.edge * SLOW_START_GROWTH
        {
            self.phase = Phase::SlowStart;
            self.edge = 0.0;
        }
        let level = match self.phase {
            // As HyStart++ grows TCP's window fast until the delay rises,
            // then carefully: an apiserver that takes every LIST offered
            // (its heartbeats at 3-10 ms) took 40 s of ×1.3 steps to
            // reach, half of a minute's LISTs refused.
            Phase::SlowStart if ratio < FAST_BELOW => self.level * FAST_GROWTH,
            Phase::SlowStart => self.level * SLOW_START_GROWTH,
            // Recovery: the slow-start step, but not past `recover_to`.
            Phase::Steady if self.level < self.recover_to => (self.level * SLOW_START_GROWTH)
                .min(self.recover_to)
                .max(self.level * GROWTH),
            Phase::Steady => self.level * GROWTH,
        };
        // A step larger than the probe's: a spike right after it undoes it.
        let multiplied = level > self.level * GROWTH * 1.000_001;
        // Two multiplications back to back: a spike after the second may
        // be the first's doing (the real apiserver answers a step 3–5 s
        // late, one step's evidence is 4 s), so an undo takes back both.
        let before = self.level;
        let undo_to = if self.multiplied {
            self.before_step
        } else {
            before
        };
        self.change(level, now);
        self.multiplied = multiplied;
        self.before_step = before;
        self.undo_to = undo_to;
        self.increases += 1;
        Action::Increase
    }

    /// Cut the level by `cut` (of what is used), unless the last cut has
    /// not shown yet or the level is at its minimum.
    fn decrease(&mut self, cut: f64, o: &Observation, now: Instant) -> Action {
        let held = self.last_decrease.is_some_and(|d| {
            let drained = self
                .drained_at
                .is_some_and(|t| now.saturating_duration_since(t) >= HOLD_AFTER_DRAIN);
            !drained && now.saturating_duration_since(d) < MAX_HOLD
        });
        if held {
            return Action::HoldDraining;
        }
        let (lo, _) = self.range();
        if self.level <= lo {
            return Action::HoldBound;
        }
        let in_use = self.level.min(self.used());
        let level = in_use * cut;
        self.recover_to = in_use * RECOVERY;
        self.edge = in_use;
        // A first cut at one request at a time says that request was heavy
        // (the first LIST from a cold etcd always is), not where the
        // budget's edge is: slow start goes on.
        if !(self.one_request && self.decreases == 0) {
            self.phase = Phase::Steady;
        }
        self.change(level, now);
        self.last_decrease = Some(now);
        self.drained_at = (o.inflight_used <= self.inflight()).then_some(now);
        self.decreases += 1;
        Action::Decrease
    }

    /// Back to the level before the last multiplication (before the last
    /// two, when they came back to back): the step found the edge.
    fn undo_step(&mut self, o: &Observation, now: Instant) -> Action {
        // Slow start goes on, from the level undone to, until a step
        // is undone at (or under) the level a step was undone at before:
        // the real apiserver pauses now and then whatever the load (one
        // pause right after the step to 99 MB ended slow start there, and
        // the run served 33 LISTs a minute against the best static pool's
        // 81), but the same edge twice is the apiserver's.
        if self.edge > 0.0 && self.level <= self.edge * 1.000_001 {
            self.phase = Phase::Steady;
        }
        self.recover_to = 0.0;
        self.edge = self.level;
        self.change(self.undo_to, now);
        self.last_decrease = Some(now);
        self.drained_at = (o.inflight_used <= self.inflight()).then_some(now);
        self.decreases += 1;
        Action::Decrease
    }

    pub fn view(&self, now: Instant) -> ControllerView {
        ControllerView {
            level_bytes: self.level,
            bytes_per_second: self.rate(),
            inflight_bytes: self.inflight(),
            service_seconds: self.service_seconds(),
            phase: self.phase,
            last_action: self.last_action,
            seconds_since_change: now.saturating_duration_since(self.changed_at).as_secs_f64(),
            seconds_since_decrease: self
                .last_decrease
                .map(|d| now.saturating_duration_since(d).as_secs_f64()),
            increases: self.increases,
            decreases: self.decreases,
        }
    }
}

#[cfg(test)]
#[path = "adaptive_tests.rs"]
mod tests;
