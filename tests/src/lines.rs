//! Reading a child's output line by line, and waiting for a condition, with deadlines.

use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How many of the last lines seen an error message quotes.
const QUOTED_LINES: usize = 30;

/// What [`LineReader::next_before`] got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    Line(String),
    /// The deadline passed with no new line.
    Timeout,
    /// The stream ended (the child exited or closed it).
    Closed,
}

/// The lines of a stream, read on a thread of their own (so the child never blocks on a
/// full pipe) and received here with a deadline.
pub struct LineReader {
    what: String,
    rx: Receiver<String>,
    seen: Vec<String>,
}

impl LineReader {
    /// Starts reading `stream`; `what` names it in error messages ("kubectl get -w stdout").
    pub fn spawn<R: Read + Send + 'static>(what: impl Into<String>, stream: R) -> Self {
        let what = what.into();
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name(format!("read {what}"))
            .spawn(move || {
                let mut reader = BufReader::new(stream);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    match reader.read_until(b'\n', &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            let line = String::from_utf8_lossy(&buf);
                            let line = line.trim_end_matches(['\n', '\r']).to_string();
                            if tx.send(line).is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            panic!("cannot start a thread to read {what}: {e}");
        }
        Self {
            what,
            rx,
            seen: Vec::new(),
        }
    }

    /// The next line, waiting at most until `deadline`.
    pub fn next_before(&mut self, deadline: Instant) -> Next {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(left) {
            Ok(line) => {
                self.seen.push(line.clone());
                Next::Line(line)
            }
            Err(RecvTimeoutError::Timeout) => Next::Timeout,
            Err(RecvTimeoutError::Disconnected) => Next::Closed,
        }
    }

    /// Reads lines until one satisfies `matches` and returns it; fails, quoting the last
    /// lines read, if none does within `timeout` or the stream ends first. Lines read before
    /// the call are not looked at again.
    pub fn wait_for(
        &mut self,
        timeout: Duration,
        description: &str,
        mut matches: impl FnMut(&str) -> bool,
    ) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.next_before(deadline) {
                Next::Line(line) if matches(&line) => return Ok(line),
                Next::Line(_) => {}
                Next::Timeout => anyhow::bail!(
                    "no line of {} matched {description} within {timeout:?}; {}",
                    self.what,
                    self.tail()
                ),
                Next::Closed => anyhow::bail!(
                    "{} ended before a line matched {description}; {}",
                    self.what,
                    self.tail()
                ),
            }
        }
    }

    /// Every line read so far.
    pub fn seen(&self) -> &[String] {
        &self.seen
    }

    /// The last lines read, for error messages.
    pub fn tail(&self) -> String {
        let from = self.seen.len().saturating_sub(QUOTED_LINES);
        format!(
            "last {} of {} lines read:\n{}",
            self.seen.len() - from,
            self.seen.len(),
            self.seen[from..].join("\n")
        )
    }
}

/// Calls `check` every `interval` until it returns `Some`, failing with `description` (and
/// the last error `check` returned, if any) once `timeout` has passed.
pub fn eventually<T>(
    timeout: Duration,
    description: &str,
    mut check: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let interval = Duration::from_millis(100);
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => None,
            Err(e) => Some(e),
        };
        if Instant::now() >= deadline {
            return Err(match last {
                Some(e) => e.context(format!("{description}: not within {timeout:?}")),
                None => anyhow::anyhow!("{description}: not within {timeout:?}"),
            });
        }
        std::thread::sleep(interval);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may unwrap
mod tests {
    use super::*;

    #[test]
    fn waits_for_a_matching_line_and_reports_the_end() {
        let mut r = LineReader::spawn("input", std::io::Cursor::new("a\nb 1\r\nc\n"));
        let line = r.wait_for(Duration::from_secs(5), "b", |l| l.starts_with('b'));
        assert_eq!(line.unwrap(), "b 1");
        let err = r.wait_for(Duration::from_secs(5), "z", |l| l == "z");
        let err = format!("{:#}", err.unwrap_err());
        assert!(err.contains("input ended before a line matched z"), "{err}");
        assert!(err.contains("3 lines read"), "{err}");
        assert_eq!(r.seen(), ["a", "b 1", "c"]);
    }

    #[test]
    fn times_out_on_a_silent_stream() {
        // A stream nobody writes to: reads block until the writer is dropped.
        struct Silent(Receiver<()>);
        impl Read for Silent {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                let _ = self.0.recv();
                Ok(0)
            }
        }
        let (writer, rx) = mpsc::channel::<()>();
        let mut r = LineReader::spawn("silence", Silent(rx));
        let started = Instant::now();
        let err = r.wait_for(Duration::from_millis(200), "x", |_| true);
        assert!(started.elapsed() >= Duration::from_millis(200));
        let err = format!("{:#}", err.unwrap_err());
        assert!(err.contains("within 200ms"), "{err}");
        drop(writer);
        assert_eq!(
            r.next_before(Instant::now() + Duration::from_secs(5)),
            Next::Closed
        );
    }

    #[test]
    fn eventually_returns_the_first_some_or_the_last_error() {
        let mut calls = 0;
        let v = eventually(Duration::from_secs(5), "three calls", || {
            calls += 1;
            Ok((calls == 3).then_some(calls))
        });
        assert_eq!(v.unwrap(), 3);
        let err = eventually(Duration::from_millis(150), "never", || {
            Err::<Option<()>, _>(anyhow::anyhow!("still broken"))
        });
        let err = format!("{:#}", err.unwrap_err());
        assert!(
            err.contains("never: not within") && err.contains("still broken"),
            "{err}"
        );
    }
}
