//! The adaptive budget's controller: it moves the heavy lane's bytes/s rate
//! and bytes-in-flight budget toward the largest values that keep the
//! protected lanes' p99 (see [`super::signal`]) within the target. Pure:
//! time and observations are passed in.
//!
//! ## One level, two outputs
//! The controller steers one number, the *level* `L` in bytes: what the
//! heavy lane may hold at once. The in-flight budget is `L` and the pool's
//! rate lets `L` be admitted every [`TURNOVER`] (4 s, the default static
//! pool's burst over its rate), each clamped to its own bounds:
//! `inflight = clamp(L, minInflight, maxInflight)`,
//! `rate = clamp(L / 4 s, minBytesPerSecond, maxBytesPerSecond)`.
//! Long LISTs are held back by the in-flight budget (a dozen 33 MB LISTs at
//! once wrecked the heartbeats); short ones by the rate, which spreads them
//! out (the same dozen spread over a minute did not). Below one large
//! request's size the in-flight budget admits it alone and the rate keeps
//! falling, down to `minBytesPerSecond`: slower, never starved.
//!
//! ## Why not AIMD, a gradient or Vegas as they are
//! All three adapt a request count from the latency of the requests they
//! limit, sampled per request. Here the signal is another lane's latency,
//! and it answers late: a decrease takes effect only when the LISTs admitted
//! before it have ended, seconds later.
//! - *Gradient* (Envoy, Gradient2: `limit·(target/sample)` each window)
//!   re-decides every window; with a delayed response it cuts again and
//!   again for the same overload (and Envoy's periodic forced minimum to
//!   re-measure its baseline would stall every LIST for seconds). We keep
//!   its idea that the size of a cut follows how far over the target the
//!   signal is: `f = clamp(SET_POINT·target/p99, 0.5, 0.9)`.
//! - *AIMD* (concurrency-limits' `AIMDLimit`: `+1` while used, `×0.9` on a
//!   drop) has the right shape and a guard against growing while unused,
//!   which we keep: the level grows only while heavy requests waited for
//!   it. Its additive step is for fairness between competing flows; we
//!   have one flow per apiserver, and bytes span five orders of magnitude,
//!   so our increases are proportional.
//! - *Vegas* (`VegasLimit`: grow while the estimated queue is small, shrink
//!   when large, hold between) gives the band we keep: between
//!   [`HEADROOM`]·target and [`SET_POINT`]·target, the level holds, so it
//!   does not probe right at the edge.
//!
//! ## Why the set point is under the target
//! The target is a p99 over minutes of heartbeats; the controller sees a
//! p99 over seconds, and learns it was too high only after the fact. Each
//! probe that crosses its threshold costs a second or two of slow
//! heartbeats, and 1% of a minute's heartbeats is 0.6 s. So it cuts at
//! `SET_POINT` (0.7) of the target, not at the target, and grows only
//! under `HEADROOM` (0.6): probes that overshoot its threshold mostly stay
//! under the target. On the real apiserver, cutting at the target missed
//! it (run p99s of 58–62 ms against 50), and cutting at 0.8 of it still
//! missed by a hair on the real apiserver and the simulator alike (50.9
//! and 51.7 ms against 50) while serving more than the best static pool. The other side of the trade is
//! noise: a single pause of the apiserver slows two or three heartbeats at
//! once, which the signal's estimate ignores (never the two largest
//! samples), so it does not cut for it; bench/RESULTS.md has the runs.
//!
//! ## The rules
//! Every `intervalSeconds` the controller gets the signal, the target and
//! what the heavy lane did since the last step.
//! - **Decrease** when the p99 is over `SET_POINT`·target (or the apiserver answered
//!   429/5xx) while heavy requests were in flight: `L = max(min, min(L,
//!   used)·f)`, where `used` is the larger of the peak bytes in flight and
//!   the bytes admitted over the last [`USE_WINDOW`] times `TURNOVER`, so a
//!   level inflated while idle is cut to what is used. Then **hold**: no
//!   further decrease until the bytes in flight have fallen under the new
//!   budget and a signal window ([`HOLD_AFTER_DRAIN`]) has passed, or
//!   [`MAX_HOLD`] in any case — until then the p99 still reflects LISTs
//!   admitted before the cut.
//! - **Increase** when, for at least [`MIN_EVIDENCE`] (in slow start; after
//!   it [`STEADY_EVIDENCE`], 4 s) since the last change
//!   (and since the p99 was last in the band), the p99 stayed under
//!   `HEADROOM`·target, no 429/5xx came back, heavy requests waited for the
//!   budget, and the last change could show: a request admitted after it
//!   has completed, or `MAX_HOLD` passed. An idle lane shows nothing: on
//!   the real apiserver a level that doubled while every LIST waited for
//!   the rate opened the gate to a dozen LISTs at once.
//!   A cold start begins at one request at a time: a level under the
//!   largest waiting request's predicted cost only slows that request (it
//!   runs alone), so the level goes to that cost as soon as one waits.
//!   Then, in slow start, it grows by [`SLOW_START_GROWTH`] (×1.3, not ×2:
//!   the heartbeats feel a rise only seconds later, when the LISTs it let
//!   in are being encoded, and on the real apiserver doubling had reached
//!   the maximum, a dozen LISTs in flight, before the first slow heartbeat
//!   came back). Slow start ends at the first decrease (but for one at one
//!   request at a time: the first LIST from a cold etcd pauses the
//!   apiserver whatever the budget); after it the level
//!   grows by [`GROWTH`] (×1.125: a halving is regained in six steps), but
//!   a level cut under one waiting request steps back up to that request
//!   in one increase (with the same evidence as any other): in between, the
//!   request runs alone anyway, only later, and ×1.125 steps from a few
//!   MB to a 76 MB LIST took a minute of 429s.
//! - **Recovery** after a decrease, as TCP CUBIC regains its window: the
//!   level in use when the heartbeats went slow was near what the apiserver
//!   takes, so while the level is under [`RECOVERY`] (0.8) of it, growth
//!   is the slow-start step (×1.3), and only past it the ×1.125 probe. A
//!   cut by half is regained to 0.8 in two steps instead of four, each on
//!   the same evidence as any increase. On the real apiserver one pause cut
//!   the level from 168 to 65 MB early in a run, and ×1.125 steps did not
//!   climb back to the ~150 MB it took until the run's last seconds: 40 to
//!   52 LISTs a minute where other runs served 90.
//! - **Back to slow start** once the level has grown one slow-start step
//!   (×1.3) past the level in use at the last decrease without another:
//!   that edge was a pause, not the apiserver's limit. On the real
//!   apiserver one spike right after the step to 99 MB ended slow start
//!   there, and ×1.125 steps took the rest of the run to reach the
//!   ~400 MB it took (37 LISTs a minute against the best static pool's 81).
//! - **Hold** otherwise: no signal (too few protected requests), idle, or
//!   in the band.
//!
//! ## The tail: the target's own 1%
//! The short window steers fast; whether the target holds is decided over
//! the minute (see [`super::signal`]'s tail): the share of protected
//! requests over the target, against a budget of 0.8% ([`TAIL_BUDGET`]:
//! of the 1% a p99 allows, what tollgate's view of the latency leaves for
//! the clients' own). It enters the rules three ways.
//! - A short window over the set point cuts only if the tail has spent
//!   more than `SET_POINT` of its budget: one pause of the apiserver that
//!   slowed three heartbeats of a healthy minute is what the 1% is for
//!   (on the simulator, at one LIST at a time, each LIST's pause cut the
//!   level and the next step put it back, every 2.5 s). In an overload
//!   every heartbeat is slow, and the budget is spent within a second or
//!   so. But right after a slow-start (or recovery) multiplication a spike
//!   is the likeliest onset of what the step let in (on the real apiserver
//!   the heartbeats' median tripled over the 3 s the tail took to fill
//!   after one): over the target it cuts; within it, the step is undone —
//!   the level before it had shown healthy, and a cut of what is in use
//!   (which lags a growing level) halved the level there, costing half
//!   the run's LISTs while ×1.125 steps climbed back.
//! - Growth needs the tail under `HEADROOM` of its budget too. On the
//!   simulator each LIST slowed one or two heartbeats, which the short
//!   window never shows; the level grew until fifteen LISTs a minute put
//!   the run's p99 at the target's edge (45–55 ms against 50).
//! - A tail over its whole budget cuts by `clamp(budget/share, 0.5, 0.9)`
//!   even with the short window healthy, at most once per half
//!   [`super::signal::TAIL_WINDOW`] (the tail still holds the samples from
//!   before the last cut for that long).
//!
//! With too few protected requests for a 1% tail
//! ([`super::signal::TAIL_MIN_SAMPLES`] a minute), the short window
//! decides alone, as before.
//!
//! Properties (tested): the level and both outputs stay within their
//! bounds whatever is observed; a sustained violation with heavy requests
//! in flight drives the level down to its minimum; after it ends, demand
//! with a healthy signal brings the level back to its maximum.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::settings::Bounds;
use super::signal::{Tail, TAIL_WINDOW};

