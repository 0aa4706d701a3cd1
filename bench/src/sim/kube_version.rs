//! Which Kubernetes release the simulator answers as (`--kube-version`), and the rules that
//! differ between them in what a client sees or what a request costs:
//!
//! | | 1.20 (Tess.IO's era, the model's calibration) | 1.37 (the current release) |
//! |---|---|---|
//! | consistent LIST (no `resourceVersion`, with or without `limit`) | a quorum range read of etcd | the watch cache, once it has seen etcd's current revision (KEP-2340, `ConsistentListFromCache`, default since 1.31): one revision request to etcd, no objects read from it |
//! | exact LIST (`resourceVersionMatch=Exact`, `resourceVersion=N` with `limit`), continue token | etcd at that revision | a cache snapshot at that revision while the watch cache still has it (KEP-4988, `ListFromCacheSnapshot`, beta and on since 1.34); older: etcd, which answers 410 once compacted |
//! | `apiserver_storage_list_total` | LISTs that reached etcd, by `resource` | every LIST, by `group`, `resource`, `index` and `storage` (`etcd` or `watchcache`) |
//! | discovery, `/version` | `api/discovery-1.20.json` | `api/discovery-current.json` (both written by `scripts/sim-discovery.sh` from the real apiservers) |
//!
//! A GET without `resourceVersion` reads etcd on both (the cacher delegates it "for backward
//! compatibility"). The rules are the 1.37.2 sources' (`k8s.io/apiserver`
//! `pkg/storage/cacher/cacher.go`, `shouldDelegateList` and `shouldDelegateExactRV`), checked
//! against the real apiserver by the differential tests (`tests/CONFORMANCE.md`).

/// `--kube-version`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum KubeVersion {
    /// kube-apiserver 1.20.2: what the cost model was calibrated against.
    #[default]
    #[value(name = "1.20")]
    V1_20,
    /// The current release, 1.37.2.
    #[value(name = "1.37")]
    V1_37,
}

/// The watch cache's state a store decision needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheState {
    /// Filled (after a modeled restart it is not, until it has relisted).
    pub ready: bool,
    /// The oldest revision it can still serve a snapshot at (its history window).
    pub oldest: u64,
    /// The newest revision it has seen.
    pub newest: u64,
}

/// What a LIST asks for, as far as choosing a store goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListRead {
    /// No `resourceVersion`, no continue token: the latest state.
    Consistent,
    /// `resourceVersion=0` or `NotOlderThan`: already the cache's on both releases.
    AnyRecent,
    /// One revision: `resourceVersionMatch=Exact`, `resourceVersion=N` with `limit`, or a
    /// continue token's.
    Exact(u64),
}

/// Which store serves a LIST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServedBy {
    /// A range read of etcd.
    Etcd,
    /// The watch cache; `revision_check`: it first asked etcd for its current revision (a
    /// consistent read from the cache), one request that reads no objects.
    Cache { revision_check: bool },
}

impl KubeVersion {
    /// `major.minor`, as the flag spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            KubeVersion::V1_20 => "1.20",
            KubeVersion::V1_37 => "1.37",
        }
    }

    /// Which store serves a LIST that asks for `read`. `consistent_from_cache`: the what-if
    /// flag `--consistent-reads-from-cache`, which gives 1.20 the current rule for consistent
    /// LISTs. A cold cache sends everything to etcd (the caller may refuse instead).
    pub fn list_store(
        self,
        read: ListRead,
        cache: CacheState,
        consistent_from_cache: bool,
    ) -> ServedBy {
        if !cache.ready {
            return ServedBy::Etcd;
        }
        let current = self == KubeVersion::V1_37;
        match read {
            ListRead::AnyRecent => ServedBy::Cache {
                revision_check: false,
            },
            ListRead::Consistent if current || consistent_from_cache => ServedBy::Cache {
                revision_check: true,
            },
            ListRead::Consistent => ServedBy::Etcd,
            // A snapshot the cache still holds; one older than its window goes to etcd. (A
            // revision it has not reached is left to etcd's "too large resource version"
            // answer, as on 1.20: the real cache waits for it and answers the same 504.)
            ListRead::Exact(rv) if current && (cache.oldest..=cache.newest).contains(&rv) => {
                ServedBy::Cache {
                    revision_check: false,
                }
            }
            ListRead::Exact(_) => ServedBy::Etcd,
        }
    }

    /// Whether `apiserver_storage_list_total` counts the watch cache's LISTs too, labelled by
    /// store (1.20 counts only etcd's, by resource).
    pub fn counts_cache_lists(self) -> bool {
        self == KubeVersion::V1_37
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WARM: CacheState = CacheState {
        ready: true,
        oldest: 100,
        newest: 200,
    };

    #[test]
    fn the_stores_each_release_reads_a_list_from() {
        use KubeVersion::*;
        use ListRead::*;
        let cache = ServedBy::Cache {
            revision_check: false,
        };
        let checked = ServedBy::Cache {
            revision_check: true,
        };
        let table = [
            // (release, read, --consistent-reads-from-cache, served by)
            (V1_20, Consistent, false, ServedBy::Etcd),
            (V1_20, Consistent, true, checked),
            (V1_37, Consistent, false, checked),
            (V1_20, AnyRecent, false, cache),
            (V1_37, AnyRecent, false, cache),
            (V1_20, Exact(150), false, ServedBy::Etcd),
            (V1_20, Exact(150), true, ServedBy::Etcd),
            (V1_37, Exact(150), false, cache),
            (V1_37, Exact(100), false, cache),
            (V1_37, Exact(99), false, ServedBy::Etcd),
            (V1_37, Exact(200), false, cache),
            (V1_37, Exact(250), false, ServedBy::Etcd),
        ];
        for (v, read, flag, want) in table {
            assert_eq!(
                v.list_store(read, WARM, flag),
                want,
                "{v:?} {read:?} {flag}"
            );
        }
        let cold = CacheState {
            ready: false,
            ..WARM
        };
        for read in [Consistent, AnyRecent, Exact(150)] {
            assert_eq!(V1_37.list_store(read, cold, true), ServedBy::Etcd);
        }
    }
}
