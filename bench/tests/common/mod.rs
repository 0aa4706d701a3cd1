//! A small HTTP client for the simulator's loopback tests.
#![allow(dead_code, unused_macros, clippy::unwrap_used)]

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use std::time::Duration;

pub struct Http {
    pub base: String,
    client: Client<HttpConnector, Full<Bytes>>,
    token: Option<String>,
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

impl Http {
    pub fn new(base: &str) -> Http {
        Http {
            base: base.to_string(),
            client: Client::builder(TokioExecutor::new()).build_http(),
            token: None,
        }
    }

    pub fn with_token(base: &str, token: &str) -> Http {
        Http {
            token: Some(token.to_string()),
            ..Http::new(base)
        }
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: impl Into<Bytes>,
    ) -> Request<Full<Bytes>> {
        let mut b = Request::builder()
            .method(method)
            .uri(format!("{}{}", self.base, path))
            .header("content-type", content_type);
        if let Some(t) = &self.token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        b.body(Full::new(body.into())).unwrap()
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: impl Into<Bytes>,
    ) -> Reply {
        let req = self.request(method, path, content_type, body);
        let resp = tokio::time::timeout(Duration::from_secs(30), self.client.request(req))
            .await
            .expect("timed out")
            .expect("request failed");
        let (parts, body) = resp.into_parts();
        let body = tokio::time::timeout(Duration::from_secs(30), body.collect())
            .await
            .expect("body timed out")
            .expect("body failed")
            .to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path, "application/json", Bytes::new())
            .await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.send(Method::POST, path, "application/json", body.to_string())
            .await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Reply {
        self.send(Method::PUT, path, "application/json", body.to_string())
            .await
    }

    pub async fn patch(&self, path: &str, content_type: &str, body: &Value) -> Reply {
        self.send(Method::PATCH, path, content_type, body.to_string())
            .await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        self.send(Method::DELETE, path, "application/json", Bytes::new())
            .await
    }

    /// Opens a watch and returns a reader of its events.
    pub async fn watch(&self, path: &str) -> Watch {
        let req = self.request(Method::GET, path, "application/json", Bytes::new());
        let resp = tokio::time::timeout(Duration::from_secs(30), self.client.request(req))
            .await
            .expect("timed out")
            .expect("watch failed");
        assert_eq!(resp.status(), StatusCode::OK, "watch {path}");
        Watch {
            body: resp.into_body(),
            buf: Vec::new(),
        }
    }
}

pub struct Watch {
    body: hyper::body::Incoming,
    buf: Vec<u8>,
}

impl Watch {
    /// The next event, or `None` when the stream ends or nothing comes within `wait`.
    pub async fn next(&mut self, wait: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Some(serde_json::from_slice(&line).expect("watch event is JSON"));
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .ok()??
                .ok()?;
            if let Ok(data) = frame.into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }
}

/// Starts a simulator in-process on a free port with these flags.
pub async fn sim(flags: &[&str]) -> bench::sim::RunningSim {
    let mut args = vec!["sim", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(flags);
    let parsed = <bench::cli::SimArgs as clap::Parser>::parse_from(args);
    let config = parsed.into_config().expect("flags make a config");
    bench::sim::start(config).await.expect("sim starts")
}

/// Which store a behaviour test runs against: every one runs against both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    /// `--store etcd` against a real etcd of the test's own.
    Etcd,
}

/// A simulator on `backend`, with the etcd it uses (stopped after the simulator).
pub struct StoreSim {
    pub sim: bench::sim::RunningSim,
    pub etcd: Option<bench::sim::etcd_server::EtcdServer>,
}

impl std::ops::Deref for StoreSim {
    type Target = bench::sim::RunningSim;
    fn deref(&self) -> &bench::sim::RunningSim {
        &self.sim
    }
}

/// Starts a real etcd (off the async runtime: it polls with blocking waits).
pub async fn etcd() -> bench::sim::etcd_server::EtcdServer {
    tokio::task::spawn_blocking(bench::sim::etcd_server::EtcdServer::start)
        .await
        .unwrap()
        .expect("etcd starts")
}

/// [`sim`] on the memory store or on a fresh etcd.
pub async fn sim_on(backend: Backend, flags: &[&str]) -> StoreSim {
    match backend {
        Backend::Memory => StoreSim {
            sim: sim(flags).await,
            etcd: None,
        },
        Backend::Etcd => {
            let etcd = etcd().await;
            let mut all = vec!["--store", "etcd", "--etcd-endpoints", &etcd.url];
            all.extend_from_slice(flags);
            StoreSim {
                sim: sim(&all).await,
                etcd: Some(etcd),
            }
        }
    }
}

/// Runs each named `async fn NAME(Backend)` against both stores: `NAME::memory` and `NAME::etcd`.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn memory() {
                super::$name($crate::common::Backend::Memory).await
            }
            #[tokio::test]
            async fn etcd() {
                super::$name($crate::common::Backend::Etcd).await
            }
        }
    )*};
}

pub fn rv(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .parse()
        .expect("numeric resourceVersion")
}
