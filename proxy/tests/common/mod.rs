//! Loopback test harness: certificates (rcgen), a small hyper upstream that
//! records what it sees, tollgate started in-process on port 0, and clients.
#![allow(dead_code, clippy::unwrap_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tollgate::{Config, Gateway};

pub type TestBody = BoxBody<Bytes, std::io::Error>;

pub fn body(b: impl Into<Bytes>) -> TestBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

/// Deterministic pseudo-random bytes (xorshift, 8 bytes a step), produced
/// chunk by chunk so 100 MB need not sit in memory.
pub struct Gen {
    x: u64,
    left: usize,
}

impl Gen {
    pub fn new(n: usize, seed: u64) -> Gen {
        Gen {
            x: seed | 1,
            left: n,
        }
    }

    pub fn next_chunk(&mut self, max: usize) -> Option<Bytes> {
        if self.left == 0 {
            return None;
        }
        let len = max.min(self.left);
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            self.x ^= self.x << 13;
            self.x ^= self.x >> 7;
            self.x ^= self.x << 17;
            out.extend_from_slice(&self.x.to_le_bytes());
        }
        out.truncate(len);
        self.left -= len;
        Some(Bytes::from(out))
    }
}

pub fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
    let mut g = Gen::new(n, seed);
    let mut v = Vec::with_capacity(n);
    while let Some(c) = g.next_chunk(1 << 20) {
        v.extend_from_slice(&c);
    }
    v
}

/// SHA-256 and length of a generated stream, computed streaming.
pub fn gen_digest(n: usize, seed: u64) -> String {
    use sha2::Digest;
    let mut g = Gen::new(n, seed);
    let mut h = sha2::Sha256::new();
    while let Some(c) = g.next_chunk(1 << 20) {
        h.update(&c);
    }
    format!("{:x}", h.finalize())
}

/// A stream of `data` in `chunk`-sized frames (a chunked body).
pub fn chunked(data: Vec<u8>, chunk: usize) -> TestBody {
    let data = Bytes::from(data);
    let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = (0..data.len())
        .step_by(chunk.max(1))
        .map(|i| Ok(Frame::data(data.slice(i..(i + chunk).min(data.len())))))
        .collect();
    StreamBody::new(futures_util::stream::iter(frames)).boxed()
}

pub fn sha(data: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(data))
}

/// Poll `cond` until it holds or `deadline` passes.
/// The value of one series in tollgate's metrics text, `series` being the
/// name and labels exactly as encoded; NaN when absent.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

pub async fn eventually<F: FnMut() -> bool>(what: &str, deadline: Duration, mut cond: F) {
    let end = tokio::time::Instant::now() + deadline;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// === certificates ===

pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pub pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// (cert PEM, key PEM) for a leaf.
    pub fn issue(&self, cn: &str, org: Option<&str>, server: bool) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let sans = if server {
            vec!["localhost".to_string(), "127.0.0.1".to_string()]
        } else {
            vec![]
        };
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        if let Some(o) = org {
            params.distinguished_name.push(DnType::OrganizationName, o);
        }
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Files of a PKI: serving CA (for tollgate and the upstream), client CA,
/// front-proxy CA, and leaves.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub serving_ca: Ca,
    pub client_ca: Ca,
    pub front_ca: Ca,
}

impl Pki {
    pub fn new() -> Pki {
        Pki {
            dir: tempfile::tempdir().unwrap(),
            serving_ca: Ca::new("serving-ca"),
            client_ca: Ca::new("client-ca"),
            front_ca: Ca::new("front-proxy-ca"),
        }
    }

    pub fn write(&self, name: &str, pem: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, pem).unwrap();
        p
    }

    /// (cert path, key path)
    pub fn leaf(
        &self,
        ca: &Ca,
        name: &str,
        cn: &str,
        org: Option<&str>,
        server: bool,
    ) -> (PathBuf, PathBuf) {
        let (c, k) = ca.issue(cn, org, server);
        (
            self.write(&format!("{name}.crt"), &c),
            self.write(&format!("{name}.key"), &k),
        )
    }
}

// === upstream ===

/// What the upstream saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    pub peer_cn: Option<String>,
    pub version: http::Version,
}

pub struct Upstream {
    pub url: String,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub events: broadcast::Sender<Bytes>,
    /// ConfigMap `kube-system/extension-apiserver-authentication`.
    pub auth: Arc<AuthConfigMap>,
    stop: CancellationToken,
}