/// The rate lets the in-flight level turn over once in this time.
pub const TURNOVER: Duration = Duration::from_secs(4);
/// Over this share of the target the level is cut…
pub const SET_POINT: f64 = 0.7;
/// …and under this share it may grow; between them it holds.
pub const HEADROOM: f64 = 0.6;
/// The least time a change is watched before the next increase in slow
/// start (the signal's shortest window)…
pub const MIN_EVIDENCE: Duration = super::signal::MIN_WINDOW;
/// …and after it: one turnover of the level, the time the rate takes to
/// admit what the level holds. Past slow start the level is near the
/// apiserver's edge, where the real apiserver answers a step 3–5 s late
/// (its heap grows with what it holds); ×1.125 every 2 s stepped past the
/// edge before the first step's slow heartbeats came back.
pub const STEADY_EVIDENCE: Duration = TURNOVER;
/// After a decrease has drained, the time before another may follow.
pub const HOLD_AFTER_DRAIN: Duration = super::signal::MIN_WINDOW;
/// The longest a decrease holds off the next, drained or not.
pub const MAX_HOLD: Duration = Duration::from_secs(30);
/// Growth per increase in slow start (and in recovery)…
pub const SLOW_START_GROWTH: f64 = 1.3;
/// …and after it.
pub const GROWTH: f64 = 1.125;
/// After a decrease, growth is the slow-start step up to this share of the
/// level in use at the cut.
pub const RECOVERY: f64 = 0.8;
/// Admitted bytes are summed over this long to measure use.
pub const USE_WINDOW: Duration = Duration::from_secs(10);
/// The share of protected requests over the target the controller allows:
/// 0.8%, not the whole 1% a p99 lets be slower, since the clients see more
/// slow requests than tollgate does (their own queueing and tollgate's
/// write path are not in the latency it measures, request to response
/// headers): in two real-apiserver runs tollgate counted 5 and 8 slow
/// heartbeats in a minute where the clients' p99 put at least 12 over.
pub const TAIL_BUDGET: f64 = 0.008;
/// The smallest and largest cut.
const CUT_RANGE: (f64, f64) = (0.5, 0.9);
/// How far over the target a 429/5xx from the apiserver counts.
const ERROR_RATIO: f64 = 1.5;
/// Per-step admission records kept (USE_WINDOW at the fastest interval).
const MAX_ADMISSIONS: usize = 256;

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
    /// Between `HEADROOM`·target and `SET_POINT`·target, or the tail
    /// between `HEADROOM` and all of its budget.
    HoldBand,
    /// The short window over the set point, but the tail within its
    /// budget: a pause the target's 1% absorbs.
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
    /// The level in use at the last decrease (0: none yet).
    edge: f64,
    /// After a decrease: when the bytes in flight fell under the budget.
    drained_at: Option<Instant>,
    /// Peak bytes in flight since the last change.
    peak: f64,
    /// The largest cost that waited since the last change.
    waiting: f64,
    /// `(step time, bytes admitted)` over `USE_WINDOW`.
    admissions: VecDeque<(Instant, f64)>,
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
            edge: 0.0,
            drained_at: None,
            peak: 0.0,
            waiting: 0.0,
            admissions: VecDeque::new(),
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
        (self.level / TURNOVER.as_secs_f64()).clamp(b.min_rate, b.max_rate.max(b.min_rate))
    }

    /// The in-flight budget, bytes.
    pub fn inflight(&self) -> f64 {
        let b = &self.bounds;
        self.level
            .clamp(b.min_inflight, b.max_inflight.max(b.min_inflight))
    }

    pub fn phase(&self) -> Phase {
        self.phase
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
        self.peak.max(per_second * TURNOVER.as_secs_f64())
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
        if ratio > 1.0 {
            self.evidence_since = now;
            if !busy {
                // Not ours to fix: nothing heavy was running.
                return Action::HoldIdle;
            }
            let spike = o.upstream_errors == 0 && spent.is_some_and(|s| s <= SET_POINT);
            if spike && !self.multiplied {
                return Action::HoldSpike;
            }
            // Just after a slow-start or recovery multiplication a spike is the likeliest
            // onset of the overload it let in, and waiting for the tail to
            // fill costs seconds of slow heartbeats. Still within the target,
            // the step is undone; over it, cut.
            if spike && ratio <= 1.0 / SET_POINT {
                return self.undo_step(o, now);
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
        if o.upstream_errors > 0
            || ratio > HEADROOM / SET_POINT
            || spent.is_some_and(|s| s > HEADROOM)
        {
            self.evidence_since = now;
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
        // A cold start to one request has nothing to watch yet.
        if !(one_request && self.phase == Phase::SlowStart) {
            let evidence = match self.phase {
                Phase::SlowStart => MIN_EVIDENCE,
                Phase::Steady => STEADY_EVIDENCE,
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
            Phase::SlowStart => self.level * SLOW_START_GROWTH,
            // Recovery: the slow-start step, but not past `recover_to`.
            Phase::Steady if self.level < self.recover_to => (self.level * SLOW_START_GROWTH)
                .min(self.recover_to)
                .max(self.level * GROWTH),
            Phase::Steady => self.level * GROWTH,
        };
        // A step larger than the probe's: a spike right after it cuts.
        let multiplied = level > self.level * GROWTH * 1.000_001;
        let before = self.level;
        self.change(level, now);
        self.multiplied = multiplied;
        self.before_step = before;
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
        // A cut at one request at a time says that request was heavy
        // (the first LIST from a cold etcd always is), not where the
        // budget's edge is: slow start goes on.
        if !self.one_request {
            self.phase = Phase::Steady;
        }
        self.change(level, now);
        self.last_decrease = Some(now);
        self.drained_at = (o.inflight_used <= self.inflight()).then_some(now);
        self.decreases += 1;
        Action::Decrease
    }

    /// Back to the level before the last multiplication, which had shown
    /// healthy, and out of slow start (but at one request at a time): the
    /// step found the edge.
    fn undo_step(&mut self, o: &Observation, now: Instant) -> Action {
        if !self.one_request {
            self.phase = Phase::Steady;
        }
        self.recover_to = 0.0;
        self.edge = self.level;
        self.change(self.before_step, now);
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
