//! The command line of `tollgate-bench`: clap's argument structs, kept out of the library
//! modules, which take plain settings ([`crate::sim::SimConfig`], [`crate::demo::DemoConfig`],
//! paths). Each `*Args` here turns into those.
//!
//! - [`sim`]: `tollgate-bench sim`, named after kube-apiserver's flags.
//! - [`capacity`]: `tollgate-bench capacity`.
//! - [`demo`]: `tollgate-bench demo`.

pub mod capacity;
pub mod demo;
pub mod sim;

pub use capacity::CapacityArgs;
pub use demo::DemoArgs;
pub use sim::SimArgs;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tollgate-bench",
    version,
    about = "Tollgate's test bench: a simulated kube-apiserver, capacity search and reports"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run a simulated kube-apiserver that kubectl, loadgen and tollgate can use.
    Sim(Box<SimArgs>),
    /// Search how much load the system under test takes within its SLOs (capacity) or how much
    /// resource a load needs (demand), Theodolite-style; resumable.
    Capacity(CapacityArgs),
    /// Write the HTML report (report.html, self-contained) and its Markdown of a capacity,
    /// demo or loadgen output directory.
    Report(ReportArgs),
    /// Show what tollgate does: four runs on a simulated control plane (heartbeats only,
    /// direct and through tollgate; LIST storm without tollgate, through tollgate), then a
    /// report.
    Demo(DemoArgs),
}

#[derive(clap::Args)]
pub struct ReportArgs {
    /// The directory `capacity --output`, `demo --output` or `loadgen --output` wrote.
    pub dir: std::path::PathBuf,
}
