//! The per-request context (pingora's CTX): what one request has become
//! through the steps of [`crate::handle::handle`]. It is built up to
//! admission (identity, classification, pattern, prediction, lane), admit
//! adds what the request holds, forward reads it, and observe moves the
//! part it needs into the response body's end-of-stream callback.

use std::sync::Arc;

use tokio::time::Instant;

use crate::admit::Hold;
use crate::classify::Classified;
use crate::config::Config;
use crate::enforce::Lane;
use crate::identity::Client;
use crate::pattern::PatternKey;
use crate::predict::Prediction;

/// One request's context.
#[derive(Debug)]
pub struct RequestCtx {
    /// When the request arrived.
    pub started: Instant,
    /// The configuration it is served under (a reload does not change it).
    pub config: Arc<Config>,
    /// Who sent it.
    pub client: Client,
    /// What it asks for.
    pub classified: Classified,
    /// The relist guard's policy rewrote it to `resourceVersion=0`.
    pub rewritten: bool,
    /// An HTTP/1.1 upgrade (exec, attach, port-forward).
    pub upgrade: bool,
    /// The pattern it is learned under.
    pub key: PatternKey,
    /// What the pattern cache predicted it costs.
    pub predicted: Prediction,
    /// The admission lane it is served in.
    pub lane: Lane,
    /// What admission gave it, held until its response ends (or starts, for
    /// a long-running request).
    pub hold: Hold,
}

impl RequestCtx {
    /// A watch, exec, attach, port-forward…: its response runs as long as
    /// the client wants (no request timeout, no duration observed).
    pub fn long_running(&self) -> bool {
        self.classified.info.is_long_running()
    }
}
