//! Values that pass validation must not panic later: any configuration
//! `validate` accepts (the check behind start, `check-config` and reload)
//! starts, serves requests on both protocols, a watch, the admin endpoints,
//! and drains, with no panic anywhere in the process. And values out of
//! range are refused with their field by `check-config` (exit 64) and by a
//! reload, which keeps the running configuration.
//!
//! One test per binary where a panic hook counts every panic of the
//! process: a panic in a connection's or a background task is otherwise
//! silent (tokio catches it), which is how `timeouts.idleSeconds: 1e300`
//! went unnoticed.
#![allow(clippy::unwrap_used)]

mod common;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::Request;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestCaseError, TestError, TestRunner};
use tollgate::Config;

/// Every panic in this process since the hook was set.
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    });
}

/// How a field's value is drawn.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Float,
    Int,
    Choice(&'static [&'static str]),
}

/// Every numeric (and mode-like) field, by its path in the file.
const FIELDS: &[(&str, Kind)] = &[
    ("mode", Kind::Choice(&["off", "dryRun", "enforce"])),
    ("upstream.maxStreamsPerConnection", Kind::Int),
    ("upstream.lightProtocol", Kind::Choice(&["http2", "http1"])),
    ("upstream.maxLightConnections", Kind::Int),
    ("upstream.connectTimeoutSeconds", Kind::Float),
    ("upstream.healthCheck.intervalSeconds", Kind::Float),
    ("upstream.healthCheck.timeoutSeconds", Kind::Float),
    ("upstream.metricsScrape.intervalSeconds", Kind::Float),
    ("maxConnections", Kind::Int),
    ("admin.maxConnections", Kind::Int),
    ("admin.headerReadSeconds", Kind::Float),
    ("admin.idleSeconds", Kind::Float),
    ("timeouts.headerReadSeconds", Kind::Float),
    ("timeouts.requestSeconds", Kind::Float),
    ("timeouts.keepAliveSeconds", Kind::Float),
    ("timeouts.idleSeconds", Kind::Float),
    ("drain.windowSeconds", Kind::Float),
    ("tokenReview.enabled", Kind::Choice(&["true", "false"])),
    ("tokenReview.cacheSeconds", Kind::Float),
    ("patterns.capacity", Kind::Int),
    ("patterns.halfLifeSeconds", Kind::Float),
    ("patterns.defaultListBytes", Kind::Float),
    ("patterns.defaultRequestBytes", Kind::Float),
    ("patterns.defaultObjectBytes", Kind::Float),
    ("patterns.gzipRatio", Kind::Float),
    ("lanes.heavyThresholdBytes", Kind::Float),
    ("lanes.maxWaitSeconds", Kind::Float),
    ("lanes.maxInflight.exempt", Kind::Int),
    ("lanes.maxInflight.system", Kind::Int),
    ("lanes.maxInflight.workload", Kind::Int),
    ("lanes.maxInflight.heavy", Kind::Int),
    ("lanes.maxInflight.self", Kind::Int),
    ("quota.mode", Kind::Choice(&["static", "adaptive"])),
    ("quota.inflightBytes", Kind::Float),
    ("quota.bytesPerSecond", Kind::Float),
    ("quota.burstBytes", Kind::Float),
    ("quota.etcdReadWeight", Kind::Float),
    ("quota.maxWaitSeconds", Kind::Float),
    ("quota.logPerSecond", Kind::Float),
    ("quota.queue.perFlowDepth", Kind::Int),
    ("quota.queue.maxFlows", Kind::Int),
    ("quota.queue.quantumBytes", Kind::Float),
    ("quota.perClient.requestsPerSecond", Kind::Float),
    ("quota.perClient.burst", Kind::Int),
    ("quota.perClient.maxClients", Kind::Int),
    ("quota.retryAfter.minSeconds", Kind::Int),
    ("quota.retryAfter.maxSeconds", Kind::Int),
    ("quota.retryAfter.jitter", Kind::Float),
    (
        "quota.scaling.mode",
        Kind::Choice(&["fixed", "nodeProportional", "containerProportional"]),
    ),
    ("quota.scaling.bytesPerSecondPerUnit", Kind::Float),
    ("quota.scaling.burstBytesPerUnit", Kind::Float),
    ("quota.scaling.refreshSeconds", Kind::Float),
    (
        "quota.adaptive.target",
        Kind::Choice(&["auto", "1us", "200ms", "3600s"]),
    ),
    (
        "quota.adaptive.floor",
        Kind::Choice(&["1us", "50ms", "3600s"]),
    ),
    ("quota.adaptive.baselineFactor", Kind::Float),
    ("quota.adaptive.minBytesPerSecond", Kind::Float),
    ("quota.adaptive.maxBytesPerSecond", Kind::Float),
    ("quota.adaptive.minInflightBytes", Kind::Float),
    ("quota.adaptive.maxInflightBytes", Kind::Float),
    ("quota.adaptive.intervalSeconds", Kind::Float),
    ("relistGuard.enabled", Kind::Choice(&["true", "false"])),
    ("relistGuard.warmupSeconds", Kind::Float),
    ("relistGuard.startFraction", Kind::Float),
];

