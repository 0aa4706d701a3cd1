//! The per-request context (pingora's CTX): what one request has become
//! through the steps of [`crate::handle::handle`]. It is built up to
//! admission (identity, classification, pattern, prediction, lane), admit
//! adds what the request holds, forward reads it, and observe moves the
//! part it needs into the response body's end-of-stream callback.
//!
//! It is held across the admit and forward awaits, inside every request's
//! future: so it keeps of the classification only the few facts later
//! steps read ([`RequestKind`]), and what only heavy requests need is
//! boxed ([`Hold`]).

use std::sync::Arc;

use tokio::time::Instant;

use crate::admit::Hold;
use apimodel::Verb;

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
    /// What kind of request it is.
    pub kind: RequestKind,
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
    /// Heavy only because its pattern was unlearned: the lane it moves to if
    /// the pattern is learned light while it waits for its turn (a kubelet's
    /// LIST of its own pods waited seconds behind LISTs of all pods, and got
    /// 429s, for a pattern known to cost 100 bytes by then).
    pub lane_if_light: Option<Lane>,
    /// What admission gave it, held until its response ends (or starts, for
    /// a long-running request).
    pub hold: Hold,
}

/// What the steps after admission read of the classification.
#[derive(Debug, Clone, Copy)]
pub struct RequestKind {
    pub verb: Verb,
    /// A watch, exec, attach, port-forward…: its response runs as long as
    /// the client wants (no request timeout, no duration observed).
    pub long_running: bool,
    /// A LIST of everything in its scope, in one response
    /// ([`Classified::is_full_list`]).
    pub full_list: bool,
    /// A watch-list that streams its initial state, then a bookmark.
    pub streams_initial_events: bool,
}

impl RequestKind {
    pub fn of(c: &Classified) -> RequestKind {
        RequestKind {
            verb: c.info.verb,
            long_running: c.info.is_long_running(),
            full_list: c.is_full_list(),
            streams_initial_events: c.watch_list
                && c.info.options.send_initial_events == Some(true),
        }
    }
}

impl RequestCtx {
    /// See [`RequestKind::long_running`].
    pub fn long_running(&self) -> bool {
        self.kind.long_running
    }
}
