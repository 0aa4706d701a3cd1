//! The upstream pool: least outstanding requests among healthy upstreams,
//! periodic health checks, ejection on connection failure and re-admission
//! after a check or an interval, and the connections of each identity (with or without the
//! front-proxy certificate): HTTP/2 spread so no connection carries more streams than the
//! apiserver allows, HTTP/1.1 for upgrades; light requests go over HTTP/1.1 with
//! `upstream.lightProtocol: http1`. Health checks use tollgate's own identity, which forwarded
//! requests never carry.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::header;
use http::uri::{Authority, Scheme};
use http::{HeaderValue, Request, Response, Uri, Version};
use hyper::body::Incoming;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::h2_spread::{http_client, Connect, HttpClient, Spreads, StreamSlot};
use super::light_h1::LightH1;
use crate::config::{Config, ConfigError, HealthCheck, LightProtocol};
use crate::requestheader::{Trusted, TrustedHeaders};
use crate::tls::{self, TlsError};
use crate::BoxError;
use crate::{Body, Error};

/// One apiserver.
#[derive(Debug)]
pub struct Upstream {
    pub url: String,
    /// Its place in the pool: each worker's connections to it are found by it.
    index: usize,
    scheme: Scheme,
    authority: Authority,
    /// `scheme://authority`, what its connections are opened to.
    origin: Uri,
    outstanding: AtomicUsize,
    healthy: AtomicBool,
    /// Milliseconds since the pool's epoch when it was ejected.
    ejected_at_ms: AtomicU64,
}