/// Values at and around every edge: zero, tiny, the bounds, huge, not numbers.
const FLOATS: &[&str] = &[
    "-1", "0", "1e-300", "1e-9", "0.0005", "0.001", "0.05", "0.5", "1", "2", "60", "1000", "86400",
    "86401", "1e6", "1e9", "1e15", "1.2e15", "1e19", "1e20", "1e300", ".inf", ".nan",
];
const INTS: &[&str] = &[
    "0",
    "1",
    "2",
    "1000",
    "1000000",
    "10000000",
    "10000001",
    "4294967296",
    "18446744073709551615",
];

/// One case: a few fields set to drawn values, the rest default.
fn case() -> impl Strategy<Value = Vec<(usize, String)>> {
    let one = (0..FIELDS.len(), any::<prop::sample::Index>(), 0.0f64..1e5).prop_map(
        |(field, pick, plain)| {
            let value = match FIELDS[field].1 {
                // An edge most of the time, an ordinary number sometimes.
                Kind::Float if pick.index(4) == 0 => format!("{plain}"),
                Kind::Float => pick.get(FLOATS).to_string(),
                Kind::Int => pick.get(INTS).to_string(),
                Kind::Choice(c) => pick.get(c).to_string(),
            };
            (field, value)
        },
    );
    prop::collection::vec(one, 1..4)
}

/// A node of the file being written: a section or a value.
enum Node {
    Section(BTreeMap<String, Node>),
    Value(String),
}

fn set(root: &mut BTreeMap<String, Node>, path: &str, value: &str) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let Some(last) = parts.pop() else { return };
    let mut map = root;
    for p in parts {
        let entry = map
            .entry(p.to_string())
            .or_insert_with(|| Node::Section(BTreeMap::new()));
        map = match entry {
            Node::Section(m) => m,
            Node::Value(_) => return,
        };
    }
    map.insert(last.to_string(), Node::Value(value.to_string()));
}

/// Flow-style YAML of a section.
fn yaml(map: &BTreeMap<String, Node>) -> String {
    let fields: Vec<String> = map
        .iter()
        .map(|(k, v)| match v {
            Node::Section(m) => format!("{k}: {}", yaml(m)),
            Node::Value(s) => format!("{k}: {s}"),
        })
        .collect();
    format!("{{{}}}", fields.join(", "))
}

fn file(upstream: &str, fields: &[(usize, String)]) -> String {
    let mut root = BTreeMap::new();
    set(&mut root, "upstream.urls", &format!("[\"{upstream}\"]"));
    for (i, value) in fields {
        set(&mut root, FIELDS[*i].0, value);
    }
    yaml(&root)
}

/// What one accepted configuration did.
struct Served {
    /// The HTTP/2 GET got a response (any status).
    answered: bool,
}

/// Start tollgate with `config`, send it a GET on each protocol, a heavy
/// LIST and a watch, read the admin endpoints, and drain.
async fn exercise(config: Config) -> Served {
    let tg = start(config).await;
    let within = Duration::from_secs(3);
    let send = |client: HttpClient, url: String| async move {
        let req = Request::get(url).body(body(Bytes::new())).unwrap();
        let resp = tokio::time::timeout(within, client.request(req)).await;
        matches!(resp, Ok(Ok(_)))
    };
    send(h1_client(), tg.url("http", "/api/v1/namespaces/a/pods/x")).await;
    let answered = send(
        h2_client(),
        tg.url("http", "/api/v1/namespaces/a/configmaps/y"),
    )
    .await;
    send(h1_client(), tg.url("http", "/api/v1/pods?size=5000")).await;
    send(h2_client(), tg.url("http", "/api/v1/pods?watch=1")).await;
    for path in ["/metrics", "/debug/patterns", "/debug/budget", "/readyz"] {
        send(h1_client(), tg.admin_url(path)).await;
    }
    // The admin listener answers (a small connection cap may refuse a connection
    // whose predecessor's slot is not given back yet: try again).
    let deadline = tokio::time::Instant::now() + within;
    while !send(h1_client(), tg.admin_url("/healthz")).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the admin listener does not answer"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The drain must not panic; a long drain window may keep it going.
    if let Some(Err(e)) = tg.stop_within(within).await {
        panic!("the serve task ended with {e}");
    }
    Served { answered }
}

