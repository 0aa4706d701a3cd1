//! The pure parts of admission: no I/O, no clock (time is an argument), so
//! each is unit-tested with exact numbers. The admit step that uses them is
//! [`crate::admit`].
//! - [`lane`]: lane assignment by identity, verb and pattern.
//! - [`slots`]: in-flight slots per lane; per-flow shares and round-robin
//!   queues inside the light lanes ([`share`]: the pure core).
//! - [`pool`]: the quota pool (refill, debit, reconcile, debt).
//! - [`drr`]: per-flow queues served by deficit round robin on bytes.
//! - [`heavy`]: the heavy lane's state: pool, queues, in-flight, guard, size.
//! - [`ratelimit`]: per-client heavy-request rates (governor, bounded).
//! - [`retry`]: `Retry-After` with jitter; rate-limited rejection logs.
//! - [`guard`]: the relist-storm guard's warm-up ramp.
//! - [`scaling`]: pool size by node or container count.
//! - [`decision`]: decisions, reasons, and the predicted and actual charge.
//! - [`settings`]: the `lanes`, `quota` and `relistGuard` configuration.

pub mod decision;
pub mod drr;
pub mod guard;
pub mod heavy;
pub mod lane;
pub mod ratelimit;
pub mod retry;
pub mod scaling;
/// The settings live with the configuration; this path stays for code (and
/// tests) that name it here.
pub use crate::config::settings::enforce as settings;
pub mod share;
pub mod slots;

pub use decision::{Decision, Reason};
pub use lane::Lane;
