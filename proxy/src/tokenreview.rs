//! A cache of TokenReviews: who a bearer token belongs to, asked of the
//! apiserver with tollgate's own identity (it needs RBAC to create
//! `tokenreviews`; off by default). For classification and lanes only,
//! never for authorization: the apiserver still authenticates every
//! forwarded request itself. Never on the hot path: an unknown token starts
//! a review in the background and is classified by its JWT claims meanwhile.
//! Keyed by token hash; the token itself is only sent to the apiserver.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::forward::UpstreamPool;
use crate::identity::{bearer_token, Client, Identity};

/// Most tokens remembered; past it, expired entries go, then all.
const MAX_ENTRIES: usize = 10_000;

/// A reviewed token's user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewedUser {
    pub user: String,
    pub groups: Vec<String>,
}

/// What the cache knows about a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Reviewed: its user, or `None` if the apiserver did not authenticate it.
    Known(Option<ReviewedUser>),
    /// Never seen (or expired): the caller starts a review.
    Start,
    /// A review is under way.
    Pending,
}

#[derive(Debug)]
enum Entry {
    Pending(Instant),
    Done {
        at: Instant,
        user: Option<ReviewedUser>,
    },
}

/// The cache. Time is passed in.
#[derive(Debug)]
pub struct TokenReviews {
    ttl: Duration,
    entries: Mutex<HashMap<String, Entry>>,
}

impl TokenReviews {
    pub fn new(ttl: Duration) -> Self {
        TokenReviews {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Look a token hash up; `Start` marks it pending, so one review runs per token.
    pub fn lookup(&self, hash: &str, now: Instant) -> Lookup {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = |at: &Instant| now.saturating_duration_since(*at) < self.ttl;
        match entries.get(hash) {
            Some(Entry::Done { at, user }) if fresh(at) => return Lookup::Known(user.clone()),
            Some(Entry::Pending(at)) if fresh(at) => return Lookup::Pending,
            _ => {}
        }
        if entries.len() >= MAX_ENTRIES {
            entries.retain(|_, e| match e {
                Entry::Pending(at) | Entry::Done { at, .. } => fresh(at),
            });
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(hash.to_string(), Entry::Pending(now));
        Lookup::Start
    }

    /// Record a review's answer.
    pub fn record(&self, hash: &str, user: Option<ReviewedUser>, now: Instant) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.insert(hash.to_string(), Entry::Done { at: now, user });
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
/// background on `pool` (never waited for).
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
    match reviews.lookup(&hash, now) {
        Lookup::Known(Some(u)) => client.identity.set_reviewed(&u.user, &u.groups),
        Lookup::Known(None) | Lookup::Pending => {}
        Lookup::Start => {
            let Some(token) = bearer_token(headers).map(str::to_string) else {
                return;
            };
            let (reviews, pool) = (reviews.clone(), pool.clone());
            tokio::spawn(async move {
                let Some(u) = pool.upstreams().iter().find(|u| u.is_healthy()).cloned() else {
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
                let user = match answer {
                    Ok(body) => parse_response(&body),
                    Err(e) => {
                        tracing::debug!(token = %hash, error = %e, "token review failed");
                        None
                    }
                };
                reviews.record(&hash, user, Instant::now());
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_review_per_token_until_it_expires() {
        let c = TokenReviews::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(c.lookup("h", t0), Lookup::Start);
        assert_eq!(c.lookup("h", t0), Lookup::Pending);
        let u = ReviewedUser {
            user: "system:node:n1".into(),
            groups: vec!["system:nodes".into()],
        };
        c.record("h", Some(u.clone()), t0);
        assert_eq!(
            c.lookup("h", t0 + Duration::from_secs(59)),
            Lookup::Known(Some(u))
        );
        assert_eq!(c.lookup("h", t0 + Duration::from_secs(60)), Lookup::Start);
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
