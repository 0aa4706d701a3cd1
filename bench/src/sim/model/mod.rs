//! The cost model of the simulated control plane (`--cost-model modeled`):
//! requests are charged what a real apiserver and etcd would spend on them
//! and wait for it on timers, so the simulated control plane slows down,
//! holds memory and crashes like a real one while the machine stays idle.
//! The page `bench/MODEL.md` documents it and its calibration.
//!
//! - [`costs`]: the constants and the pure request → demand functions.
//! - [`ps`]: processor sharing, the pure core of a station's CPU.
//! - [`lock`]: etcd's backend lock (range reads vs write commits), pure.
//! - [`heap`]: Go's heap and garbage collector, which the apiserver's RSS follows; pure.
//! - [`stations`]: the apiserver CPU and etcd, driven by one event-driven task.
//! - [`control`]: memory, the OOM kill, the restart and the cold watch cache; the metrics.

pub mod control;
pub mod costs;
pub mod heap;
pub mod lock;
pub mod ps;
pub mod stations;

pub use control::{ControlPlane, MemoryHold, ModelConfig};
pub use costs::{Constants, Demand, ListShape};
