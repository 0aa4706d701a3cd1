//! What admission decided and why (what a request is charged is
//! [`crate::predict::charge`]).

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
