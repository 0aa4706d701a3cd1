//! What admission decided and why, and what a request is charged: the
//! predicted cost at admission, the actual cost when its response ended.

use crate::predict::Prediction;

/// What happened to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Admit,
    /// Admitted after waiting.
    Queue,
    Reject,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Admit => "admit",
            Decision::Queue => "queue",
            Decision::Reject => "reject",
        }
    }
}

/// Why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The exempt lane: never limited.
    Exempt,
    /// A light lane's in-flight slot.
    Slot,
    /// The pool had the bytes.
    Pool,
    /// A continue page of a list whose earlier page was admitted: admitted
    /// at once, its cost debited ([`crate::admit::pages`]).
    Continuation,
    /// Costs more than the burst: admitted with a full pool, into debt.
    Debt,
    /// A light lane stayed full for its whole wait.
    Inflight,
    /// The pool did not have the bytes within `maxWait`.
    MaxWait,
    /// The client's queue (in its lane) was full.
    QueueFull,
    /// Too many clients were waiting (in its lane).
    TooManyFlows,
    /// The client's heavy-request rate was over its limit.
    RateLimit,
    /// Another request of its unlearned heavy-looking pattern stayed in
    /// flight for the whole wait.
    Unlearned,
    /// The share of the cluster-wide etcd-read budget had no room within
    /// `maxWait` ([`crate::budget::shared`]).
    SharedBudget,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Exempt => "exempt",
            Reason::Slot => "slot",
            Reason::Pool => "pool",
            Reason::Continuation => "continuation",
            Reason::Debt => "debt",
            Reason::Inflight => "inflight",
            Reason::MaxWait => "maxWait",
            Reason::QueueFull => "queueFull",
            Reason::TooManyFlows => "tooManyFlows",
            Reason::RateLimit => "rateLimit",
            Reason::Unlearned => "unlearned",
            Reason::SharedBudget => "sharedBudget",
        }
    }

    /// Words for the 429 message.
    pub fn explain(self) -> &'static str {
        match self {
            Reason::Inflight => "too many requests in flight in this lane",
            Reason::MaxWait => "the byte quota had no room for this request within the wait limit",
            Reason::QueueFull => "too many of this client's requests are already waiting",
            Reason::TooManyFlows => "too many clients are waiting",
            Reason::RateLimit => "this client sends heavy requests faster than its rate limit",
            Reason::Unlearned => {
                "a request of this pattern, whose cost is not learned yet, is still in flight"
            }
            Reason::SharedBudget => {
                "the etcd-read budget shared by all masters had no room for this request within the wait limit"
            }
            _ => "admitted",
        }
    }
}

/// The bytes a prediction charges: sent plus weighted etcd reads.
pub fn charge(p: &Prediction, etcd_read_weight: f64) -> f64 {
    p.response_bytes + etcd_read_weight * p.read_bytes
}

/// The bytes read from etcd once the response ended: an unfiltered etcd
/// read reads what it sends; a filtered one what was predicted.
pub fn actual_read(p: &Prediction, filtered: bool, sent: f64) -> f64 {
    if p.read_bytes <= 0.0 {
        0.0
    } else if filtered {
        p.read_bytes
    } else {
        sent
    }
}

/// The actual charge once the response ended: the bytes sent (uncompressed
/// estimate) plus the etcd reads they imply (an unfiltered etcd read reads
/// what it sends; a filtered one reads what was predicted). A response cut
/// short is never refunded below its debit: the apiserver did the work.
pub fn actual_charge(
    p: &Prediction,
    filtered: bool,
    sent: f64,
    complete: bool,
    etcd_read_weight: f64,
    debited: f64,
) -> f64 {
    let actual = sent + etcd_read_weight * actual_read(p, filtered, sent);
    if complete {
        actual
    } else {
        actual.max(debited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_weigh_etcd_reads_and_never_refund_cut_responses() {
        use crate::predict::Source;
        let p = Prediction {
            response_bytes: 100.0,
            read_bytes: 100.0,
            source: Source::Pattern,
        };
        assert_eq!(charge(&p, 2.0), 300.0);
        assert_eq!(actual_charge(&p, false, 50.0, true, 2.0, 300.0), 150.0);
        let filtered = Prediction {
            read_bytes: 1000.0,
            ..p
        };
        assert_eq!(
            actual_charge(&filtered, true, 10.0, true, 2.0, 2100.0),
            2010.0
        );
        assert_eq!(actual_charge(&p, false, 10.0, false, 2.0, 300.0), 300.0);
    }
}
