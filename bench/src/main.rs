//! `tollgate-bench`: the simulated kube-apiserver, the capacity search, reports and the demo.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tollgate-bench",
    version,
    about = "Tollgate's test bench: a simulated kube-apiserver, capacity search and reports"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a simulated kube-apiserver that kubectl, loadgen and tollgate can use.
    Sim(Box<bench::sim::SimArgs>),
    /// Search how much load the system under test takes within its SLOs (capacity) or how much
    /// resource a load needs (demand), Theodolite-style; resumable.
    Capacity(bench::capacity::CapacityArgs),
    /// Write the HTML report (report.html, self-contained) and its Markdown of a capacity,
    /// demo or loadgen output directory.
    Report(ReportArgs),
    /// Show what tollgate does: four runs on a simulated control plane (heartbeats only,
    /// direct and through tollgate; LIST storm without tollgate, through tollgate), then a
    /// report.
    Demo(bench::demo::DemoArgs),
}

#[derive(clap::Args)]
struct ReportArgs {
    /// The directory `capacity --output`, `demo --output` or `loadgen --output` wrote.
    dir: std::path::PathBuf,
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Sim(args) => bench::sim::run(*args, shutdown_signal())
            .await
            .map_err(anyhow::Error::from),
        Command::Capacity(args) => bench::capacity::run::main(args, shutdown_signal()).await,
        Command::Report(args) => bench::report::write_report(&args.dir)
            .map(|page| println!("report: {}", page.display()))
            .map_err(anyhow::Error::from),
        Command::Demo(args) => bench::demo::main(args, shutdown_signal()).await,
    };
    // Exit here rather than by returning: dropping the runtime would wait for
    // a blocking stdin read (--exit-with-stdin) that may never end.
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("tollgate-bench: {e:#}");
            std::process::exit(1)
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