#[test]
fn any_accepted_configuration_starts_serves_and_drains_without_panicking() {
    count_panics();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let up = rt.block_on(Upstream::start(None));
    let (accepted, answered, cases) = (Cell::new(0), Cell::new(0), Cell::new(0));
    let mut runner = TestRunner::new(RunnerConfig {
        cases: 128,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let result = runner.run(&case(), |fields| {
        cases.set(cases.get() + 1);
        let text = file(&up.url, &fields);
        let Ok(config) = Config::from_yaml(&text) else {
            return Ok(());
        };
        if config.validate().is_err() {
            return Ok(());
        }
        accepted.set(accepted.get() + 1);
        let before = PANICS.load(Ordering::SeqCst);
        let served = rt.block_on(exercise(config));
        answered.set(answered.get() + usize::from(served.answered));
        let panics = PANICS.load(Ordering::SeqCst) - before;
        if panics > 0 {
            return Err(TestCaseError::fail(format!(
                "{panics} panic(s) with the accepted configuration {text}"
            )));
        }
        Ok(())
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, fields)) => {
            panic!("{why} (fields {fields:?})")
        }
        Err(e) => panic!("{e}"),
    }
    let (accepted, answered, cases) = (accepted.get(), answered.get(), cases.get());
    eprintln!("{cases} configurations, {accepted} accepted, {answered} served a request");
    // The property held on enough accepted configurations to mean something.
    assert!(
        accepted * 4 >= cases,
        "only {accepted} of {cases} configurations were accepted"
    );
    assert!(
        answered * 2 >= accepted,
        "only {answered} of {accepted} accepted configurations served a request"
    );
}

const EXE: &str = env!("CARGO_BIN_EXE_tollgate");

/// `tollgate [check-config] --config FILE` with `text` in FILE: exit code and stderr.
fn run_with(check: bool, text: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, text).unwrap();
    let mut cmd = std::process::Command::new(EXE);
    if check {
        cmd.arg("check-config");
    }
    let out = cmd
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .arg("--config")
        .arg(&path)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_and_start_refuse_values_out_of_range_with_the_field() {
    let base = "upstream: {urls: [\"http://127.0.0.1:1\"]}\n";
    for (extra, field) in [
        ("timeouts: {idleSeconds: 1e300}", "timeouts.idleSeconds"),
        ("quota: {maxWaitSeconds: 1e300}", "quota.maxWaitSeconds"),
        ("lanes: {maxWaitSeconds: 1e300}", "lanes.maxWaitSeconds"),
        ("drain: {windowSeconds: 1e20}", "drain.windowSeconds"),
    ] {
        let text = format!("{base}{extra}\n");
        for check in [true, false] {
            // A start refused by the check exits at once, before binding.
            let (code, err) = run_with(check, &text);
            assert_eq!(code, Some(64), "{extra} (check-config: {check}): {err}");
            assert!(err.contains(field), "{extra}: {err}");
        }
    }
    let (code, err) = run_with(true, &format!("{base}drain: {{windowSeconds: 86400}}\n"));
    assert_eq!(code, Some(0), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_with_a_value_out_of_range_is_refused_and_the_old_config_kept() {
    count_panics();
    let up = Upstream::start(None).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    let good = format!(
        "upstream: {{urls: [\"{}\"]}}\ndrain: {{windowSeconds: 0}}\ntimeouts: {{idleSeconds: 60}}\n",
        up.url
    );
    std::fs::write(&path, &good).unwrap();
    let flags = tollgate::Flags {
        config: Some(path.clone()),
        ..tollgate::Flags::default()
    };
    let tg = start(Config::load(&flags).unwrap()).await;
    let before = PANICS.load(Ordering::SeqCst);
    for bad in [
        "idleSeconds: 1e300",
        "requestSeconds: 1e300",
        "keepAliveSeconds: 1e300",
    ] {
        std::fs::write(&path, good.replace("idleSeconds: 60", bad)).unwrap();
        tg.gateway.reload_from(Config::load(&flags));
        assert_eq!(tg.gateway.config().timeouts.idle_seconds, 60.0, "{bad}");
        assert_eq!(tg.gateway.config().timeouts.request_seconds, 70.0, "{bad}");
        // New connections on both protocols are served with the old values.
        for client in [h1_client(), h2_client()] {
            let (code, _) = get_text(&client, &tg.url("http", "/api/v1/namespaces/a/pods/x")).await;
            assert_eq!(code, http::StatusCode::OK, "{bad}");
        }
    }
    let metrics = tg.gateway.encode_metrics().unwrap();
    assert!(
        metrics.contains("tollgate_config_reloads_total{result=\"error\"} 3"),
        "{metrics}"
    );
    assert_eq!(PANICS.load(Ordering::SeqCst), before, "no panic");
    tg.stop().await;
}
