//! LIST: which revision a request reads (consistent, any, not older than N,
//! exactly N, or a continue token's), selector filtering, `limit`/`continue`
//! paging, and the response streamed chunk by chunk from a snapshot, never
//! built whole in memory.

use super::respond::Encoding;
use super::table;
use crate::sim::model::ListShape;
use crate::sim::resources::ResourceDef;
use crate::sim::storage::object::Obj;
use crate::sim::storage::read::{Filter, ListPlan, ReadAt};
use crate::sim::storage::store::ObjMap;
use apimodel::{ListOptions, Status};
use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use std::ops::Bound;
use std::sync::Arc;

/// Bytes gathered before a chunk is handed to the connection.
const CHUNK: usize = 64 * 1024;

fn parse_rv(v: &str) -> Result<u64, Status> {
    v.parse::<u64>().map_err(|_| {
        Status::invalid(
            "",
            "",
            "",
            format!("resourceVersion: Invalid value: {v:?}: must be a non-negative integer"),
        )
    })
}

/// Validates the options as the apiserver does and decides what to read.
pub fn plan(def: &ResourceDef, namespace: &str, o: &ListOptions) -> Result<ListPlan, Status> {
    let filter = Filter::parse(def, o)?.in_namespace(namespace);
    let rv = o.resource_version.as_deref().map(parse_rv).transpose()?;
    let m = o.resource_version_match.as_deref();
    if m.is_some() && rv.is_none() {
        return Err(invalid_list_options(
            "resourceVersionMatch",
            "FieldValueForbidden",
            "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    if let Some(token) = &o.continue_token {
        if rv.is_some() {
            return Err(invalid_list_options(
                "resourceVersion",
                "FieldValueForbidden",
                "Forbidden: specifying resource version is not allowed when using continue",
            ));
        }
        let (at, start) = decode_continue(token)?;
        return Ok(ListPlan {
            read_at: ReadAt::Exact(at),
            limit: o.limit,
            start: Some(start),
            filter,
            from_cache: false,
            fresh: false,
        });
    }
    let (read_at, from_cache) =
        match (rv, m) {
            (None, _) => (ReadAt::Latest, false),
            (Some(0), None | Some("NotOlderThan")) => (ReadAt::Latest, true),
            (Some(0), Some("Exact")) => return Err(invalid_list_options(
                "resourceVersionMatch",
                "FieldValueForbidden",
                "Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            )),
            (Some(n), Some("NotOlderThan")) => (ReadAt::NotOlderThan(n), true),
            (Some(n), Some("Exact")) => (ReadAt::Exact(n), false),
            (Some(n), None) if o.limit.is_some() => (ReadAt::Exact(n), false),
            (Some(n), None) => (ReadAt::NotOlderThan(n), true),
            (Some(_), Some(other)) => {
                return Err(invalid_list_options(
                    "resourceVersionMatch",
                    "FieldValueNotSupported",
                    &format!(
                    "Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
                ),
                ))
            }
        };
    Ok(ListPlan {
        read_at,
        // kube-apiserver's watch cache answers `resourceVersion=0` whole: `limit` is ignored
        // (and no continue token given), whatever the size.
        limit: o.limit.filter(|_| rv != Some(0)),
        start: None,
        filter,
        from_cache,
        fresh: false,
    })
}

/// 422 for list options the apiserver refuses: `ListOptions.meta.k8s.io "" is invalid: …`,
/// with the field as the cause.
fn invalid_list_options(field: &str, reason: &str, detail: &str) -> Status {
    let mut status = Status::invalid(
        "meta.k8s.io",
        "ListOptions",
        "",
        format!("ListOptions.meta.k8s.io \"\" is invalid: {field}: {detail}"),
    );
    if let Some(d) = status.details.as_mut() {
        d.causes.push(apimodel::status::StatusCause {
            reason: reason.into(),
            message: detail.into(),
            field: field.into(),
        });
    }
    status
}

/// The continue token the apiserver writes: base64 of `{"v":"meta.k8s.io/v1","rv":N,"start":"<key>\u0000"}`.
pub fn encode_continue(rv: u64, last_key: &str) -> String {
    let v =
        serde_json::json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{last_key}\u{0}")});
    base64::engine::general_purpose::STANDARD.encode(v.to_string())
}

fn decode_continue(token: &str) -> Result<(u64, String), Status> {
    let bad = |why: &str| Status::bad_request(format!("continue key is not valid: {why}"));
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(token))
        .map_err(|_| bad("not base64"))?;
    let v: serde_json::Value = serde_json::from_slice(&raw).map_err(|_| bad("not JSON"))?;
    if v["v"] != "meta.k8s.io/v1" {
        return Err(bad("unsupported version"));
    }
    let rv = v["rv"]
        .as_u64()
        .filter(|rv| *rv > 0)
        .ok_or_else(|| bad("incorrect encoded start resourceVersion (version meta.k8s.io/v1)"))?;
    let start = v["start"]
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad("encoded start key empty"))?;
    Ok((rv, start.to_string()))
}

/// Only the keys of one namespace (`ns/…`), as etcd reads the range
/// `/registry/pods/ns/`; everything when `namespace` is empty.
pub fn namespace_range(map: ObjMap, namespace: &str) -> ObjMap {
    if namespace.is_empty() {
        return map;
    }
    // '/' < '0': every key of the namespace sorts between "ns/" and "ns0".
    let (_, _, from) = map.split_lookup(&format!("{namespace}/"));
    let (within, _, _) = from.split_lookup(&format!("{namespace}0"));
    within
}

/// What serving `plan` over `map` reads, evaluates and returns, counted up
/// front for the cost model. From etcd, the whole key range is read (up to a
/// full page with `limit`) whatever the selectors; from the watch cache, a
/// `spec.nodeName=X` pod LIST reads only the node's pods (the cacher's index).
pub fn shape(
    def: &ResourceDef,
    map: &ObjMap,
    filter: &Filter,
    start: Option<&str>,
    limit: Option<u64>,
    from_etcd: bool,
) -> ListShape {
    let map = namespace_range(map.clone(), &filter.namespace);
    let from = match start {
        Some(k) => Bound::Included(k),
        None => Bound::Unbounded,
    };
    let indexed_node =
        (!from_etcd && def.name == "pods")
            .then(|| {
                filter.fields.requirements.iter().find(|r| {
                    r.field == "spec.nodeName" && r.op == apimodel::selector::FieldOp::Equals
                })
            })
            .flatten()
            .map(|r| r.value.as_str());
    let mut s = ListShape {
        from_etcd,
        revision_check: false,
        ..ListShape::default()
    };
    for (_, o) in map.range::<_, str>((from, Bound::Unbounded)) {
        if let Some(node) = indexed_node {
            if o.field(def, "spec.nodeName").as_deref() != Some(node) {
                continue;
            }
        }
        let len = o.json.len() as u64;
        s.fetched += 1;
        s.fetched_bytes += len;
        s.evaluated += 1;
        if filter.matches(def, o) {
            s.returned += 1;
            s.returned_bytes += len;
            if limit.is_some_and(|l| s.returned >= l) {
                break;
            }
        }
    }
    s
}

/// Counts a LIST reports to the metrics when its body ends.
#[derive(Debug, Default, Clone, Copy)]
pub struct ListStats {
    pub fetched: u64,
    pub evaluated: u64,
    pub returned: u64,
}

/// What a body sends, in order.
enum Items {
    /// A page chosen up front (a LIST with `limit`).
    Page(std::vec::IntoIter<Arc<Obj>>),
    /// The whole snapshot, walked by key range: each chunk resumes after the
    /// last key it sent. (Consuming the map instead would copy every leaf of
    /// the tree it shares with the store, keys included, as it goes.)
    Walk { map: ObjMap, after: Option<String> },
}

type OnDone = Box<dyn FnOnce(ListStats) + Send>;

/// The chunks of one LIST response.
pub struct ListBody {
    head: Option<Bytes>,
    items: Items,
    def: &'static ResourceDef,
    encoding: Encoding,
    filter: Option<Filter>,
    first: bool,
    done: bool,
    now: i64,
    stats: ListStats,
    on_done: Option<OnDone>,
    /// `{"kind":"K","apiVersion":"V",`: left out of each item, as kube-apiserver does.
    type_prefix: Vec<u8>,
}

/// Builds the response body for a plan over a snapshot. With a limit, the page
/// is chosen up front (the continue token goes in the head); without, the
/// snapshot is walked as the client reads.
pub fn body(
    def: &'static ResourceDef,
    rv: u64,
    map: ObjMap,
    plan: ListPlan,
    encoding: Encoding,
    now: i64,
    on_done: OnDone,
) -> ListBody {
    let map = namespace_range(map, &plan.filter.namespace);
    let map = match &plan.start {
        Some(start) => {
            let (_, at, mut rest) = map.split_lookup(start);
            if let Some(o) = at {
                rest.insert(start.clone(), o);
            }
            rest
        }
        None => map,
    };
    let mut stats = ListStats::default();
    // `remainingItemCount`, as kube-apiserver counts it: the keys after the page, only
    // for a LIST without selectors (with them, the count would be a guess, so it is left out).
    let mut remaining = None;
    let (items, filter, cont): (Items, Option<Filter>, Option<String>) = match plan.limit {
        Some(limit) => {
            let mut page = Vec::new();
            let mut cont = None;
            let mut iter = map.iter();
            for (k, o) in iter.by_ref() {
                stats.fetched += 1;
                stats.evaluated += 1;
                if plan.filter.matches(def, o) {
                    page.push(o.clone());
                    if page.len() as u64 >= limit {
                        cont = Some(k.clone());
                        break;
                    }
                }
            }
            // No continue token when nothing follows the page.
            let left = if cont.is_some() {
                iter.count() as u64
            } else {
                0
            };
            let cont = cont.filter(|_| left > 0).map(|k| encode_continue(rv, &k));
            if cont.is_some() && plan.filter.labels.is_empty() && plan.filter.fields.is_empty() {
                remaining = Some(left);
            }
            (Items::Page(page.into_iter()), None, cont)
        }
        None => (Items::Walk { map, after: None }, Some(plan.filter), None),
    };
    let head = head(def, rv, cont.as_deref(), remaining, encoding);
    ListBody {
        head: Some(head),
        items,
        def,
        encoding,
        filter,
        first: true,
        done: false,
        now,
        stats,
        on_done: Some(on_done),
        type_prefix: crate::sim::storage::object::type_meta_prefix(def),
    }
}

fn head(
    def: &ResourceDef,
    rv: u64,
    cont: Option<&str>,
    remaining: Option<u64>,
    encoding: Encoding,
) -> Bytes {
    let mut meta = serde_json::json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = c.into();
    } else if def.is_custom() {
        // Unstructured lists (custom resources) always carry it.
        meta["continue"] = "".into();
    }
    if let Some(n) = remaining {
        meta["remainingItemCount"] = n.into();
    }
    let s = match encoding {
        Encoding::Json => format!(
            "{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{},\"items\":[",
            def.list_kind(),
            def.api_version(),
            meta
        ),
        Encoding::Table(v) => format!(
            "{{\"kind\":\"Table\",\"apiVersion\":\"meta.k8s.io/{v}\",\"metadata\":{},\"columnDefinitions\":{},\"rows\":[",
            meta,
            table::columns(def)
        ),
    };
    Bytes::from(s)
}

impl Iterator for ListBody {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if let Some(h) = self.head.take() {
            return Some(h);
        }
        if self.done {
            return None;
        }
        let mut buf = BytesMut::with_capacity(CHUNK + 4096);
        // Taken out for the walk (so `add` can borrow the rest), put back below.
        let mut items = std::mem::replace(&mut self.items, Items::Page(Vec::new().into_iter()));
        let full = match &mut items {
            Items::Page(page) => page.any(|o| self.add(&mut buf, &o)),
            Items::Walk { map, after } => {
                let from = match after {
                    Some(k) => Bound::Excluded(k.as_str()),
                    None => Bound::Unbounded,
                };
                let mut last = None;
                for (k, o) in map.range::<_, str>((from, Bound::Unbounded)) {
                    if self.add(&mut buf, o) {
                        last = Some(k.clone());
                        break;
                    }
                }
                if last.is_some() {
                    *after = last;
                    true
                } else {
                    false
                }
            }
        };
        self.items = items;
        if full {
            return Some(buf.freeze());
        }
        self.done = true;
        buf.extend_from_slice(b"]}");
        if let Some(f) = self.on_done.take() {
            f(self.stats);
        }
        Some(buf.freeze())
    }
}

impl ListBody {
    /// Adds `o` to the chunk if the filter lets it through; true once the chunk is full.
    fn add(&mut self, buf: &mut BytesMut, o: &Obj) -> bool {
        if let Some(f) = &self.filter {
            self.stats.fetched += 1;
            self.stats.evaluated += 1;
            if !f.matches(self.def, o) {
                return false;
            }
        }
        self.stats.returned += 1;
        if !self.first {
            buf.put_u8(b',');
        }
        self.first = false;
        match self.encoding {
            Encoding::Json => {
                let (open, rest) = o.json_without_type_meta(&self.type_prefix);
                buf.extend_from_slice(open);
                buf.extend_from_slice(rest);
            }
            Encoding::Table(_) => {
                buf.extend_from_slice(table::row(self.def, o, self.now).to_string().as_bytes())
            }
        }
        buf.len() >= CHUNK
    }
}

impl Drop for ListBody {
    fn drop(&mut self) {
        // A client that went away mid-list still read what it read.
        if let Some(f) = self.on_done.take() {
            f(self.stats);
        }
    }
}
