//! Enforcement: lanes, the byte-cost quota pool, per-client rate limits,
//! fair queues, rejections with `Retry-After`, the relist-storm guard and
//! cluster-size scaling. The pure parts take time as an argument:
//! - [`lane`]: lane assignment by identity, verb and pattern; in-flight slots.
//! - [`pool`]: the quota pool (refill, debit, reconcile, debt).
//! - [`drr`]: per-flow queues served by deficit round robin on bytes.
//! - [`ratelimit`]: per-client heavy-request rates (governor, bounded).
//! - [`retry`]: `Retry-After` with jitter; rate-limited rejection logs.
//! - [`guard`]: the relist-storm guard's warm-up ramp.
//! - [`scaling`]: pool size by node or container count.
//! - [`decide`]: admission itself and the heavy lane's dispatcher.
//! - [`settings`]: the `lanes`, `quota` and `relistGuard` configuration.

pub mod decide;
pub mod drr;
pub mod guard;
pub mod lane;
pub mod pool;
pub mod ratelimit;
pub mod retry;
pub mod scaling;
pub mod settings;

pub use decide::{Admission, Decision, Hold, Reason, Verdict};
pub use lane::Lane;