impl Upstream {
    /// The upstream at `url`, `index`th in its pool.
    pub(crate) fn parse(url: &str, index: usize) -> Result<Upstream, Error> {
        let bad = |reason: &str| Error::Upstream {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let uri: Uri = url.parse().map_err(|_| bad("not a URL"))?;
        let scheme = uri.scheme().cloned().ok_or_else(|| bad("no scheme"))?;
        let authority = uri.authority().cloned().ok_or_else(|| bad("no host"))?;
        let origin = Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query("/")
            .build()
            .map_err(|_| bad("not a URL"))?;
        Ok(Upstream {
            url: url.to_string(),
            index,
            scheme,
            authority,
            origin,
            outstanding: AtomicUsize::new(0),
            healthy: AtomicBool::new(true),
            ejected_at_ms: AtomicU64::new(0),
        })
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }

    pub(crate) fn origin(&self) -> &Uri {
        &self.origin
    }

    /// Reached over TLS, where ALPN may choose HTTP/2; a plain one is spoken to in HTTP/1.1.
    pub(crate) fn is_https(&self) -> bool {
        self.scheme == Scheme::HTTPS
    }

    /// The request URI on this upstream. The upstream's parts are cloned (shared bytes), the
    /// request's path moved, not parsed again from text as `Uri::builder` would.
    fn uri(&self, original: Uri) -> Result<Uri, http::Error> {
        let mut parts = original.into_parts();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        if parts.path_and_query.is_none() {
            parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        }
        Ok(Uri::from_parts(parts)?)
    }
}

/// Holds one outstanding request on an upstream (and its HTTP/2 stream
/// slot) until dropped.
#[derive(Debug)]
pub struct Outstanding {
    upstream: Arc<Upstream>,
    stream: Option<StreamSlot>,
}

impl Outstanding {
    pub fn upstream(&self) -> &Arc<Upstream> {
        &self.upstream
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.upstream.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Debug)]
pub struct UpstreamPool {
    upstreams: Vec<Arc<Upstream>>,
    epoch: Instant,
    retry_after: Duration,
    anonymous: Spreads,
    front_proxy: Option<Spreads>,
    own: HttpClient,
    health: HealthCheck,
    /// tollgate's own bearer token (from a kubeconfig), for its own requests only.
    own_token: Option<HeaderValue>,
    recoveries: AtomicU64,
    /// The identity headers the apiservers trust: a property of the upstreams.
    trusted: Arc<Trusted>,
}

impl UpstreamPool {
    pub fn new(config: &Config) -> Result<UpstreamPool, Error> {
        let up = &config.upstream;
        let kube = up
            .kubeconfig
            .as_deref()
            .map(kubeio::kubeconfig::load_file)
            .transpose()?;
        let kube_origin = up.kubeconfig.clone().unwrap_or_default();
        let roots = match (&up.ca_file, kube.as_ref().and_then(|k| k.ca_pem.as_ref())) {
            (Some(file), _) => Some(tls::load_roots(file)?),
            (None, Some(pem)) => Some(tls::roots_from_pem(pem, &kube_origin)?),
            (None, None) => None,
        };
        let pair = |c: &Option<std::path::PathBuf>,
                    k: &Option<std::path::PathBuf>|
         -> Result<_, TlsError> {
            match (c, k) {
                (Some(c), Some(k)) => Ok(Some(tls::load_identity(c, k)?)),
                _ => Ok(None),
            }
        };
        let front = pair(&up.front_proxy_cert_file, &up.front_proxy_key_file)?;
        let own = match (
            pair(&up.client_cert_file, &up.client_key_file)?,
            kube.as_ref().and_then(|k| k.identity_pem()),
        ) {
            (Some(id), _) => Some(id),
            (None, Some((cert, key))) => Some(tls::identity_from_pem(cert, key, &kube_origin)?),
            (None, None) => None,
        };
        // `token`, else `tokenFile` (read once, at start).
        let token = kube.as_ref().map(|k| k.read_token()).transpose()?.flatten();
        let own_token = token
            .and_then(|t| HeaderValue::from_str(&format!("Bearer {t}")).ok())
            .map(|mut v| {
                v.set_sensitive(true);
                v
            });
        let timeout = Duration::from_secs_f64(up.connect_timeout_seconds);
        let ping = (
            Duration::from_secs_f64(up.timeouts.ping_interval_seconds),
            Duration::from_secs_f64(up.timeouts.ping_timeout_seconds),
        );
        let connect = |tls| Connect {
            tls,
            timeout,
            ping,
            read_pace: None,
        };
        // One count of light HTTP/1.1 requests in flight for both identities (see LightH1).
        let light_h1_in_flight = Arc::new(AtomicUsize::new(0));
        let spreads = |cfg: &Connect| {
            let light_h1 = (up.light_protocol == LightProtocol::Http1).then(|| {
                LightH1::new(
                    cfg.clone(),
                    light_h1_in_flight.clone(),
                    up.max_light_connections,
                )
            });
            Spreads::new(cfg.clone(), up.max_streams_per_connection, light_h1)
        };
        let anon_cfg = connect(tls::client_config(roots.as_ref(), None)?);
        let front_proxy = match &front {
            Some(id) => {
                let cfg = connect(tls::client_config(roots.as_ref(), Some(id))?);
                Some(spreads(&cfg))
            }
            None => None,
        };
        let own_cfg = connect(tls::client_config(roots.as_ref(), own.as_ref())?);
        let trusted = TrustedHeaders::configured(&up.request_headers)
            .map_err(|(field, reason)| ConfigError::Invalid { field, reason })?;
        let mut upstreams = Vec::new();
        for url in &up.urls {
            let bad = |reason: &str| Error::Upstream {
                url: url.clone(),
                reason: reason.to_string(),
            };
            let upstream = Upstream::parse(url, upstreams.len())?;
            if upstream.is_https() && roots.is_none() {
                return Err(bad(
                    "an https upstream needs --upstream-ca (or a kubeconfig with its CA)",
                ));
            }
            upstreams.push(Arc::new(upstream));
        }
        Ok(UpstreamPool {
            upstreams,
            epoch: Instant::now(),
            retry_after: Duration::from_secs_f64(up.health_check.interval_seconds),
            anonymous: spreads(&anon_cfg),
            front_proxy,
            own: http_client(own_cfg, true),
            health: up.health_check.clone(),
            own_token,
            recoveries: AtomicU64::new(0),
            trusted: Arc::new(Trusted::new(trusted)),
        })
    }

    pub fn upstreams(&self) -> &[Arc<Upstream>] {
        &self.upstreams
    }

    pub fn has_front_proxy(&self) -> bool {
        self.front_proxy.is_some()
    }

    /// The identity headers the apiservers trust, configured and learned.
    pub fn trusted_headers(&self) -> &Arc<Trusted> {
        &self.trusted
    }

