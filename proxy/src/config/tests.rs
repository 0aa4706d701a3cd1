use clap::Parser;

use super::*;

/// tollgate's flags as a command line of their own.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    flags: Flags,
}

#[test]
fn empty_file_is_defaults() {
    let c = Config::from_yaml("").expect("defaults");
    assert_eq!(c.listen, "0.0.0.0:6443");
    assert_eq!(c.admin_listen.as_deref(), Some("127.0.0.1:9443"));
    assert_eq!(c.patterns.capacity, 10_000);
}

#[test]
fn file_settings_and_mode_off() {
    let c = Config::from_yaml(
        "mode: off\nlisten: 127.0.0.1:1\nupstream:\n  urls: [\"https://a:6443\"]\npatterns:\n  consistentStore: watchCache\n",
    )
    .expect("parses");
    assert_eq!(c.mode, Mode::Off);
    assert_eq!(c.listen, "127.0.0.1:1");
    assert_eq!(c.upstream.urls, vec!["https://a:6443".to_string()]);
    assert_eq!(c.patterns.consistent_store, StoreSetting::WatchCache);
    assert_eq!(
        Config::default().patterns.consistent_store,
        StoreSetting::Auto
    );
    assert_eq!(c.upstream.light_protocol, LightProtocol::Http2, "default");
    c.validate().expect("valid");
}

#[test]
fn light_protocol_http1_and_its_connection_cap() {
    let c = Config::from_yaml(
        "upstream: {urls: [\"https://a:6443\"], lightProtocol: http1, maxLightConnections: 8}\n",
    )
    .expect("parses");
    assert_eq!(c.upstream.light_protocol, LightProtocol::Http1);
    assert_eq!(c.upstream.max_light_connections, 8);
    c.validate().expect("valid");
    let err = Config::from_yaml("upstream: {lightProtocol: http3}\n").expect_err("no such");
    assert!(err.contains("http3"), "{err}");
    let mut c = c;
    c.upstream.max_light_connections = 0;
    let err = c.validate().expect_err("no connections at all");
    assert!(
        err.to_string().contains("upstream.maxLightConnections"),
        "{err}"
    );
}

#[test]
fn unknown_field_is_refused_with_its_line() {
    let err = Config::from_yaml("listen: a:1\nupstream:\n  urlz: []\n").expect_err("typo");
    assert!(err.contains("urlz"), "{err}");
    assert!(err.contains('3'), "line number missing: {err}");
}

#[test]
fn flags_override_file() {
    let mut c = Config::from_yaml("listen: 127.0.0.1:1\nupstream: {urls: [\"http://a:1\"]}\n")
        .expect("parses");
    let flags = Flags {
        listen: Some("127.0.0.1:2".into()),
        upstreams: vec!["http://b:2".into(), "http://c:3".into()],
        ..Flags::default()
    };
    c.apply(&flags);
    assert_eq!(c.listen, "127.0.0.1:2");
    assert_eq!(c.upstream.urls.len(), 2);
}

#[test]
fn validation_names_the_field() {
    let mut c = Config::default();
    let err = c.validate().expect_err("no upstream");
    assert!(err.to_string().contains("upstream.urls"));
    c.upstream.urls = vec!["ftp://x".into()];
    assert!(c.validate().is_err());
    c.upstream.urls = vec!["http://x:1".into()];
    c.tls.cert_file = Some("a".into());
    assert!(c
        .validate()
        .expect_err("pair")
        .to_string()
        .contains("tls.certFile"));
}

#[test]
fn modes_default_to_dry_run() {
    assert_eq!(Config::default().mode, Mode::DryRun);
    for (text, mode) in [
        ("mode: off", Mode::Off),
        ("mode: dryRun", Mode::DryRun),
        ("mode: enforce", Mode::Enforce),
    ] {
        assert_eq!(Config::from_yaml(text).expect("parses").mode, mode);
    }
    assert!(Config::from_yaml("mode: dry-run").is_err());
}

