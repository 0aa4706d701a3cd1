//! Hostile input never panics the simulator: it answers with a Status.
#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use common::{sim, Http};
use serde_json::json;

#[tokio::test]
async fn multibyte_generate_name_is_refused_not_a_panic() {
    let s = sim(&[]).await;
    let c = Http::new(&s.url);
    let body = json!({"metadata": {"generateName": "é".repeat(70)}});
    let r = c.post("/api/v1/namespaces/default/configmaps", &body).await;
    assert_eq!(r.status, 422, "{}", String::from_utf8_lossy(&r.body));
    // The server is still there.
    assert_eq!(c.get("/version").await.status, 200);
    let ok = c
        .post(
            "/api/v1/namespaces/default/configmaps",
            &json!({"metadata": {"generateName": "a".repeat(70)}}),
        )
        .await;
    assert_eq!(ok.status, 201);
    assert_eq!(ok.json()["metadata"]["name"].as_str().unwrap().len(), 63);
}
