//! SIGINT (Ctrl-C) and SIGTERM (a Job deleted, a node drained, `timeout`)
//! both stop a run the same way: the schedule ends, in-flight requests get
//! `--drain-timeout` to finish, and the results are written marked
//! `"interrupted": true`. The process then exits 128 + the signal's number,
//! as a shell reports a process killed by it, so a Job does not count an
//! interrupted index as complete.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

/// Exit status after SIGINT (128 + 2).
pub const EXIT_SIGINT: u8 = 130;
/// Exit status after SIGTERM (128 + 15).
pub const EXIT_SIGTERM: u8 = 143;

/// The shutdown token a run watches, and which signal (if any) cancelled it.
#[derive(Debug, Clone)]
pub struct Interrupts {
    token: CancellationToken,
    /// The exit status the signal calls for; 0 until one arrives.
    exit: Arc<AtomicU8>,
}

impl Interrupts {
    /// Listens for SIGINT and SIGTERM on the current tokio runtime; the first
    /// one cancels [`Interrupts::token`].
    pub fn listen(what: &'static str) -> Interrupts {
        let me = Interrupts {
            token: CancellationToken::new(),
            exit: Arc::new(AtomicU8::new(0)),
        };
        let on_signal = me.clone();
        tokio::spawn(async move {
            let Some(code) = wait_for_signal().await else {
                return;
            };
            tracing::warn!(status = code, "interrupted: stopping, draining and {what}");
            on_signal.exit.store(code, Ordering::Relaxed);
            on_signal.token.cancel();
        });
        me
    }

    /// Cancelled by the first signal.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// 128 + the signal's number, once one arrived.
    pub fn exit_code(&self) -> Option<u8> {
        match self.exit.load(Ordering::Relaxed) {
            0 => None,
            code => Some(code),
        }
    }
}

/// The exit status of the first SIGINT or SIGTERM; `None` if neither can be
/// listened for (the run then only ends by its duration).
#[cfg(unix)]
async fn wait_for_signal() -> Option<u8> {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut int, mut term) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (i, t),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!(error = %e, "cannot listen for SIGINT/SIGTERM");
            return None;
        }
    };
    tokio::select! {
        _ = int.recv() => Some(EXIT_SIGINT),
        _ = term.recv() => Some(EXIT_SIGTERM),
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() -> Option<u8> {
    tokio::signal::ctrl_c().await.ok().map(|()| EXIT_SIGINT)
}
