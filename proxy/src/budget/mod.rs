//! The heavy lane's budget, all pure cores with time passed in:
//! - [`pool`]: the bytes/s token bucket that may go into debt, reconciled
//!   with each response's actual cost.
//! - [`inflight`]: bytes in flight, beside the bytes/s pool; a request
//!   larger than the whole budget runs alone.
//! - [`unlearned`]: one request at a time per heavy-looking pattern until
//!   it has a completed response.
//! - [`signal`]: the protected lanes' short-window p99 and the baseline
//!   learned while no heavy request is in flight.
//! - [`latencies`]: the bounded queue the light requests' latencies wait
//!   in, without a lock, until admission hands them to the signal.
//! - [`adaptive`]: the controller that moves the rate and the in-flight
//!   budget toward the largest values that keep the signal within target.
//! - [`heavy`]: the three above together as admission holds them, with
//!   what they learn between two controller steps; static or adaptive.
//! - [`settings`]: `quota.mode`, `quota.inflightBytes`, `quota.adaptive`.
//! - `plant`, `harness` (tests only): the apiserver as a seeded plant in
//!   virtual time, and the heavy lane in closed loop in front of it; the
//!   controller's properties are checked there over many seeds.
//! - [`shared`]: the etcd-read part of heavy requests' cost, spent from a
//!   share of one budget the tollgates of all masters lease through etcd
//!   (`quota.global`).

pub mod adaptive;
#[cfg(test)]
mod harness;
#[cfg(test)]
mod harness_tests;
pub mod heavy;
pub mod inflight;
pub mod latencies;
#[cfg(test)]
mod plant;
pub mod pool;
/// The settings live with the configuration; this path stays for code (and
/// tests) that name it here.
pub use crate::config::settings::budget as settings;
pub mod shared;
pub mod signal;
pub mod unlearned;
