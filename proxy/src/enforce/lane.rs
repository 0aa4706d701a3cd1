//! Lanes: every request is assigned one by identity, verb and pattern, and
//! each lane has its own in-flight limit ([`super::slots`]), so node
//! heartbeats never wait behind LISTs.
//!
//! Assignment is pure ([`assign`]): the first matching rule names a lane;
//! a request of the `system` or `workload` lane whose predicted cost passes
//! the heavy threshold goes to `heavy` instead (a LIST storm from a
//! controller is still a LIST storm). Identity conditions match only
//! verified identities, except for rules of the `workload` and `heavy`
//! lanes, where unverified service-account JWT claims may choose too.

use crate::config::settings::enforce::{LaneRule, Lanes};
use crate::identity::Identity;

pub use crate::config::settings::enforce::Lane;

/// What lane assignment looks at.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub identity: &'a Identity,
    /// `get`, `list`, `watch`, …
    pub verb: &'a str,
    /// Pattern resource (`pods`, `apps/deployments`); empty for non-resource.
    pub resource: &'a str,
    /// For non-resource requests: the path.
    pub non_resource_path: Option<&'a str>,
    /// LIST-like and predicted at or past the heavy threshold.
    pub heavy: bool,
}

/// `pattern` with an optional trailing `*` matches `value`.
pub fn glob(pattern: &str, value: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => value.starts_with(prefix),
        None => pattern == value,
    }
}

/// Does the identity match users/groups? `verified_only` refuses identities
/// tollgate could not verify.
pub fn identity_matches(
    identity: &Identity,
    users: &[String],
    groups: &[String],
    verified_only: bool,
) -> bool {
    if users.is_empty() && groups.is_empty() {
        return true;
    }
    if verified_only && !identity.is_verified() {
        return false;
    }
    let (user, member_of) = match identity {
        Identity::Certificate { user, groups } => (Some(user.as_str()), groups.as_slice()),
        Identity::Token { user, groups, .. } => (user.as_deref(), groups.as_slice()),
        Identity::Anonymous => (None, &[][..]),
    };
    // A rule naming users and groups means "these users or these groups".
    let user_ok = user.is_some_and(|u| users.iter().any(|p| glob(p, u)));
    let group_ok = member_of.iter().any(|g| groups.iter().any(|p| p == g));
    user_ok || group_ok
}

fn rule_matches(rule: &LaneRule, s: &Subject<'_>) -> bool {
    let verified_only = matches!(rule.lane, Lane::Exempt | Lane::System);
    if !identity_matches(s.identity, &rule.users, &rule.groups, verified_only) {
        return false;
    }
    if !rule.verbs.is_empty() && !rule.verbs.iter().any(|v| v == s.verb) {
        return false;
    }
    if !rule.resources.is_empty() && !rule.resources.iter().any(|r| r == s.resource) {
        return false;
    }
    if !rule.non_resource_urls.is_empty() {
        let Some(path) = s.non_resource_path else {
            return false;
        };
        if !rule.non_resource_urls.iter().any(|p| glob(p, path)) {
            return false;
        }
    }
    true
}

/// The lane of a request. Pure.
pub fn assign(lanes: &Lanes, s: &Subject<'_>) -> Lane {
    let ruled = lanes
        .rules
        .iter()
        .find(|r| rule_matches(r, s))
        .map_or(Lane::Workload, |r| r.lane);
    match ruled {
        Lane::Exempt | Lane::Heavy | Lane::SelfLane => ruled,
        Lane::System | Lane::Workload if s.heavy => Lane::Heavy,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::settings::enforce::default_rules;

    fn cert(user: &str, groups: &[&str]) -> Identity {
        Identity::Certificate {
            user: user.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    fn subject<'a>(identity: &'a Identity, verb: &'a str, heavy: bool) -> Subject<'a> {
        Subject {
            identity,
            verb,
            resource: "pods",
            non_resource_path: None,
            heavy,
        }
    }

    #[test]
    fn default_rules_by_identity_verb_and_cost() {
        let lanes = Lanes::default();
        let node = cert("system:node:n1", &["system:nodes"]);
        assert_eq!(
            assign(&lanes, &subject(&node, "patch", false)),
            Lane::System
        );
        assert_eq!(
            assign(&lanes, &subject(&node, "list", true)),
            Lane::Heavy,
            "a heavy LIST is heavy whoever sends it"
        );
        let admin = cert("admin", &["system:masters"]);
        assert_eq!(assign(&lanes, &subject(&admin, "list", true)), Lane::Exempt);
        let user = cert("alice", &["dev"]);
        assert_eq!(
            assign(&lanes, &subject(&user, "get", false)),
            Lane::Workload
        );
        assert_eq!(assign(&lanes, &subject(&user, "list", true)), Lane::Heavy);
        let probe = Identity::Anonymous;
        let s = Subject {
            identity: &probe,
            verb: "get",
            resource: "/healthz",
            non_resource_path: Some("/healthz"),
            heavy: false,
        };
        assert_eq!(assign(&lanes, &s), Lane::Exempt);
    }

    #[test]
    fn unverified_claims_never_reach_exempt_or_system() {
        let lanes = Lanes::default();
        let claimed = Identity::Token {
            hash: "h".into(),
            user: Some("system:serviceaccount:kube-system:x".into()),
            groups: vec!["system:masters".into()],
            verified: false,
        };
        assert_eq!(
            assign(&lanes, &subject(&claimed, "get", false)),
            Lane::Workload
        );
        let reviewed = Identity::Token {
            hash: "h".into(),
            user: Some("system:serviceaccount:kube-system:x".into()),
            groups: vec!["system:masters".into()],
            verified: true,
        };
        assert_eq!(
            assign(&lanes, &subject(&reviewed, "get", false)),
            Lane::Exempt
        );
        // A workload/heavy rule may choose by the unverified claim.
        let mut custom = Lanes {
            rules: default_rules(),
            ..Lanes::default()
        };
        custom.rules.insert(
            0,
            LaneRule {
                lane: Lane::Heavy,
                users: vec!["system:serviceaccount:kube-system:x".into()],
                ..LaneRule::default()
            },
        );
        assert_eq!(
            assign(&custom, &subject(&claimed, "get", false)),
            Lane::Heavy
        );
    }

    #[test]
    fn rules_by_verb_resource_and_glob() {
        let lanes = Lanes {
            rules: vec![LaneRule {
                lane: Lane::System,
                users: vec!["ops-*".into()],
                verbs: vec!["patch".into()],
                resources: vec!["coordination.k8s.io/leases".into()],
                ..LaneRule::default()
            }],
            ..Lanes::default()
        };
        let ops = cert("ops-1", &[]);
        let mut s = subject(&ops, "patch", false);
        s.resource = "coordination.k8s.io/leases";
        assert_eq!(assign(&lanes, &s), Lane::System);
        s.verb = "get";
        assert_eq!(assign(&lanes, &s), Lane::Workload);
        assert!(glob("a*", "abc") && glob("abc", "abc") && !glob("abc", "ab"));
    }
}
