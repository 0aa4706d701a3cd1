//! `tollgate-bench capacity` flags.

use std::path::PathBuf;

/// `tollgate-bench capacity EXECUTION`: where the execution file is and where results go.
#[derive(Debug, clap::Args)]
pub struct CapacityArgs {
    /// The execution file (YAML or JSON): system under test, load, dimensions, SLOs, search.
    pub execution: PathBuf,
    /// Directory for the results file, each experiment's files and the summaries. Rerunning
    /// with the same directory replays its results and continues where the last run stopped.
    #[arg(long, default_value = "capacity-out")]
    pub output: PathBuf,
}
