//! `loadgen etcd` flags and their checks, turned into an [`EtcdConfig`];
//! also a scenario's `etcd:` phase, whose flags are the same.

use std::path::PathBuf;
use std::time::Duration;

use super::{parse_duration, ScheduleArg};
use crate::etcd::{EtcdConfig, EtcdError, RangeSpec, SeedSpec, WatchSpec};
use crate::rate::Rate;
use crate::schedule::ScheduleKind;

/// The largest value loadgen writes: etcd's default `--max-request-bytes`
/// (1.5 MiB) less room for the key and the request's framing.
pub const MAX_VALUE_SIZE: usize = 1_572_864 - 4096;

/// Direct etcd load: range reads over a prefix, puts, watches — recorded like
/// the API operations (open loop, latency from each request's intended start).
///
/// Plain http:// endpoints only (no TLS client certificates yet).
#[derive(Debug, Clone, clap::Args)]
pub struct EtcdArgs {
    /// etcd client URL, e.g. http://127.0.0.1:2379 (repeat or comma-separate for a cluster; http only).
    #[arg(long = "endpoints", value_delimiter = ',', help_heading = "Target")]
    pub endpoints: Vec<String>,

    // --- ranges ---
    /// Range reads over --range-prefix per N/s, N/min or N/h [default: none].
    #[arg(long, help_heading = "Ranges")]
    pub ranges: Option<Rate>,
    /// Key prefix each range reads (the apiserver keeps pods under /registry/pods/).
    #[arg(long, default_value = "/registry/pods/", help_heading = "Ranges")]
    pub range_prefix: String,
    /// Most keys one range returns; 0 = no limit (the whole prefix: Tess.IO's "large range").
    #[arg(long, default_value_t = 0, help_heading = "Ranges")]
    pub range_limit: u64,
    /// Serializable ranges (served by the member asked, no quorum) [default: linearizable].
    #[arg(long, help_heading = "Ranges")]
    pub serializable: bool,
    /// Ranges return keys without values [default: false].
    #[arg(long, conflicts_with = "count_only", help_heading = "Ranges")]
    pub keys_only: bool,
    /// Ranges return only the count of keys [default: false].
    #[arg(long, help_heading = "Ranges")]
    pub count_only: bool,

    // --- puts ---
    /// Puts per N/s, N/min or N/h, cycling over --put-keys keys [default: none].
    #[arg(long, help_heading = "Puts")]
    pub puts: Option<Rate>,
    /// Bytes per put value (Tess.IO's pods are ~3.3 KB); at least 96, at most 1.5 MiB - 4 KiB.
    #[arg(long, default_value_t = 3300, help_heading = "Puts")]
    pub put_size: usize,
    /// Key prefix of the puts: put i writes PREFIX(i mod --put-keys).
    #[arg(long, default_value = "/loadgen/puts/", help_heading = "Puts")]
    pub put_prefix: String,
    /// Number of distinct keys the puts cycle over.
    #[arg(long, default_value_t = 5000, help_heading = "Puts")]
    pub put_keys: u64,

    // --- watches ---
    /// Watches on --watch-prefix; each event is timed from the put's send time stamped in its value.
    #[arg(long, default_value_t = 0, help_heading = "Watches")]
    pub watches: u64,
    /// Key prefix the watches follow [default: --put-prefix].
    #[arg(long, help_heading = "Watches")]
    pub watch_prefix: Option<String>,

    // --- seed ---
    /// Before the load, make sure N keys exist under RANGE-PREFIX/loadgen-seed/ (so a large range reads something; skipped if they already do; for a test etcd only).
    #[arg(long, default_value_t = 0, help_heading = "Seed")]
    pub seed: u64,
    /// Bytes per seeded value.
    #[arg(long, default_value_t = 3300, help_heading = "Seed")]
    pub seed_size: usize,

    // --- run ---
    /// How long to schedule requests (e.g. 30s, 5m, 1h).
    #[arg(long, default_value = "60s", value_parser = parse_duration, help_heading = "Run")]
    pub duration: Duration,
    /// Arrival schedule of every rate.
    #[arg(long, value_enum, default_value_t = ScheduleArg::Constant, help_heading = "Run")]
    pub schedule: ScheduleArg,
    /// Number of steps for --schedule steps.
    #[arg(long, default_value_t = 5, help_heading = "Run")]
    pub steps: u32,
    /// Length of each step for --schedule steps.
    #[arg(long, default_value = "60s", value_parser = parse_duration, help_heading = "Run")]
    pub step_duration: Duration,
    /// Seed of the Poisson arrivals (--schedule poisson).
    #[arg(long, default_value_t = 1, help_heading = "Run")]
    pub schedule_seed: u64,
    /// Outstanding requests per operation; ticks beyond it are dropped and counted.
    #[arg(long, default_value_t = 1000, help_heading = "Run")]
    pub max_in_flight: usize,
    /// Per-request timeout.
    #[arg(long, default_value = "60s", value_parser = parse_duration, help_heading = "Run")]
    pub timeout: Duration,
    /// After --duration, SIGTERM or SIGINT, how long in-flight requests may still finish.
    #[arg(long, default_value = "30s", value_parser = parse_duration, help_heading = "Run")]
    pub drain_timeout: Duration,
    /// Write summary.json, perfdata.json, timeseries.csv and histograms/ here.
    #[arg(long, help_heading = "Run")]
    pub output: Option<PathBuf>,
    /// Prometheus /metrics URLs to scrape for CPU and memory (etcd serves one on its client URL).
    #[arg(long, num_args = 1.., help_heading = "Run")]
    pub server_metrics: Vec<String>,
    /// How often to scrape --server-metrics.
    #[arg(long, default_value = "5s", value_parser = parse_duration, help_heading = "Run")]
    pub server_metrics_interval: Duration,
    /// Do not draw the progress line (it is never drawn when stdout is not a terminal).
    #[arg(long, help_heading = "Run")]
    pub no_progress: bool,
}

