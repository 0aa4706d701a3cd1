//! Per-series handles into the hottest families, so a request does not take a
//! family's lock and hash its label set each time it is counted.

use std::sync::OnceLock;

use apimodel::{ConsistencyClass, Verb};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use super::{ClassLabel, DecisionLabel, Metrics, VerbCode, VerbLabel};
use crate::pattern::PatternVerb;

/// The series of `tollgate_requests` (200), `tollgate_response_bytes` and
/// `tollgate_request_duration_seconds` one verb's responses touch, each looked up in its
/// family once, on first use: each family lookup takes its lock and hashes the label set,
/// on every request. A handle is the family's own series (a clone shares it), and each is created
/// only when first counted, so the exported text is the same as without them.
#[derive(Debug, Default)]
pub struct PerVerb {
    slots: [VerbSeries; PerVerb::SLOTS],
}

/// One verb's series; see [`PerVerb`].
#[derive(Debug, Default)]
struct VerbSeries {
    ok: OnceLock<Counter>,
    response_bytes: OnceLock<Counter>,
    duration: OnceLock<Histogram>,
}

impl PerVerb {
    /// More than `apimodel::Verb` has variants; a verb past it is looked up each time.
    const SLOTS: usize = 16;

    fn slot(&self, verb: Verb) -> Option<&VerbSeries> {
        self.slots.get(verb as usize)
    }

    /// `tollgate_requests{verb, code}` + 1.
    pub fn request(&self, m: &Metrics, verb: Verb, code: u16) {
        let v = verb.as_str();
        match self.slot(verb) {
            Some(s) if code == 200 => {
                s.ok.get_or_init(|| {
                    m.requests
                        .get_or_create(&VerbCode { verb: v, code })
                        .clone()
                })
                .inc()
            }
            _ => m.requests.get_or_create(&VerbCode { verb: v, code }).inc(),
        };
    }

    /// `tollgate_response_bytes{verb}` + `bytes`.
    pub fn response_bytes(&self, m: &Metrics, verb: Verb, bytes: u64) {
        let v = verb.as_str();
        match self.slot(verb) {
            Some(s) => s
                .response_bytes
                .get_or_init(|| {
                    m.response_bytes
                        .get_or_create(&VerbLabel { verb: v })
                        .clone()
                })
                .inc_by(bytes),
            None => m
                .response_bytes
                .get_or_create(&VerbLabel { verb: v })
                .inc_by(bytes),
        };
    }

    /// One observation of `tollgate_request_duration_seconds{verb}`.
    pub fn duration(&self, m: &Metrics, verb: Verb, seconds: f64) {
        let v = verb.as_str();
        match self.slot(verb) {
            Some(s) => s
                .duration
                .get_or_init(|| m.duration.get_or_create(&VerbLabel { verb: v }).clone())
                .observe(seconds),
            None => m
                .duration
                .get_or_create(&VerbLabel { verb: v })
                .observe(seconds),
        }
    }
}

/// The same for the three families of prediction accuracy, by pattern class (verb and
/// consistency): one slot per class, each series created when first counted.
#[derive(Debug)]
pub struct PerClass {
    slots: [ClassSeries; PerClass::SLOTS],
}

impl Default for PerClass {
    fn default() -> Self {
        PerClass {
            slots: std::array::from_fn(|_| ClassSeries::default()),
        }
    }
}

#[derive(Debug, Default)]
struct ClassSeries {
    predicted: OnceLock<Counter>,
    actual: OnceLock<Counter>,
    ratio: OnceLock<Histogram>,
}

impl PerClass {
    /// Verbs (`PerVerb::SLOTS`, the last one for a watch-list) × consistency (none and
    /// three classes).
    const VERBS: usize = PerVerb::SLOTS;
    const SLOTS: usize = PerClass::VERBS * 4;

    fn slot(
        &self,
        verb: PatternVerb,
        consistency: Option<ConsistencyClass>,
    ) -> Option<&ClassSeries> {
        let v = match verb {
            PatternVerb::Api(v) if (v as usize) < PerClass::VERBS - 1 => v as usize,
            PatternVerb::Api(_) => return None,
            PatternVerb::WatchList => PerClass::VERBS - 1,
        };
        let c = match consistency {
            None => 0,
            Some(ConsistencyClass::Cache) => 1,
            Some(ConsistencyClass::Consistent) => 2,
            Some(ConsistencyClass::Exact) => 3,
        };
        self.slots.get(v * 4 + c)
    }

