//! A cache of TokenReviews: who a bearer token belongs to, asked of the
//! apiserver with tollgate's own identity (it needs RBAC to create
//! `tokenreviews`; off by default). For classification and lanes only,
//! never for authorization: the apiserver still authenticates every
//! forwarded request itself. Never on the hot path: an unknown token starts
//! a review in the background and is classified by its JWT claims meanwhile.
//! Keyed by token hash; the token itself is only sent to the apiserver.
//!
//! **Not an amplifier.** Every review is a request to the apiserver with
//! tollgate's privileged identity, and anyone can make up tokens: 3,000 junk
//! tokens from one address once caused 3,000 reviews. So reviews are bounded
//! per source address (the client IP): a token bucket (`tokenReview.perSourcePerSecond`,
//! `perSourceBurst`) and a cap on its reviews in flight (`perSourceInFlight`); a
//! token past them is simply not reviewed now (classified by its claims, asked
//! again on a later request). Rejected tokens are remembered by hash
//! (a negative cache of its own, bounded, so junk never evicts the users known).
//! `tollgate_token_reviews_total{result}` counts reviews by outcome
//! (`authenticated`, `rejected`, `error`) and the ones not made (`limited`).

use std::collections::HashMap;
use std::net::Ipv6Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::time::Instant;

use crate::forward::UpstreamPool;
use crate::identity::{bearer_token, Client, Identity};
use crate::metrics::ResultLabel;

/// Most tokens remembered with their user (or pending); past it, expired entries go, then all.
const MAX_ENTRIES: usize = 10_000;

/// Most rejected tokens remembered; past it, expired ones go, then all rejected ones.
const MAX_REJECTED: usize = 10_000;

/// Most source addresses tracked; past it, idle ones (bucket full, nothing in
/// flight) go, and if none is idle a new address's tokens are not reviewed.
const MAX_SOURCES: usize = 10_000;

/// A reviewed token's user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewedUser {
    pub user: String,
    pub groups: Vec<String>,
}

/// How many reviews one source address may cause.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Reviews a second, on average.
    pub per_second: f64,
    /// Reviews at once after a quiet spell.
    pub burst: f64,
    /// Reviews in flight at once.
    pub in_flight: usize,
}

/// What the cache knows about a token.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Reviewed: its user, or `None` if the apiserver did not authenticate it.
    Known(Option<ReviewedUser>),
    /// Never seen (or expired): the caller starts a review, holding the slot
    /// (the source's review in flight) until it is recorded or dropped.
    Start(ReviewSlot),
    /// A review is under way.
    Pending,
    /// Not now: the source has used its reviews.
    Limited,
}

#[derive(Debug)]
enum Entry {
    Pending(Instant),
    Done { at: Instant, user: ReviewedUser },
}

/// One source address's bucket and reviews in flight.
#[derive(Debug)]
struct Source {
    tokens: f64,
    at: Instant,
    in_flight: usize,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// Rejected token hashes and when.
    rejected: HashMap<String, Instant>,
    sources: HashMap<Ipv6Addr, Source>,
}

/// The cache. Time is passed in.
#[derive(Debug)]
pub struct TokenReviews {
    ttl: Duration,
    limits: Limits,
    state: Mutex<State>,
    outcomes: Family<ResultLabel, Counter>,
}

/// A source's review in flight, given back when dropped.
#[derive(Debug)]
pub struct ReviewSlot {
    reviews: Arc<TokenReviews>,
    source: Ipv6Addr,
}

impl PartialEq for ReviewSlot {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source && Arc::ptr_eq(&self.reviews, &other.reviews)
    }
}

impl Eq for ReviewSlot {}

impl Drop for ReviewSlot {
    fn drop(&mut self) {
        let mut state = self.reviews.lock();
        if let Some(s) = state.sources.get_mut(&self.source) {
            s.in_flight = s.in_flight.saturating_sub(1);
        }
    }
}

