//! The relist guard's policy: a consistent LIST without `limit` of a client
//! a rule matches (verified identities only) is rewritten to
//! `resourceVersion=0` — served from the watch cache, possibly a little
//! stale — before it is predicted and admitted.

use apimodel::{ConsistencyClass, Verb};
use http::Request;
use hyper::body::Incoming;

use super::Admission;
use crate::classify::{classify, Classified};
use crate::config::Config;
use crate::enforce::lane::identity_matches;
use crate::identity::Client;
use crate::metrics::Metrics;
use crate::pattern::PatternKey;

/// The request as it will be served: `classified` unchanged (`false`), or
/// rewritten and classified again (`true`) if a rule applies. In place, not
/// by value: the classification is large and this runs on every request.
pub fn rewrite_to_cache(
    admission: &Admission,
    metrics: &Metrics,
    req: &mut Request<Incoming>,
    client: &Client,
    classified: &mut Classified,
    config: &Config,
) -> bool {
    match rewritten(admission, req, client, classified, config) {
        Some(again) => {
            metrics.rewrites.inc();
            *classified = again;
            true
        }
        None => false,
    }
}

fn rewritten(
    admission: &Admission,
    req: &mut Request<Incoming>,
    client: &Client,
    classified: &Classified,
    config: &Config,
) -> Option<Classified> {
    let rules = &config.relist_guard.rewrite_to_cache;
    let info = &classified.info;
    if rules.is_empty()
        || info.verb != Verb::List
        || classified.consistency != Some(ConsistencyClass::Consistent)
        || info.options.limit.is_some()
        || info.options.continue_token.is_some()
    {
        return None;
    }
    let resource = PatternKey::new(classified, client.identity.class()).resource;
    let warming = || admission.warming_up(config.admission());
    let applies = rules.iter().any(|r| {
        identity_matches(&client.identity, &r.users, &r.groups, true)
            && (r.resources.is_empty() || r.resources.contains(&resource))
            && (!r.during_warmup_only || warming())
    });
    if !applies {
        return None;
    }
    let uri = req.uri();
    let pq = match uri.query() {
        Some(q) if !q.is_empty() => format!("{}?{q}&resourceVersion=0", uri.path()),
        _ => format!("{}?resourceVersion=0", uri.path()),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(pq.parse().ok()?);
    let rewritten = http::Uri::from_parts(parts).ok()?;
    let again = classify(req.method(), &rewritten, req.headers()).ok()?;
    *req.uri_mut() = rewritten;
    Some(again)
}