fn invalid(flag: &'static str, message: impl Into<String>) -> EtcdError {
    EtcdError::Invalid {
        flag,
        message: message.into(),
    }
}

fn check_size(flag: &'static str, size: usize) -> Result<(), EtcdError> {
    if size < crate::etcd::value::MIN_SIZE {
        return Err(invalid(
            flag,
            format!(
                "{size} bytes is too small: a value carries a {}-byte stamp",
                crate::etcd::value::MIN_SIZE
            ),
        ));
    }
    if size > MAX_VALUE_SIZE {
        return Err(invalid(
            flag,
            format!("{size} bytes is more than etcd accepts by default (--max-request-bytes 1.5 MiB); at most {MAX_VALUE_SIZE}"),
        ));
    }
    Ok(())
}

impl EtcdArgs {
    /// Checks the flags and builds the run's [`EtcdConfig`].
    pub fn into_config(self) -> Result<EtcdConfig, EtcdError> {
        let endpoints = endpoints(&self.endpoints)?;
        if self.duration.is_zero() {
            return Err(invalid("duration", "must be greater than zero"));
        }
        if self.ranges.is_none() && self.puts.is_none() && self.watches == 0 && self.seed == 0 {
            return Err(EtcdError::NothingToDo);
        }
        self.check_sizes()?;
        if self.max_in_flight == 0 {
            return Err(invalid("max-in-flight", "must be at least 1"));
        }
        if self.timeout.is_zero() {
            return Err(invalid("timeout", "must be greater than zero"));
        }
        let schedule = self.schedule()?;
        let watch_prefix = self
            .watch_prefix
            .clone()
            .unwrap_or_else(|| self.put_prefix.clone());
        Ok(EtcdConfig {
            endpoints,
            duration: self.duration,
            schedule,
            max_in_flight: self.max_in_flight,
            timeout: self.timeout,
            drain_timeout: self.drain_timeout,
            ranges: self.ranges.map(|rate| RangeSpec {
                rate,
                prefix: self.range_prefix.clone(),
                limit: self.range_limit,
                serializable: self.serializable,
                keys_only: self.keys_only,
                count_only: self.count_only,
            }),
            puts: self.puts.map(|rate| crate::etcd::PutSpec {
                rate,
                prefix: self.put_prefix.clone(),
                size: self.put_size,
                keys: self.put_keys,
            }),
            watches: (self.watches > 0).then_some(WatchSpec {
                count: self.watches,
                prefix: watch_prefix,
            }),
            seed: (self.seed > 0).then(|| SeedSpec {
                count: self.seed,
                size: self.seed_size,
                prefix: format!("{}{}", self.range_prefix, crate::etcd::SEED_DIR),
            }),
            output: self.output,
            server_metrics: self.server_metrics,
            server_metrics_interval: self.server_metrics_interval,
            progress: !self.no_progress,
        })
    }

    /// The puts' and the seed's values and keys.
    fn check_sizes(&self) -> Result<(), EtcdError> {
        if self.puts.is_some() {
            check_size("put-size", self.put_size)?;
            if self.put_keys == 0 {
                return Err(invalid("put-keys", "must be at least 1"));
            }
            if self.put_prefix.is_empty() {
                return Err(invalid(
                    "put-prefix",
                    "must not be empty (puts would land all over the key space)",
                ));
            }
        }
        if self.seed > 0 {
            check_size("seed-size", self.seed_size)?;
        }
        Ok(())
    }

    fn schedule(&self) -> Result<ScheduleKind, EtcdError> {
        Ok(match self.schedule {
            ScheduleArg::Constant => ScheduleKind::Constant,
            ScheduleArg::Poisson => ScheduleKind::Poisson {
                seed: self.schedule_seed,
            },
            ScheduleArg::Steps => {
                if self.steps == 0 {
                    return Err(invalid("steps", "must be at least 1"));
                }
                if self.step_duration.is_zero() {
                    return Err(invalid("step-duration", "must be greater than zero"));
                }
                ScheduleKind::Steps {
                    steps: self.steps,
                    step: self.step_duration,
                }
            }
        })
    }
}