/// The upstream's `extension-apiserver-authentication`: its `data` (none: not
/// published), served by GET, list and watch; [`AuthConfigMap::publish`] changes it and
/// tells the watches.
pub struct AuthConfigMap {
    pub data: Mutex<Option<serde_json::Value>>,
    pub events: broadcast::Sender<Bytes>,
}

impl AuthConfigMap {
    /// What kubeadm's apiserver publishes (X-Remote-*; no uid list, as before 1.32).
    pub fn kubeadm() -> serde_json::Value {
        serde_json::json!({
            "requestheader-username-headers": "[\"X-Remote-User\"]",
            "requestheader-group-headers": "[\"X-Remote-Group\"]",
            "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]",
        })
    }

    fn object(&self) -> Option<serde_json::Value> {
        let data = self.data.lock().unwrap().clone()?;
        Some(serde_json::json!({
            "kind": "ConfigMap", "apiVersion": "v1",
            "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system", "resourceVersion": "7"},
            "data": data,
        }))
    }

    /// Publish `data` (or take the ConfigMap away) and send watches the change.
    pub fn publish(&self, data: Option<serde_json::Value>) {
        *self.data.lock().unwrap() = data;
        if let Some(object) = self.object() {
            let event = serde_json::json!({"type": "MODIFIED", "object": object});
            let _ = self.events.send(Bytes::from(format!("{event}\n")));
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Routes:
/// - `/bytes/N?mode=fixed|chunked&seed=S` → N pseudo-random bytes
/// - `POST /echo` → the request body streamed back
/// - `/api/v1/pods?watch=1` → a chunked stream of what `events` sends
/// - `/api/v1/...` LIST → `size=N` bytes (default 1000) of JSON-ish filler
/// - an upgrade request → 101, then an echo of the upgraded stream
/// - anything else → 200 `ok`
impl Upstream {
    pub async fn start(tls: Option<Arc<rustls::ServerConfig>>) -> Upstream {
        Upstream::start_with(tls, None).await
    }

    /// With a cap on concurrent HTTP/2 streams per connection.
    pub async fn start_with(
        tls: Option<Arc<rustls::ServerConfig>>,
        max_streams: Option<u32>,
    ) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let (events, _) = broadcast::channel(1024);
        let auth = Arc::new(AuthConfigMap {
            data: Mutex::new(Some(AuthConfigMap::kubeadm())),
            events: broadcast::channel(16).0,
        });
        let up = Upstream {
            url: format!("{scheme}://{addr}"),
            seen: Arc::default(),
            events: events.clone(),
            auth: auth.clone(),
            stop: CancellationToken::new(),
        };
        let (seen, stop) = (up.seen.clone(), up.stop.clone());
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        tokio::spawn(async move {
            loop {
                let (tcp, _) = tokio::select! {
                    _ = stop.cancelled() => return,
                    a = listener.accept() => a.unwrap(),
                };
                let (seen, events, acceptor) = (seen.clone(), events.clone(), acceptor.clone());
                let auth = auth.clone();
                tokio::spawn(async move {
                    match acceptor {
                        None => {
                            serve_upstream(TokioIo::new(tcp), None, seen, events, auth, max_streams)
                                .await
                        }
                        Some(a) => {
                            let Ok(stream) = a.accept(tcp).await else {
                                return;
                            };
                            let cn = stream
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|c| c.first())
                                .and_then(tollgate::identity::PeerCertificate::from_der)
                                .map(|p| p.user);
                            serve_upstream(
                                TokioIo::new(stream),
                                cn,
                                seen,
                                events,
                                auth,
                                max_streams,
                            )
                            .await
                        }
                    }
                });
            }
        });
        up
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The last request whose path and query contain `needle`.
    pub fn last_for(&self, needle: &str) -> Seen {
        self.seen()
            .into_iter()
            .rev()
            .find(|s| s.path.contains(needle))
            .expect("request reached upstream")
    }
}

async fn serve_upstream<I>(
    io: TokioIo<I>,
    cn: Option<String>,
    seen: Arc<Mutex<Vec<Seen>>>,
    events: broadcast::Sender<Bytes>,
    auth: Arc<AuthConfigMap>,
    max_streams: Option<u32>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req: Request<Incoming>| {
        let (seen, events, cn, auth) = (seen.clone(), events.clone(), cn.clone(), auth.clone());
        async move { Ok::<_, Infallible>(upstream_route(req, cn, seen, events, auth).await) }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder.http2().max_concurrent_streams(max_streams);
    let _ = builder.serve_connection_with_upgrades(io, svc).await;
}

fn query_param(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == name).then(|| v.to_string())
    })
}

