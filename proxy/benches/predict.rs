//! `predict` + `observe` on a pattern cache holding 10,000 patterns: the
//! per-request cost of learning (target: under 2 µs together).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderMap, Method};
use tokio::time::Instant;
use tollgate::classify::classify;
use tollgate::config::Patterns;
use tollgate::identity::ClientClass;
use tollgate::pattern::PatternKey;
use tollgate::predict::{Completion, Outcome, PatternCache};

fn keys(n: usize) -> Vec<PatternKey> {
    (0..n)
        .map(|i| {
            let url = format!(
                "/apis/g{}.example.com/v1/r{i}?fieldSelector=spec.x%3D{i}",
                i % 50
            );
            let uri: http::Uri = url.parse().expect("uri");
            let c = classify(&Method::GET, &uri, &HeaderMap::new()).expect("classifies");
            PatternKey::new(&c, ClientClass::User)
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let keys = keys(10_000);
    let mut cache = PatternCache::new(Patterns {
        capacity: 20_000,
        ..Patterns::default()
    });
    let start = Instant::now();
    let outcome = |bytes: u64| Outcome {
        status: 200,
        bytes,
        gzip: false,
        latency: Duration::from_millis(3),
        completion: Completion::End,
        full_list: false,
        client: "user:bench".into(),
        initial_bytes: None,
    };
    for (i, k) in keys.iter().enumerate() {
        cache.observe(k, &outcome(1000 + i as u64), start);
    }
    let mut i = 0usize;
    let mut now = start;
    c.bench_function("predict+observe, 10k patterns", |b| {
        b.iter(|| {
            i = (i + 7919) % keys.len();
            now += Duration::from_micros(100);
            let k = &keys[i];
            let p = cache.predict(black_box(k), now);
            cache.observe(k, &outcome(p.response_bytes as u64), now);
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
