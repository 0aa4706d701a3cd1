//! The reading verbs' handlers: GET, LIST and WATCH, each charged to the cost model before
//! it is served, read from the store the plan chooses, and counted when its body ends.

use super::list::{self, ListStats};
use super::respond::{self, Body, Encoding};
use super::watch::{self, WatchCtx};
use super::{scope, table, Api};
use crate::sim::clock;
use crate::sim::inflight::InflightGuard;
use crate::sim::kube_version::{CacheState, ListRead, ServedBy};
use crate::sim::metrics::{LongRunningLabels, StorageListLabels};
use crate::sim::model::ListShape;
use crate::sim::resources::{self, ResourceDef};
use crate::sim::storage::read::{ListPlan, ReadAt};
use apimodel::{RequestInfo, Status};
use http::{header, HeaderValue, Response, StatusCode};
use std::sync::Arc;
use tokio::time::Instant;

impl Api {
    /// Which store serves a LIST: the release's rule (`sim::kube_version`; with
    /// `--consistent-reads-from-cache`, consistent LISTs from the cache on 1.20 too). While the
    /// cache is cold after a modeled restart, cache reads go to storage, or get 503 with
    /// `--reject-until-cache-ready`. Returns the plan and whether the cache first asked etcd
    /// for its current revision (a consistent read from the cache).
    fn choose_store(&self, mut plan: ListPlan) -> Result<(ListPlan, bool), Status> {
        let m = &self.model;
        let ready = m.cache_ready();
        let read = match (plan.read_at, &plan.start) {
            (ReadAt::Latest, None) if !plan.from_cache => ListRead::Consistent,
            (ReadAt::Exact(rv), _) => ListRead::Exact(rv),
            _ => ListRead::AnyRecent,
        };
        let cache = CacheState {
            ready,
            oldest: self.store.compacted(),
            newest: self.store.revision(),
        };
        let served =
            self.config
                .kube_version
                .list_store(read, cache, m.config.consistent_reads_from_cache);
        let mut revision_check = false;
        if let ServedBy::Cache { revision_check: r } = served {
            plan.from_cache = true;
            plan.fresh = r;
            revision_check = r;
        }
        if plan.from_cache && !ready {
            if m.config.reject_until_cache_ready {
                return Err(Status::service_unavailable(
                    "the watch cache is not ready yet, please retry",
                ));
            }
            plan.from_cache = false;
        }
        Ok((plan, revision_check))
    }

    pub(super) async fn get(
        &self,
        def: &'static ResourceDef,
        info: &RequestInfo,
        encoding: Encoding,
    ) -> Response<Body> {
        if info.subresource == "scale" {
            return match super::scale::get(self, def, info) {
                Ok(v) => respond::json_value(StatusCode::OK, &v),
                Err(s) => respond::status(&s),
            };
        }
        let key = crate::sim::storage::object::key(&info.namespace, &info.name);
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

    pub(super) async fn list(
        self: &Arc<Self>,
        def: &'static ResourceDef,
        info: &RequestInfo,
        encoding: Encoding,
        guard: Option<InflightGuard>,
        started: Instant,
    ) -> Response<Body> {
        let result = match list::plan(def, &info.namespace, &info.options) {
            Ok(plan) => match self.choose_store(plan) {
                Ok((plan, revision_check)) => self
                    .storage
                    .list(def, &plan)
                    .await
                    .map(|(rv, map, from_etcd)| (plan, rv, map, from_etcd, revision_check)),
                Err(s) => Err(s),
            },
            Err(s) => Err(s),
        };
        let (plan, rv, map, from_etcd, revision_check) = match result {
            Ok(x) => x,
            Err(s) => {
                self.count(info, def, s.code, started);
                return respond::status(&s);
            }
        };
        // The modeled cost: what the apiserver reads, evaluates and sends,
        // waited for before the first byte (1.20 builds the whole list first).
        let shape = self.model.enabled().then(|| ListShape {
            revision_check: revision_check && !from_etcd,
            ..list::shape(
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
            api.metrics.count_storage_list(def, from_etcd);
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

    pub(super) async fn watch(
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
            kube_version: self.config.kube_version,
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
}
