//! Watching `kube-system/extension-apiserver-authentication`, so a change of the
//! apiserver's trusted names applies within seconds (a 60 s poll let a newly
//! trusted `X-Evil-Groups` through for 47 s). An informer's loop, by hand: list
//! the one ConfigMap (a field selector on its name, which the Role
//! `extension-apiserver-authentication-reader` allows), watch from the list's
//! resourceVersion for `refreshSeconds`, and list again when the watch ends, fails
//! or says its version expired (an `ERROR` event, 410). Reads that fail are
//! retried after 1 s, doubling to `refreshSeconds`. Where the list is refused but a
//! GET of the object is allowed (a narrower Role), that GET is made instead, every
//! retry: a poll, logged as such.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use http_body_util::BodyExt;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::{counted, fetch, read_timeout, HeaderNames, Trusted, MAX_CONFIGMAP_BYTES};
use crate::config;
use crate::forward::UpstreamPool;
use crate::metrics::Metrics;

/// The list of the one ConfigMap, by its name.
const LIST_PATH: &str = "/api/v1/namespaces/kube-system/configmaps?fieldSelector=metadata.name%3Dextension-apiserver-authentication";

/// The first wait after a failed read.
const RETRY_FIRST: Duration = Duration::from_secs(1);

/// How much longer than its `timeoutSeconds` a watch may stay silent before it is
/// taken for stalled (the apiserver closes it at `timeoutSeconds`).
const WATCH_MARGIN: Duration = Duration::from_secs(15);

#[derive(Debug, Deserialize)]
struct ListMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
}

#[derive(Debug, Deserialize)]
struct List {
    metadata: ListMeta,
    #[serde(default)]
    items: Vec<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    object: serde_json::Value,
}

/// The names in a listed ConfigMap and the version to watch from.
fn parse_list(body: &[u8]) -> Result<(HeaderNames, String), String> {
    let list: List = serde_json::from_slice(body).map_err(|e| format!("not a list: {e}"))?;
    let name = |o: &serde_json::Value| {
        o.pointer("/metadata/name").and_then(|n| n.as_str())
            == Some("extension-apiserver-authentication")
    };
    let Some(cm) = list.items.iter().find(|o| name(o)) else {
        return Err("the apiserver publishes no such ConfigMap".into());
    };
    let names = HeaderNames::from_configmap(cm.to_string().as_bytes())?;
    Ok((names, list.metadata.resource_version))
}

/// What one watch event means.
#[derive(Debug, PartialEq)]
enum Seen {
    /// The ConfigMap as it is now.
    Names(HeaderNames),
    /// Nothing to do (a bookmark, a deletion: names learned stay stripped).
    Nothing,
    /// The watch must start over from a list (an `ERROR`: 410 Gone and the like).
    Relist(String),
}

fn parse_event(line: &[u8]) -> Result<Seen, String> {
    let e: Event = serde_json::from_slice(line).map_err(|e| format!("not a watch event: {e}"))?;
    match e.kind.as_str() {
        "ADDED" | "MODIFIED" => {
            HeaderNames::from_configmap(e.object.to_string().as_bytes()).map(Seen::Names)
        }
        "ERROR" => Ok(Seen::Relist(
            e.object
                .get("message")
                .and_then(|m| m.as_str())
                .unwrap_or("watch error")
                .to_string(),
        )),
        _ => Ok(Seen::Nothing),
    }
}

/// Learn from `names`, saying so when something changed.
fn apply(trusted: &Trusted, names: &HeaderNames) {
    trusted.set_error(None);
    if trusted.learn(names) {
        let t = trusted.get();
        let (user, group) = t.forward_names();
        tracing::info!(?names, %user, %group,
            "the identity headers the apiserver trusts changed: stripping every one of them");
    }
}

/// Why a watch ended.
enum WatchEnd {
    Stopped,
    /// Ended as watches do, or asked for a list: list again at once.
    Relist,
    Failed(String),
}

/// Watch from `version` on the first upstream that answers until the watch ends.
async fn watch(
    pool: &UpstreamPool,
    version: &str,
    seconds: u64,
    head_timeout: Duration,
    trusted: &Trusted,
    stop: &CancellationToken,
) -> WatchEnd {
    let path = format!(
        "{LIST_PATH}&watch=1&allowWatchBookmarks=true&timeoutSeconds={seconds}&resourceVersion={version}"
    );
    let Some(u) = pool
        .upstreams()
        .iter()
        .find(|u| u.is_healthy())
        .or(pool.upstreams().first())
    else {
        return WatchEnd::Failed("no upstream".into());
    };
    let resp = tokio::select! {
        _ = stop.cancelled() => return WatchEnd::Stopped,
        r = pool.own_stream(u, &path, head_timeout) => r,
    };
    let mut body = match resp {
        Ok(r) => r.into_body(),
        Err(e) => return WatchEnd::Failed(format!("watch: {e}")),
    };
    let silence = Duration::from_secs(seconds) + WATCH_MARGIN;
    let mut buf = BytesMut::new();
    loop {
        let frame = tokio::select! {
            _ = stop.cancelled() => return WatchEnd::Stopped,
            f = tokio::time::timeout(silence, body.frame()) => f,
        };
        let data = match frame {
            Err(_) => return WatchEnd::Failed("the watch stalled".into()),
            Ok(None) => return WatchEnd::Relist,
            Ok(Some(Err(e))) => return WatchEnd::Failed(format!("watch: {e}")),
            Ok(Some(Ok(f))) => match f.into_data() {
                Ok(d) => d,
                Err(_) => continue,
            },
        };
        buf.extend_from_slice(&data);
        while let Some(end) = buf.iter().position(|b| *b == b'\n') {
            let line = buf.split_to(end + 1);
            let line = line.trim_ascii();
            if line.is_empty() {
                continue;
            }
            match parse_event(line) {
                Ok(Seen::Names(names)) => apply(trusted, &names),
                Ok(Seen::Nothing) => {}
                Ok(Seen::Relist(why)) => {
                    tracing::debug!(%why, "the identity headers' watch asks for a list");
                    return WatchEnd::Relist;
                }
                Err(e) => return WatchEnd::Failed(e),
            }
        }
        // One event holds one ConfigMap, which is bounded like a read of it.
        if buf.remaining() > 2 * MAX_CONFIGMAP_BYTES {
            return WatchEnd::Failed("a watch event past 2 MiB".into());
        }
    }
}

