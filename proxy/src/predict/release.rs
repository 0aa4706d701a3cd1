//! Which Kubernetes release the upstream runs, read from its `/version`, and
//! what that release's apiserver does with each consistency class: the prior
//! for which store answers, before any learning. Pure: parsing and a table.
//!
//! From the apiserver's own sources (`k8s.io/apiserver/pkg/features`,
//! `pkg/storage/cacher/delegator`), at v1.37.2:
//!
//! | class | before 1.31 | 1.31–1.33 | 1.34+ |
//! |---|---|---|---|
//! | `cache` (`resourceVersion=0`, `NotOlderThan`) | watch cache | watch cache | watch cache |
//! | `consistent` (no `resourceVersion`) | etcd (quorum read) | watch cache once etcd's progress notify confirms it is fresh (`ConsistentListFromCache`, beta default on in 1.31) | same (GA in 1.34) |
//! | `exact` (`Exact`, `resourceVersion=N` with `limit`, `continue`) | etcd | etcd | cache snapshot while the revision is in the watch cache's history (`ListFromCacheSnapshot`, beta default on in 1.34, KEP-4988), else etcd |
//!
//! Still etcd on every release: resources without a watch cache (`events`),
//! a consistent read whose cache does not catch up within 3 s (the fallback),
//! an exact revision older than the cache's history. tollgate cannot tell from
//! a request whether its revision is still in that history (it is bounded by
//! events, ≥75 s while busy), so `exact` keeps the etcd prior on every
//! release: over-charged by at most its own response when a snapshot served
//! it. The learned store ([`super::PatternCache::learn_store`]) overrides the
//! prior for `consistent` per resource, so `events` is priced as etcd once seen.

use super::Store;

/// A Kubernetes release, `major.minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Release {
    pub major: u32,
    pub minor: u32,
}

/// The first release whose apiserver serves consistent LISTs from the watch
/// cache by default (`ConsistentListFromCache` beta, default on).
pub const CONSISTENT_FROM_CACHE: Release = Release {
    major: 1,
    minor: 31,
};

/// Why `/version` gave no release.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    #[error("the body is not a JSON object")]
    NotJson,
    #[error("neither gitVersion nor major/minor name a release")]
    NoRelease,
}

impl Release {
    /// The release in a `/version` body: `gitVersion` (`v1.37.2`,
    /// `v1.37.2-gke.100`, `v1.20.2+k3s1`), else `major`/`minor` (`"1"`,
    /// `"27+"` as some providers send).
    pub fn from_version_body(body: &[u8]) -> Result<Release, ReleaseError> {
        let v: serde_json::Value =
            serde_json::from_slice(body).map_err(|_| ReleaseError::NotJson)?;
        let obj = v.as_object().ok_or(ReleaseError::NotJson)?;
        let field = |name: &str| obj.get(name).and_then(|f| f.as_str());
        if let Some(r) = field("gitVersion").and_then(Release::from_git_version) {
            return Ok(r);
        }
        match (field("major"), field("minor")) {
            (Some(major), Some(minor)) => Ok(Release {
                major: leading_number(major).ok_or(ReleaseError::NoRelease)?,
                minor: leading_number(minor).ok_or(ReleaseError::NoRelease)?,
            }),
            _ => Err(ReleaseError::NoRelease),
        }
    }

    /// `v1.37.2-gke.100` → 1.37; `1.20` → 1.20; anything else → `None`.
    pub fn from_git_version(s: &str) -> Option<Release> {
        let s = s.trim();
        let s = s.strip_prefix('v').unwrap_or(s);
        let mut parts = s.splitn(3, '.');
        let major = parts.next()?.parse().ok()?;
        let minor = leading_number(parts.next()?)?;
        Some(Release { major, minor })
    }

    /// Which store the apiserver of this release answers a consistent LIST from.
    pub fn consistent_store(self) -> Store {
        if self >= CONSISTENT_FROM_CACHE {
            Store::WatchCache
        } else {
            Store::Etcd
        }
    }
}

impl std::fmt::Display for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The digits a string starts with (`27+` → 27), if any and not absurd.
fn leading_number(s: &str) -> Option<u32> {
    let digits: &str = &s[..s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len())];
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(major: u32, minor: u32) -> Release {
        Release { major, minor }
    }

    #[test]
    fn git_versions_as_providers_write_them() {
        for (s, want) in [
            ("v1.37.2", Some(rel(1, 37))),
            ("v1.37.2-gke.100", Some(rel(1, 37))),
            ("v1.20.2", Some(rel(1, 20))),
            ("v1.31.0-eks-1234abc", Some(rel(1, 31))),
            ("v1.30.4+k3s1", Some(rel(1, 30))),
            ("1.29", Some(rel(1, 29))),
            (" v1.28.1 ", Some(rel(1, 28))),
            ("v1.34.0-tollgate-sim", Some(rel(1, 34))),
            ("v1", None),
            ("v1.x.2", None),
            ("", None),
            ("vv1.2.3", None),
            ("v99999999999.1.0", None),
            ("garbage", None),
            ("v1.\u{0663}.0", None),
        ] {
            assert_eq!(Release::from_git_version(s), want, "{s:?}");
        }
    }

    #[test]
    fn version_bodies_and_garbage() {
        let body = br#"{"major":"1","minor":"37","gitVersion":"v1.37.2","platform":"linux/amd64"}"#;
        assert_eq!(Release::from_version_body(body), Ok(rel(1, 37)));
        // An odd gitVersion: the major/minor fields, `+` and all.
        let body = br#"{"major":"1","minor":"27+","gitVersion":"custom-build"}"#;
        assert_eq!(Release::from_version_body(body), Ok(rel(1, 27)));
        let body = br#"{"major":"1","minor":"","gitVersion":""}"#;
        assert_eq!(
            Release::from_version_body(body),
            Err(ReleaseError::NoRelease)
        );
        assert_eq!(
            Release::from_version_body(br#"{"kind":"Status","code":403}"#),
            Err(ReleaseError::NoRelease)
        );
        for junk in [
            &b"<html>forbidden</html>"[..],
            b"",
            b"[1,2]",
            b"\"v1.37.2\"",
            &[0xff, 0xfe, 0x00],
        ] {
            assert_eq!(
                Release::from_version_body(junk),
                Err(ReleaseError::NotJson),
                "{junk:?}"
            );
        }
    }

    #[test]
    fn consistent_lists_come_from_the_cache_from_1_31() {
        assert_eq!(rel(1, 20).consistent_store(), Store::Etcd);
        assert_eq!(rel(1, 30).consistent_store(), Store::Etcd);
        assert_eq!(rel(1, 31).consistent_store(), Store::WatchCache);
        assert_eq!(rel(1, 37).consistent_store(), Store::WatchCache);
        assert_eq!(rel(2, 0).consistent_store(), Store::WatchCache);
        assert_eq!(rel(0, 99).consistent_store(), Store::Etcd);
    }
}
