//! One request's way through the gateway, written top to bottom in
//! [`handle`]: identify → classify → pattern → predict → admit → forward →
//! observe, one call per step over one [`RequestCtx`]. Each step's function
//! is in the module named after it; the shared state is [`Gateway`].

use std::net::IpAddr;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::admit::{self, with_lane};
use crate::classify::classify;
use crate::context::{RequestCtx, RequestKind};
use crate::enforce::lane::Lane;
use crate::forward;
use crate::gateway::Gateway;
use crate::identity::{Client, PeerCertificate};
use crate::pattern::PatternKey;
use crate::status::ProxyError;
use crate::tokenreview;
use crate::Body;

/// One request, from arrival to the response head; the body streams on.
/// `source` is the address its connection came from.
pub async fn handle(
    gw: &Gateway,
    mut req: Request<Incoming>,
    peer: Option<Arc<PeerCertificate>>,
    source: IpAddr,
) -> Response<Body> {
    let started = Instant::now();
    let config = gw.config();
    // identify (a bearer token by its cached TokenReview, if enabled)
    let mut client = Client::of(peer.as_deref(), req.headers(), source);
    tokenreview::review(gw.reviews(), gw.pool(), &mut client, req.headers(), started);
    // classify (and, by the relist guard's policy, maybe read from the cache)
    let mut classified = match classify(req.method(), req.uri(), req.headers()) {
        Ok(c) => c,
        Err(e) => return gw.observer().answered(None, ProxyError::BadRequest(e)),
    };
    let (admission, metrics) = (gw.admission(), gw.metrics());
    let rewritten = admit::rewrite_to_cache(
        admission,
        metrics,
        &mut req,
        &client,
        &mut classified,
        &config,
    );
    // pattern, predict
    let key = PatternKey::new(&classified, client.identity.class());
    let (predicted, unlearned_heavy) = {
        let cache = gw.pattern_store().lock();
        let predicted = cache.predict(&key, started);
        (predicted, admit::unlearned_heavy(&cache, &key, &predicted))
    };
    tracing::debug!(pattern = %key, client = %client.identity.display_name(), predicted = predicted.cost(), "request");
    let lane = admit::lane(
        &config,
        &client,
        &classified,
        &key,
        &predicted,
        unlearned_heavy,
    );
    let lane_if_light = (lane == Lane::Heavy && unlearned_heavy)
        .then(|| admit::lane(&config, &client, &classified, &key, &predicted, false))
        .filter(|l| *l != Lane::Heavy);
    let mut ctx = RequestCtx {
        lane,
        lane_if_light,
        hold: admit::Hold::Nothing,
        upgrade: forward::is_upgrade(req.headers()),
        kind: RequestKind::of(&classified),
        started,
        config,
        client,
        rewritten,
        key,
        predicted,
    };
    // Not held across the awaits (the future would carry it): `ctx.kind` has what is left to read.
    drop(classified);
    // admit, queue or reject (429)
    let patterns = gw.pattern_store();
    if let Err(too_many) = admit::admit(admission, patterns, metrics, &mut ctx).await {
        return too_many;
    }
    // forward
    let forwarded = match forward::forward(gw.pool(), gw.tunnels(), req, &ctx).await {
        Ok(f) => f,
        // An unsettled hold refunds its debit: the upstream did no work.
        Err(e) => {
            let resp = gw.observer().answered(Some(ctx.kind.verb), e);
            return with_lane(resp, ctx.lane);
        }
    };
    admit::on_response_start(admission, &mut ctx, forwarded.status());
    // observe, once the body ends
    gw.observer().observe(forwarded, ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `f` returns, without making one.
    fn future_size<'a, F, Fut>(_: F) -> usize
    where
        F: FnOnce(&'a Gateway, Request<Incoming>, Option<Arc<PeerCertificate>>, IpAddr) -> Fut,
    {
        std::mem::size_of::<Fut>()
    }

    /// Every request's future is allocated whole and holds the context
    /// across its awaits: what only some requests need stays out of it
    /// (boxed or dropped before the awaits).
    #[test]
    fn the_request_future_stays_small() {
        let ctx = std::mem::size_of::<RequestCtx>();
        assert!(ctx <= 256, "RequestCtx is {ctx} bytes");
        let handle = future_size(handle);
        assert!(handle <= 4096, "handle's future is {handle} bytes");
    }
}
