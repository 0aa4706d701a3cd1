//! `tollgate-bench`: the simulated kube-apiserver, and (later) the capacity search, reports and demo.

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
