//! The `loadgen` binary: parse flags, install logging and the SIGINT/SIGTERM
//! handler, run (or merge / seed / cleanup), print, and exit with the status
//! loadgen/README.md's exit-code table gives.

use std::process::ExitCode;

use clap::Parser;
use loadgen::cli::{Cli, Command};
use loadgen::signal::Interrupts;

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
        Ok(config) => return run(config),
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

/// A run: 0, or 128 + the signal's number when a signal ended it early
/// (its results are written all the same), or 1 when it failed.
fn run(config: loadgen::Config) -> ExitCode {
    interrupted_or(|interrupts| async move {
        let report = loadgen::run(config, interrupts.token()).await?;
        print!("{}", report.table());
        Ok(())
    })
}

/// Runs `body` on a new runtime with the signal handler installed; a signal
/// decides the exit status over success (an interrupted run is not complete).
fn interrupted_or<F, Fut>(body: F) -> ExitCode
where
    F: FnOnce(Interrupts) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return finish(Err(e.into())),
    };
    let (result, interrupted) = rt.block_on(async {
        let interrupts = Interrupts::listen("writing results");
        let result = body(interrupts.clone()).await;
        (result, interrupts.exit_code())
    });
    match (result, interrupted) {
        (Ok(()), Some(code)) => ExitCode::from(code),
        (result, _) => finish(result),
    }
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

/// `loadgen etcd`: flag errors exit 64, run errors 1, a signal 128 + its number.
fn etcd(args: loadgen::cli::etcd::EtcdArgs) -> ExitCode {
    let config = match args.into_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("loadgen etcd: {e}");
            return ExitCode::from(64);
        }
    };
    interrupted_or(|interrupts| async move {
        let seed_only =
            config.ranges.is_none() && config.puts.is_none() && config.watches.is_none();
        let report = loadgen::etcd::run(config, interrupts.token()).await?;
        if seed_only {
            println!("etcd: seed in place");
        } else {
            print!("{}", report.table());
        }
        Ok(())
    })
}
