//! One request's way through the simulated apiserver:
//! authenticate → parse → max-in-flight → route → serve → count.

pub mod binding;
pub mod counts;
pub mod crd;
pub mod defaults;
pub mod delete;
pub mod discovery;
pub mod list;
mod nonresource;
pub mod patch;
pub mod protobuf;
mod reads;
pub mod respond;
pub mod scale;
pub mod serialized;
pub mod table;
pub mod validate;
pub mod watch;
pub mod write;

use self::delete::DeleteOptions;
use self::patch::PatchType;
use self::respond::Body;
use self::write::Change;
use crate::sim::auth::authn::Authenticator;
use crate::sim::inflight::Inflight;
use crate::sim::metrics::{DurationLabels, RequestLabels, SimMetrics};
use crate::sim::model::ControlPlane;
use crate::sim::resources::{self, ResourceDef};
use crate::sim::storage::read::Filter;
use crate::sim::storage::reaper::Reaper;
use crate::sim::storage::store::Store;
use crate::sim::storage::Storage;
use apimodel::{RequestInfo, Status, Verb};
use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use prometheus_client::registry::Registry;
use rustls_pki_types::CertificateDer;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Settings the handlers read.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    pub max_body_bytes: usize,
    pub bookmark_every: Duration,
    pub kubelet_delete_delay: Duration,
    /// host:port clients reach us at, for `/api`'s serverAddressByClientCIDRs.
    pub server_address: String,
    /// `--controllers`: a garbage collector runs, so deletes honour `propagationPolicy`
    /// (Foreground and Orphan leave the owner to it, with its finalizer).
    pub garbage_collector: bool,
    /// `--kube-version`: the release whose rules and documents the sim answers with.
    pub kube_version: crate::sim::kube_version::KubeVersion,
}

/// Everything a request may touch.
pub struct Api {
    /// The memory store, or with `--store etcd` the watch cache.
    pub store: Arc<Store>,
    /// Where writes and consistent reads go.
    pub storage: Arc<Storage>,
    pub metrics: SimMetrics,
    pub registry: Registry,
    pub inflight: Arc<Inflight>,
    pub authn: Authenticator,
    pub reaper: Arc<Reaper>,
    pub config: ApiConfig,
    pub shutdown: CancellationToken,
    /// The cost model (a no-op with `--cost-model none`).
    pub model: Arc<ControlPlane>,
    /// What `/metrics` says is stored.
    pub counts: counts::ObjectCounts,
    /// Services' ClusterIPs (10.96.0.0/12, kubeadm's default range).
    pub cluster_ips: Arc<defaults::ClusterIps>,
}

/// What the connection knows about its client.
#[derive(Debug, Default, Clone)]
pub struct Peer {
    pub certs: Option<Vec<CertificateDer<'static>>>,
}

fn header_str(req: &Request<Incoming>, h: header::HeaderName) -> Option<&str> {
    req.headers().get(h).and_then(|v| v.to_str().ok())
}

