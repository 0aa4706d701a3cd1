//! tollgate-bench: the test bench for Tollgate.
//!
//! Layout:
//! - [`sim`]: the simulated kube-apiserver (`tollgate-bench sim`).
//! - [`capacity`]: the capacity search: execution files, strategies, SLOs, experiments, results.
//! - [`capacity_command`]: `tollgate-bench capacity`: the search run, its results and reports.
//! - [`report`]: the HTML and Markdown reports (`tollgate-bench report`).
//! - [`demo`]: the demo (`tollgate-bench demo`): a LIST storm without tollgate, through its
//!   adaptive default and through static pools, with each run's goodput.
//! - [`cli`]: the command line's argument structs, turned into the settings the others take.
//! - [`process`]: child processes and `/metrics` scrapes the demo and capacity runs share.
#![forbid(unsafe_code)]

pub mod capacity;
pub mod capacity_command;
pub mod cli;
pub mod demo;
pub mod process;
pub mod report;
pub mod sim;
