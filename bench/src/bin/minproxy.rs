//! `minproxy`: the smallest useful hyper reverse proxy, the floor any hyper-based proxy here is
//! compared with (`bench/scripts/proxy-bench.sh`, plain HTTP; `bench/scripts/tls-bench.sh`, the
//! deployed shape). It does no work: no classification, no metrics, no header rewriting beyond
//! what forwarding needs (the URI is pointed at the upstream; hop-by-hop `Connection`/`Keep-Alive`
//! dropped). Bodies are streamed both ways.
//!
//! TLS is optional on each side, so the same floor serves both benchmarks: `--tls-cert/--tls-key`
//! serve TLS (ALPN h2 and http/1.1, as tollgate offers), `--client-ca` requires a client
//! certificate from that CA at the handshake (as nginx's `ssl_verify_client on` and HAProxy's
//! `verify required`), and an `https://` upstream is reached with `--upstream-ca` and, if given,
//! a client certificate (`--upstream-client-cert/--upstream-client-key`, the front-proxy
//! certificate in the deployed shape), offering h2 and http/1.1 as tollgate does.
//!
//! ```text
//! minproxy --listen 127.0.0.1:0 --upstream http://127.0.0.1:8080
//! ```
//! Prints `minproxy serving at http(s)://ADDR` on stdout once it listens. Worker threads: tokio's
//! default, or `TOKIO_WORKER_THREADS`.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use http::header::{CONNECTION, HOST};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

type Body = BoxBody<Bytes, hyper::Error>;
type UpstreamClient = Client<HttpsConnector<HttpConnector>, Body>;

/// A minimal hyper reverse proxy: the floor tollgate's forwarding cost is compared with.
#[derive(Debug, Parser)]
#[command(name = "minproxy")]
struct Args {
    /// Address to listen on, e.g. 127.0.0.1:0 [default: none, required]
    #[arg(long)]
    listen: String,
    /// Upstream URL, http://HOST:PORT or https://HOST:PORT [default: none, required]
    #[arg(long)]
    upstream: Uri,
    /// Serving certificate (PEM); with --tls-key serves TLS [default: none, plain HTTP]
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Serving private key (PEM) [default: none]
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// CA (PEM) that every client certificate must chain to; clients without one are refused at
    /// the handshake [default: none, no client certificates]
    #[arg(long, requires = "tls_cert")]
    client_ca: Option<PathBuf>,
    /// With --client-ca: clients without a certificate are served too (as nginx's
    /// `ssl_verify_client optional`, for drivers that cannot present one, e.g. wrk)
    /// [default: off, a certificate is required]
    #[arg(long, requires = "client_ca")]
    client_ca_optional: bool,
    /// CA (PEM) verifying an https:// upstream's certificate [default: none, required for https]
    #[arg(long)]
    upstream_ca: Option<PathBuf>,
    /// Client certificate (PEM) presented to an https:// upstream [default: none]
    #[arg(long, requires = "upstream_client_key")]
    upstream_client_cert: Option<PathBuf>,
    /// Private key (PEM) of --upstream-client-cert [default: none]
    #[arg(long, requires = "upstream_client_cert")]
    upstream_client_key: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Err means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let authority = args
        .upstream
        .authority()
        .cloned()
        .context("--upstream has no host")?;
    let scheme = args.upstream.scheme().cloned().unwrap_or(Scheme::HTTP);
    let client = upstream_client(&args, &scheme)?;
    let acceptor = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(TlsAcceptor::from(Arc::new(server_config(
            cert,
            key,
            args.client_ca.as_deref(),
            args.client_ca_optional,
        )?))),
        _ => None,
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(serve(
            args.listen,
            acceptor,
            Upstream {
                client,
                scheme,
                authority,
            },
        ))
}

/// Where and how requests are forwarded.
#[derive(Clone)]
struct Upstream {
    client: UpstreamClient,
    scheme: Scheme,
    authority: Authority,
}

