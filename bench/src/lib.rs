//! tollgate-bench: the test bench for Tollgate.
//!
//! Layout:
//! - [`sim`]: the simulated kube-apiserver (`tollgate-bench sim`).
#![forbid(unsafe_code)]

pub mod sim;