async fn upstream_route(
    mut req: Request<Incoming>,
    peer_cn: Option<String>,
    seen: Arc<Mutex<Vec<Seen>>>,
    events: broadcast::Sender<Bytes>,
    auth: Arc<AuthConfigMap>,
) -> Response<TestBody> {
    let path = req.uri().path().to_string();
    seen.lock().unwrap().push(Seen {
        path: req.uri().to_string(),
        headers: req.headers().clone(),
        peer_cn,
        version: req.version(),
    });
    let ok = |b: Bytes| Full::new(b).map_err(|never| match never {}).boxed();
    if req.headers().contains_key(http::header::UPGRADE) {
        let on = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(up) = on.await {
                let (mut r, mut w) = tokio::io::split(TokioIo::new(up));
                let _ = tokio::io::copy(&mut r, &mut w).await;
            }
        });
        let proto = req.headers()[http::header::UPGRADE].clone();
        return Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("connection", "Upgrade")
            .header("upgrade", proto)
            .body(ok(Bytes::new()))
            .unwrap();
    }
    if let Some(n) = path.strip_prefix("/bytes/") {
        let n: usize = n.parse().unwrap_or(0);
        let seed: u64 = query_param(&req, "seed")
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        let data = pseudo_random(n, seed);
        let body = if query_param(&req, "mode").as_deref() == Some("chunked") {
            chunked(data, 16 * 1024)
        } else {
            ok(Bytes::from(data))
        };
        return Response::builder()
            .header("x-sha256", sha(&pseudo_random(n, seed)))
            .body(body)
            .unwrap();
    }
    if let Some(n) = path.strip_prefix("/stream/") {
        let n: usize = n.parse().unwrap_or(0);
        let seed: u64 = query_param(&req, "seed")
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        let stream = futures_util::stream::unfold(Gen::new(n, seed), |mut g| async move {
            g.next_chunk(64 * 1024)
                .map(|c| (Ok::<_, std::io::Error>(Frame::data(c)), g))
        });
        return Response::new(StreamBody::new(stream).boxed());
    }
    if path == "/apis/authentication.k8s.io/v1/tokenreviews" {
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let review: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let status = if review["spec"]["token"] == "node-token" {
            serde_json::json!({"authenticated": true, "user": {"username": "system:node:n1", "groups": ["system:nodes"]}})
        } else {
            serde_json::json!({"authenticated": false})
        };
        let answer = serde_json::json!({"kind": "TokenReview", "status": status});
        return Response::new(ok(Bytes::from(answer.to_string())));
    }
    if path == "/metrics" {
        let text = "apiserver_storage_objects{resource=\"pods\"} 5000\napiserver_storage_objects{resource=\"deployments.apps\"} 7\napiserver_storage_list_total{resource=\"configmaps\"} 0\n";
        return Response::new(ok(Bytes::from_static(text.as_bytes())));
    }
    if path == "/echo" {
        return Response::new(req.into_body().map_err(std::io::Error::other).boxed());
    }
    if path == "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication" {
        return match auth.object() {
            Some(o) => Response::new(ok(Bytes::from(o.to_string()))),
            None => Response::builder()
                .status(StatusCode::NOT_FOUND)
                .body(ok(Bytes::new()))
                .unwrap(),
        };
    }
    if path == "/api/v1/namespaces/kube-system/configmaps" {
        if query_param(&req, "watch").is_some() {
            let rx = auth.events.subscribe();
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                match rx.recv().await {
                    Ok(b) => Some((Ok::<_, std::io::Error>(Frame::data(b)), rx)),
                    Err(_) => None,
                }
            });
            return Response::new(StreamBody::new(stream).boxed());
        }
        let items: Vec<_> = auth.object().into_iter().collect();
        let list = serde_json::json!({"kind": "ConfigMapList", "metadata": {"resourceVersion": "7"}, "items": items});
        return Response::new(ok(Bytes::from(list.to_string())));
    }
    if path.starts_with("/api/v1/") && query_param(&req, "watch").is_some() {
        let rx = events.subscribe();
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            match rx.recv().await {
                Ok(b) => Some((Ok::<_, std::io::Error>(Frame::data(b)), rx)),
                Err(_) => None,
            }
        });
        return Response::builder()
            .header("content-type", "application/json")
            .body(StreamBody::new(stream).boxed())
            .unwrap();
    }
    if path.starts_with("/api/") {
        let size: usize = query_param(&req, "size")
            .and_then(|s| s.parse().ok())
            .unwrap_or(1000);
        let gzip = query_param(&req, "gzip").is_some();
        // A real apiserver decodes a write's whole body before it answers: a client body
        // that breaks off then fails the exchange, never after an answer (issue 34's 400).
        if req.method() != hyper::Method::GET
            && req.method() != hyper::Method::HEAD
            && req.into_body().collect().await.is_err()
        {
            return Response::new(ok(Bytes::new()));
        }
        let mut resp = Response::builder().header("content-type", "application/json");
        if gzip {
            // Not real gzip: tollgate must pass bytes through without looking.
            resp = resp.header("content-encoding", "gzip");
        }
        return resp.body(ok(Bytes::from(vec![b'x'; size]))).unwrap();
    }
    Response::new(ok(Bytes::from_static(b"ok")))
}

