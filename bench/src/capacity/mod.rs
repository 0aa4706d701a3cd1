//! Capacity planning in Theodolite's model (issue 10): a grid of load × resource amounts,
//! SLO experiments on its cells chosen by a search strategy, and the capacity and demand
//! metrics read off the verdicts.
//!
//! - [`execution`]: the execution file and its validation.
//! - [`search`]: the strategies (full, linear, binary, lower-bound restriction), stateless so
//!   a rerun replays stored results and continues where it stopped.
//! - [`slo`]: SLOs checked against loadgen's `summary.json`.
//! - [`goodput`]: what a run served (LISTs answered 2xx per minute, their bytes) and, with
//!   tollgate in front, the experiment with the most of it read off as the capacity.
//! - [`results`]: the append-only results file that replay reads.
//! - [`experiment`]: one experiment: start the system under test, run loadgen, check SLOs.
//! - [`samples`]: metrics sampled each second during an experiment (tollgate's quota pool).
//!
//! The command that runs the search and writes its reports is [`crate::capacity_command`].

pub mod execution;
pub mod experiment;
pub mod goodput;
pub mod results;
pub mod samples;
pub mod search;
pub mod slo;