/// `--endpoints` as `http://HOST:PORT` URLs (a bare `HOST:PORT` gets `http://`).
fn endpoints(given: &[String]) -> Result<Vec<String>, EtcdError> {
    if given.is_empty() {
        return Err(invalid(
            "endpoints",
            "give at least one etcd client URL, e.g. --endpoints http://127.0.0.1:2379",
        ));
    }
    let mut endpoints = Vec::new();
    for e in given {
        let e = e.trim();
        if e.starts_with("https://") {
            return Err(invalid(
                "endpoints",
                format!("`{e}`: TLS is not supported yet; use an http:// client URL"),
            ));
        }
        let url = if e.contains("://") {
            e.to_string()
        } else {
            format!("http://{e}")
        };
        let ok = url
            .parse::<http::Uri>()
            .ok()
            .filter(|u| u.scheme_str() == Some("http") && u.authority().is_some());
        if ok.is_none() {
            return Err(invalid(
                "endpoints",
                format!("`{e}` is not an http://HOST:PORT URL"),
            ));
        }
        endpoints.push(url);
    }
    Ok(endpoints)
}

/// A scenario phase's `etcd:` flags as `loadgen etcd` would parse them.
#[derive(Debug, clap::Parser)]
#[command(name = "etcd")]
struct EtcdPhaseCli {
    #[command(flatten)]
    args: EtcdArgs,
}

/// Whether a phase's flags name their own `--endpoints`.
pub fn has_endpoints(args: &[String]) -> bool {
    args.iter()
        .any(|a| a == "--endpoints" || a.starts_with("--endpoints="))
}

/// An `etcd:` phase's flags → its config; `endpoints` unless the flags name their own.
pub fn parse_phase(args: &[String], endpoints: Option<&str>) -> Result<EtcdConfig, String> {
    let mut argv = vec!["etcd".to_string(), "--no-progress".to_string()];
    argv.extend(args.iter().cloned());
    if !has_endpoints(args) {
        if let Some(e) = endpoints {
            argv.extend(["--endpoints".to_string(), e.to_string()]);
        }
    }
    let cli = <EtcdPhaseCli as clap::Parser>::try_parse_from(&argv)
        .map_err(|e| e.render().to_string().trim().to_string())?;
    cli.args.into_config().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrap {
        #[command(flatten)]
        args: EtcdArgs,
    }

    fn config(args: &[&str]) -> Result<EtcdConfig, String> {
        let mut all = vec!["etcd"];
        all.extend_from_slice(args);
        let w = Wrap::try_parse_from(all).map_err(|e| e.to_string())?;
        w.args.into_config().map_err(|e| e.to_string())
    }

    #[test]
    fn builds_a_config() {
        let c = config(&[
            "--endpoints",
            "127.0.0.1:2379,http://127.0.0.1:2380",
            "--ranges",
            "2/s",
            "--puts",
            "100/s",
            "--watches",
            "3",
            "--seed",
            "10",
            "--serializable",
        ])
        .expect("config");
        assert_eq!(
            c.endpoints,
            vec!["http://127.0.0.1:2379", "http://127.0.0.1:2380"]
        );
        let r = c.ranges.expect("ranges");
        assert_eq!(
            (r.prefix.as_str(), r.limit, r.serializable),
            ("/registry/pods/", 0, true)
        );
        assert_eq!(c.watches.expect("watches").prefix, "/loadgen/puts/");
        assert_eq!(c.seed.expect("seed").prefix, "/registry/pods/loadgen-seed/");
    }

    #[test]
    fn refuses_bad_flags_with_what_is_wrong() {
        let table: &[(&[&str], &str)] = &[
            (
                &["--ranges", "1/s"],
                "--endpoints: give at least one etcd client URL",
            ),
            (
                &["--endpoints", "https://e:2379", "--puts", "1/s"],
                "TLS is not supported",
            ),
            (
                &["--endpoints", "http://"],
                "is not an http://HOST:PORT URL",
            ),
            (&["--endpoints", "e:1"], "nothing to do"),
            (
                &["--endpoints", "e:1", "--puts", "1/s", "--put-size", "10"],
                "--put-size: 10 bytes is too small",
            ),
            (
                &[
                    "--endpoints",
                    "e:1",
                    "--puts",
                    "1/s",
                    "--put-size",
                    "2000000",
                ],
                "--put-size: 2000000 bytes is more than etcd accepts",
            ),
            (
                &["--endpoints", "e:1", "--puts", "1/s", "--put-keys", "0"],
                "--put-keys: must be at least 1",
            ),
            (
                &["--endpoints", "e:1", "--puts", "1/s", "--duration", "0s"],
                "--duration: must be greater than zero",
            ),
            (
                &["--endpoints", "e:1", "--puts", "5/fortnight"],
                "unknown unit `fortnight`",
            ),
            (
                &[
                    "--endpoints",
                    "e:1",
                    "--ranges",
                    "1/s",
                    "--keys-only",
                    "--count-only",
                ],
                "cannot be used with",
            ),
            (
                &["--endpoints", "e:1", "--seed", "5", "--seed-size", "1"],
                "--seed-size: 1 bytes is too small",
            ),
        ];
        for (args, want) in table {
            let err = config(args).expect_err(want);
            assert!(err.contains(want), "{args:?}: {err}");
        }
    }
}
