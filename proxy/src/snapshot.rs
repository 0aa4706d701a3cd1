//! A value read on every request and replaced whole now and then (the
//! running configuration, the trusted identity headers): readers take an
//! `Arc` of the version they started with and never hold the lock.

use std::sync::{Arc, RwLock};

#[derive(Debug)]
pub struct Snapshot<T>(RwLock<Arc<T>>);

impl<T> Snapshot<T> {
    pub fn new(value: T) -> Snapshot<T> {
        Snapshot(RwLock::new(Arc::new(value)))
    }

    pub fn get(&self) -> Arc<T> {
        self.0
            .read()
            .map(|v| v.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    pub fn set(&self, value: T) {
        self.update(|_| value);
    }

    /// Replace the value with `next(current)`, under the write lock so two
    /// updates never lose one another; returns the new value.
    pub fn update(&self, next: impl FnOnce(&T) -> T) -> Arc<T> {
        let mut current = match self.0.write() {
            Ok(c) => c,
            Err(e) => e.into_inner(),
        };
        *current = Arc::new(next(&current));
        current.clone()
    }
}
