//! One etcd-bound budget shared by the tollgates of all masters, through
//! etcd (`quota.global`). The apiserver's memory and CPU are per master and
//! stay with the local budget ([`super::heavy`]); the etcd reads of every
//! master land on the one etcd, so what harms it is their *sum*. Each
//! tollgate spends the etcd-read part of its heavy requests' cost
//! (`read_bytes`, 0 for watch-cache reads) from a leased share of the
//! cluster-wide `etcdBytesPerSecond`, Doorman-style; no request waits on
//! etcd: a request reads the share from an atomic.
//!
//! - [`alloc`]: the coordinator's pure allocation core (demands in, grants
//!   out; sum ≤ budget − reserve, floors, shrink before grow).
//! - [`gate`]: the local application: a token bucket of etcd-read bytes
//!   refilled at the share in force, which heavy requests pass before the
//!   local pool; and the demand it measures.
//! - [`member`]: what a member does each renewal (pure): which share is in
//!   force, when to rewrite its demand.
//! - [`coordination`]: the etcd side: registration under a lease,
//!   election, the coordinator's grants, the loop.
//! - [`session`]: one connection to etcd: the lease kept alive, the watch
//!   on the prefix.
//! - [`pace`]: when the loop acts: renewals, changes seen by the watch,
//!   the coordinator's steps.
//! - [`settings`]: `quota.global` and the `--etcd-*` flags.
//! - [`metrics`]: the `tollgate_shared_budget_*` metrics.
//!
//! ## The constants, and why
//! - [`LEASE_TTL`] 10 s: a member's registration and the coordinator's key
//!   live on a lease of this TTL. A dead tollgate's share is freed, and a
//!   dead coordinator replaced, within it; it rides out a GC pause or an
//!   etcd leader election (1 s election timeout by default) without
//!   dropping members.
//! - [`RENEW`] 1 s: members renew their lease, measure their demand, read
//!   the allocation and (if the demand changed) write it; the coordinator
//!   steps. Between renewals every member reads again as soon as another
//!   wrote under the prefix (a watch): a new allocation is applied, and a
//!   shrink acknowledged, within milliseconds, not at the next renewal. A
//!   moved LIST storm is followed in the time the demand takes to show it
//!   (its first or second renewal after the move: the demand is a rate
//!   over the renewal period, smoothed with a 1 s time constant, and is
//!   written once it moved by [`DEMAND_CHANGE`]), plus one coordinator
//!   step to shrink and, [`pace::STEP_GAP`] later, one to grow: about 1–2 s
//!   (bench/RESULTS.md). Polling alone took up to a renewal at each of the
//!   four hops (demand seen, shrink read, acknowledgement seen, growth
//!   read): 3.3 s measured. A shorter renewal would cut the hops too, but
//!   would sample the demand more often, and a LIST a second would read
//!   as a sawtooth worth rewriting every time; watches cost no writes.
//! - [`pace::STEP_GAP`] 250 ms: after writing the allocation, the
//!   coordinator waits this long before its next step, so the
//!   acknowledgements a shrink calls for (milliseconds apart) are answered
//!   with one write, not one each; at most 4 allocation writes a second.
//! - [`GRANT_TTL`] 3 s: a member applies a grant for at most this long
//!   after it last read it, and never past its own lease's expiry as it
//!   knows it; then it falls back. The coordinator counts a grant it
//!   replaced as spent for as long (unless the member acknowledged the new
//!   one), and a new coordinator only shrinks for as long. Three missed
//!   renewals: short enough that a member cut off from etcd is on its
//!   fallback, and a shrink it never acknowledged is given to others,
//!   within three seconds; long enough that one slow read does not drop a
//!   member to its fallback.
//! - [`DEFAULT_RESERVE`] 10% of the budget is never granted: members
//!   without a grant (just started, cut off from etcd) spend `reserve / N`
//!   each, so the cluster stays within the budget while etcd is out.
//! - [`DEFAULT_FLOOR`] 5% of the budget per member (at most `(B −
//!   reserve)/N`): a master with no LISTs now can still serve one when it
//!   comes, before the coordinator has seen its demand.
//! - Writes: a member writes its demand only when it moved by more than
//!   [`DEMAND_CHANGE`] (25%) and 1% of the budget, or to acknowledge a
//!   grant lower than the one it had (a higher one needs no
//!   acknowledgement: the coordinator counts the higher of the two as held
//!   anyway); the coordinator writes all grants in one transaction, only
//!   when one moved by more than [`GRANT_HYSTERESIS`] (2% of the budget)
//!   or a member came or went. Lease keep-alives, reads and watches are
//!   not writes to the key space.

pub mod alloc;
pub mod coordination;
pub mod gate;
pub mod member;
pub mod metrics;
pub mod pace;
pub mod session;
/// The settings live with the configuration; this path stays for code (and
/// tests) that name it here.
pub use crate::config::settings::shared as settings;

use std::time::Duration;

/// Members' and the coordinator's lease TTL.
pub const LEASE_TTL: Duration = Duration::from_secs(10);
/// Renewal and coordinator step interval.
pub const RENEW: Duration = Duration::from_secs(1);
/// How long a grant read is applied without a newer read.
pub const GRANT_TTL: Duration = Duration::from_secs(3);
pub use crate::config::settings::shared::{DEFAULT_FLOOR, DEFAULT_RESERVE};
/// Relative change of demand worth a write.
pub const DEMAND_CHANGE: f64 = 0.25;
/// Change of a grant worth a write, as a fraction of the budget.
pub const GRANT_HYSTERESIS: f64 = 0.02;