/// List the ConfigMap on the first upstream that answers.
async fn list(pool: &UpstreamPool, timeout: Duration) -> Result<(HeaderNames, String), String> {
    let mut why = String::from("no upstream");
    let mut upstreams: Vec<_> = pool.upstreams().iter().collect();
    upstreams.sort_by_key(|u| !u.is_healthy());
    for u in upstreams {
        match pool
            .own_get(u, LIST_PATH, 2 * MAX_CONFIGMAP_BYTES, timeout)
            .await
        {
            Ok(body) => return parse_list(&body),
            Err(e) => why = format!("{}: {e}", u.url),
        }
    }
    Err(why)
}

/// Keep the names current until `stop`, when tollgate has a front-proxy certificate:
/// list and watch the ConfigMap, as this module's doc says.
pub async fn learn_loop(
    config: Arc<config::Current>,
    pool: Arc<UpstreamPool>,
    trusted: Arc<Trusted>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    // Without a front-proxy certificate the apiserver reads no identity header from
    // tollgate's connections: the names do not matter, and tollgate asks nothing.
    if !pool.has_front_proxy() {
        return;
    }
    // Logged as a warning when it starts failing, then at debug level.
    let mut failing = false;
    let mut retry = RETRY_FIRST;
    loop {
        let c = config.get();
        let refresh = Duration::from_secs_f64(c.upstream.request_headers.refresh_seconds);
        let timeout = read_timeout(&c);
        let failure = match counted(list(&pool, timeout).await, &metrics) {
            Ok((names, version)) => {
                failing = false;
                retry = RETRY_FIRST;
                apply(&trusted, &names);
                let seconds = refresh.as_secs().max(1);
                match watch(&pool, &version, seconds, timeout, &trusted, &stop).await {
                    WatchEnd::Stopped => return,
                    WatchEnd::Relist => continue,
                    WatchEnd::Failed(e) => e,
                }
            }
            // A Role that allows a GET only: poll with it.
            Err(e) => match counted(fetch(&pool, timeout).await, &metrics) {
                Ok(names) => {
                    apply(&trusted, &names);
                    if !failing {
                        tracing::warn!(error = %e, every = ?refresh,
                            "cannot list and watch the identity headers the apiserver trusts, only get them: reading them every refreshSeconds");
                    }
                    failing = true;
                    retry = refresh;
                    String::new()
                }
                Err(_) => e,
            },
        };
        if !failure.is_empty() {
            trusted.set_error(Some(failure.clone()));
            if failing {
                tracing::debug!(error = %failure, "reading the identity headers failed");
            } else {
                failing = true;
                tracing::warn!(error = %failure, "cannot read the identity headers the apiserver trusts; keeping the names known so far");
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(retry) => {}
        }
        retry = (retry * 2).min(refresh.max(RETRY_FIRST));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_gives_the_names_and_the_version_to_watch_from() {
        let list = br#"{"kind":"ConfigMapList","metadata":{"resourceVersion":"42"},"items":[
            {"metadata":{"name":"extension-apiserver-authentication"},
             "data":{"requestheader-group-headers":"[\"X-Evil-Groups\"]"}}]}"#;
        let (names, version) = parse_list(list).expect("parses");
        assert_eq!(version, "42");
        assert_eq!(names.group, ["x-evil-groups"]);
        let empty = br#"{"metadata":{"resourceVersion":"1"},"items":[]}"#;
        assert!(parse_list(empty).is_err(), "no ConfigMap is not no names");
        let other = br#"{"metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"p"}}]}"#;
        assert!(
            parse_list(other).is_err(),
            "another object is not the ConfigMap"
        );
    }

    #[test]
    fn watch_events() {
        let modified = br#"{"type":"MODIFIED","object":{"data":{"requestheader-username-headers":"[\"X-U\"]"}}}"#;
        let Ok(Seen::Names(n)) = parse_event(modified) else {
            panic!("names")
        };
        assert_eq!(n.user, ["x-u"]);
        let gone = br#"{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old resource version"}}"#;
        assert_eq!(
            parse_event(gone),
            Ok(Seen::Relist("too old resource version".into()))
        );
        let bookmark = br#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}"#;
        assert_eq!(parse_event(bookmark), Ok(Seen::Nothing));
        assert!(parse_event(b"{").is_err());
    }
}
