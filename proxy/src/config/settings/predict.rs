//! The `patterns` settings: the pattern cache's bounds, its defaults for
//! what was never seen, and which store serves each consistency class.

use serde::Deserialize;

/// Which store serves a consistency class; decides whether a filtered LIST is
/// charged for every object the apiserver reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Store {
    /// The apiserver's watch cache: selectors are cheap (indexed or in memory).
    WatchCache,
    /// etcd: the whole resource is read, then filtered.
    Etcd,
}

/// `patterns.consistentStore`: a store, or `auto` — the upstream's release
/// says ([`super::release`]): the watch cache from 1.31, etcd before, and etcd
/// while the release is unknown (`/version` unread or unreadable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StoreSetting {
    Auto,
    WatchCache,
    Etcd,
}

/// The pattern cache and predictor.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Patterns {
    /// Most patterns kept; the coldest 10% are evicted when full. Default `10000`.
    pub capacity: usize,
    /// Half-life of the decayed statistics, seconds. Default `300`.
    pub half_life_seconds: f64,
    /// Prediction for a LIST of a resource never seen, bytes. Default `1048576`.
    pub default_list_bytes: f64,
    /// Prediction for any other request never seen, bytes. Default `4096`.
    pub default_request_bytes: f64,
    /// Bytes per object assumed when only the apiserver's object count is
    /// known (until a full LIST teaches it). Default `4096`.
    pub default_object_bytes: f64,
    /// Assumed uncompressed/compressed ratio of gzip responses until one is
    /// learned for the resource. Default `8`.
    pub gzip_ratio: f64,
    /// Store that serves `cache` reads. Default `watchCache`.
    pub cache_store: Store,
    /// Store that serves `consistent` reads. Default `auto`: by the
    /// upstream's release (watch cache from 1.31, etcd before or unknown).
    /// Either way, what is learned per resource from the apiserver's metrics wins.
    pub consistent_store: StoreSetting,
    /// Store that serves `exact` reads. Default `etcd`.
    pub exact_store: Store,
}

impl Default for Patterns {
    fn default() -> Self {
        Patterns {
            capacity: 10_000,
            half_life_seconds: 300.0,
            default_list_bytes: 1_048_576.0,
            default_request_bytes: 4096.0,
            default_object_bytes: 4096.0,
            gzip_ratio: 8.0,
            cache_store: Store::WatchCache,
            consistent_store: StoreSetting::Auto,
            exact_store: Store::Etcd,
        }
    }
}
