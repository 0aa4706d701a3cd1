//! Identities through tollgate: what the upstream sees, and spoofed headers that never reach it.

use super::*;

pub(crate) fn identity_is_the_clients(client: Scheme) -> anyhow::Result<()> {
    let stack = Stack::start(client, &[])?;
    let anonymous = (
        "system:anonymous".to_string(),
        String::new(),
        strings(&["system:unauthenticated"]),
    );
    assert_eq!(whoami(&stack.anonymous()?)?, anonymous, "no credentials");

    if client == Scheme::Http {
        // kubectl sends a kubeconfig's credentials only over TLS, so through an HTTP
        // listener every kubectl user is anonymous...
        assert_eq!(whoami(&stack.alice()?)?, anonymous, "kubectl over http");
        // ...but a bearer token sent over HTTP is forwarded as is.
        let (user, uid, groups, _) = curl_whoami(&stack.curl(Who::Token("alice-token"))?, &[])?;
        assert_eq!(
            (user, uid, groups),
            (
                "alice".into(),
                "uid-alice".into(),
                strings(&["dev", "ops", "system:authenticated"])
            )
        );
        return stack.still_running();
    }

    // With a front-proxy certificate tollgate reads the identity header names the upstream
    // trusts before serving, and counts the read, whatever its result (the sim publishes no
    // extension-apiserver-authentication).
    let metrics = stack.proxy.admin_ok("/metrics")?;
    let reads = kubeio::promtext::sum(&metrics, "tollgate_requestheader_reads_total");
    assert!(
        reads.is_some_and(|n| n >= 1.0),
        "tollgate_requestheader_reads_total: {reads:?}"
    );

    // The certificate user: CN and O reach the sim through the front-proxy headers.
    assert_eq!(
        whoami(&stack.carol()?)?,
        (
            "carol".into(),
            String::new(),
            strings(&["team-a", "team-b", "system:authenticated"])
        ),
        "certificate user"
    );
    // The token user: the token is forwarded, the sim resolves it.
    assert_eq!(
        whoami(&stack.alice()?)?,
        (
            "alice".into(),
            "uid-alice".into(),
            strings(&["dev", "ops", "system:authenticated"])
        ),
        "token user"
    );
    let bob = stack
        .proxy
        .kubectl_as("bob", &KubeUser::Token("bob-token".into()))?;
    assert_eq!(whoami(&bob)?.0, "bob");

    // A token the sim does not know: its 401 comes back through tollgate.
    let wrong = stack
        .proxy
        .kubectl_as("wrong", &KubeUser::Token("not-a-token".into()))?;
    let err = wrong.fails(&["auth", "whoami", "-o", "json"])?;
    assert!(err.contains("Unauthorized"), "{err}");

    // A certificate from a CA tollgate does not trust never authenticates its CN or O.
    let other_ca = CertAuthority::generate("not-the-client-ca")?;
    let forged = other_ca.issue_client("carol", &["system:masters"])?;
    let mallory = stack.proxy.kubectl_as(
        "mallory",
        &KubeUser::ClientCert {
            cert_pem: forged.cert_pem,
            key_pem: forged.key_pem,
        },
    )?;
    let r = mallory.run(&["auth", "whoami", "-o", "json"])?;
    // (tollgate refuses it in the TLS handshake; kube-apiserver would answer 401. Either way
    // it must not be carol.)
    eprintln!(
        "an untrusted client certificate: success={}, stderr: {}",
        r.success(),
        r.stderr.trim()
    );
    if r.success() {
        let (user, _, groups, _) = user_info(&serde_json::from_str(&r.stdout)?)?;
        assert_eq!(user, "system:anonymous", "an untrusted certificate");
        assert!(!groups.iter().any(|g| g == "system:masters"), "{groups:?}");
    }
    // A certificate and a token: as kube-apiserver, the certificate wins.
    let (user, _, _, _) = curl_whoami(
        &{
            let mut c = stack.curl(Who::Carol)?;
            c.token = Some("alice-token".into());
            c
        },
        &[],
    )?;
    assert_eq!(user, "carol", "certificate and token");
    stack.still_running()
}

pub(crate) fn spoofed_remote_headers_never_reach_the_upstream(
    client: Scheme,
) -> anyhow::Result<()> {
    let stack = Stack::start(client, &[])?;
    let spoof = [
        "-H",
        "X-Remote-User: spoofed-admin",
        "-H",
        "X-Remote-Group: system:masters",
        "-H",
        "X-Remote-Extra-Scopes: everything",
        "-H",
        "x-remote-user: spoofed-lowercase",
    ];

    // The oracle works: the sim does take these headers from a client presenting the
    // front-proxy certificate (so a leak through tollgate would show).
    let mut control = Curl::new(&stack.sim.url);
    control.cacert = Some(stack.sim_ca_file.clone());
    control.cert = Some(stack.front_proxy_files.clone());
    let (user, _, groups, _) = curl_whoami(
        &control,
        &[
            "-H",
            "X-Remote-User: spoofed-admin",
            "-H",
            "X-Remote-Group: system:masters",
        ],
    )?;
    assert_eq!(
        (user.as_str(), groups.as_slice()),
        (
            "spoofed-admin",
            strings(&["system:masters", "system:authenticated"]).as_slice()
        ),
        "control: the sim honours X-Remote-* from the front proxy"
    );

    let mut cases: Vec<(Who, (&str, Vec<String>))> = vec![
        (
            Who::Anonymous,
            ("system:anonymous", strings(&["system:unauthenticated"])),
        ),
        (
            Who::Token("alice-token"),
            ("alice", strings(&["dev", "ops", "system:authenticated"])),
        ),
    ];
    if client == Scheme::Tls {
        cases.push((
            Who::Carol,
            (
                "carol",
                strings(&["team-a", "team-b", "system:authenticated"]),
            ),
        ));
    }
    let versions: &[&str] = match client {
        Scheme::Tls => &["--http1.1", "--http2"],
        Scheme::Http => &["--http1.1", "--http2-prior-knowledge"],
    };
    for (who, (expected_user, expected_groups)) in cases {
        for version in versions {
            let mut args = vec![*version];
            args.extend_from_slice(&spoof);
            let (user, _, groups, extra) = curl_whoami(&stack.curl(who)?, &args)
                .with_context(|| format!("{who:?} {version}"))?;
            assert_eq!(user, expected_user, "{who:?} {version}: the sim saw");
            assert_eq!(groups, expected_groups, "{who:?} {version}: groups");
            assert!(
                extra.is_null() || extra.as_object().is_some_and(|m| m.is_empty()),
                "{who:?} {version}: extra {extra}"
            );
        }
    }
    stack.still_running()
}
