//! Small in-process HTTP(S) servers on 127.0.0.1:0 for loadgen's tests.
#![allow(dead_code)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub type Body = BoxBody<Bytes, Infallible>;
pub type Handler = Arc<
    dyn Fn(Request<Incoming>) -> Pin<Box<dyn Future<Output = Response<Body>> + Send>> + Send + Sync,
>;

/// A whole body.
pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

/// A streaming body fed by the returned sender.
pub fn channel_body() -> (tokio::sync::mpsc::Sender<Bytes>, Body) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    (tx, StreamBody::new(stream).boxed())
}

/// A JSON response.
pub fn json(status: u16, body: serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(full(body.to_string()))
        .expect("response")
}

/// A running test server; stops when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    stop: CancellationToken,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl TestServer {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Serves `handler` over plain HTTP/1.1 and h2c.
pub async fn serve<F, Fut>(handler: F) -> TestServer
where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    serve_with(handler, None).await
}

/// Serves `handler`, over TLS when `tls` is given (ALPN h2 and http/1.1).
pub async fn serve_with<F, Fut>(handler: F, tls: Option<Arc<rustls::ServerConfig>>) -> TestServer
where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let handler: Handler = Arc::new(move |req| Box::pin(handler(req)));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = tokio::select! {
                _ = s.cancelled() => return,
                r = listener.accept() => match r { Ok(c) => c, Err(_) => continue },
            };
            let handler = handler.clone();
            let tls = tls.clone();
            let s = s.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let h = handler.clone();
                    async move { Ok::<_, Infallible>(h(req).await) }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                match tls {
                    Some(cfg) => {
                        let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
                        let Ok(stream) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let conn = builder.serve_connection(TokioIo::new(stream), svc);
                        tokio::select! { _ = conn => {}, _ = s.cancelled() => {} }
                    }
                    None => {
                        let conn = builder.serve_connection(TokioIo::new(tcp), svc);
                        tokio::select! { _ = conn => {}, _ = s.cancelled() => {} }
                    }
                };
            });
        }
    });
    TestServer { addr, stop }
}

/// A self-signed certificate for `localhost`/127.0.0.1: (cert PEM, key PEM, server config).
pub fn tls_server() -> (String, String, Arc<rustls::ServerConfig>) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let key = rcgen::KeyPair::generate().expect("key");
    let params =
        rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("params");
    let cert = params.self_signed(&key).expect("cert");
    let cert_pem = cert.pem();
    let key_pem = key.serialize_pem();
    let der = rustls::pki_types::CertificateDer::from(cert.der().to_vec());
    let key_der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key der");
    let mut cfg = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![der], key_der)
        .expect("server config");
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    (cert_pem, key_pem, Arc::new(cfg))
}

/// Polls `cond` every 10 ms until it holds or `within` passes.
pub async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A config with one operation kind, ready to adjust.
pub fn config(server: &str, args: &[&str]) -> loadgen::Config {
    let mut argv = vec!["loadgen", "--server", server, "--no-progress"];
    argv.extend_from_slice(args);
    let cli = <loadgen::cli::Cli as clap::Parser>::try_parse_from(argv).expect("flags");
    cli.into_config().expect("config")
}

/// Reads a request body to its end.
pub async fn body_bytes(req: Request<Incoming>) -> Bytes {
    req.into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default()
}