impl TokenReviews {
    pub fn new(ttl: Duration, limits: Limits, outcomes: Family<ResultLabel, Counter>) -> Arc<Self> {
        Arc::new(TokenReviews {
            ttl,
            limits,
            state: Mutex::new(State::default()),
            outcomes,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, outcome: &str) {
        self.outcomes
            .get_or_create(&ResultLabel {
                result: outcome.into(),
            })
            .inc();
    }

    /// Look a token hash up; `Start` marks it pending, so one review runs per
    /// token, and takes one of `source`'s reviews.
    pub fn lookup(self: &Arc<Self>, hash: &str, source: Ipv6Addr, now: Instant) -> Lookup {
        let mut state = self.lock();
        let fresh = |at: &Instant| now.saturating_duration_since(*at) < self.ttl;
        match state.entries.get(hash) {
            Some(Entry::Done { at, user }) if fresh(at) => {
                return Lookup::Known(Some(user.clone()))
            }
            Some(Entry::Pending(at)) if fresh(at) => return Lookup::Pending,
            _ => {}
        }
        if state.rejected.get(hash).is_some_and(fresh) {
            return Lookup::Known(None);
        }
        if !self.take(&mut state, source, now) {
            drop(state);
            self.count("limited");
            return Lookup::Limited;
        }
        if state.entries.len() >= MAX_ENTRIES {
            state.entries.retain(|_, e| match e {
                Entry::Pending(at) | Entry::Done { at, .. } => fresh(at),
            });
            if state.entries.len() >= MAX_ENTRIES {
                state.entries.clear();
            }
        }
        state.entries.insert(hash.to_string(), Entry::Pending(now));
        Lookup::Start(ReviewSlot {
            reviews: self.clone(),
            source,
        })
    }

    /// Take one review from `source`'s bucket and in-flight cap, if it has one.
    fn take(&self, state: &mut State, source: Ipv6Addr, now: Instant) -> bool {
        let Limits {
            per_second,
            burst,
            in_flight,
        } = self.limits;
        let refill = |s: &Source| {
            (s.tokens + now.saturating_duration_since(s.at).as_secs_f64() * per_second).min(burst)
        };
        if !state.sources.contains_key(&source) && state.sources.len() >= MAX_SOURCES {
            state
                .sources
                .retain(|_, s| s.in_flight > 0 || refill(s) < burst);
            if state.sources.len() >= MAX_SOURCES {
                return false;
            }
        }
        let s = state.sources.entry(source).or_insert(Source {
            tokens: burst,
            at: now,
            in_flight: 0,
        });
        s.tokens = refill(s);
        s.at = now;
        if s.tokens < 1.0 || s.in_flight >= in_flight {
            return false;
        }
        s.tokens -= 1.0;
        s.in_flight += 1;
        true
    }

    /// Record a review's answer (`Err` if it failed: remembered as rejected, so a
    /// failing apiserver is not asked again for the same token until it expires),
    /// and give the source's slot back.
    pub fn record(
        &self,
        hash: &str,
        answer: Result<Option<ReviewedUser>, ()>,
        slot: ReviewSlot,
        now: Instant,
    ) {
        let outcome = match &answer {
            Ok(Some(_)) => "authenticated",
            Ok(None) => "rejected",
            Err(()) => "error",
        };
        {
            let mut state = self.lock();
            match answer {
                Ok(Some(user)) => {
                    state
                        .entries
                        .insert(hash.to_string(), Entry::Done { at: now, user });
                }
                Ok(None) | Err(()) => {
                    state.entries.remove(hash);
                    if state.rejected.len() >= MAX_REJECTED {
                        let ttl = self.ttl;
                        state
                            .rejected
                            .retain(|_, at| now.saturating_duration_since(*at) < ttl);
                        if state.rejected.len() >= MAX_REJECTED {
                            state.rejected.clear();
                        }
                    }
                    state.rejected.insert(hash.to_string(), now);
                }
            }
        }
        drop(slot);
        self.count(outcome);
    }

    /// Tokens remembered: (with a user or pending, rejected, sources tracked).
    pub fn sizes(&self) -> (usize, usize, usize) {
        let state = self.lock();
        (
            state.entries.len(),
            state.rejected.len(),
            state.sources.len(),
        )
    }
}

/// The TokenReview request body.
pub fn request_body(token: &str) -> Bytes {
    let body = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token},
    });
    Bytes::from(body.to_string())
}

