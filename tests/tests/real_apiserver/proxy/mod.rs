//! tollgate in front of the real kube-apiserver, with the front-proxy client certificate
//! start.sh made: certificate clients authenticated by tollgate (`--client-ca`, the cluster
//! CA) and forwarded as `X-Remote-User`/`X-Remote-Group`, token clients forwarded as they
//! are, and everything the apiserver says passed back as it said it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use tempfile::TempDir;
use tests::{CertAuthority, KubeUser, Kubectl, RealApiserver, TollgateOptions, TollgateProcess};

use super::{Http, Reply};

mod passthrough;

/// A bearer token for test-user (`--token-auth-file`), so a token client has RBAC too.
const TOKEN: &str = "tollgate-e2e-test-user-token";
/// How long a test waits for a watcher to print an expected line.
const WATCH_WAIT: Duration = Duration::from_secs(30);

/// The real apiserver and tollgate in front of it.
struct Stack {
    tollgate: TollgateProcess,
    kube: RealApiserver,
    inputs: TempDir,
}

impl Stack {
    /// `flags` go to kube-apiserver (after `--token-auth-file`).
    fn start(flags: &[&str]) -> anyhow::Result<Self> {
        let inputs = tempfile::Builder::new()
            .prefix("tollgate-e2e-real-")
            .tempdir()?;
        let tokens = inputs.path().join("tokens.csv");
        std::fs::write(
            &tokens,
            format!("{TOKEN},test-user,uid-test-user,\"test-users\"\n"),
        )?;
        let token_flag = format!("--token-auth-file={}", tokens.display());
        let mut all = vec![token_flag.as_str()];
        all.extend_from_slice(flags);
        let kube = RealApiserver::start(&all)?;
        let ca = kube.ca_pem()?;
        let options = TollgateOptions {
            upstream_url: kube.url.clone(),
            upstream_ca_pem: Some(ca.clone()),
            tls: true,
            // The cluster CA signs admin's and test-user's certificates.
            client_ca_pem: Some(ca),
            front_proxy: Some(kube.front_proxy()?),
            // tollgate's own identity, for health checks and scraping only (never forwarded).
            args: vec![
                "--upstream-client-cert".into(),
                kube.var("KUBE_ADMIN_CERT")?.into(),
                "--upstream-client-key".into(),
                kube.var("KUBE_ADMIN_KEY")?.into(),
            ],
            ..TollgateOptions::default()
        };
        let tollgate = TollgateProcess::start(&options)?;
        Ok(Self {
            tollgate,
            kube,
            inputs,
        })
    }

    fn scratch(&self) -> PathBuf {
        self.inputs.path().join("curl")
    }

    /// curl to tollgate, trusting its serving CA.
    fn via_tollgate(&self) -> anyhow::Result<Http> {
        let ca = self
            .tollgate
            .serving_ca_file()?
            .context("tollgate serves TLS")?;
        Ok(Http::new(&self.tollgate.url, &self.scratch()).with_cacert(ca))
    }

    /// curl straight to the apiserver.
    fn direct(&self) -> anyhow::Result<Http> {
        Ok(Http::new(&self.kube.url, &self.scratch()).with_cacert(self.kube.file("KUBE_CA_CERT")?))
    }

    fn admin_cert(&self, h: Http) -> anyhow::Result<Http> {
        Ok(h.with_cert(
            self.kube.file("KUBE_ADMIN_CERT")?,
            self.kube.file("KUBE_ADMIN_KEY")?,
        ))
    }

    fn user_cert(&self, h: Http) -> anyhow::Result<Http> {
        Ok(h.with_cert(
            self.kube.file("KUBE_USER_CERT")?,
            self.kube.file("KUBE_USER_KEY")?,
        ))
    }

    /// kubectl through tollgate as `user`.
    fn kubectl(&self, name: &str, user: &KubeUser) -> anyhow::Result<Kubectl> {
        self.tollgate.kubectl_as(name, user)
    }

    /// Both processes must outlive every request.
    fn still_running(mut self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.tollgate.is_running(),
            "tollgate exited during the test; its log:\n{}",
            self.tollgate.log()
        );
        anyhow::ensure!(
            self.kube.is_running(),
            "kube-apiserver exited during the test; its log:\n{}",
            self.kube.log()
        );
        Ok(())
    }
}

/// The error kubectl printed must name `user` as who the apiserver saw.
fn forbidden_as(k: &Kubectl, args: &[&str], user: &str) -> anyhow::Result<()> {
    let err = k.fails(args)?;
    anyhow::ensure!(
        err.contains("Forbidden") || err.contains("forbidden"),
        "`kubectl {}`: not a 403: {err}",
        args.join(" ")
    );
    anyhow::ensure!(
        err.contains(&format!("User \"{user}\"")),
        "`kubectl {}`: the apiserver saw someone other than {user}: {err}",
        args.join(" ")
    );
    Ok(())
}