    /// Any upstream healthy.
    pub fn ready(&self) -> bool {
        self.upstreams.iter().any(|u| u.is_healthy())
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The healthy upstream with the fewest outstanding requests (an ejected
    /// one is eligible again once the retry interval passed), skipping
    /// `avoid`; if none is healthy, the least busy of all (fail open).
    pub fn pick(&self, avoid: Option<&Arc<Upstream>>) -> Option<Outstanding> {
        let now = self.now_ms();
        let retry = self.retry_after.as_millis() as u64;
        let candidates = self
            .upstreams
            .iter()
            .filter(|u| avoid.is_none_or(|a| !Arc::ptr_eq(a, u)));
        let eligible = |u: &&Arc<Upstream>| {
            u.is_healthy() || now.saturating_sub(u.ejected_at_ms.load(Ordering::Relaxed)) >= retry
        };
        let chosen = candidates
            .clone()
            .filter(eligible)
            .min_by_key(|u| u.outstanding())
            .or_else(|| candidates.min_by_key(|u| u.outstanding()))?;
        chosen.outstanding.fetch_add(1, Ordering::Relaxed);
        Some(Outstanding {
            upstream: chosen.clone(),
            stream: None,
        })
    }

    /// Take an upstream out of rotation after a connection failure.
    pub fn eject(&self, upstream: &Upstream) {
        if upstream.healthy.swap(false, Ordering::Relaxed) {
            tracing::warn!(upstream = %upstream.url, "upstream ejected");
        }
        upstream
            .ejected_at_ms
            .store(self.now_ms(), Ordering::Relaxed);
    }

    fn restore(&self, upstream: &Upstream) {
        if !upstream.healthy.swap(true, Ordering::Relaxed) {
            tracing::info!(upstream = %upstream.url, "upstream healthy again");
            self.recoveries.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many times an upstream came back (unhealthy → healthy): each
    /// starts the relist guard's warm-up.
    pub fn recoveries(&self) -> u64 {
        self.recoveries.load(Ordering::Relaxed)
    }

    /// Send `req` to the upstream `slot` holds: with the front-proxy
    /// certificate when `front_proxy`, over HTTP/1.1 when `upgrade`, on the bulk
    /// connections when `bulk` (see [`Spreads`]). The stream slot stays in
    /// `slot` until it is dropped.
    pub async fn send(
        &self,
        slot: &mut Outstanding,
        mut req: Request<Body>,
        front_proxy: bool,
        upgrade: bool,
        bulk: bool,
    ) -> Result<Response<Incoming>, SendError> {
        let original = std::mem::take(req.uri_mut());
        *req.uri_mut() = slot
            .upstream
            .uri(original)
            .map_err(|e| SendError::Build(e.to_string()))?;
        *req.version_mut() = Version::HTTP_11;
        let spreads = match (front_proxy, &self.front_proxy) {
            (true, Some(spreads)) => spreads,
            _ => &self.anonymous,
        };
        if upgrade {
            return spreads.send_h1(req).await;
        }
        // Boxed, as hyper-util's client boxed its own: the send holds the request, a wait for an
        // opening connection and hyper's response future across its awaits, and every request's
        // future would hold room for all of that (`handle::tests::the_request_future_stays_small`:
        // 4,864 bytes unboxed).
        let (resp, stream) = Box::pin(spreads.send(&slot.upstream, req, bulk)).await?;
        slot.stream = stream;
        Ok(resp)
    }

    /// Check every upstream each interval until `stop`.
    pub async fn health_loop(self: Arc<Self>, stop: CancellationToken) {
        if !self.health.enabled {
            return;
        }
        let interval = Duration::from_secs_f64(self.health.interval_seconds);
        loop {
            for u in &self.upstreams {
                let ok = self.check(u).await;
                if ok {
                    self.restore(u);
                } else {
                    self.eject(u);
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }

    async fn check(&self, u: &Upstream) -> bool {
        let timeout = Duration::from_secs_f64(self.health.timeout_seconds);
        match self.own_get(u, &self.health.path, 1 << 20, timeout).await {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!(upstream = %u.url, error = %e, "health check failed");
                false
            }
        }
    }

    /// GET `path` on `u` with tollgate's own identity; the body (at most
    /// `limit` bytes) of a 2xx response, or why not.
    pub async fn own_get(
        &self,
        u: &Upstream,
        path: &str,
        limit: usize,
        timeout: Duration,
    ) -> Result<bytes::Bytes, String> {
        self.own_request(u, http::Method::GET, path, None, limit, timeout)
            .await
    }

    /// A request of tollgate's own (health check, scrape, TokenReview),
    /// with its own identity and an optional JSON body.
    pub async fn own_request(
        &self,
        u: &Upstream,
        method: http::Method,
        path: &str,
        json: Option<bytes::Bytes>,
        limit: usize,
        timeout: Duration,
    ) -> Result<bytes::Bytes, String> {
        use http_body_util::{BodyExt, Limited};
        let uri = format!("{}{}", u.url.trim_end_matches('/'), path)
            .parse::<Uri>()
            .map_err(|e| e.to_string())?;
        let mut req = Request::builder().method(method).uri(uri);
        if json.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        let mut req = req
            .body(crate::status::full(json.unwrap_or_default()))
            .map_err(|e| e.to_string())?;
        if let Some(token) = &self.own_token {
            req.headers_mut()
                .insert(header::AUTHORIZATION, token.clone());
        }
        let fetch = async {
            let resp = self.own.request(req).await.map_err(|e| e.to_string())?;
            if !resp.status().is_success() {
                return Err(format!("status {}", resp.status()));
            }
            let body = Limited::new(resp.into_body(), limit).collect().await;
            body.map(|b| b.to_bytes()).map_err(|e| e.to_string())
        };
        tokio::time::timeout(timeout, fetch)
            .await
            .map_err(|_| "timed out".to_string())?
    }

    /// A GET of tollgate's own whose body streams on (a watch): the response once a
    /// 2xx head arrives within `timeout`; the caller bounds the body's reads.
    pub async fn own_stream(
        &self,
        u: &Upstream,
        path: &str,
        timeout: Duration,
    ) -> Result<Response<Incoming>, String> {
        let uri = format!("{}{}", u.url.trim_end_matches('/'), path)
            .parse::<Uri>()
            .map_err(|e| e.to_string())?;
        let mut req = Request::get(uri)
            .body(crate::status::full(bytes::Bytes::new()))
            .map_err(|e| e.to_string())?;
        if let Some(token) = &self.own_token {
            req.headers_mut()
                .insert(header::AUTHORIZATION, token.clone());
        }
        let resp = tokio::time::timeout(timeout, self.own.request(req))
            .await
            .map_err(|_| "timed out".to_string())?
            .map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("status {}", resp.status()));
        }
        Ok(resp)
    }
}

/// Why a request did not reach an upstream.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("cannot build the upstream request: {0}")]
    Build(String),
    /// No connection could be opened: the upstream is not reachable, and a request without a
    /// body may be tried on another.
    #[error("cannot reach the upstream")]
    Connect(#[source] BoxError),
    /// The request failed on an open connection.
    #[error("upstream request failed")]
    Request(#[source] BoxError),
    /// Every connection this worker may open to the upstream carries its most streams.
    #[error("all {connections} connections to the upstream carry {streams} streams each")]
    Busy { connections: usize, streams: usize },
}

impl SendError {
    /// An HTTP/1.1 client's error: a connect error if it failed opening its connection.
    pub(crate) fn legacy(e: hyper_util::client::legacy::Error) -> SendError {
        if e.is_connect() {
            SendError::Connect(Box::new(e))
        } else {
            SendError::Request(Box::new(e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(urls: &[&str]) -> UpstreamPool {
        let mut config = Config::default();
        config.upstream.urls = urls.iter().map(|s| s.to_string()).collect();
        UpstreamPool::new(&config).expect("pool")
    }

    #[test]
    fn least_outstanding_and_ejection() {
        let p = pool(&["http://127.0.0.1:1", "http://127.0.0.1:2"]);
        let a = p.pick(None).expect("one");
        let b = p.pick(None).expect("two");
        assert!(!Arc::ptr_eq(a.upstream(), b.upstream()), "spread over both");
        drop(b);
        let c = p.pick(None).expect("three");
        assert!(!Arc::ptr_eq(a.upstream(), c.upstream()), "the idle one");
        p.eject(c.upstream());
        let d = p.pick(None).expect("four");
        assert!(
            Arc::ptr_eq(a.upstream(), d.upstream()),
            "ejected one skipped"
        );
        assert_eq!(a.upstream().outstanding(), 2);
        let e = p
            .pick(Some(a.upstream()))
            .expect("fail open to the ejected one");
        assert!(Arc::ptr_eq(c.upstream(), e.upstream()));
        assert!(p.ready());
    }

    /// The path and query are kept, whatever form the request's URI came in
    /// (origin-form over HTTP/1.1, absolute over HTTP/2); scheme and host
    /// are the upstream's.
    #[test]
    fn the_upstream_uri_keeps_the_path() {
        let p = pool(&["http://10.0.0.1:6443"]);
        let u = &p.upstreams()[0];
        for (from, to) in [
            (
                "/api/v1/pods?limit=5",
                "http://10.0.0.1:6443/api/v1/pods?limit=5",
            ),
            (
                "https://tollgate.example:8443/apis/apps/v1/deployments",
                "http://10.0.0.1:6443/apis/apps/v1/deployments",
            ),
        ] {
            let uri = u.uri(from.parse().expect("uri")).expect("built");
            assert_eq!(uri.to_string(), to, "{from}");
        }
    }

    #[test]
    fn https_without_ca_is_refused() {
        let mut config = Config::default();
        config.upstream.urls = vec!["https://127.0.0.1:1".into()];
        assert!(UpstreamPool::new(&config).is_err());
    }
}