    /// A complete, uncompressed success: predicted and actual bytes, and their ratio
    /// when something was predicted.
    pub fn observe(
        &self,
        m: &Metrics,
        verb: PatternVerb,
        consistency: Option<ConsistencyClass>,
        predicted: f64,
        actual: u64,
    ) {
        let class = || ClassLabel {
            verb: verb.as_str(),
            consistency: consistency.map_or("none", |c| c.as_str()),
        };
        let ratio = (predicted > 0.0).then(|| actual as f64 / predicted);
        let Some(s) = self.slot(verb, consistency) else {
            let class = class();
            m.predicted_bytes
                .get_or_create(&class)
                .inc_by(predicted as u64);
            m.actual_bytes.get_or_create(&class).inc_by(actual);
            if let Some(r) = ratio {
                m.prediction_ratio.get_or_create(&class).observe(r);
            }
            return;
        };
        s.predicted
            .get_or_init(|| m.predicted_bytes.get_or_create(&class()).clone())
            .inc_by(predicted as u64);
        s.actual
            .get_or_init(|| m.actual_bytes.get_or_create(&class()).clone())
            .inc_by(actual);
        if let Some(r) = ratio {
            s.ratio
                .get_or_init(|| m.prediction_ratio.get_or_create(&class()).clone())
                .observe(r);
        }
    }
}

/// The series of `tollgate_decisions` (six labels: mode, lane, verb, consistency, decision,
/// reason), each looked up in its family once: every admitted request counts one, and the
/// family's lookup took its lock and hashed the six strings (SipHash) each time, ~1,000
/// instructions a request (bench/RESULTS.md, issue 36). A slot is chosen by the labels'
/// addresses (they are `&'static str`s) and holds the first label set that lands in it; a label
/// set whose slot holds another one is looked up in the family as before. The series are the
/// family's own (a clone shares it), created when first counted: the exported text is the same.
#[derive(Debug)]
pub struct PerDecision {
    slots: [OnceLock<(DecisionLabel, Counter)>; PerDecision::SLOTS],
}

impl Default for PerDecision {
    fn default() -> Self {
        PerDecision {
            slots: std::array::from_fn(|_| OnceLock::new()),
        }
    }
}

impl PerDecision {
    /// A workload meets a handful of label sets; 64 keeps collisions rare at 512 bytes.
    const SLOTS: usize = 64;

    fn index(l: &DecisionLabel) -> usize {
        let mut h: u64 = 0;
        for s in [l.mode, l.lane, l.verb, l.consistency, l.decision, l.reason] {
            h = (h ^ s.as_ptr() as u64 ^ s.len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        (h >> 58) as usize % PerDecision::SLOTS
    }

    /// `tollgate_decisions{label}` + 1.
    pub fn inc(&self, m: &Metrics, label: DecisionLabel) {
        let slot = self.slots.get(Self::index(&label));
        let cached = slot
            .map(|s| s.get_or_init(|| (label.clone(), m.decisions.get_or_create(&label).clone())));
        match cached {
            Some((l, c)) if *l == label => c.inc(),
            _ => m.decisions.get_or_create(&label).inc(),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    fn label(lane: &'static str, decision: &'static str) -> DecisionLabel {
        DecisionLabel {
            mode: "dryRun",
            lane,
            verb: "get",
            consistency: "none",
            decision,
            reason: "light",
        }
    }

    /// Every label set is counted in its own series of the family, whether it has a slot of its
    /// own, shares one with another set (all 70 sets here cannot have one each), or not.
    #[test]
    fn decisions_counted_through_the_slots_land_in_their_series() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let lanes: Vec<&'static str> = (0..70)
            .map(|i| &*Box::leak(format!("lane{i}").into_boxed_str()))
            .collect();
        for (i, lane) in lanes.iter().enumerate() {
            for _ in 0..=i % 3 {
                m.per_decision.inc(&m, label(lane, "admit"));
            }
        }
        m.per_decision.inc(&m, label(lanes[0], "reject"));
        for (i, lane) in lanes.iter().enumerate() {
            let n = m.decisions.get_or_create(&label(lane, "admit")).get();
            assert_eq!(n, (i % 3 + 1) as u64, "{lane}");
        }
        assert_eq!(
            m.decisions.get_or_create(&label(lanes[0], "reject")).get(),
            1
        );
    }
}
