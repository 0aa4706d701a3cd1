//! The container count for the pool's `containerProportional` scaling
//! (see [`crate::enforce::scaling`]). Containers need pod specs: a paged
//! `resourceVersion=0` LIST (served by the watch cache, not etcd) that
//! excludes terminal pods by field selector, at a low refresh rate, with
//! tollgate's own identity in the `self` lane. Each page is bounded; only
//! three arrays of each pod are decoded.

use std::sync::Arc;

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::admit::Admission;
use crate::config::settings::enforce::ScalingMode;
use crate::config::{self, Config};
use crate::enforce::lane::Lane;
use crate::enforce::slots::{SlotLimits, SlotOutcome};
use crate::forward::UpstreamPool;

/// Pods per page of the container count.
pub const PAGE_LIMIT: u32 = 500;
/// Most bytes one page may take (about 100 KB per pod is far more than any).
const MAX_PAGE_BYTES: usize = 64 << 20;

/// The path of one page of the container count.
pub fn page_path(continue_token: Option<&str>) -> String {
    let mut p = format!(
        "/api/v1/pods?resourceVersion=0&limit={PAGE_LIMIT}&fieldSelector=status.phase%21%3DSucceeded%2Cstatus.phase%21%3DFailed"
    );
    if let Some(c) = continue_token {
        p.push_str("&continue=");
        p.push_str(
            &percent_encoding::utf8_percent_encode(c, percent_encoding::NON_ALPHANUMERIC)
                .to_string(),
        );
    }
    p
}

#[derive(Deserialize)]
struct PodList {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default)]
    items: Vec<Pod>,
}

#[derive(Deserialize, Default)]
struct ListMeta {
    #[serde(default, rename = "continue")]
    continue_token: Option<String>,
}

#[derive(Deserialize)]
struct Pod {
    #[serde(default)]
    spec: PodSpec,
    #[serde(default)]
    status: PodStatus,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PodSpec {
    #[serde(default)]
    containers: Vec<serde::de::IgnoredAny>,
    #[serde(default)]
    init_containers: Vec<serde::de::IgnoredAny>,
    #[serde(default)]
    ephemeral_containers: Vec<serde::de::IgnoredAny>,
}

#[derive(Deserialize, Default)]
struct PodStatus {
    #[serde(default)]
    phase: Option<String>,
}

/// Containers in the non-terminal pods of one page, and the continue token.
pub fn count_page(body: &[u8]) -> Result<(u64, Option<String>), serde_json::Error> {
    let list: PodList = serde_json::from_slice(body)?;
    let containers = list
        .items
        .iter()
        .filter(|p| !matches!(p.status.phase.as_deref(), Some("Succeeded" | "Failed")))
        .map(|p| {
            (p.spec.containers.len()
                + p.spec.init_containers.len()
                + p.spec.ephemeral_containers.len()) as u64
        })
        .sum();
    let token = list.metadata.continue_token.filter(|c| !c.is_empty());
    Ok((containers, token))
}

/// Count containers every `quota.scaling.refreshSeconds` while the mode is
/// `containerProportional`, until `stop`; admission scales its pool by them.
pub async fn container_loop(
    config: Arc<config::Current>,
    pool: Arc<UpstreamPool>,
    admission: Arc<Admission>,
    stop: CancellationToken,
) {
    loop {
        let config = config.get();
        let scaling = config.quota.scaling.clone();
        if scaling.mode == ScalingMode::ContainerProportional {
            match count_containers(&config, &pool, &admission).await {
                Ok(n) => {
                    tracing::debug!(containers = n, "counted containers");
                    admission.set_cluster_size("containers", n as f64);
                }
                Err(e) => tracing::warn!(error = %e, "counting containers failed"),
            }
        }
        let wait = std::time::Duration::from_secs_f64(scaling.refresh_seconds);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// The container count's flow in the `self` lane (tollgate's own: any
/// constant but 0).
const CONTAINER_COUNT_FLOW: u64 = 1;

async fn count_containers(
    config: &Config,
    pool: &UpstreamPool,
    admission: &Admission,
) -> Result<u64, String> {
    let slots = admission.slots();
    let wait = std::time::Duration::from_secs_f64(config.lanes.max_wait_seconds);
    let limits = SlotLimits::of(Lane::SelfLane, &config.lanes);
    let _slot = match slots
        .take(Lane::SelfLane, CONTAINER_COUNT_FLOW, limits, wait)
        .await
    {
        SlotOutcome::Now(s) | SlotOutcome::Waited(s) => s,
        SlotOutcome::Full | SlotOutcome::Refused(_) => return Err("the self lane is full".into()),
    };
    let upstream = pool
        .upstreams()
        .iter()
        .find(|u| u.is_healthy())
        .cloned()
        .ok_or("no healthy upstream")?;
    let mut total = 0u64;
    let mut token: Option<String> = None;
    // A cluster of 1,000,000 pods is 2,000 pages; more means a loop.
    for _ in 0..10_000 {
        let path = page_path(token.as_deref());
        let body = pool
            .own_get(
                &upstream,
                &path,
                MAX_PAGE_BYTES,
                std::time::Duration::from_secs(60),
            )
            .await?;
        let (n, next) = count_page(&body).map_err(|e| e.to_string())?;
        total += n;
        match next {
            Some(t) => token = Some(t),
            None => return Ok(total),
        }
    }
    Err("too many pages".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_of_non_terminal_pods_are_counted() {
        let page = br#"{"kind":"PodList","metadata":{"continue":"abc"},"items":[
            {"metadata":{"name":"a"},"spec":{"containers":[{"name":"x"},{"name":"y"}],"initContainers":[{"name":"i"}]},"status":{"phase":"Running"}},
            {"spec":{"containers":[{"name":"x"}],"ephemeralContainers":[{"name":"debug"}]},"status":{"phase":"Pending"}},
            {"spec":{"containers":[{"name":"x"}]},"status":{"phase":"Succeeded"}}
        ]}"#;
        assert_eq!(count_page(page).expect("parses"), (5, Some("abc".into())));
        let last = br#"{"metadata":{"continue":""},"items":[]}"#;
        assert_eq!(count_page(last).expect("parses"), (0, None));
        assert!(page_path(Some("a b")).ends_with("&continue=a%20b"));
        assert!(page_path(None).contains("resourceVersion=0&limit=500"));
    }
}
