//! The demo's claims and their targets: heartbeat PATCH p99 against the baseline on the same
//! path, and the protected run's goodput against the best static pool tried.

use serde::{Deserialize, Serialize};

use super::runs::Headline;
use crate::report::{fmt, Table};

/// The target every run's heartbeats are held to is tollgate's default adaptive target:
/// PATCH p99 ≤ max(this × the baseline through tollgate, [`TARGET_FLOOR_MS`]), with no heartbeat
/// failing and no apiserver crash.
pub const TARGET_BASELINE_MULTIPLE: f64 = 2.0;
pub const TARGET_FLOOR_MS: f64 = 50.0;
/// The unprotected run must be at least this multiple of the direct baseline (or crash).
pub const UNPROTECTED_TARGET: f64 = 10.0;
/// The protected run must serve at least this fraction of the best static pool's goodput.
pub const GOODPUT_TARGET: f64 = 0.8;

/// The heartbeat PATCH p99 target in ms, from the baseline through tollgate's p99.
pub fn target_ms(baseline_tollgate_p99: Option<f64>) -> Option<f64> {
    baseline_tollgate_p99.map(|b| (TARGET_BASELINE_MULTIPLE * b).max(TARGET_FLOOR_MS))
}

/// Sets each run's `within_target` against the target the baseline through tollgate gives.
pub fn judge(h: &mut [Headline]) {
    let target = target_ms(
        h.iter()
            .find(|x| x.run == "baseline-tollgate")
            .and_then(|x| x.patch_p99_ms),
    );
    for x in h {
        x.within_target = match (target, x.patch_p99_ms) {
            (Some(t), Some(p)) => Some(p <= t && x.heartbeat_failures == 0 && x.sim_crashes == 0),
            _ => None,
        };
    }
}

/// The demo's claims: heartbeat PATCH p99 ratios, each against the baseline that takes the same
/// path (tollgate's own cost is not charged to the storm, nor hidden from it), and the protected
/// run's goodput against the best static pool the demo tried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ratios {
    /// protected p99 / baseline-through-tollgate p99.
    pub protected_vs_tollgate_baseline: Option<f64>,
    /// The target as a ratio: [`target_ms`] / baseline-through-tollgate p99.
    pub protected_target: f64,
    /// [`target_ms`], when the baseline through tollgate has a p99.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protected_target_ms: Option<f64>,
    /// The protected run is within the target: p99 at most the target, no heartbeat failed,
    /// no crash (None: a p99 is missing).
    pub protected_met: Option<bool>,
    /// unprotected p99 / direct baseline p99.
    pub unprotected_vs_direct_baseline: Option<f64>,
    pub unprotected_target: f64,
    /// The unprotected run's apiserver crashed (the target is met either way then).
    pub unprotected_crashed: bool,
    pub unprotected_met: Option<bool>,
    /// baseline-through-tollgate p99 / direct baseline p99: what tollgate alone adds.
    pub tollgate_baseline_vs_direct: Option<f64>,
    /// Static pools the demo ran (runs `static-…`); 0: the best static pool was not measured.
    #[serde(default)]
    pub static_pools_tried: usize,
    /// The static pool run within the target that served the most LISTs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_static: Option<String>,
    /// protected LISTs served/min / the best static pool's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protected_vs_best_static: Option<f64>,
    #[serde(default = "goodput_target")]
    pub goodput_target: f64,
    /// `protected_vs_best_static >= goodput_target` and the protected run within the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput_met: Option<bool>,
}

fn goodput_target() -> f64 {
    GOODPUT_TARGET
}

impl Ratios {
    pub fn of(h: &[Headline]) -> Ratios {
        let get = |n: &str| h.iter().find(|x| x.run == n);
        let p99 = |n: &str| get(n).and_then(|x| x.patch_p99_ms);
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        let protected = ratio(p99("protected"), p99("baseline-tollgate"));
        let unprotected = ratio(p99("unprotected"), p99("baseline"));
        let crashed = get("unprotected").is_some_and(|u| u.sim_crashes > 0);
        let target = target_ms(p99("baseline-tollgate"));
        let statics: Vec<&Headline> = h.iter().filter(|x| x.run.starts_with("static-")).collect();
        let best = statics
            .iter()
            .filter(|x| x.within_target == Some(true))
            .max_by(|a, b| {
                a.lists_served_per_minute
                    .total_cmp(&b.lists_served_per_minute)
            });
        let protected_met = get("protected").and_then(|x| x.within_target);
        let vs_best = match (get("protected"), best) {
            (Some(p), Some(b)) if b.lists_served_per_minute > 0.0 => {
                Some(p.lists_served_per_minute / b.lists_served_per_minute)
            }
            _ => None,
        };
        Ratios {
            protected_vs_tollgate_baseline: protected,
            protected_target: ratio(target, p99("baseline-tollgate"))
                .unwrap_or(TARGET_BASELINE_MULTIPLE),
            protected_target_ms: target,
            protected_met,
            unprotected_vs_direct_baseline: unprotected,
            unprotected_target: UNPROTECTED_TARGET,
            unprotected_crashed: crashed,
            unprotected_met: if crashed {
                Some(true)
            } else {
                unprotected.map(|r| r >= UNPROTECTED_TARGET)
            },
            tollgate_baseline_vs_direct: ratio(p99("baseline-tollgate"), p99("baseline")),
            static_pools_tried: statics.len(),
            best_static: best.map(|b| b.title.clone()),
            protected_vs_best_static: vs_best,
            goodput_target: GOODPUT_TARGET,
            goodput_met: vs_best.map(|r| r >= GOODPUT_TARGET && protected_met == Some(true)),
        }
    }

