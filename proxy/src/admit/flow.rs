//! A flow: the requests that queue together, share a light lane's per-flow
//! share and one per-client heavy-request rate.
//!
//! A verified identity (a client certificate checked against the client CA,
//! a token a TokenReview confirmed) is a flow by `quota.queue.flowBy`: the
//! identity, the User-Agent product, or both. Whatever tollgate could not
//! verify — no credentials, a bearer token not (yet) reviewed, whatever its
//! unverified JWT claims say — is one flow per source address (an IPv6
//! address by its /64, what one host is usually given): otherwise every
//! junk token or made-up user agent would be a new flow, with its own
//! queue, its own share of a lane and its own heavy-request rate (1,341
//! LISTs, each with a fresh invalid token, were all forwarded).
//!
//! Two forms of one equivalence: [`Flow::name`], a string for the heavy
//! lane's queues, the rate limiter and `Retry-After`'s jitter, and
//! [`Flow::id`], a keyed hash the light lanes take on every request without
//! allocating.

use std::hash::{BuildHasher, Hash, Hasher};
use std::net::{IpAddr, Ipv6Addr};

use crate::config::settings::enforce::FlowBy;
use crate::identity::{Client, Identity};

/// The flow of one request.
#[derive(Debug, Clone, Copy)]
pub enum Flow<'a> {
    /// An identity tollgate could not verify, by where it came from.
    Source(IpAddr),
    /// A verified client, by `flowBy`.
    Verified { client: &'a Client, by: FlowBy },
}

impl<'a> Flow<'a> {
    pub fn of(client: &'a Client, by: FlowBy) -> Flow<'a> {
        if client.identity.is_verified() {
            Flow::Verified { client, by }
        } else {
            Flow::Source(host(client.source))
        }
    }

    /// The flow as a string (never a token: tokens are known by their hash).
    pub fn name(&self) -> String {
        match *self {
            Flow::Source(IpAddr::V4(a)) => format!("source:{a}"),
            Flow::Source(IpAddr::V6(a)) => format!("source:{a}/64"),
            Flow::Verified { client, by } => match by {
                FlowBy::User => client.identity.display_name(),
                FlowBy::UserAgent => client.product().to_string(),
                FlowBy::UserAndUserAgent => client.display_name(),
            },
        }
    }

    /// The flow as a hash keyed by `keys` (a per-process random key, so
    /// nobody can pick a name that lands on another client's flow).
    pub fn id(&self, keys: &impl BuildHasher) -> u64 {
        let mut h = keys.build_hasher();
        match *self {
            Flow::Source(a) => {
                0u8.hash(&mut h);
                a.hash(&mut h);
            }
            Flow::Verified { client, by } => {
                1u8.hash(&mut h);
                if by != FlowBy::UserAgent {
                    hash_identity(&client.identity, &mut h);
                }
                if by != FlowBy::User {
                    client.product().hash(&mut h);
                }
            }
        }
        h.finish()
    }
}

/// What names a verified identity (as its display name does).
fn hash_identity(identity: &Identity, h: &mut impl Hasher) {
    match identity {
        Identity::Certificate { user, .. } => (0u8, user).hash(h),
        Identity::Token { hash, .. } => (1u8, hash).hash(h),
        Identity::Anonymous => 2u8.hash(h),
    }
}

/// The host an address stands for: an IPv4 address itself (also when
/// written IPv4-mapped), an IPv6 address its /64.
fn host(a: Ipv6Addr) -> IpAddr {
    match a.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6((u128::from(a) & !u128::from(u64::MAX)).into()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::hash_map::RandomState;

    use super::*;

    fn client(identity: Identity, source: &str, agent: &str) -> Client {
        Client {
            identity,
            user_agent: agent.into(),
            source: match source.parse().expect("an address") {
                IpAddr::V4(a) => a.to_ipv6_mapped(),
                IpAddr::V6(a) => a,
            },
        }
    }

    fn token(hash: &str, verified: bool) -> Identity {
        Identity::Token {
            hash: hash.into(),
            user: Some("system:serviceaccount:default:x".into()),
            groups: Vec::new(),
            verified,
        }
    }

    #[test]
    fn unverified_identities_are_one_flow_per_source_address() {
        let keys = RandomState::new();
        let by = FlowBy::UserAndUserAgent;
        let a = client(token("aaaa", false), "10.0.0.1", "curl/8");
        let b = client(token("bbbb", false), "10.0.0.1", "kubectl/1.34");
        let anon = client(Identity::Anonymous, "10.0.0.1", "x");
        let elsewhere = client(token("aaaa", false), "10.0.0.2", "curl/8");
        let (fa, fb) = (Flow::of(&a, by), Flow::of(&b, by));
        assert_eq!(fa.name(), "source:10.0.0.1");
        assert_eq!(fa.name(), fb.name());
        assert_eq!(fa.id(&keys), fb.id(&keys));
        assert_eq!(fa.id(&keys), Flow::of(&anon, by).id(&keys));
        assert_ne!(fa.id(&keys), Flow::of(&elsewhere, by).id(&keys));
        let v6a = client(Identity::Anonymous, "2001:db8::1", "");
        let v6b = client(Identity::Anonymous, "2001:db8::ffff:1", "");
        assert_eq!(Flow::of(&v6a, by).name(), "source:2001:db8::/64");
        assert_eq!(Flow::of(&v6a, by).id(&keys), Flow::of(&v6b, by).id(&keys));
        let mapped = client(Identity::Anonymous, "::ffff:10.0.0.1", "");
        assert_eq!(Flow::of(&mapped, by).name(), "source:10.0.0.1");
    }

    #[test]
    fn verified_identities_are_flows_by_flow_by() {
        let keys = RandomState::new();
        let cert = |user: &str, agent: &str| {
            client(
                Identity::Certificate {
                    user: user.into(),
                    groups: Vec::new(),
                },
                "10.0.0.1",
                agent,
            )
        };
        let (alice, alice2, bob) = (
            cert("alice", "kubectl/1.34 (linux)"),
            cert("alice", "helm/3"),
            cert("bob", "kubectl/1.30"),
        );
        let same = |by, x: &Client, y: &Client| {
            let (fx, fy) = (Flow::of(x, by), Flow::of(y, by));
            assert_eq!(fx.name() == fy.name(), fx.id(&keys) == fy.id(&keys));
            fx.id(&keys) == fy.id(&keys)
        };
        assert!(same(FlowBy::User, &alice, &alice2));
        assert!(!same(FlowBy::User, &alice, &bob));
        assert!(same(FlowBy::UserAgent, &alice, &bob));
        assert!(!same(FlowBy::UserAgent, &alice, &alice2));
        assert!(!same(FlowBy::UserAndUserAgent, &alice, &alice2));
        assert_eq!(Flow::of(&alice, FlowBy::User).name(), "user:alice");
        let reviewed = client(token("cccc", true), "10.0.0.9", "");
        assert!(Flow::of(&reviewed, FlowBy::User).name().contains("cccc"));
    }
}
