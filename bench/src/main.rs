//! `tollgate-bench`: the simulated kube-apiserver, the capacity search, reports and the demo.

use bench::cli::{Cli, Command};
use clap::Parser;

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
        Command::Sim(args) => match args.into_config() {
            Ok(config) => bench::sim::run(config, shutdown_signal())
                .await
                .map_err(anyhow::Error::from),
            Err(e) => Err(e.into()),
        },
        Command::Capacity(args) => {
            bench::capacity_command::main(&args.execution, &args.output, shutdown_signal()).await
        }
        Command::Report(args) => bench::report::write_report(&args.dir)
            .map(|page| println!("report: {}", page.display()))
            .map_err(anyhow::Error::from),
        Command::Demo(args) => bench::demo::main(args.into_config(), shutdown_signal()).await,
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
