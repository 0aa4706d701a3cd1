//! One request's way through the simulated apiserver:
//! authenticate → parse → max-in-flight → route → serve → count.

use super::authn::Authenticator;
use super::inflight::{Inflight, InflightGuard};
use super::list::{self, ListStats};
use super::metrics::{
    DurationLabels, LongRunningLabels, RequestLabels, SimMetrics, StorageListLabels,
};
use super::model::ControlPlane;
use super::reaper::Reaper;
use super::resources::{self, ResourceDef};
use super::respond::{self, Body, Encoding};
use super::storage::Storage;
use super::store::Store;
use super::table;
use super::watch::{self, WatchCtx};
use super::write::{self, Change, DeleteOptions};
use super::{clock, patch::PatchType};
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
        let Some(def) = resources::lookup(&info.group, &info.version, &info.resource) else {
            if !resources::serves_group_version(&info.group, &info.version) {
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

    /// Which store serves a LIST (issue 5): consistent LISTs from the cache with
    /// `--consistent-reads-from-cache` once it is ready; while the cache is cold
    /// after a modeled restart, cache reads go to storage, or get 503 with
    /// `--reject-until-cache-ready`. Exact revisions and continue tokens always
    /// read storage.
    fn choose_store(&self, mut plan: list::ListPlan) -> Result<list::ListPlan, Status> {
        let m = &self.model;
        let ready = m.cache_ready();
        if !plan.from_cache
            && m.config.consistent_reads_from_cache
            && ready
            && plan.read_at == list::ReadAt::Latest
            && plan.start.is_none()
        {
            plan.from_cache = true;
        }
        if plan.from_cache && !ready {
            if m.config.reject_until_cache_ready {
                return Err(Status::service_unavailable(
                    "the watch cache is not ready yet, please retry",
                ));
            }
            plan.from_cache = false;
        }
        Ok(plan)
    }

    fn count(&self, info: &RequestInfo, def: &ResourceDef, code: u16, started: Instant) {
        count(&self.metrics, info, def, code, started);
    }

    async fn get(
        &self,
        def: &'static ResourceDef,
        info: &RequestInfo,
        encoding: Encoding,
    ) -> Response<Body> {
        let key = super::object::key(&info.namespace, &info.name);
        // Without resourceVersion a GET is a quorum read; with one, the cache serves it.
        let consistent = info.options.resource_version.is_none();
        if self.model.enabled() {
            let bytes = self
                .store
                .get(resources::index_of(def), &key)
                .map_or(0, |o| o.json.len() as u64);
            let from_etcd = consistent || !self.model.cache_ready();
            let d = self.model.constants().get(bytes, from_etcd);
            self.model.serve(&d).await;
        }
        let found = match self.storage.get(def, &key, consistent).await {
            Ok(o) => o,
            Err(e) => return respond::status(&Status::internal(e.to_string())),
        };
        match found {
            None => respond::status(&Status::not_found(def.group, def.name, &info.name)),
            Some(o) => match encoding {
                Encoding::Json => respond::json(StatusCode::OK, o.json.clone()),
                Encoding::Table(v) => respond::json_value(
                    StatusCode::OK,
                    &table::single(def, &o, o.rv, v, clock::now_unix()),
                ),
            },
        }
    }

    async fn list(
        self: &Arc<Self>,
        def: &'static ResourceDef,
        info: &RequestInfo,
        encoding: Encoding,
        guard: Option<InflightGuard>,
        started: Instant,
    ) -> Response<Body> {
        let result = match list::plan(def, &info.namespace, &info.options) {
            Ok(plan) => match self.choose_store(plan) {
                Ok(plan) => self
                    .storage
                    .list(def, &plan)
                    .await
                    .map(|(rv, map, from_etcd)| (plan, rv, map, from_etcd)),
                Err(s) => Err(s),
            },
            Err(s) => Err(s),
        };
        let (plan, rv, map, from_etcd) = match result {
            Ok(x) => x,
            Err(s) => {
                self.count(info, def, s.code, started);
                return respond::status(&s);
            }
        };
        // The modeled cost: what the apiserver reads, evaluates and sends,
        // waited for before the first byte (1.20 builds the whole list first).
        let shape = self.model.enabled().then(|| {
            list::shape(
                def,
                &map,
                &plan.filter,
                plan.start.as_deref(),
                plan.limit,
                from_etcd,
            )
        });
        let mut hold = None;
        if let Some(s) = &shape {
            let d = self.model.constants().list(s);
            match self.model.hold(d.memory) {
                Some(h) => hold = Some(h),
                // OOM-killed: a dead process never answers; the connection
                // this request came on is being dropped.
                None => std::future::pending::<()>().await,
            }
            self.model.serve(&d).await;
        }
        let api = self.clone();
        let info2 = info.clone();
        let storage = if from_etcd { "etcd" } else { "watchcache" };
        let on_done = Box::new(move |mut stats: ListStats| {
            let _guard = guard;
            let _hold = hold;
            if let Some(s) = shape {
                // What the modeled apiserver read, not what the simulator walked.
                stats.fetched = s.fetched;
                stats.evaluated = s.evaluated;
            }
            let l = StorageListLabels {
                resource: def.name.to_string(),
                storage: storage.to_string(),
            };
            api.metrics
                .list_fetched
                .get_or_create(&l)
                .inc_by(stats.fetched);
            api.metrics
                .list_evaluated
                .get_or_create(&l)
                .inc_by(stats.evaluated);
            api.metrics
                .list_returned
                .get_or_create(&l)
                .inc_by(stats.returned);
            if from_etcd {
                let r = super::metrics::ResourceLabels {
                    resource: def.name.to_string(),
                };
                api.metrics.storage_lists.get_or_create(&r).inc();
            }
            api.count(&info2, def, 200, started);
        });
        let body = list::body(def, rv, map, plan, encoding, clock::now_unix(), on_done);
        let mut r = Response::new(respond::iter_body(body));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    }

    async fn watch(
        self: &Arc<Self>,
        def: &'static ResourceDef,
        info: &RequestInfo,
        encoding: Encoding,
        started: Instant,
    ) -> Response<Body> {
        let plan = match watch::plan(def, &info.namespace, &info.options) {
            Ok(p) => p,
            Err(s) => {
                self.count(info, def, s.code, started);
                return respond::status(&s);
            }
        };
        if self.model.enabled() {
            // The cacher holds watches until the cache is filled, then sends
            // the initial state from it.
            self.model.wait_cache_ready().await;
            // kube-apiserver's cacher after a restart: its window starts at
            // the revision it listed at, and an older watch gets an ERROR
            // event with 410 ("too old resource version"), so informers relist.
            let floor = self.model.watch_floor();
            if let watch::Start::After(n) = plan.start {
                if n < floor {
                    self.count(info, def, 200, started);
                    let s = Status::expired(format!("too old resource version: {n} ({floor})"));
                    let event = format!("{{\"type\":\"ERROR\",\"object\":{}}}\n", s.to_json());
                    return respond::json(StatusCode::OK, event);
                }
            }
            if let watch::Start::FullState { .. } = plan.start {
                let (_, map) = self.store.snapshot(resources::index_of(def));
                let s = list::shape(def, &map, &plan.filter, None, None, false);
                self.model
                    .serve(&self.model.constants().watch_start(&s))
                    .await;
            }
        }
        let labels = LongRunningLabels {
            verb: "WATCH".into(),
            resource: def.name.into(),
            scope: scope(info).into(),
            component: "apiserver".into(),
        };
        let gauge = self.metrics.longrunning.get_or_create(&labels).clone();
        gauge.inc();
        struct Done {
            api: Arc<Api>,
            info: RequestInfo,
            def: &'static ResourceDef,
            started: Instant,
            gauge: prometheus_client::metrics::gauge::Gauge,
        }
        impl Drop for Done {
            fn drop(&mut self) {
                self.gauge.dec();
                self.api.count(&self.info, self.def, 200, self.started);
            }
        }
        let done = Done {
            api: self.clone(),
            info: info.clone(),
            def,
            started,
            gauge,
        };
        let ctx = WatchCtx {
            store: self.store.clone(),
            resource: resources::index_of(def),
            def,
            encoding,
            bookmark_every: self.config.bookmark_every,
            // Ends with the server, or with this incarnation at a modeled crash.
            shutdown: self.model.connections(),
            guard: Box::new(done),
        };
        let mut r = Response::new(watch::start(ctx, plan));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r.headers_mut().insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        r
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
            match super::protobuf::to_json(&body) {
                Ok(v) => Bytes::from(v.to_string()),
                Err(e @ super::protobuf::ProtobufError::Malformed(_)) => {
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
                    &super::object::key(&info.namespace, &info.name),
                )
                .map_or(0, |o| o.json.len());
            let d = self.model.constants().write(current.max(body.len()) as u64);
            self.model.serve(&d).await;
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
                    match write::delete(self, def, &info.namespace, &info.name, &o, dry_run).await {
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
        let filter = match list::Filter::parse(def, &info.options) {
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
                if let Ok(d) = write::delete(self, def, &o.namespace, &o.name, &opts, dry_run).await
                {
                    items.push(d);
                }
            }
        }
        let mut out = format!("{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{{\"resourceVersion\":\"{rv}\"}},\"items\":[", def.list_kind(), def.api_version()).into_bytes();
        let type_prefix = super::object::type_meta_prefix(def);
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
fn returns_deleted_object(def: &ResourceDef, o: &super::object::Obj) -> bool {
    def.name == "pods"
        || def.name == "namespaces"
        || o.value()["metadata"].get("deletionTimestamp").is_some()
}

/// The registry's `Success` for a finished delete: `details.kind` is the resource, as
/// kube-apiserver fills it.
fn deleted_status(def: &ResourceDef, o: &super::object::Obj) -> String {
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