fn upstream_client(args: &Args, scheme: &Scheme) -> anyhow::Result<UpstreamClient> {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    let builder = HttpsConnectorBuilder::new();
    let connector = if *scheme == Scheme::HTTPS {
        let ca = args
            .upstream_ca
            .as_deref()
            .context("an https:// --upstream needs --upstream-ca")?;
        let mut roots = RootCertStore::empty();
        for cert in certs(ca)? {
            roots.add(cert).context("--upstream-ca")?;
        }
        let config = ClientConfig::builder().with_root_certificates(roots);
        let config = match (&args.upstream_client_cert, &args.upstream_client_key) {
            (Some(cert), Some(key)) => config
                .with_client_auth_cert(certs(cert)?, private_key(key)?)
                .context("--upstream-client-cert")?,
            _ => config.with_no_client_auth(),
        };
        builder
            .with_tls_config(config)
            .https_only()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http)
    } else {
        anyhow::ensure!(
            *scheme == Scheme::HTTP,
            "--upstream must be http:// or https://"
        );
        builder
            .with_tls_config(
                ClientConfig::builder()
                    .with_root_certificates(RootCertStore::empty())
                    .with_no_client_auth(),
            )
            .https_or_http()
            .enable_http1()
            .wrap_connector(http)
    };
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    optional: bool,
) -> anyhow::Result<ServerConfig> {
    let builder = ServerConfig::builder();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certs(ca)? {
                roots.add(cert).context("--client-ca")?;
            }
            let mut verifier = WebPkiClientVerifier::builder(Arc::new(roots));
            if optional {
                verifier = verifier.allow_unauthenticated();
            }
            let verifier = verifier.build().context("--client-ca")?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs(cert)?, private_key(key)?)
        .context("--tls-cert")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

fn certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("reading certificates from {}", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in {}", path.display());
    Ok(certs)
}

fn private_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .with_context(|| format!("reading a private key from {}", path.display()))
}

async fn serve(
    listen: String,
    acceptor: Option<TlsAcceptor>,
    upstream: Upstream,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(&listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let scheme = if acceptor.is_some() { "https" } else { "http" };
    println!("minproxy serving at {scheme}://{}", listener.local_addr()?);
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(a) => a,
            Err(_) => continue,
        };
        let _ = tcp.set_nodelay(true);
        let upstream = upstream.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            match acceptor {
                Some(acceptor) => {
                    // A failed handshake (no or a foreign client certificate) ends the connection.
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        serve_connection(tls, upstream).await;
                    }
                }
                None => serve_connection(tcp, upstream).await,
            }
        });
    }
}

async fn serve_connection<IO>(io: IO, upstream: Upstream)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req: Request<Incoming>| {
        let upstream = upstream.clone();
        async move { Ok::<_, Infallible>(forward(&upstream, req).await) }
    });
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

async fn forward(upstream: &Upstream, req: Request<Incoming>) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    let pq = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let uri = Uri::builder()
        .scheme(upstream.scheme.clone())
        .authority(upstream.authority.clone())
        .path_and_query(pq)
        .build();
    let Ok(uri) = uri else {
        return error(StatusCode::BAD_REQUEST);
    };
    parts.uri = uri;
    parts.headers.remove(CONNECTION);
    parts.headers.remove("keep-alive");
    parts.headers.remove(HOST);
    // hyper's client picks HTTP/2 when the upstream negotiated it (ALPN), else HTTP/1.1.
    parts.version = http::Version::HTTP_11;
    let req = Request::from_parts(parts, body.boxed());
    match upstream.client.request(req).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            parts.headers.remove(CONNECTION);
            parts.headers.remove("keep-alive");
            Response::from_parts(parts, body.boxed())
        }
        Err(_) => error(StatusCode::BAD_GATEWAY),
    }
}

fn error(code: StatusCode) -> Response<Body> {
    let mut resp = Response::new(
        Full::new(Bytes::new())
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = code;
    resp
}
