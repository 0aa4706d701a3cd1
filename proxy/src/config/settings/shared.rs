//! `quota.global`: the etcd-bound budget shared by the tollgates of all
//! masters, and how to reach etcd (the `--etcd-*` flags, as
//! kube-apiserver's). Off unless `etcdBytesPerSecond` and `etcdServers`
//! are given. The budget, reserve, floor and fallback are read at every
//! renewal (a reload applies within a second; the coordinator's own
//! values are the ones granted); the etcd servers, prefix and
//! certificates at start.

use std::path::PathBuf;

use serde::Deserialize;

use super::enforce::Invalid;

/// Fraction of the budget never granted.
pub const DEFAULT_RESERVE: f64 = 0.10;
/// Fraction of the budget each live member gets at least.
pub const DEFAULT_FLOOR: f64 = 0.05;

/// Where kube-apiserver keeps the cluster's objects: never ours.
const APISERVER_PREFIX: &str = "/registry";

/// `quota.global`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Global {
    /// Cluster-wide etcd-read bytes/s (the `read_bytes` part of heavy
    /// requests' cost) all tollgates naming the same prefix share; `0`
    /// turns the shared budget off. Default `0`.
    pub etcd_bytes_per_second: f64,
    /// Names the budget in the default prefix. Default `default`.
    pub cluster: String,
    /// Key prefix of the members, the coordinator and the grants; never
    /// under `/registry`. Default `/tollgate/budget/<cluster>`.
    pub prefix: Option<String>,
    /// Fraction of the budget never granted: what members without a grant
    /// spend. Default `0.1`.
    pub reserve_fraction: f64,
    /// Fraction of the budget each live member gets at least. Default `0.05`.
    pub floor_fraction: f64,
    /// What a member spends while it has no valid grant (etcd out of
    /// reach, just started); `0` is `reserve / N` with `N` the members it
    /// last saw. Never unlimited. Default `0`.
    pub fallback_bytes_per_second: f64,
    /// etcd client URLs (`--etcd-servers`). Default none.
    pub etcd_servers: Vec<String>,
    /// CA (PEM) verifying etcd's serving certificate (`--etcd-cafile`).
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) presented to etcd (`--etcd-certfile`).
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM) (`--etcd-keyfile`).
    pub key_file: Option<PathBuf>,
}

impl Default for Global {
    fn default() -> Self {
        Global {
            etcd_bytes_per_second: 0.0,
            cluster: "default".into(),
            prefix: None,
            reserve_fraction: DEFAULT_RESERVE,
            floor_fraction: DEFAULT_FLOOR,
            fallback_bytes_per_second: 0.0,
            etcd_servers: Vec::new(),
            ca_file: None,
            cert_file: None,
            key_file: None,
        }
    }
}

impl Global {
    /// Whether the shared budget is on.
    pub fn enabled(&self) -> bool {
        self.etcd_bytes_per_second > 0.0 && !self.etcd_servers.is_empty()
    }

    /// The key prefix, without a trailing `/`.
    pub fn prefix(&self) -> String {
        match &self.prefix {
            Some(p) => p.trim_end_matches('/').to_string(),
            None => format!("/tollgate/budget/{}", self.cluster),
        }
    }

    /// Bytes/s never granted.
    pub fn reserve(&self) -> f64 {
        self.etcd_bytes_per_second * self.reserve_fraction
    }

    /// A member's share without a valid grant, `members` seen last.
    pub fn fallback(&self, members: usize) -> f64 {
        if self.fallback_bytes_per_second > 0.0 {
            self.fallback_bytes_per_second
        } else {
            self.reserve() / members.max(1) as f64
        }
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        let fraction = |field, v: f64| {
            if (0.0..1.0).contains(&v) {
                Ok(())
            } else {
                Err((field, format!("must be in [0, 1), got {v}")))
            }
        };
        if !(self.etcd_bytes_per_second >= 0.0 && self.etcd_bytes_per_second.is_finite()) {
            return Err((
                "quota.global.etcdBytesPerSecond",
                format!(
                    "must be a finite number >= 0, got {}",
                    self.etcd_bytes_per_second
                ),
            ));
        }
        fraction("quota.global.reserveFraction", self.reserve_fraction)?;
        fraction("quota.global.floorFraction", self.floor_fraction)?;
        if !(self.fallback_bytes_per_second >= 0.0 && self.fallback_bytes_per_second.is_finite()) {
            return Err((
                "quota.global.fallbackBytesPerSecond",
                "must be a finite number >= 0 (the fallback is never unlimited)".into(),
            ));
        }
        if self.etcd_bytes_per_second > 0.0 && self.etcd_servers.is_empty() {
            return Err((
                "quota.global.etcdServers",
                "a shared budget needs the etcd servers (--etcd-servers)".into(),
            ));
        }
        let prefix = self.prefix();
        if !prefix.starts_with('/') || prefix.len() < 2 {
            return Err((
                "quota.global.prefix",
                format!("{prefix:?} must start with / and name a key space of its own"),
            ));
        }
        if prefix == APISERVER_PREFIX || prefix.starts_with(&format!("{APISERVER_PREFIX}/")) {
            return Err((
                "quota.global.prefix",
                format!("{prefix:?} is under {APISERVER_PREFIX}, kube-apiserver's key space"),
            ));
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err((
                "quota.global.certFile/keyFile",
                "give both or neither (--etcd-certfile, --etcd-keyfile)".into(),
            ));
        }
        for url in &self.etcd_servers {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err((
                    "quota.global.etcdServers",
                    format!("{url:?} must be an http:// or https:// URL"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on() -> Global {
        Global {
            etcd_bytes_per_second: 100e6,
            etcd_servers: vec!["http://127.0.0.1:2379".into()],
            ..Global::default()
        }
    }

    #[test]
    fn off_by_default_with_its_own_prefix() {
        let g = Global::default();
        assert!(!g.enabled());
        assert_eq!(g.validate(), Ok(()));
        assert_eq!(g.prefix(), "/tollgate/budget/default");
        assert!(on().enabled());
        assert_eq!(on().fallback(4), 2.5e6, "reserve / N");
        let fixed = Global {
            fallback_bytes_per_second: 1e6,
            ..on()
        };
        assert_eq!(fixed.fallback(4), 1e6);
    }

    #[test]
    fn refuses_the_apiserver_key_space_and_half_configurations() {
        let field = |g: Global| g.validate().map_err(|e| e.0);
        for prefix in ["/registry", "/registry/pods", "/", "tollgate"] {
            let g = Global {
                prefix: Some(prefix.into()),
                ..on()
            };
            assert_eq!(field(g), Err("quota.global.prefix"), "{prefix}");
        }
        assert_eq!(
            field(Global {
                prefix: Some("/registry-tollgate".into()),
                ..on()
            }),
            Ok(())
        );
        assert_eq!(
            field(Global {
                etcd_servers: vec![],
                ..on()
            }),
            Err("quota.global.etcdServers")
        );
        assert_eq!(
            field(Global {
                cert_file: Some("c.pem".into()),
                ..on()
            }),
            Err("quota.global.certFile/keyFile")
        );
        assert_eq!(
            field(Global {
                reserve_fraction: 1.0,
                ..on()
            }),
            Err("quota.global.reserveFraction")
        );
        assert_eq!(
            field(Global {
                fallback_bytes_per_second: f64::INFINITY,
                ..on()
            }),
            Err("quota.global.fallbackBytesPerSecond")
        );
    }
}
