//! Requests for no resource: health, version, discovery, OpenAPI, `/metrics`
//! and `selfsubjectreviews` (who `kubectl auth whoami` says you are).

use super::discovery;
use super::respond::{self, Body};
use super::{read_body, Api};
use crate::sim::auth::user::UserInfo;
use crate::sim::resources::{self, ResourceDef};
use apimodel::{RequestInfo, Status};
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;

impl Api {
    pub(super) async fn non_resource(
        &self,
        req: Request<Incoming>,
        info: &RequestInfo,
        user: &UserInfo,
    ) -> Response<Body> {
        let path = info.path.trim_end_matches('/');
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let ok = |v: serde_json::Value| respond::json_value(StatusCode::OK, &v);
        let kube = self.config.kube_version;
        match (req.method(), parts.as_slice()) {
            (&Method::GET, ["healthz" | "livez" | "readyz", ..]) => {
                respond::plain(StatusCode::OK, "ok")
            }
            (&Method::GET, ["version"]) => ok(discovery::version(kube)),
            (&Method::GET, ["metrics"]) => self.metrics_text(),
            (&Method::GET, ["api"]) => ok(discovery::api_versions(&self.config.server_address)),
            (&Method::GET, ["api", v]) => {
                discovery::resource_list(kube, self.store.custom(), "", v)
                    .map_or_else(|| not_found(path), ok)
            }
            (&Method::GET, ["apis"]) => ok(discovery::group_list(kube, self.store.custom())),
            (&Method::GET, ["apis", g]) => discovery::api_group(kube, self.store.custom(), g)
                .map_or_else(|| not_found(path), ok),
            (&Method::GET, ["apis", g, v]) => {
                discovery::resource_list(kube, self.store.custom(), g, v)
                    .map_or_else(|| not_found(path), ok)
            }
            (&Method::GET, ["openapi", "v3"]) => {
                ok(discovery::openapi_v3_root(kube, self.store.custom()))
            }
            (&Method::GET, ["openapi", "v3", "api", v]) => {
                discovery::openapi_v3(kube, self.store.custom(), "", v)
                    .map_or_else(|| not_found(path), ok)
            }
            (&Method::GET, ["openapi", "v3", "apis", g, v]) => {
                discovery::openapi_v3(kube, self.store.custom(), g, v)
                    .map_or_else(|| not_found(path), ok)
            }
            (&Method::POST, ["apis", "authentication.k8s.io", "v1", "selfsubjectreviews"]) => {
                if let Err(s) = read_body(req.into_body(), self.config.max_body_bytes).await {
                    return respond::status(&s);
                }
                respond::json_value(
                    StatusCode::CREATED,
                    &json!({"kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1",
                            "metadata": {"creationTimestamp": null}, "status": {"userInfo": user}}),
                )
            }
            _ => not_found(path),
        }
    }

    fn metrics_text(&self) -> Response<Body> {
        let counts = self
            .counts
            .report(resources::slots(), |i| self.store.count(i));
        // One series per resource, as kube-apiserver counts them: versions of a group add up.
        let mut by_name = std::collections::BTreeMap::<String, usize>::new();
        let kube = self.config.kube_version;
        // The release's own kinds (the store has a slot for both releases'), and CRDs'.
        let served = |d: &ResourceDef| {
            d.is_custom() || resources::lookup_in(kube, d.group, d.version, d.name).is_some()
        };
        for def in self
            .store
            .defs()
            .iter()
            .filter(|d| d.supports_verb("list"))
            .filter(|d| served(d))
        {
            let name = if def.group.is_empty() {
                def.name.to_string()
            } else {
                format!("{}.{}", def.name, def.group)
            };
            *by_name.entry(name).or_default() += counts.get(def.index).copied().unwrap_or(0);
        }
        for (name, count) in by_name {
            self.metrics
                .storage_objects
                .get_or_create(&crate::sim::metrics::ResourceLabels { resource: name })
                .set(count as i64);
        }
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            return respond::status(&Status::internal(format!("encoding metrics: {e}")));
        }
        let mut r = Response::new(respond::full(out));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        );
        r
    }
}

fn not_found(_path: &str) -> Response<Body> {
    respond::status(&Status::resource_not_found())
}