impl Api {
    /// Serves one request.
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>, peer: &Peer) -> Response<Body> {
        let started = Instant::now();
        let (method, uri) = (req.method().clone(), req.uri().clone());
        let content_type = req.headers().get(header::CONTENT_TYPE).cloned();
        let mut resp = self.route(req, peer, started).await;
        tracing::debug!(%method, %uri, ?content_type, status = resp.status().as_u16(), "request");
        let h = resp.headers_mut();
        h.insert(
            "audit-id",
            HeaderValue::from_str(&uuid::Uuid::new_v4().to_string())
                .unwrap_or(HeaderValue::from_static("-")),
        );
        h.entry(header::CACHE_CONTROL)
            .or_insert(HeaderValue::from_static("no-cache, private"));
        resp
    }

    async fn route(
        self: &Arc<Self>,
        req: Request<Incoming>,
        peer: &Peer,
        started: Instant,
    ) -> Response<Body> {
        let user = match self
            .authn
            .authenticate(req.headers(), peer.certs.as_deref())
        {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "authentication failed");
                return respond::status(&Status::unauthorized());
            }
        };
        let info =
            match RequestInfo::parse(req.method().as_str(), req.uri().path(), req.uri().query()) {
                Ok(i) => i,
                Err(e) => return respond::status(&Status::bad_request(e.to_string())),
            };
        if !info.is_resource()
            || (info.group == "authentication.k8s.io" && info.resource == "selfsubjectreviews")
        {
            return self.non_resource(req, &info, &user).await;
        }
        let Some(def) = self.resource(&info) else {
            if !resources::serves_group_version(
                self.config.kube_version,
                &info.group,
                &info.version,
            ) && !self
                .store
                .custom()
                .serves_group_version(&info.group, &info.version)
            {
                // No API group installed there: kube-apiserver's mux answers in plain text.
                return respond::plain(StatusCode::NOT_FOUND, "404 page not found\n");
            }
            return respond::status(&Status::resource_not_found());
        };
        if (!def.namespaced && !info.namespace.is_empty())
            || (!info.subresource.is_empty()
                && !def.subresources.contains(&info.subresource.as_str()))
        {
            return respond::status(&Status::resource_not_found());
        }
        if info.verb == Verb::Create && !info.name.is_empty() && info.subresource.is_empty() {
            // A POST to a named object has no route (creates go to the collection).
            return respond::status(&method_not_allowed());
        }
        if (info.subresource.is_empty() && !def.supports_verb(info.verb.as_str()))
            || (info.subresource == "binding" && info.verb != Verb::Create)
        {
            // Verbs discovery does not list for the resource have no route.
            return respond::status(&method_not_allowed());
        }
        // kube-apiserver's max-in-flight filter: long-running requests are not
        // counted, and system:masters is never refused.
        let guard = if info.is_long_running() {
            None
        } else {
            match self.inflight.try_acquire(info.verb.is_mutating()) {
                Some(g) => Some(g),
                None if user.groups.iter().any(|g| g == "system:masters") => None,
                None => {
                    self.count(&info, def, 429, started);
                    return respond::too_many_requests();
                }
            }
        };
        let Some(encoding) = respond::negotiate(header_str(&req, header::ACCEPT)) else {
            return respond::not_acceptable();
        };
        let resp = match info.verb {
            Verb::List => return self.list(def, &info, encoding, guard, started).await,
            Verb::Watch => return self.watch(def, &info, encoding, started).await,
            Verb::Get => self.get(def, &info, encoding).await,
            _ => self.write(req, def, &info).await,
        };
        self.count(&info, def, resp.status().as_u16(), started);
        drop(guard);
        resp
    }

    /// The resource a request names: a built-in, or one a CRD serves.
    fn resource(&self, info: &RequestInfo) -> Option<&'static ResourceDef> {
        resources::lookup_in(
            self.config.kube_version,
            &info.group,
            &info.version,
            &info.resource,
        )
        .or_else(|| {
            let c = self
                .store
                .custom()
                .lookup(&info.group, &info.version, &info.resource)?;
            c.versions
                .iter()
                .find(|v| v.def.version == info.version)
                .map(|v| v.def)
        })
    }

    fn count(&self, info: &RequestInfo, def: &ResourceDef, code: u16, started: Instant) {
        count(&self.metrics, info, def, code, started);
    }

    async fn write(
        &self,
        req: Request<Incoming>,
        def: &'static ResourceDef,
        info: &RequestInfo,
    ) -> Response<Body> {
        let content_type = header_str(&req, header::CONTENT_TYPE)
            .unwrap_or("application/json")
            .to_string();
        let query = req.uri().query().map(String::from);
        let dry_run = apimodel::request::query_pairs(query.as_deref().unwrap_or(""))
            .any(|(k, v)| k == "dryRun" && v == "All");
        let body = match read_body(req.into_body(), self.config.max_body_bytes).await {
            Ok(b) => b,
            Err(s) => return respond::status(&s),
        };
        let body = if content_type.starts_with("application/vnd.kubernetes.protobuf")
            && matches!(info.verb, Verb::Create | Verb::Update)
        {
            match protobuf::to_json(&body) {
                Ok(v) => Bytes::from(v.to_string()),
                Err(e @ protobuf::ProtobufError::Malformed(_)) => {
                    return respond::status(&Status::bad_request(e.to_string()))
                }
                Err(e) => {
                    return respond::status(&Status::failure(
                        415,
                        "UnsupportedMediaType",
                        e.to_string(),
                    ))
                }
            }
        } else {
            body
        };
        if self.model.enabled() {
            let current = self
                .store
                .get(
                    resources::index_of(def),
                    &crate::sim::storage::object::key(&info.namespace, &info.name),
                )
                .map_or(0, |o| o.json.len());
            let d = self.model.constants().write(current.max(body.len()) as u64);
            self.model.serve(&d).await;
        }
        if info.subresource == "binding" {
            return match binding::create(self, def, info, &body, dry_run).await {
                Ok(s) | Err(s) => respond::status(&s),
            };
        }
        if info.subresource == "scale" {
            return match scale::update(self, def, info, &content_type, &body, dry_run).await {
                Ok(v) => respond::json_value(StatusCode::OK, &v),
                Err(s) => respond::status(&s),
            };
        }
        if info.verb == Verb::Create && !def.supports_verb("get") {
            // A review (TokenReview, SubjectAccessReview, …) is answered, never stored.
            return match write::parse_object(&body) {
                Ok(mut o) => {
                    o.entry("status").or_insert_with(|| serde_json::json!({}));
                    respond::json_value(StatusCode::CREATED, &serde_json::Value::Object(o))
                }
                Err(s) => respond::status(&s),
            };
        }
        let result = match info.verb {
            Verb::Create => write::create(self, def, info, &body, dry_run)
                .await
                .map(|o| (StatusCode::CREATED, o)),
            Verb::Update => write::update(self, def, info, Change::Replace(&body), dry_run)
                .await
                .map(|o| (StatusCode::OK, o)),
            Verb::Patch => match PatchType::from_content_type(&content_type) {
                Some(kind) => write::update(self, def, info, Change::Patch(kind, &body), dry_run)
                    .await
                    .map(|o| (StatusCode::OK, o)),
                None => Err(Status::unsupported_media_type()),
            },
            Verb::Delete => match DeleteOptions::parse(query.as_deref(), &body) {
                Ok(o) => {
                    match delete::delete(self, def, &info.namespace, &info.name, &o, dry_run).await
                    {
                        Ok(gone) if !returns_deleted_object(def, &gone) => {
                            return respond::json(StatusCode::OK, deleted_status(def, &gone))
                        }
                        r => r.map(|o| (StatusCode::OK, o)),
                    }
                }
                Err(s) => Err(s),
            },
            Verb::DeleteCollection => {
                return self
                    .delete_collection(def, info, query.as_deref(), &body, dry_run)
                    .await
            }
            _ => Err(Status::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({})",
                info.verb
            ))),
        };
        match result {
            Ok((code, o)) => respond::json(code, o.json.clone()),
            Err(s) => respond::status(&s),
        }
    }

    async fn delete_collection(
        &self,
        def: &'static ResourceDef,
        info: &RequestInfo,
        query: Option<&str>,
        body: &[u8],
        dry_run: bool,
    ) -> Response<Body> {
        let filter = match Filter::parse(def, &info.options) {
            Ok(f) => f,
            Err(s) => return respond::status(&s),
        };
        let opts = match DeleteOptions::parse(query, body) {
            Ok(o) => o,
            Err(s) => return respond::status(&s),
        };
        let (rv, map) = self.store.snapshot(resources::index_of(def));
        let mut items = Vec::new();
        for (_, o) in map.iter() {
            if (info.namespace.is_empty() || o.namespace == info.namespace)
                && filter.matches(def, o)
            {
                if let Ok(d) =
                    delete::delete(self, def, &o.namespace, &o.name, &opts, dry_run).await
                {
                    items.push(d);
                }
            }
        }
        let mut out = format!("{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{{\"resourceVersion\":\"{rv}\"}},\"items\":[", def.list_kind(), def.api_version()).into_bytes();
        let type_prefix = crate::sim::storage::object::type_meta_prefix(def);
        for (i, o) in items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let (open, rest) = o.json_without_type_meta(&type_prefix);
            out.extend_from_slice(open);
            out.extend_from_slice(rest);
        }
        out.extend_from_slice(b"]}");
        respond::json(StatusCode::OK, out)
    }
}

