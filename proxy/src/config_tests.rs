use super::*;

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
    assert_eq!(c.patterns.consistent_store, Store::WatchCache);
    c.validate().expect("valid");
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
