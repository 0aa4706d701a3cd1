//! The demo's short search for the best static pool: what a hand-tuned fixed budget serves on
//! this control plane, for the adaptive default's goodput to be compared with.
//!
//! A full search (bench/scripts/goodput.sh bisects on log(rate)) costs a run per step; the demo
//! has time for two or three. So: a first pool from what bench/RESULTS.md measured on this
//! model (20 MB/s served ~8 LISTs/min of 30,000 pods at a heartbeat p99 of 41–71 ms, the edge
//! of a 50 ms target), then double it while it meets the target and halve it while it does
//! not. The best is the pool within the target that served the most; with so few steps it is
//! a lower bound of the best static pool, and the report says how many pools were tried.

/// One static pool tried: its rate, whether its run met the target, and its goodput.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tried {
    pub bytes_per_second: u64,
    pub within_target: bool,
    pub lists_per_minute: f64,
}

/// The next pool to try, or none when `tries` pools have run.
pub fn next(first: u64, tries: usize, tried: &[Tried]) -> Option<u64> {
    if tried.len() >= tries {
        return None;
    }
    let Some(last) = tried.last() else {
        return Some(first);
    };
    let next = if last.within_target {
        // Above the best passing pool, below the least failing one.
        let cap = tried
            .iter()
            .filter(|t| !t.within_target)
            .map(|t| t.bytes_per_second)
            .min();
        let up = last.bytes_per_second.saturating_mul(2);
        match cap {
            Some(c) if up >= c => geometric_mean(last.bytes_per_second, c),
            _ => up,
        }
    } else {
        let floor = tried
            .iter()
            .filter(|t| t.within_target)
            .map(|t| t.bytes_per_second)
            .max();
        let down = last.bytes_per_second / 2;
        match floor {
            Some(f) if down <= f => geometric_mean(f, last.bytes_per_second),
            _ => down,
        }
    };
    (!tried.iter().any(|t| t.bytes_per_second == next) && next > 0).then_some(next)
}

fn geometric_mean(a: u64, b: u64) -> u64 {
    ((a as f64) * (b as f64)).sqrt().round() as u64
}

/// The pool within the target that served the most (the lower rate on a tie).
pub fn best(tried: &[Tried]) -> Option<Tried> {
    tried
        .iter()
        .filter(|t| t.within_target)
        .copied()
        .reduce(|a, b| {
            if b.lists_per_minute > a.lists_per_minute
                || (b.lists_per_minute == a.lists_per_minute
                    && b.bytes_per_second < a.bytes_per_second)
            {
                b
            } else {
                a
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(rate: u64, ok: bool, served: f64) -> Tried {
        Tried {
            bytes_per_second: rate,
            within_target: ok,
            lists_per_minute: served,
        }
    }

    #[test]
    fn doubles_while_within_the_target_and_halves_while_not() {
        assert_eq!(next(20, 3, &[]), Some(20));
        assert_eq!(next(20, 3, &[t(20, true, 8.0)]), Some(40));
        assert_eq!(next(20, 3, &[t(20, false, 8.0)]), Some(10));
        // Between a pass and a fail: their geometric mean.
        assert_eq!(
            next(20, 3, &[t(20, true, 8.0), t(40, false, 15.0)]),
            Some(28)
        );
        assert_eq!(
            next(20, 3, &[t(20, false, 8.0), t(10, true, 4.0)]),
            Some(14)
        );
        assert_eq!(next(20, 2, &[t(20, true, 8.0), t(40, true, 15.0)]), None);
    }

    #[test]
    fn the_best_is_the_most_served_within_the_target() {
        let tried = [t(20, true, 8.0), t(40, false, 15.0), t(28, true, 11.0)];
        assert_eq!(best(&tried), Some(t(28, true, 11.0)));
        assert_eq!(best(&[t(20, false, 8.0)]), None);
        assert_eq!(
            best(&[t(40, true, 8.0), t(20, true, 8.0)]),
            Some(t(20, true, 8.0))
        );
    }
}