/// What a DELETE answers: kube-apiserver's registry returns the object for pods
/// (`ReturnDeletedObject`), for namespaces and for anything whose deletion is still pending
/// (finalizers, grace period); otherwise a `Status` naming what was deleted.
fn returns_deleted_object(def: &ResourceDef, o: &crate::sim::storage::object::Obj) -> bool {
    def.name == "pods"
        || def.name == "namespaces"
        || o.value()["metadata"].get("deletionTimestamp").is_some()
}

/// The registry's `Success` for a finished delete: `details.kind` is the resource, as
/// kube-apiserver fills it.
fn deleted_status(def: &ResourceDef, o: &crate::sim::storage::object::Obj) -> String {
    let mut s = Status::success();
    s.code = 0;
    s.details = Some(apimodel::status::StatusDetails {
        name: o.name.clone(),
        group: def.group.into(),
        kind: def.name.into(),
        uid: o.uid.clone(),
        ..Default::default()
    });
    s.to_json()
}

/// kube-apiserver's 405 for a method no route takes, with empty details.
fn method_not_allowed() -> Status {
    let mut s = Status::method_not_allowed(
        "the server does not allow this method on the requested resource",
    );
    s.details = Some(apimodel::status::StatusDetails::default());
    s
}

fn scope(info: &RequestInfo) -> &'static str {
    if !info.name.is_empty() {
        "resource"
    } else if info.namespace.is_empty() {
        "cluster"
    } else {
        "namespace"
    }
}