/// A TLS upstream as kube-apiserver with `--requestheader-client-ca-file`: served by the
/// serving CA, it accepts client certificates of the front-proxy CA.
pub async fn front_proxy_upstream(pki: &Pki, max_streams: Option<u32>) -> Upstream {
    let (up_cert, up_key) = pki.leaf(&pki.serving_ca, "upstream", "apiserver", None, true);
    let front_ca = pki.write("front-ca.crt", &pki.front_ca.pem);
    let up_tls = tollgate::tls::server_config(
        tollgate::tls::load_identity(&up_cert, &up_key).unwrap(),
        Some(&tollgate::tls::ClientCertAuthority::load(&front_ca).unwrap()),
    )
    .unwrap();
    Upstream::start_with(Some(Arc::new(up_tls)), max_streams).await
}

// === tollgate ===

pub struct Running {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub gateway: Gateway,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    pub fn url(&self, scheme: &str, path: &str) -> String {
        format!("{scheme}://{}{path}", self.addr)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// Shut down and wait for the drain to finish.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(20), &mut self.task)
            .await
            .expect("drain finishes")
            .expect("serve task");
    }

    /// Shut down and wait for the drain up to `within`: `None` if it is still
    /// draining then, else how the serve task ended (a panic is an `Err`).
    pub async fn stop_within(
        mut self,
        within: Duration,
    ) -> Option<Result<(), tokio::task::JoinError>> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(within, &mut self.task).await.ok()
    }
}

/// A config pointing at `upstreams`, draining instantly, health checks fast.
pub fn config(upstreams: &[&str]) -> Config {
    let mut c = Config::default();
    c.upstream.urls = upstreams.iter().map(|s| s.to_string()).collect();
    c.drain.window_seconds = 0.0;
    c.upstream.health_check.interval_seconds = 0.2;
    c.upstream.metrics_scrape.interval_seconds = 0.2;
    c
}

pub async fn start(config: Config) -> Running {
    tollgate::install_crypto_provider();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, admin_addr) = (listener.local_addr().unwrap(), admin.local_addr().unwrap());
    let gateway = Gateway::new(config).expect("gateway");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let g = gateway.clone();
    let task = tokio::spawn(async move {
        tollgate::server::serve(
            g,
            listener,
            Some(admin),
            async move {
                let _ = rx.await;
            },
            tollgate::workers::Workers::local(),
        )
        .await
    });
    Running {
        addr,
        admin: admin_addr,
        gateway,
        shutdown: Some(tx),
        task,
    }
}

// === clients ===

pub type HttpClient = Client<HttpConnector, TestBody>;

pub fn h1_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// HTTP/2 with prior knowledge (h2c).
pub fn h2_client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

pub type TlsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, TestBody>;

/// A TLS client trusting `ca_pem`, presenting `identity` if given; `h2` picks ALPN h2 only.
pub fn tls_client(ca_pem: &str, identity: Option<(&PathBuf, &PathBuf)>, h2: bool) -> TlsClient {
    tls_client_from(ca_pem, identity, h2, None)
}

/// As [`tls_client`], connecting from `source` if given: another loopback
/// address is another client machine (a flow of its own for tollgate).
pub fn tls_client_from(
    ca_pem: &str,
    identity: Option<(&PathBuf, &PathBuf)>,
    h2: bool,
    source: Option<std::net::IpAddr>,
) -> TlsClient {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    let cfg = match identity {
        Some((c, k)) => {
            let id = tollgate::tls::load_identity(c, k).unwrap();
            builder.with_client_auth_cert(id.chain, id.key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_local_address(source);
    let b = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(cfg)
        .https_only();
    let connector = if h2 {
        b.enable_http2().wrap_connector(tcp)
    } else {
        b.enable_http1().wrap_connector(tcp)
    };
    Client::builder(TokioExecutor::new())
        .http2_only(h2)
        .build(connector)
}

pub async fn get_text(client: &HttpClient, url: &str) -> (StatusCode, String) {
    let resp = client
        .request(Request::get(url).body(body(Bytes::new())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let b = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&b).into_owned())
}
