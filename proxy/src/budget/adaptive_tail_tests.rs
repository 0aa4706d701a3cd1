//! The adaptive controller and the tail's error budget: pauses the budget
//! absorbs, spending that stops growth or cuts.

use super::*;

/// A tail whose minute has `minute_slow` of 1,200 slow and whose last 20 s
/// (400 samples) `recent_slow`.
fn burning(minute_slow: usize, recent_slow: usize) -> Option<Tail> {
    Some(Tail {
        recent_samples: 400,
        recent_span: Duration::from_secs(20),
        recent_slow,
        ..tail(minute_slow).expect("a tail")
    })
}

#[test]
fn a_pause_the_minutes_tail_absorbs_cuts_nothing() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    let grown = three_increases(&mut c, t0);
    // 170 ms in the short window, 3 of the minute's 1,200 heartbeats slow,
    // right after a slow-start step: the step is undone, with the one
    // before it as they came back to back (the likeliest
    // onset of what it let in).
    let pause = Observation {
        tail: tail(3),
        ..obs(Some(170), grown, 2, true)
    };
    assert_eq!(c.step(&pause, t0 + ms(12_500)), Action::Decrease);
    assert_eq!(c.phase(), Phase::SlowStart, "a first step undone");
    let level = c.level();
    assert!((level - grown / SLOW_START_GROWTH / SLOW_START_GROWTH).abs() < 1.0);
    // Any other time, the tail absorbs it (once the cut has drained).
    let t0 = t0 + ms(12_500) + MAX_HOLD;
    assert_eq!(c.step(&pause, t0 + ms(12_500)), Action::HoldSpike);
    assert_eq!(c.level(), level);
    // The same with the tail's budget spent five times over: an overload,
    // cut by half.
    let overload = Observation {
        tail: tail(60),
        ..obs(Some(170), level, 2, true)
    };
    assert_eq!(c.step(&overload, t0 + ms(13_000)), Action::Decrease);
    let floor = c.range().0;
    assert!(level / 2.0 < floor, "this cut reaches the floor");
    assert_eq!(c.level(), floor);
}

#[test]
fn the_tail_stops_growth_and_cuts_once_when_spent() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    let level = three_increases(&mut c, t0);
    // The short window healthy, but 10 of 1,200 slow (0.83%, over
    // GROW_BURN of the 1% budget): no growth.
    c.note_completion(t0 + ms(12_100));
    let ten = Observation {
        tail: tail(10),
        ..obs(Some(10), level, 1, true)
    };
    assert_eq!(c.step(&ten, t0 + ms(14_000)), Action::HoldBand);
    assert_eq!(c.level(), level);
    // 15 of 1,200 (1.25%, 1.25 budgets): cut by 1/1.25, from what is used.
    let fifteen = Observation {
        tail: tail(15),
        ..obs(Some(10), level, 1, true)
    };
    assert_eq!(c.step(&fifteen, t0 + ms(15_000)), Action::Decrease);
    assert!((c.level() - level * 0.8).abs() < 1.0);
    assert_eq!(c.phase(), Phase::Steady);
    // The tail still holds the samples from before the cut: no second cut
    // for half a window, however drained.
    for s in 1..30 {
        let o = Observation {
            tail: tail(15),
            ..obs(Some(10), 0.0, 0, true)
        };
        assert_eq!(c.step(&o, t0 + ms(15_000 + s * 1000)), Action::HoldBand);
    }
    let o = Observation {
        tail: tail(15),
        ..obs(Some(10), 0.0, 1, true)
    };
    assert_eq!(c.step(&o, t0 + ms(45_500)), Action::Decrease);
    // Under GROW_BURN of the budget (9 of 1,200), with evidence: growth again.
    c.note_completion(t0 + ms(46_000));
    let nine = Observation {
        tail: tail(9),
        ..obs(Some(10), 0.0, 0, true)
    };
    assert_eq!(c.step(&nine, t0 + ms(49_500)), Action::Increase);
}

#[test]
fn growth_follows_the_budget_spent_now_not_the_minutes_old_samples() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    let level = three_increases(&mut c, t0);
    c.note_completion(t0 + ms(12_100));
    // The minute at 11 of 1,200 (within its budget, over GROW_BURN), but
    // of the last 20 s's 400 only 2 slow (0.5%): the level cut since spends
    // half the budget; it may grow.
    let minute_high_now_low = Observation {
        tail: burning(11, 2),
        ..obs(Some(10), level, 1, true)
    };
    assert_eq!(
        c.step(&minute_high_now_low, t0 + ms(16_000)),
        Action::Increase
    );
    // The other way round: a quiet minute, but 4 of the last 400 slow
    // (1%, spent as fast as it allows): no growth…
    c.note_completion(t0 + ms(16_100));
    let minute_low_now_high = Observation {
        tail: burning(4, 4),
        ..obs(Some(10), level, 1, true)
    };
    assert_eq!(
        c.step(&minute_low_now_high, t0 + ms(20_500)),
        Action::HoldBand
    );
}

#[test]
fn a_spike_cuts_only_while_the_budget_is_spent_faster_than_it_allows() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    // One request at a time (a step that multiplies nothing).
    assert_eq!(c.step(&waiting(33.0 * MB), t0 + ms(500)), Action::Increase);
    let spike = |recent_slow| Observation {
        tail: burning(4, recent_slow),
        ..obs(Some(45), 33.0 * MB, 1, true)
    };
    // 3 of the last 400 slow (0.75%): a pause the budget absorbs.
    assert_eq!(c.step(&spike(3), t0 + ms(3000)), Action::HoldSpike);
    // 4 of 400 (1%): the whole budget's rate, over CUT_BURN of it; cut
    // (at one LIST at a time on the simulator, each LIST's pause held the
    // burn right at 1 and the run's p99 at the target, a hair either side).
    assert_eq!(c.step(&spike(4), t0 + ms(3500)), Action::Decrease);
}

#[test]
fn a_spike_at_one_request_at_a_time_is_left_to_the_tail() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    // A 62 MB LIST waits: the level steps to it (one at a time), in slow start.
    let waiting = Observation {
        waiting: 62.0 * MB,
        tail: tail(4),
        ..obs(Some(10), 0.0, 0, false)
    };
    assert_eq!(c.step(&waiting, t0 + ms(500)), Action::Increase);
    assert_eq!(c.phase(), Phase::SlowStart);
    // Its pause slows a few heartbeats: the minute's tail has room for it.
    let pause = Observation {
        waiting: 62.0 * MB,
        tail: tail(6),
        ..obs(Some(70), 62.0 * MB, 1, false)
    };
    assert_eq!(c.step(&pause, t0 + ms(2500)), Action::HoldSpike);
    assert_eq!(c.level(), 62.0 * MB);
}
