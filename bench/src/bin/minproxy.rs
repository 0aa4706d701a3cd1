//! `minproxy`: the smallest useful hyper reverse proxy, the floor any hyper-based proxy here is
//! compared with (issue 3's benchmarks, `bench/scripts/proxy-bench.sh`). It does no work:
//! no classification, no metrics, no TLS, no header rewriting beyond what forwarding needs
//! (the URI is pointed at the upstream; hop-by-hop `Connection`/`Keep-Alive` dropped).
//! Bodies are streamed both ways.
//!
//! ```text
//! minproxy --listen 127.0.0.1:0 --upstream http://127.0.0.1:8080
//! ```
//! Prints `minproxy serving at http://ADDR` on stdout once it listens.

use std::convert::Infallible;

use anyhow::Context;
use http::header::{CONNECTION, HOST};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

type Body = BoxBody<Bytes, hyper::Error>;

fn usage() -> anyhow::Error {
    anyhow::anyhow!("usage: minproxy --listen ADDR --upstream http://HOST:PORT")
}

fn main() -> anyhow::Result<()> {
    let mut listen = None;
    let mut upstream = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next(),
            "--upstream" => upstream = args.next(),
            _ => return Err(usage()),
        }
    }
    let (listen, upstream) = (listen.ok_or_else(usage)?, upstream.ok_or_else(usage)?);
    let upstream: Uri = upstream.parse().context("--upstream")?;
    anyhow::ensure!(
        upstream.scheme() == Some(&Scheme::HTTP),
        "--upstream must be http://"
    );
    let authority = upstream
        .authority()
        .cloned()
        .context("--upstream has no host")?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(serve(listen, authority))
}

async fn serve(listen: String, authority: Authority) -> anyhow::Result<()> {
    let listener = TcpListener::bind(&listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    println!("minproxy serving at http://{}", listener.local_addr()?);
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Body> =
        Client::builder(TokioExecutor::new()).build(connector);
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(a) => a,
            Err(_) => continue,
        };
        let _ = tcp.set_nodelay(true);
        let client = client.clone();
        let authority = authority.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let client = client.clone();
                let authority = authority.clone();
                async move { Ok::<_, Infallible>(forward(&client, authority, req).await) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}

async fn forward(
    client: &Client<HttpConnector, Body>,
    authority: Authority,
    req: Request<Incoming>,
) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    let pq = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let uri = Uri::builder()
        .scheme(Scheme::HTTP)
        .authority(authority)
        .path_and_query(pq)
        .build();
    let Ok(uri) = uri else {
        return error(StatusCode::BAD_REQUEST);
    };
    parts.uri = uri;
    parts.headers.remove(CONNECTION);
    parts.headers.remove("keep-alive");
    parts.headers.remove(HOST);
    parts.version = http::Version::HTTP_11;
    let req = Request::from_parts(parts, body.boxed());
    match client.request(req).await {
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