/// The user of an authenticated TokenReview response.
pub fn parse_response(body: &[u8]) -> Option<ReviewedUser> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let status = v.get("status")?;
    if status.get("authenticated")?.as_bool() != Some(true) {
        return None;
    }
    let user = status.get("user")?;
    Some(ReviewedUser {
        user: user.get("username")?.as_str()?.to_string(),
        groups: user
            .get("groups")
            .and_then(|g| g.as_array())
            .map(|g| {
                g.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
    })
}

/// Name a token client by its cached TokenReview, or start one in the
/// background on `pool` (never waited for), within the client address's limits.
pub fn review(
    reviews: Option<&Arc<TokenReviews>>,
    pool: &Arc<UpstreamPool>,
    client: &mut Client,
    headers: &http::HeaderMap,
    now: Instant,
) {
    let (Some(reviews), Identity::Token { hash, .. }) = (reviews, &client.identity) else {
        return;
    };
    let hash = hash.clone();
    match reviews.lookup(&hash, client.source, now) {
        Lookup::Known(Some(u)) => client.identity.set_reviewed(&u.user, &u.groups),
        Lookup::Known(None) | Lookup::Pending | Lookup::Limited => {}
        Lookup::Start(slot) => {
            let Some(token) = bearer_token(headers).map(str::to_string) else {
                return;
            };
            let (reviews, pool) = (reviews.clone(), pool.clone());
            tokio::spawn(async move {
                let Some(u) = pool.upstreams().iter().find(|u| u.is_healthy()).cloned() else {
                    reviews.record(&hash, Err(()), slot, Instant::now());
                    return;
                };
                let answer = pool
                    .own_request(
                        &u,
                        http::Method::POST,
                        "/apis/authentication.k8s.io/v1/tokenreviews",
                        Some(request_body(&token)),
                        1 << 20,
                        Duration::from_secs(5),
                    )
                    .await;
                let answer = match answer {
                    Ok(body) => Ok(parse_response(&body)),
                    Err(e) => {
                        tracing::debug!(token = %hash, error = %e, "token review failed");
                        Err(())
                    }
                };
                reviews.record(&hash, answer, slot, Instant::now());
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        per_second: 1.0,
        burst: 10.0,
        in_flight: 2,
    };

    fn cache() -> Arc<TokenReviews> {
        TokenReviews::new(Duration::from_secs(60), LIMITS, Family::default())
    }

    const A: Ipv6Addr = Ipv6Addr::LOCALHOST;
    const B: Ipv6Addr = Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0x0a00, 1);

    fn started(l: Lookup) -> ReviewSlot {
        match l {
            Lookup::Start(slot) => slot,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn one_review_per_token_until_it_expires() {
        let c = cache();
        let t0 = Instant::now();
        let slot = started(c.lookup("h", A, t0));
        assert_eq!(c.lookup("h", A, t0), Lookup::Pending);
        let u = ReviewedUser {
            user: "system:node:n1".into(),
            groups: vec!["system:nodes".into()],
        };
        c.record("h", Ok(Some(u.clone())), slot, t0);
        assert_eq!(
            c.lookup("h", A, t0 + Duration::from_secs(59)),
            Lookup::Known(Some(u))
        );
        assert!(matches!(
            c.lookup("h", A, t0 + Duration::from_secs(60)),
            Lookup::Start(_)
        ));
    }

    #[test]
    fn rejected_tokens_are_remembered_by_hash() {
        let c = cache();
        let t0 = Instant::now();
        let slot = started(c.lookup("junk", A, t0));
        c.record("junk", Ok(None), slot, t0);
        assert_eq!(c.lookup("junk", B, t0), Lookup::Known(None));
        let slot = started(c.lookup("down", A, t0));
        c.record("down", Err(()), slot, t0);
        assert_eq!(c.lookup("down", A, t0), Lookup::Known(None));
        assert_eq!(c.sizes().1, 2);
    }

    #[test]
    fn one_source_gets_its_burst_then_its_rate_and_never_more_in_flight() {
        let c = cache();
        let t0 = Instant::now();
        // Two in flight at most.
        let a = started(c.lookup("t0", A, t0));
        let b = started(c.lookup("t1", A, t0));
        assert_eq!(c.lookup("t2", A, t0), Lookup::Limited);
        // Another address is not held back.
        let other = started(c.lookup("u0", B, t0));
        c.record("t0", Ok(None), a, t0);
        c.record("t1", Ok(None), b, t0);
        c.record("u0", Ok(None), other, t0);
        // 3,000 fresh tokens in 3 s, answered at once: the burst (10) plus the rate.
        let mut started_reviews = 2;
        for i in 0..3000u32 {
            let now = t0 + Duration::from_millis(u64::from(i));
            if let Lookup::Start(slot) = c.lookup(&format!("junk{i}"), A, now) {
                started_reviews += 1;
                c.record(&format!("junk{i}"), Ok(None), slot, now);
            }
        }
        assert!(
            (10..=13).contains(&started_reviews),
            "{started_reviews} reviews"
        );
    }

    #[test]
    fn the_negative_cache_and_the_sources_are_bounded() {
        let c = TokenReviews::new(
            Duration::from_secs(60),
            Limits {
                per_second: 1e9,
                burst: 1e9,
                in_flight: 1 << 20,
            },
            Family::default(),
        );
        let t0 = Instant::now();
        for i in 0..(MAX_REJECTED + 10) {
            let slot = started(c.lookup(&format!("h{i}"), A, t0));
            c.record(&format!("h{i}"), Ok(None), slot, t0);
        }
        let (entries, rejected, _) = c.sizes();
        assert_eq!(entries, 0);
        assert!(rejected <= MAX_REJECTED, "{rejected}");

        let c = cache();
        for i in 0..MAX_SOURCES {
            let source = Ipv6Addr::from((i as u128) << 16);
            let slot = started(c.lookup(&format!("s{i}"), source, t0));
            c.record(&format!("s{i}"), Ok(None), slot, t0);
        }
        // Every address just used its bucket: a new one waits...
        assert_eq!(c.lookup("new", B, t0), Lookup::Limited);
        // ...until theirs are full again and they are forgotten.
        let later = t0 + Duration::from_secs(2);
        assert!(matches!(c.lookup("new", B, later), Lookup::Start(_)));
        assert!(c.sizes().2 <= MAX_SOURCES);
    }

    #[test]
    fn responses() {
        let ok = br#"{"status":{"authenticated":true,"user":{"username":"alice","groups":["dev","system:authenticated"]}}}"#;
        assert_eq!(
            parse_response(ok),
            Some(ReviewedUser {
                user: "alice".into(),
                groups: vec!["dev".into(), "system:authenticated".into()],
            })
        );
        assert_eq!(
            parse_response(br#"{"status":{"authenticated":false}}"#),
            None
        );
        assert_eq!(parse_response(b"not json"), None);
        let body = request_body("t0k3n");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v["spec"]["token"], "t0k3n");
        assert_eq!(v["kind"], "TokenReview");
    }
}
