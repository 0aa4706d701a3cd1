//! A server started as a child process for a test: its stderr log, its pid,
//! whether it still runs, and killed (by its own handle) and reaped on drop.

use std::path::PathBuf;
use std::process::Child;

pub struct ServerChild {
    child: Child,
    stderr_log: PathBuf,
}

impl ServerChild {
    pub fn new(child: Child, stderr_log: PathBuf) -> Self {
        Self { child, stderr_log }
    }

    /// What the server has logged on stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the server is still running (it must be, at the end of every test).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        // Our own child, by its pid (the Child handle): SIGKILL, then reaped.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
