//! etcd's backend lock as the model sees it: range reads share it, write
//! commits take it exclusively (together: etcd batches commits), and a
//! waiting writer holds back new readers, so a stream of large range reads
//! delays every write behind the reads in progress. Pure: who is granted
//! what is returned, the caller wakes them.

use std::collections::VecDeque;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Read,
    Write,
}

/// The lock's state; tickets are the caller's ids for waiters.
#[derive(Debug, Default)]
pub struct BackendLock {
    readers: usize,
    writers: usize,
    waiting_readers: VecDeque<u64>,
    waiting_writers: VecDeque<u64>,
}

impl BackendLock {
    /// Takes the lock for `ticket` if it can now; false: it waits (until a
    /// `release` returns its ticket).
    pub fn acquire(&mut self, mode: Mode, ticket: u64) -> bool {
        match mode {
            Mode::Read if self.writers == 0 && self.waiting_writers.is_empty() => {
                self.readers += 1;
                true
            }
            Mode::Write if self.readers == 0 => {
                self.writers += 1;
                true
            }
            Mode::Read => {
                self.waiting_readers.push_back(ticket);
                false
            }
            Mode::Write => {
                self.waiting_writers.push_back(ticket);
                false
            }
        }
    }

    /// Releases one holder of `mode`; returns the tickets granted the lock now, with their mode.
    pub fn release(&mut self, mode: Mode) -> Vec<(u64, Mode)> {
        match mode {
            Mode::Read => self.readers = self.readers.saturating_sub(1),
            Mode::Write => self.writers = self.writers.saturating_sub(1),
        }
        let mut granted = Vec::new();
        if self.readers == 0 && !self.waiting_writers.is_empty() {
            self.writers += self.waiting_writers.len();
            granted.extend(self.waiting_writers.drain(..).map(|t| (t, Mode::Write)));
        } else if self.writers == 0 && self.waiting_writers.is_empty() {
            self.readers += self.waiting_readers.len();
            granted.extend(self.waiting_readers.drain(..).map(|t| (t, Mode::Read)));
        }
        granted
    }

    /// Forgets a waiter that went away before it was granted the lock.
    pub fn cancel(&mut self, ticket: u64) {
        self.waiting_readers.retain(|t| *t != ticket);
        self.waiting_writers.retain(|t| *t != ticket);
    }

    pub fn holders(&self) -> (usize, usize) {
        (self.readers, self.writers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_wait_for_readers_and_hold_back_new_ones() {
        let mut l = BackendLock::default();
        assert!(l.acquire(Mode::Read, 1));
        assert!(l.acquire(Mode::Read, 2));
        assert!(!l.acquire(Mode::Write, 3));
        // A waiting writer holds back a new reader.
        assert!(!l.acquire(Mode::Read, 4));
        assert!(l.release(Mode::Read).is_empty());
        assert_eq!(l.release(Mode::Read), vec![(3, Mode::Write)]);
        assert_eq!(l.holders(), (0, 1));
        // Writers share (batched commits).
        assert!(l.acquire(Mode::Write, 5));
        assert!(l.release(Mode::Write).is_empty());
        assert_eq!(l.release(Mode::Write), vec![(4, Mode::Read)]);
        assert_eq!(l.holders(), (1, 0));
    }

    #[test]
    fn a_cancelled_waiter_is_never_granted() {
        let mut l = BackendLock::default();
        assert!(l.acquire(Mode::Read, 1));
        assert!(!l.acquire(Mode::Write, 2));
        l.cancel(2);
        assert!(l.release(Mode::Read).is_empty());
        assert_eq!(l.holders(), (0, 0));
        assert!(l.acquire(Mode::Write, 3));
    }
}
