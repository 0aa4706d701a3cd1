//! An apiserver that trusts more identity headers than `X-Remote-*` (issue 20): started with
//! `--requestheader-username-headers=X-Forwarded-User,X-Remote-User` and group and extra
//! lists likewise. It takes groups from every group header it trusts, so a certificate
//! client's `X-Forwarded-Groups: system:masters` forwarded beside tollgate's own headers made
//! the client an admin. tollgate learns the names from ConfigMap
//! `kube-system/extension-apiserver-authentication` and strips them all; in enforce mode it
//! will not start when it can learn them neither there nor from its configuration.

use tests::{KubeVersion, TollgateOptions, TollgateProcess};

use super::stack::{forbidden_reply, Stack, TOKEN};
use super::Http;

/// The identity headers the apiserver trusts beside start.sh's `X-Remote-*` (the flags are
/// lists: given again, kube-apiserver appends them to start.sh's).
const APISERVER_FLAGS: [&str; 3] = [
    "--requestheader-username-headers=X-Forwarded-User,X-Remote-User",
    "--requestheader-group-headers=X-Forwarded-Groups,X-Remote-Group",
    "--requestheader-extra-headers-prefix=X-Forwarded-Extra-,X-Remote-Extra-",
];

/// What a client sends to become the admin.
const SPOOF: [&str; 4] = [
    "X-Forwarded-User: admin",
    "X-Forwarded-Groups: system:masters",
    "x-forwarded-groups: system:masters",
    "X-Forwarded-Extra-Scopes: everything",
];

/// Only the admin (system:masters) may list secrets.
const SECRETS: &str = "/api/v1/namespaces/default/secrets";

per_version!(identity_headers_the_apiserver_trusts_never_pass_from_clients);

fn identity_headers_the_apiserver_trusts_never_pass_from_clients(
    version: KubeVersion,
) -> anyhow::Result<()> {
    let s = Stack::start(version, &APISERVER_FLAGS)?;

    // The apiserver does trust the extra names: with the front-proxy certificate, straight to
    // it, X-Forwarded-Groups makes anyone an admin. That is what must not get through tollgate.
    let front_proxy = s.direct()?.with_cert(
        s.kube.file("KUBE_FRONT_PROXY_CLIENT_CERT")?,
        s.kube.file("KUBE_FRONT_PROXY_CLIENT_KEY")?,
    );
    front_proxy
        .send(
            "GET",
            SECRETS,
            None,
            &[
                "X-Forwarded-User: nobody",
                "X-Forwarded-Groups: system:masters",
            ],
        )?
        .expect(200, "the apiserver trusts X-Forwarded-Groups")?;

    spoofing_fails(&s, &s.via_tollgate()?, "tollgate learning the names")?;

    // enforce mode, front-proxy certificate, and no identity to read the ConfigMap with:
    // tollgate refuses to start and says what to set.
    let mut blind = Stack::tollgate_options(&s.kube)?;
    blind.args = vec!["--mode".into(), "enforce".into()];
    let refused = match TollgateProcess::start(&blind) {
        Ok(_) => anyhow::bail!("tollgate started in enforce mode without knowing the identity headers the apiserver trusts"),
        Err(e) => format!("{e:#}"),
    };
    for what in [
        "extension-apiserver-authentication",
        "upstream.requestHeaders.usernameHeaders",
        "--requestheader-group-headers",
    ] {
        anyhow::ensure!(
            refused.contains(what),
            "the refusal does not name {what}: {refused}"
        );
    }

    // The same with the names configured: it starts, and strips them.
    let configured = TollgateOptions {
        args: vec![
            "--mode".into(),
            "enforce".into(),
            "--requestheader-username-headers".into(),
            "X-Forwarded-User,X-Remote-User".into(),
            "--requestheader-group-headers".into(),
            "X-Forwarded-Groups,X-Remote-Group".into(),
            "--requestheader-extra-headers-prefix".into(),
            "X-Forwarded-Extra-,X-Remote-Extra-".into(),
            // 1.20 has no uid flag and trusts no uid header: any name completes the four.
            "--requestheader-uid-headers".into(),
            "X-Remote-Uid".into(),
        ],
        ..blind
    };
    let tg = TollgateProcess::start(&configured)?;
    let ca = tg
        .serving_ca_file()?
        .ok_or_else(|| anyhow::anyhow!("tollgate serves TLS"))?;
    spoofing_fails(
        &s,
        &Http::new(&tg.url, &s.scratch()).with_cacert(ca),
        "tollgate with the names configured",
    )?;
    s.still_running()
}

/// Through `via`, test-user (certificate or token) and anonymous clients sending the
/// apiserver's trusted headers stay who they are, over HTTP/1.1 and HTTP/2; test-user's own
/// identity still reaches the apiserver.
fn spoofing_fails(s: &Stack, via: &Http, what: &str) -> anyhow::Result<()> {
    for (who, h, seen_as) in [
        ("certificate", s.user_cert(via.clone())?, "test-user"),
        ("token", via.clone().with_token(TOKEN), "test-user"),
        ("anonymous", via.clone(), "system:anonymous"),
    ] {
        for http2 in [false, true] {
            let h = if http2 {
                h.clone().with_http2()
            } else {
                h.clone()
            };
            let r = h.send("GET", SECRETS, None, &SPOOF)?;
            forbidden_reply(&r, seen_as, &format!("{what}: {who} sending X-Forwarded-*"))?;
        }
    }
    s.user_cert(via.clone())?
        .send("GET", "/api/v1/namespaces/default/pods", None, &SPOOF)?
        .expect(200, &format!("{what}: test-user's own identity"))?;
    Ok(())
}
