//! The bounds on upstream exchanges (`upstream.timeouts`); how they apply
//! is in [`crate::forward::stall`].

use serde::Deserialize;

/// The bounds on upstream exchanges (`upstream.timeouts`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct UpstreamTimeouts {
    /// Seconds a watch (or exec, attach, port-forward, followed log) may
    /// wait for its response headers; a watch's `timeoutSeconds` plus
    /// `watchMarginSeconds` bounds it too, when shorter. Default `60`.
    pub watch_header_seconds: f64,
    /// Seconds past a watch's `timeoutSeconds` before tollgate gives up on
    /// it (the apiserver ends the watch then). Default `10`.
    pub watch_margin_seconds: f64,
    /// Seconds a watch without `timeoutSeconds` may pass without a byte
    /// (the apiserver ends such a watch within 3600 s). Default `3660`.
    pub watch_idle_seconds: f64,
    /// Seconds a response body that is not a watch's (LISTs, GETs, writes)
    /// may pass without a byte while tollgate waits for one. Default `30`.
    pub body_idle_seconds: f64,
    /// Seconds between HTTP/2 pings on each upstream connection, idle or
    /// not. Needs a restart. Default `30`.
    pub ping_interval_seconds: f64,
    /// Seconds a ping may go unanswered before the connection (and every
    /// stream on it) is closed. Needs a restart. Default `20`.
    pub ping_timeout_seconds: f64,
}

impl Default for UpstreamTimeouts {
    fn default() -> Self {
        UpstreamTimeouts {
            watch_header_seconds: 60.0,
            watch_margin_seconds: 10.0,
            watch_idle_seconds: 3660.0,
            body_idle_seconds: 30.0,
            ping_interval_seconds: 30.0,
            ping_timeout_seconds: 20.0,
        }
    }
}
