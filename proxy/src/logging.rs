//! How the binary logs: `--log-format text|json` and `-v`/`--log-level`, as control-plane
//! components are run (a log collector wants one JSON object per line; kube components take
//! `-v=N`). `RUST_LOG`, when set and valid, wins over `--log-level`, so a per-module filter
//! (`RUST_LOG=tollgate::admit=debug`) still works.

use std::str::FromStr;

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::EnvFilter;

/// The log line format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (colored on a terminal).
    #[default]
    Text,
    /// One JSON object per line: timestamp, level, target, message and fields.
    Json,
}

/// The logging flags, shared by every subcommand.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogFlags {
    /// Log line format: text, or json (one object per line, for log collectors) [default: text]
    #[arg(long, value_enum, value_name = "FORMAT", global = true)]
    pub log_format: Option<LogFormat>,
    /// Least severe level logged: error, warn, info, debug, trace, or a klog-style number as kube components take with -v (0-3 info, 4 debug, 5 and more trace); RUST_LOG, when set, wins [default: info]
    #[arg(short = 'v', long, alias = "v", value_name = "LEVEL", value_parser = parse_level, global = true)]
    pub log_level: Option<LevelFilter>,
}

/// `info`, `DEBUG`, … or a klog verbosity number.
pub fn parse_level(s: &str) -> Result<LevelFilter, String> {
    if let Ok(n) = s.parse::<u32>() {
        return Ok(match n {
            0..=3 => LevelFilter::INFO,
            4 => LevelFilter::DEBUG,
            _ => LevelFilter::TRACE,
        });
    }
    LevelFilter::from_str(s).map_err(|_| {
        format!("{s:?} is not a level: error, warn, info, debug, trace, or a number (-v=4)")
    })
}

/// The filter: `RUST_LOG` if it is set and parses, else `--log-level` (default info).
pub fn filter(flags: &LogFlags) -> EnvFilter {
    let level = flags.log_level.unwrap_or(LevelFilter::INFO);
    match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => {
            EnvFilter::try_new(&v).unwrap_or_else(|_| EnvFilter::new(level.to_string()))
        }
        _ => EnvFilter::new(level.to_string()),
    }
}

/// Install the process's subscriber, writing to stderr.
pub fn init(flags: &LogFlags) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(flags))
        .with_writer(std::io::stderr);
    match flags.log_format.unwrap_or_default() {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        // Fields at the top level (not under "fields"), as log collectors index them.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may unwrap
mod tests {
    use super::*;

    #[test]
    fn levels_by_name_and_by_klog_number() {
        assert_eq!(parse_level("debug").unwrap(), LevelFilter::DEBUG);
        assert_eq!(parse_level("WARN").unwrap(), LevelFilter::WARN);
        assert_eq!(parse_level("2").unwrap(), LevelFilter::INFO);
        assert_eq!(parse_level("4").unwrap(), LevelFilter::DEBUG);
        assert_eq!(parse_level("6").unwrap(), LevelFilter::TRACE);
        assert!(parse_level("loud").is_err());
    }
}
