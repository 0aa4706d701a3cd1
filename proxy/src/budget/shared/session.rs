//! One connection to etcd as the renewal loop holds it: the client, the
//! member's lease kept alive, and a watch on the prefix that wakes the loop
//! when another member wrote (a new allocation, a demand, an
//! acknowledgement, the coordinator's key gone). Every call is bounded by
//! [`RENEW`]: a slow etcd fails the renewal, it never stalls the loop.

use std::time::Duration;

use etcd_client::{
    Certificate, Client, ConnectOptions, Identity, LeaseKeepAliveStream, LeaseKeeper, TlsOptions,
    WatchOptions, WatchStream,
};
use tokio::time::Instant;

use super::{LEASE_TTL, RENEW};
use crate::config::settings::shared::Global;

/// Why a renewal failed.
#[derive(Debug, thiserror::Error)]
pub enum CoordinationError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("etcd did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the lease expired")]
    LeaseExpired,
    #[error("the watch on the prefix ended")]
    WatchEnded,
    #[error("cannot read {path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// `f`, or a timeout after [`RENEW`].
pub async fn within<T>(
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, CoordinationError> {
    match tokio::time::timeout(RENEW, f).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(CoordinationError::Timeout(RENEW)),
    }
}

fn read_file(path: &std::path::Path) -> Result<Vec<u8>, CoordinationError> {
    std::fs::read(path).map_err(|source| CoordinationError::File {
        path: path.display().to_string(),
        source,
    })
}

/// A connection with a lease kept alive and (unless it ended) a watch.
pub struct Session {
    pub client: Client,
    pub lease: i64,
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
    /// Until when the lease is known alive: when the last successful
    /// keep-alive was sent plus the TTL etcd answered.
    pub lease_until: Instant,
    watch: Option<WatchStream>,
    prefix: String,
}

impl Session {
    /// Connect to `g`'s etcd, take a lease of [`LEASE_TTL`] and watch
    /// `prefix` (with its trailing `/`).
    pub async fn connect(g: &Global, prefix: String) -> Result<Session, CoordinationError> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(RENEW)
            .with_timeout(RENEW);
        if g.ca_file.is_some() || g.cert_file.is_some() {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &g.ca_file {
                tls = tls.ca_certificate(Certificate::from_pem(read_file(ca)?));
            }
            if let (Some(cert), Some(key)) = (&g.cert_file, &g.key_file) {
                tls = tls.identity(Identity::from_pem(read_file(cert)?, read_file(key)?));
            }
            opts = opts.with_tls(tls);
        }
        let mut client = within(Client::connect(g.etcd_servers.clone(), Some(opts))).await?;
        let sent = Instant::now();
        let lease = within(client.lease_grant(LEASE_TTL.as_secs() as i64, None)).await?;
        let (keeper, stream) = within(client.lease_keep_alive(lease.id())).await?;
        let mut s = Session {
            client,
            lease: lease.id(),
            keeper,
            stream,
            lease_until: sent + Duration::from_secs(lease.ttl().max(0) as u64),
            watch: None,
            prefix,
        };
        s.ensure_watch().await?;
        Ok(s)
    }

    /// Watch the prefix again if the watch ended.
    pub async fn ensure_watch(&mut self) -> Result<(), CoordinationError> {
        if self.watch.is_none() {
            let opts = WatchOptions::new().with_prefix();
            self.watch = Some(within(self.client.watch(self.prefix.clone(), Some(opts))).await?);
        }
        Ok(())
    }

    /// Renew the lease.
    pub async fn keep_alive(&mut self) -> Result<(), CoordinationError> {
        let sent = Instant::now();
        within(self.keeper.keep_alive()).await?;
        let resp = within(self.stream.message()).await?;
        match resp {
            Some(r) if r.ttl() > 0 => {
                self.lease_until = sent + Duration::from_secs(r.ttl() as u64);
                Ok(())
            }
            _ => Err(CoordinationError::LeaseExpired),
        }
    }

    /// Give the lease back (best effort: it would expire anyway).
    pub async fn revoke(mut self) {
        let _ = within(self.client.lease_revoke(self.lease)).await;
    }

    /// Wait until a key under the prefix other than `own` changed; never
    /// returns while there is no watch. The watch ended, it is dropped
    /// (the next renewal watches again) and the error returned.
    pub async fn changed(&mut self, own: &str) -> Result<(), CoordinationError> {
        let Some(w) = self.watch.as_mut() else {
            return std::future::pending().await;
        };
        let ended = loop {
            match w.message().await {
                Ok(Some(r)) if r.canceled() => break CoordinationError::WatchEnded,
                Ok(Some(r)) => {
                    // Its own writes tell the member nothing new.
                    let other = r
                        .events()
                        .iter()
                        .any(|e| e.kv().is_some_and(|kv| kv.key() != own.as_bytes()));
                    if other {
                        return Ok(());
                    }
                }
                Ok(None) => break CoordinationError::WatchEnded,
                Err(e) => break e.into(),
            }
        };
        self.watch = None;
        Err(ended)
    }
}
