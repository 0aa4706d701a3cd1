use super::*;

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_str(v).expect("value"));
    }
    h
}

fn names(h: &HeaderMap) -> Vec<&str> {
    let mut n: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
    n.sort_unstable();
    n
}

fn alice() -> Identity {
    Identity::Certificate {
        user: "alice".into(),
        groups: vec!["dev".into(), "ops".into()],
    }
}

const CONFIGMAP: &str = r#"{"kind":"ConfigMap","apiVersion":"v1",
    "metadata":{"name":"extension-apiserver-authentication","namespace":"kube-system"},
    "data":{"client-ca-file":"-----BEGIN CERTIFICATE-----\n...",
      "requestheader-allowed-names":"[\"front-proxy-client\"]",
      "requestheader-username-headers":"[\"X-Forwarded-User\",\"X-Remote-User\"]",
      "requestheader-group-headers":"[\"X-Forwarded-Groups\",\"X-Remote-Group\"]",
      "requestheader-extra-headers-prefix":"[\"X-Forwarded-Extra-\",\"X-Remote-Extra-\"]",
      "requestheader-uid-headers":"[\"X-Forwarded-Uid\"]"}}"#;

#[test]
fn the_configmap_lists_are_read_in_order() {
    let n = HeaderNames::from_configmap(CONFIGMAP.as_bytes()).expect("parses");
    assert_eq!(n.user, ["x-forwarded-user", "x-remote-user"]);
    assert_eq!(n.group, ["x-forwarded-groups", "x-remote-group"]);
    assert_eq!(n.extra_prefixes, ["x-forwarded-extra-", "x-remote-extra-"]);
    assert_eq!(n.uid, ["x-forwarded-uid"]);
    // An apiserver without front-proxy authentication publishes none of them.
    let bare = r#"{"data":{"client-ca-file":"x"}}"#;
    assert_eq!(
        HeaderNames::from_configmap(bare.as_bytes()),
        Ok(HeaderNames::default())
    );
    for bad in [
        "not json",
        r#"{"data":{"requestheader-username-headers":"X-Remote-User"}}"#,
        r#"{"data":{"requestheader-group-headers":"[\"bad name\"]"}}"#,
    ] {
        assert!(
            HeaderNames::from_configmap(bad.as_bytes()).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn without_lists_x_remote_and_every_wildcard_name_is_stripped() {
    let t = TrustedHeaders::default();
    let mut h = headers(&[
        ("x-remote-user", "admin"),
        ("x-remote-group", "system:masters"),
        ("x-remote-extra-scopes", "x"),
        ("x-remote-uid", "0"),
        ("x-forwarded-user", "admin"),
        ("X-Forwarded-Groups", "system:masters"),
        ("x-evil-group", "system:masters"),
        ("x-user", "admin"),
        ("x-forwarded-extra-scopes", "*"),
        ("x-extra-scopes", "*"),
        ("x-forwarded-uid", "0"),
        ("x-forwarded-for", "10.0.0.1"),
        ("x-request-id", "1"),
        ("x-username", "not a wildcard name"),
        ("impersonate-user", "bob"),
    ]);
    t.rewrite(&mut h, &Identity::Anonymous, true);
    assert_eq!(
        names(&h),
        [
            "impersonate-user",
            "x-forwarded-for",
            "x-request-id",
            "x-username"
        ]
    );
    t.rewrite(&mut h, &alice(), true);
    assert_eq!(h["x-remote-user"], "alice");
    let groups: Vec<_> = h.get_all("x-remote-group").iter().collect();
    assert_eq!(groups, ["dev", "ops"]);
    // No front proxy configured: no identity headers at all, and the apiserver reads
    // none from tollgate's connections: only the known names go.
    let mut h = headers(&[("x-remote-user", "a"), ("x-forwarded-user", "a")]);
    t.rewrite(&mut h, &alice(), false);
    assert_eq!(names(&h), ["x-forwarded-user"]);
}

#[test]
fn the_wildcard_covers_each_kind_and_nothing_else() {
    for (kind, yes, no) in [
        (
            Kind::User,
            &["x-remote-user", "x-user", "x-a-b-user"][..],
            &["x-username", "remote-user", "x-remoteuser", "x-users"][..],
        ),
        (
            Kind::Group,
            &[
                "x-remote-group",
                "x-forwarded-groups",
                "x-group",
                "x-groups",
            ][..],
            &["x-groupies", "x-remote-grp", "group"][..],
        ),
        (
            Kind::Extra,
            &["x-remote-extra-a", "x-extra-scopes", "x-forwarded-extra-"][..],
            &["x-extra", "x-extras-a", "extra-a"][..],
        ),
        (
            Kind::Uid,
            &["x-remote-uid", "x-uid"][..],
            &["x-uuid", "x-remote-uids", "uid"][..],
        ),
    ] {
        for n in yes {
            assert!(kind.wildcard(n), "{kind:?} {n}");
        }
        for n in no {
            assert!(!kind.wildcard(n), "{kind:?} {n}");
        }
    }
}

#[test]
fn incomplete_configured_names_leave_the_missing_kinds_to_the_wildcard() {
    // Usernames and groups configured, the extra prefix and uid forgotten (issue 34).
    let settings = Settings {
        username_headers: vec!["X-Forwarded-User".into()],
        group_headers: vec!["X-Forwarded-Groups".into()],
        ..Settings::default()
    };
    assert_eq!(settings.missing(), ["extraHeadersPrefixes", "uidHeaders"]);
    let t = TrustedHeaders::configured(&settings).expect("valid");
    assert_eq!(t.unknown(), [Kind::Extra, Kind::Uid]);
    let mut h = headers(&[
        ("X-Forwarded-Extra-foo", "bar"),
        ("x-forwarded-uid", "0"),
        ("x-evil-groups", "kept: groups are configured"),
    ]);
    t.rewrite(&mut h, &Identity::Anonymous, true);
    assert_eq!(names(&h), ["x-evil-groups"]);
    let trusted = Trusted::new(t);
    let why = trusted.readiness(true).expect_err("not ready");
    assert!(
        why.contains("extraHeadersPrefixes, uidHeaders") && why.contains("not read yet"),
        "{why}"
    );
    trusted.set_error(Some("status 403".into()));
    assert!(trusted
        .readiness(true)
        .expect_err("not ready")
        .contains("status 403"));
    assert_eq!(trusted.readiness(false), Ok(()), "no front proxy");
    // Completed by a reload: ready, and the wildcard is off.
    let complete = Settings {
        extra_headers_prefixes: vec!["X-Forwarded-Extra-".into()],
        uid_headers: vec!["X-Forwarded-Uid".into()],
        ..settings
    };
    assert!(complete.missing().is_empty());
    assert!(trusted.configure(&complete));
    assert_eq!(trusted.readiness(true), Ok(()));
    let mut h = headers(&[("x-evil-uid", "0"), ("x-forwarded-uid", "0")]);
    trusted.get().rewrite(&mut h, &Identity::Anonymous, true);
    assert_eq!(names(&h), ["x-evil-uid"]);
}

#[test]
fn a_learned_configmap_makes_every_kind_known() {
    let trusted = Trusted::new(TrustedHeaders::default());
    assert!(trusted.readiness(true).is_err());
    // An apiserver that trusts no identity headers publishes none: known too.
    assert!(trusted.learn(&HeaderNames::default()));
    assert_eq!(trusted.readiness(true), Ok(()));
    let learned = HeaderNames::from_configmap(CONFIGMAP.as_bytes()).expect("parses");
    assert!(trusted.learn(&learned));
    let mut h = headers(&[("x-evil-groups", "a"), ("x-forwarded-groups", "a")]);
    trusted.get().rewrite(&mut h, &Identity::Anonymous, true);
    assert_eq!(names(&h), ["x-evil-groups"]);
}

#[test]
fn every_learned_name_is_stripped_and_the_first_ones_carry_the_identity() {
    let learned = HeaderNames::from_configmap(CONFIGMAP.as_bytes()).expect("parses");
    let t = TrustedHeaders::default().learned(&learned);
    let mut h = headers(&[
        ("X-Forwarded-User", "admin"),
        ("x-forwarded-groups", "system:masters"),
        ("X-Forwarded-Groups", "system:masters"),
        ("x-forwarded-extra-scopes", "*"),
        ("x-forwarded-uid", "0"),
        ("x-remote-group", "system:masters"),
        ("x-forwarded-for", "10.0.0.1"),
        ("accept", "application/json"),
    ]);
    t.rewrite(&mut h, &alice(), true);
    assert_eq!(
        names(&h),
        [
            "accept",
            "x-forwarded-for",
            "x-forwarded-groups",
            "x-forwarded-user"
        ]
    );
    assert_eq!(h["x-forwarded-user"], "alice");
    let groups: Vec<_> = h.get_all("x-forwarded-groups").iter().collect();
    assert_eq!(groups, ["dev", "ops"], "only tollgate's groups");
    // Anonymous and token clients: stripped, nothing added.
    let mut h = headers(&[("x-forwarded-user", "admin"), ("x-forwarded-groups", "a")]);
    t.rewrite(&mut h, &Identity::Anonymous, true);
    assert!(h.is_empty(), "{h:?}");
}

#[test]
fn configured_names_count_until_a_configmap_is_learned_and_stay_stripped() {
    let settings = Settings {
        username_headers: vec!["X-Proxy-User".into()],
        group_headers: vec!["X-Proxy-Group".into(), "X-Remote-Group".into()],
        extra_headers_prefixes: vec!["X-Proxy-Extra-".into()],
        ..Settings::default()
    };
    assert!(settings.any());
    assert!(!Settings::default().any());
    let t = TrustedHeaders::configured(&settings).expect("valid");
    assert_eq!(t.forward_names().0, "x-proxy-user");
    assert_eq!(t.forward_names().1, "x-proxy-group");
    for name in [
        "x-proxy-user",
        "x-proxy-group",
        "x-proxy-extra-a",
        "x-remote-user",
    ] {
        assert!(t.strips(&HeaderName::from_static(name)), "{name}");
    }
    assert!(!t.strips(&HeaderName::from_static("x-proxy-other")));

    // The apiserver publishes other lists: its first names carry the identity, and the
    // configured ones are still stripped.
    let published = HeaderNames {
        user: vec![HeaderName::from_static("x-forwarded-user")],
        group: vec![HeaderName::from_static("x-forwarded-groups")],
        ..HeaderNames::default()
    };
    let trusted = Trusted::new(t);
    assert!(trusted.learn(&published));
    assert!(!trusted.learn(&published), "nothing new");
    let t = trusted.get();
    assert_eq!(t.forward_names().0, "x-forwarded-user");
    assert_eq!(t.forward_names().1, "x-forwarded-groups");
    // Later lists without those names: learned names stay stripped.
    assert!(!trusted.learn(&HeaderNames::default()));
    let t = trusted.get();
    for name in ["x-proxy-user", "x-forwarded-user", "x-forwarded-groups"] {
        assert!(t.strips(&HeaderName::from_static(name)), "{name}");
    }
    assert_eq!(t.forward_names().0, "x-forwarded-user");
}

#[test]
fn a_reload_adds_configured_names() {
    let trusted = Trusted::new(TrustedHeaders::default());
    let settings = Settings {
        group_headers: vec!["X-Proxy-Group".into()],
        ..Settings::default()
    };
    assert!(trusted.configure(&settings));
    assert!(trusted
        .get()
        .strips(&HeaderName::from_static("x-proxy-group")));
    assert_eq!(trusted.get().forward_names().1, "x-proxy-group");
    assert!(!trusted.configure(&Settings::default()), "nothing removed");
    assert!(trusted
        .get()
        .strips(&HeaderName::from_static("x-proxy-group")));
}

#[test]
fn bad_configured_names_are_refused_with_their_field() {
    let settings = Settings {
        group_headers: vec!["X Group".into()],
        ..Settings::default()
    };
    let (field, reason) = settings.validate().expect_err("refused");
    assert_eq!(field, "upstream.requestHeaders.groupHeaders");
    assert!(reason.contains("X Group"), "{reason}");
}

#[test]
fn the_lists_are_bounded() {
    let many = HeaderNames {
        group: (0..200)
            .map(|i| HeaderName::from_bytes(format!("x-g-{i}").as_bytes()).expect("name"))
            .collect(),
        ..HeaderNames::default()
    };
    let t = TrustedHeaders::default().learned(&many);
    assert_eq!(t.names.len(), MAX_NAMES);
}

#[test]
fn the_refusal_says_what_to_set() {
    let m = refusal("status 403");
    for what in [
        "status 403",
        "upstream.requestHeaders.usernameHeaders",
        "--requestheader-username-headers",
        "--requestheader-uid-headers",
        "extension-apiserver-authentication-reader",
    ] {
        assert!(m.contains(what), "{what}: {m}");
    }
}