#[test]
fn enforcement_settings_are_validated_by_field() {
    let base = "upstream: {urls: [\"http://a:1\"]}\n";
    let check = |extra: &str| {
        Config::from_yaml(&format!("{base}{extra}"))
            .expect("parses")
            .validate()
            .map_err(|e| e.to_string())
    };
    assert!(check("quota: {bytesPerSecond: 1e6, burstBytes: 4e6}\n").is_ok());
    let err = check("quota: {burstBytes: -1}\n").expect_err("negative");
    assert!(err.contains("quota.burstBytes"), "{err}");
    let err = check("quota: {queue: {perFlowDepth: 0}}\n").expect_err("zero");
    assert!(err.contains("quota.queue.perFlowDepth"), "{err}");
    let err = check("relistGuard: {startFraction: 2}\n").expect_err("fraction");
    assert!(err.contains("relistGuard.startFraction"), "{err}");
    // Only verified identities reach system: a rule must name them.
    let err = check("lanes: {rules: [{lane: system, verbs: [patch]}]}\n").expect_err("anyone");
    assert!(err.contains("lanes.rules"), "{err}");
    let typo = format!("{base}lanes: {{rules: [{{lane: heavy, userAgent: [x]}}]}}\n");
    assert!(Config::from_yaml(&typo).is_err(), "unknown rule field");
    assert!(check("lanes: {rules: [{lane: system, groups: [ops]}]}\n").is_ok());
}

#[test]
fn flags_set_mode_quota_and_wait() {
    let cli = Cli::try_parse_from([
        "tollgate",
        "--mode",
        "enforce",
        "--quota-bytes-per-second",
        "1000",
        "--quota-burst-bytes",
        "5000",
        "--max-wait",
        "2.5s",
    ])
    .expect("parses");
    let mut c = Config::default();
    c.apply(&cli.flags);
    assert_eq!(c.mode, Mode::Enforce);
    assert_eq!(c.quota.bytes_per_second, Some(1000.0));
    assert_eq!(c.quota.burst_bytes, Some(5000.0));
    assert_eq!(c.quota.max_wait_seconds, 2.5);
    let dry = Cli::try_parse_from(["tollgate", "--mode", "dryRun", "--max-wait", "500ms"])
        .expect("parses");
    let mut c = Config::default();
    c.apply(&dry.flags);
    assert_eq!((c.mode, c.quota.max_wait_seconds), (Mode::DryRun, 0.5));
    assert!(Cli::try_parse_from(["tollgate", "--max-wait", "soon"]).is_err());
}

#[test]
fn the_readme_example_is_the_defaults() {
    let readme = include_str!("../../README.md");
    let section = readme
        .split("## Configuration file")
        .nth(1)
        .expect("a configuration section");
    let yaml = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("a yaml block");
    let c = Config::from_yaml(yaml).expect("the README's example parses");
    let d = Config::default();
    assert_eq!(c.mode, d.mode);
    assert_eq!(c.lanes.rules, d.lanes.rules);
    assert_eq!(c.quota.per_client, d.quota.per_client);
    assert_eq!(
        (c.quota.bytes_per_second, c.quota.burst_bytes),
        (d.quota.bytes_per_second, d.quota.burst_bytes)
    );
    assert_eq!(c.relist_guard.warmup_seconds, d.relist_guard.warmup_seconds);
    assert_eq!(c.upstream.timeouts, d.upstream.timeouts);
}

#[test]
fn flags_set_the_admin_tls_and_the_trusted_identity_headers() {
    let cli = Cli::try_parse_from([
        "tollgate",
        "--admin-tls-cert",
        "a.crt",
        "--admin-tls-key",
        "a.key",
        "--admin-client-ca",
        "ca.crt",
        "--requestheader-username-headers",
        "X-Forwarded-User,X-Remote-User",
        "--requestheader-group-headers=X-Forwarded-Groups",
        "--requestheader-extra-headers-prefix",
        "X-Forwarded-Extra-",
    ])
    .expect("parses");
    let mut c = Config::from_yaml("upstream: {requestHeaders: {groupHeaders: [X-File-Group]}}")
        .expect("parses");
    c.apply(&cli.flags);
    let tls = &c.admin.tls;
    assert_eq!(
        tls.cert_file.as_deref(),
        Some(std::path::Path::new("a.crt"))
    );
    assert_eq!(tls.key_file.as_deref(), Some(std::path::Path::new("a.key")));
    assert_eq!(
        tls.client_ca_file.as_deref(),
        Some(std::path::Path::new("ca.crt"))
    );
    let names = &c.upstream.request_headers;
    assert_eq!(
        names.username_headers,
        ["X-Forwarded-User", "X-Remote-User"]
    );
    assert_eq!(names.group_headers, ["X-Forwarded-Groups"], "the flag wins");
    assert_eq!(names.extra_headers_prefixes, ["X-Forwarded-Extra-"]);
    // Not given: the file's list stays.
    let mut c = Config::from_yaml("upstream: {requestHeaders: {groupHeaders: [X-File-Group]}}")
        .expect("parses");
    c.apply(&Flags::default());
    assert_eq!(c.upstream.request_headers.group_headers, ["X-File-Group"]);
}

