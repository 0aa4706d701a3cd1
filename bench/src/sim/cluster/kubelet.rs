//! `--kubelet`: kwok's default node and pod Stages (loadgen's built-in set, kwok's "fast"
//! Stages unchanged) run by loadgen's Stage engine over every node and every pod bound to
//! one: a node that is not Ready is initialized (conditions, addresses, capacity), a Pending
//! pod goes Running with its container statuses, `Ready`, `podIP`, `hostIP` and
//! `startTime` (`pod-ready`), a running pod owned by a Job completes (`pod-complete`:
//! `Succeeded`, containers terminated with exit code 0), and a pod being deleted is removed
//! (`pod-delete`; the reaper's `--kubelet-delete-delay` still ends graceful deletes when
//! the engine does not).
//!
//! The engine keeps a copy of every pod it follows (all pods bound to a node): memory
//! grows with the pods stored, as a kwok controller's does.

use loadgen::stages::engine::Scope;
use loadgen::stages::{EngineRun, StageSet, BUILTIN, BUILTIN_NAME};
use loadgen::target::ApiClient;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Stages applied at once (each is one or two requests).
const MAX_IN_FLIGHT: usize = 64;

/// kwok's default Stages, as loadgen's `--stages fast` loads them.
pub fn default_stages() -> Result<StageSet, String> {
    StageSet::parse(BUILTIN, BUILTIN_NAME).map_err(|e| e.to_string())
}

/// Starts the informers and the engine on `tracker` until `stop`.
pub fn start(
    client: ApiClient,
    timeout: Duration,
    tracker: &TaskTracker,
    stop: &CancellationToken,
) -> Result<(), String> {
    let set = Arc::new(default_stages()?);
    loadgen::stages::spawn(
        set,
        EngineRun {
            client,
            scope: Scope::AllNodes,
            time_scale: 1.0,
            timeout,
            max_in_flight: MAX_IN_FLIGHT,
            // Nothing reports them, and a recorder grows by a row a second.
            recorders: Default::default(),
            tracker,
            stop,
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_stages_run_pods_and_complete_jobs() {
        let set = default_stages().unwrap();
        let names: Vec<&str> = set.stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["node-initialize", "pod-ready", "pod-complete", "pod-delete"]
        );
    }
}