fn count(m: &SimMetrics, info: &RequestInfo, def: &ResourceDef, code: u16, started: Instant) {
    let verb = match info.verb {
        Verb::Get => "GET",
        Verb::List => "LIST",
        Verb::Watch => "WATCH",
        Verb::Create => "POST",
        Verb::Update => "PUT",
        Verb::Patch => "PATCH",
        Verb::Delete => "DELETE",
        Verb::DeleteCollection => "DELETECOLLECTION",
        Verb::Connect => "CONNECT",
        Verb::NonResource => "GET",
    };
    let d = DurationLabels {
        verb: verb.into(),
        group: def.group.into(),
        version: def.version.into(),
        resource: def.name.into(),
        subresource: info.subresource.clone(),
        scope: scope(info).into(),
        component: "apiserver".into(),
    };
    m.duration
        .get_or_create(&d)
        .observe(started.elapsed().as_secs_f64());
    let r = RequestLabels {
        verb: d.verb,
        group: d.group,
        version: d.version,
        resource: d.resource,
        subresource: d.subresource,
        scope: d.scope,
        component: d.component,
        code: code.to_string(),
    };
    m.requests.get_or_create(&r).inc();
}

/// Reads a request body up to `max` bytes: 413 beyond, 400 if the client's body breaks.
pub(super) async fn read_body(body: Incoming, max: usize) -> Result<Bytes, Status> {
    match Limited::new(body, max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(Status::too_large(max as u64))
        }
        Err(e) => Err(Status::bad_request(format!(
            "reading the request body: {e}"
        ))),
    }
}