    /// The best static pool's comparison, in words.
    fn goodput_words(&self) -> String {
        match (&self.best_static, self.protected_vs_best_static) {
            _ if self.static_pools_tried == 0 => {
                "the best static pool's goodput was not measured (no static pool tried)".into()
            }
            (Some(best), Some(r)) => format!(
                "protected goodput = {:.0}% of the best of {} static pools tried ({best}; target \
                 ≥ {:.0}%: {})",
                r * 100.0,
                self.static_pools_tried,
                self.goodput_target * 100.0,
                met(self.goodput_met)
            ),
            _ => format!(
                "none of the {} static pools tried kept the heartbeats within the target",
                self.static_pools_tried
            ),
        }
    }

    /// The ratios and whether each target is met, in one sentence.
    pub fn sentence(&self) -> String {
        let r = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}×"));
        format!(
            "Headline ratios (heartbeat PATCH p99): protected / baseline through tollgate = {} \
             (target ≤ {}: {}); unprotected / direct baseline = {}{} (target ≥ {}× or a \
             crash: {}); tollgate alone adds {} over the direct baseline; {}.",
            r(self.protected_vs_tollgate_baseline),
            self.target_words(),
            met(self.protected_met),
            r(self.unprotected_vs_direct_baseline),
            if self.unprotected_crashed {
                ", apiserver crashed"
            } else {
                ""
            },
            fmt(self.unprotected_target),
            met(self.unprotected_met),
            r(self.tollgate_baseline_vs_direct),
            self.goodput_words(),
        )
    }

    /// The protected target: tollgate's default adaptive target, as a ratio and in ms.
    fn target_words(&self) -> String {
        format!(
            "{:.2}× = max({}× baseline, {} ms){}",
            self.protected_target,
            fmt(TARGET_BASELINE_MULTIPLE),
            fmt(TARGET_FLOOR_MS),
            self.protected_target_ms
                .map_or(String::new(), |t| format!(" = {} ms", fmt(t)))
        )
    }

    /// The ratios as a table.
    pub fn table(&self) -> Table {
        let r = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}×"));
        let yes_no = |m: Option<bool>| match m {
            Some(true) => "yes".to_owned(),
            Some(false) => "no".to_owned(),
            None => "–".to_owned(),
        };
        Table {
            header: ["heartbeat PATCH p99 ratio", "measured", "target", "met"]
                .map(String::from)
                .to_vec(),
            rows: vec![
                vec![
                    "protected / baseline through tollgate".into(),
                    r(self.protected_vs_tollgate_baseline),
                    format!("≤ {}", self.target_words()),
                    yes_no(self.protected_met),
                ],
                vec![
                    "unprotected / direct baseline".into(),
                    format!(
                        "{}{}",
                        r(self.unprotected_vs_direct_baseline),
                        if self.unprotected_crashed {
                            " (crashed)"
                        } else {
                            ""
                        }
                    ),
                    format!("≥ {}× or a crash", fmt(self.unprotected_target)),
                    yes_no(self.unprotected_met),
                ],
                vec![
                    "baseline through tollgate / direct baseline".into(),
                    r(self.tollgate_baseline_vs_direct),
                    "–".into(),
                    "–".into(),
                ],
                vec![
                    format!(
                        "protected LISTs served / best static pool's ({})",
                        match (self.static_pools_tried, &self.best_static) {
                            (0, _) => "not measured".to_owned(),
                            (n, Some(b)) => format!("{b}, best of {n} tried"),
                            (n, None) => format!("none of {n} tried within the target"),
                        }
                    ),
                    self.protected_vs_best_static
                        .map_or("–".into(), |v| format!("{:.0}%", v * 100.0)),
                    format!("≥ {:.0}%", self.goodput_target * 100.0),
                    yes_no(self.goodput_met),
                ],
            ],
        }
    }
}

fn met(m: Option<bool>) -> &'static str {
    match m {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "unknown",
    }
}
