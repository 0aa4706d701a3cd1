//! The cost model of the simulated control plane (in progress for issue 5):
//! pure queueing cores with time passed in.
//!
//! - [`ps`]: processor sharing, the apiserver's and etcd's CPU.

pub mod ps;
