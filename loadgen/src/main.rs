//! The `loadgen` binary: parse flags, install logging and Ctrl-C, run (or
//! merge / seed / cleanup), print.

use std::process::ExitCode;

use clap::Parser;
use loadgen::cli::{Cli, Command};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let config = match cli.command {
        Some(Command::Nodes(nodes)) => (*nodes).into_config(),
        Some(Command::Etcd(args)) => return etcd(*args),
        Some(Command::Run(args)) => return loadgen::cli::scenario::main(*args),
        Some(command) => return finish(tool(command)),
        None => cli.run.into_config(),
    };
    let result = match config {
        Ok(config) if config.dry_run => {
            print!("{}", loadgen::safety::plan(&config));
            Ok(())
        }
        Ok(config) => run(config),
        Err(e) => {
            eprintln!("loadgen: {e}");
            return ExitCode::from(64);
        }
    };
    finish(result)
}

fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadgen: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(config: loadgen::Config) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let shutdown = CancellationToken::new();
        let on_signal = shutdown.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                tracing::warn!("interrupted: stopping and writing results");
                on_signal.cancel();
            }
        });
        let report = loadgen::run(config, shutdown).await?;
        print!("{}", report.table());
        Ok(())
    })
}

fn tool(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Merge(args) => {
            let report = loadgen::merge::merge_dirs(&args.dirs, &args.output)?;
            print!("{}", report.table());
            Ok(())
        }
        Command::Seed(args) => {
            let rt = tokio::runtime::Runtime::new()?;
            let tally = rt.block_on(loadgen::seed::seed(&args.into_config()))?;
            println!(
                "seed: {} created, {} already there, {} failed",
                tally.done, tally.unchanged, tally.failed
            );
            anyhow::ensure!(
                tally.failed == 0,
                "{} objects could not be created",
                tally.failed
            );
            Ok(())
        }
        // Handled as a run by `main`.
        Command::Nodes(_) => Ok(()),
        // Handled by `main` (its flag errors exit 64 like a run's).
        Command::Etcd(_) => Ok(()),
        // Handled by `main`: its exit status is the scenario's verdict.
        Command::Run(_) => Ok(()),
        Command::Cleanup(args) => {
            let rt = tokio::runtime::Runtime::new()?;
            let tally = rt.block_on(loadgen::seed::cleanup(&args.into_config()))?;
            println!(
                "cleanup: {} deleted, {} already gone, {} failed",
                tally.done, tally.unchanged, tally.failed
            );
            anyhow::ensure!(
                tally.failed == 0,
                "{} objects could not be deleted",
                tally.failed
            );
            Ok(())
        }
    }
}

/// `loadgen etcd`: flag errors exit 64, run errors 1.
fn etcd(args: loadgen::cli::etcd::EtcdArgs) -> ExitCode {
    let config = match args.into_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("loadgen etcd: {e}");
            return ExitCode::from(64);
        }
    };
    finish((|| {
        let rt = tokio::runtime::Runtime::new()?;
        rt.block_on(async {
            let shutdown = CancellationToken::new();
            let on_signal = shutdown.clone();
            tokio::spawn(async move {
                if tokio::signal::ctrl_c().await.is_ok() {
                    tracing::warn!("interrupted: stopping and writing results");
                    on_signal.cancel();
                }
            });
            let seed_only =
                config.ranges.is_none() && config.puts.is_none() && config.watches.is_none();
            let report = loadgen::etcd::run(config, shutdown).await?;
            if seed_only {
                println!("etcd: seed in place");
            } else {
                print!("{}", report.table());
            }
            Ok(())
        })
    })())
}