#[test]
fn the_version_and_kind_are_optional_and_refused_when_wrong() {
    let base = "upstream: {urls: [\"http://a:1\"]}\n";
    let check = |head: &str| {
        Config::from_yaml(&format!("{head}{base}"))
            .expect("parses")
            .validate()
            .map_err(|e| e.to_string())
    };
    assert!(check("").is_ok(), "neither: read as the current version");
    assert!(check("apiVersion: tollgate.io/v1alpha1\nkind: TollgateConfiguration\n").is_ok());
    let err = check("apiVersion: tollgate.io/v1\nkind: TollgateConfiguration\n")
        .expect_err("another version");
    assert!(
        err.contains("apiVersion") && err.contains("tollgate.io/v1alpha1"),
        "{err}"
    );
    let err = check("apiVersion: tollgate.io/v1alpha1\nkind: Config\n").expect_err("another kind");
    assert!(
        err.contains("kind") && err.contains("TollgateConfiguration"),
        "{err}"
    );
}

#[test]
fn kubernetes_flag_names_and_the_old_ones_set_the_same_files() {
    use std::path::Path;
    let new = Cli::try_parse_from([
        "tollgate",
        "--tls-cert-file",
        "s.crt",
        "--tls-private-key-file=s.key",
        "--client-ca-file",
        "ca.crt",
        "--admin-tls-cert-file",
        "a.crt",
        "--admin-tls-private-key-file",
        "a.key",
        "--admin-client-ca-file",
        "aca.crt",
    ])
    .expect("parses");
    let old = Cli::try_parse_from([
        "tollgate",
        "--tls-cert",
        "s.crt",
        "--tls-key=s.key",
        "--client-ca",
        "ca.crt",
        "--admin-tls-cert",
        "a.crt",
        "--admin-tls-key",
        "a.key",
        "--admin-client-ca",
        "aca.crt",
    ])
    .expect("the old names still parse");
    for cli in [new, old] {
        let mut c = Config::default();
        c.apply(&cli.flags);
        let files = |t: &ServingTls| {
            [&t.cert_file, &t.key_file, &t.client_ca_file]
                .map(|f| f.as_deref().map(Path::to_path_buf))
        };
        assert_eq!(
            files(&c.tls),
            [Some("s.crt"), Some("s.key"), Some("ca.crt")].map(|f| f.map(Into::into))
        );
        assert_eq!(
            files(&c.admin.tls),
            [Some("a.crt"), Some("a.key"), Some("aca.crt")].map(|f| f.map(Into::into))
        );
    }
    // --help shows the Kubernetes names only.
    let help = <Cli as clap::CommandFactory>::command()
        .render_long_help()
        .to_string();
    for shown in [
        "--tls-cert-file",
        "--tls-private-key-file",
        "--client-ca-file",
        "--admin-tls-cert-file",
        "--admin-tls-private-key-file",
        "--admin-client-ca-file",
    ] {
        assert!(help.contains(shown), "{shown} in --help");
    }
    for hidden in [
        "--tls-cert ",
        "--tls-key ",
        "--client-ca ",
        "--admin-client-ca ",
    ] {
        assert!(
            !help.contains(hidden),
            "{hidden} hidden from --help:\n{help}"
        );
    }
}