/// A 403 Status from the apiserver naming `user`.
fn forbidden_reply(r: &Reply, user: &str, what: &str) -> anyhow::Result<()> {
    anyhow::ensure!(r.code == 403, "{what}: HTTP {}: {}", r.code, r.text());
    let status = r.json()?;
    let message = status["message"].as_str().unwrap_or("");
    anyhow::ensure!(
        message.contains(&format!("User \"{user}\"")),
        "{what}: the apiserver saw someone other than {user}: {message}"
    );
    Ok(())
}

#[test]
fn identities_reach_the_real_apiserver_through_tollgate() -> anyhow::Result<()> {
    let s = Stack::start(&[])?;
    let admin = s.kubectl("admin", &s.kube.admin_user()?)?;
    let user = s.kubectl("test-user", &s.kube.test_user()?)?;
    let token = s.kubectl("token", &KubeUser::Token(TOKEN.into()))?;

    // The admin (system:masters) may do anything; the unprivileged users are who they are.
    assert_eq!(
        admin
            .ok(&["auth", "can-i", "list", "secrets", "-A"])?
            .trim(),
        "yes"
    );
    admin.ok(&["get", "secrets", "-A"])?;
    for (who, k) in [
        ("test-user (certificate)", &user),
        ("test-user (token)", &token),
    ] {
        let out = k.run(&["auth", "can-i", "list", "secrets"])?;
        assert_eq!(out.stdout.trim(), "no", "{who} may list secrets");
        assert_eq!(
            k.ok(&["auth", "can-i", "list", "pods"])?.trim(),
            "yes",
            "{who}"
        );
        forbidden_as(k, &["get", "secrets", "-n", "default"], "test-user")?;
        k.ok(&["get", "pods", "-n", "default"])?;
    }
    // (kubectl cannot even discover the API anonymously on 1.20: curl asks directly.)
    forbidden_reply(
        &s.via_tollgate()?.get("/api/v1/namespaces/default/pods")?,
        "system:anonymous",
        "anonymous",
    )?;

    // Spoofed X-Remote-* from clients never reach the apiserver: test-user's request goes out
    // with tollgate's front-proxy certificate, so headers that got through would make it admin.
    let spoof = ["X-Remote-User: admin", "X-Remote-Group: system:masters"];
    let secrets = "/api/v1/namespaces/default/secrets";
    for (who, h, seen_as) in [
        ("certificate", s.user_cert(s.via_tollgate()?)?, "test-user"),
        ("token", s.via_tollgate()?.with_token(TOKEN), "test-user"),
        ("anonymous", s.via_tollgate()?, "system:anonymous"),
    ] {
        for http2 in [false, true] {
            let h = if http2 {
                h.clone().with_http2()
            } else {
                h.clone()
            };
            let r = h.send("GET", secrets, None, &spoof)?;
            forbidden_reply(&r, seen_as, &format!("{who} with spoofed X-Remote-*"))?;
        }
    }

    // Impersonate-* reach the apiserver, which decides: the admin may, test-user may not.
    forbidden_as(
        &admin,
        &["get", "secrets", "--as", "test-user"],
        "test-user",
    )?;
    admin.ok(&[
        "get",
        "secrets",
        "--as",
        "someone",
        "--as-group",
        "system:masters",
    ])?;
    let err = user.fails(&["get", "pods", "--as", "admin"])?;
    assert!(
        err.contains("cannot impersonate resource \"users\"") && err.contains("User \"test-user\""),
        "test-user impersonating: {err}"
    );

    // A client certificate from a CA nobody trusts: the handshake completes and the request
    // gets the apiserver's own 401, through tollgate as directly; with a token it is the token.
    let stranger =
        CertAuthority::generate("stranger-ca")?.issue_client("admin", &["system:masters"])?;
    let (cert, key) = stranger.write_to_dir(s.inputs.path(), "stranger")?;
    let through = s.via_tollgate()?.with_cert(cert.clone(), key.clone());
    let direct = s.direct()?.with_cert(cert, key);
    let (a, b) = (
        through.get("/api/v1/namespaces")?,
        direct.get("/api/v1/namespaces")?,
    );
    assert_eq!((a.code, b.code), (401, 401), "{} / {}", a.text(), b.text());
    assert_eq!(
        a.json()?,
        b.json()?,
        "the 401 Status through tollgate and directly"
    );
    for h in [through.with_token(TOKEN), direct.with_token(TOKEN)] {
        forbidden_reply(
            &h.get(secrets)?,
            "test-user",
            "stranger certificate + token",
        )?;
        h.get("/api/v1/namespaces/default/pods")?
            .expect(200, "pods with the token")?;
    }

    // tollgate's own identity served its health checks, never a forwarded request (anonymous
    // above was refused as system:anonymous).
    s.still_running()
}
