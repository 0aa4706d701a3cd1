//! The client listener on the wire: any bytes a client may send, through hyper's
//! HTTP/1.1 and HTTP/2 (prior knowledge) parsers and tollgate's whole handler —
//! identify, classify, admit, forward to a stub apiserver on loopback, observe — as
//! the listener serves a plain connection ([`tollgate::accept::serve_for_fuzzing`]).
//! The input is written into an in-memory stream whose write half is then closed: the
//! connection must end (within 10 s: a stall is a finding), and nothing may panic.
#![no_main]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

struct World {
    rt: tokio::runtime::Runtime,
    gateway: tollgate::Gateway,
}

static WORLD: OnceLock<World> = OnceLock::new();

/// The stub apiserver: a small JSON answer to anything, a 101 to an upgrade.
async fn stub(listener: TcpListener) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let svc = service_fn(|req: Request<Incoming>| async move {
                let mut resp = Response::new(Full::new(Bytes::from_static(
                    br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}"#,
                )));
                if req.headers().contains_key(http::header::UPGRADE) {
                    *resp.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
                    resp.headers_mut()
                        .insert(http::header::CONNECTION, "Upgrade".parse().unwrap());
                    resp.headers_mut()
                        .insert(http::header::UPGRADE, "websocket".parse().unwrap());
                }
                Ok::<_, Infallible>(resp)
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(tcp), svc)
                .await;
        });
    }
}

fn world() -> &'static World {
    WORLD.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let gateway = rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
            let addr = listener.local_addr().expect("addr");
            tokio::spawn(stub(listener));
            let mut config = tollgate::Config::default();
            config.upstream.urls = vec![format!("http://{addr}")];
            config.upstream.metrics_scrape.enabled = false;
            config.admin_listen = None;
            // dryRun, the default: admission decides on every request but delays none. In
            // enforce a heavy LIST may wait its queue's maxWaitSeconds (10 s) for the budget,
            // longer than an input may take.
            config.mode = tollgate::config::Mode::DryRun;
            tollgate::Gateway::new(config).expect("gateway")
        });
        World { rt, gateway }
    })
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let remote = SocketAddr::from(([10, 0, 0, 1], 40000));
    w.rt.block_on(async {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let serving = tokio::spawn(tollgate::accept::serve_for_fuzzing(
            w.gateway.clone(),
            server,
            remote,
        ));
        let exchange = async {
            // The server may answer and close before reading it all: a write error is fine.
            let _ = client.write_all(data).await;
            let _ = client.shutdown().await;
            let mut out = Vec::new();
            let _ = client.read_to_end(&mut out).await;
            serving.await
        };
        match tokio::time::timeout(Duration::from_secs(10), exchange).await {
            Err(_) => panic!("the connection is still open 10 s after the client closed its side"),
            Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Ok(_) => {}
        }
    });
});
