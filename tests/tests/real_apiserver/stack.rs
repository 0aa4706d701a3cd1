//! The real apiserver with tollgate in front of it, as the `proxy` and `identity_headers`
//! tests start them: tollgate with the front-proxy client certificate start.sh made, the
//! cluster CA as its client CA, and the admin's certificate as its own identity (health
//! checks, scraping and reading the identity headers the apiserver trusts; never forwarded).

use std::path::PathBuf;

use anyhow::Context;
use tempfile::TempDir;
use tests::{KubeUser, KubeVersion, Kubectl, RealApiserver, TollgateOptions, TollgateProcess};

use super::{Http, Reply};

/// A bearer token for test-user (`--token-auth-file`), so a token client has RBAC too.
pub const TOKEN: &str = "tollgate-e2e-test-user-token";

/// The real apiserver and tollgate in front of it.
pub struct Stack {
    pub tollgate: TollgateProcess,
    pub kube: RealApiserver,
    pub inputs: TempDir,
}

impl Stack {
    /// tollgate's options in front of `kube`: TLS, the cluster CA as client CA, the
    /// front-proxy certificate, and the admin's certificate as its own identity.
    pub fn tollgate_options(kube: &RealApiserver) -> anyhow::Result<TollgateOptions> {
        let ca = kube.ca_pem()?;
        Ok(TollgateOptions {
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
        })
    }

    /// kube-apiserver `version`; `flags` go to it (after `--token-auth-file`).
    pub fn start(version: KubeVersion, flags: &[&str]) -> anyhow::Result<Self> {
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
        let kube = RealApiserver::start_version(version, &all)?;
        let options = Self::tollgate_options(&kube)?;
        let tollgate = TollgateProcess::start(&options)?;
        Ok(Self {
            tollgate,
            kube,
            inputs,
        })
    }

    pub fn scratch(&self) -> PathBuf {
        self.inputs.path().join("curl")
    }

    /// curl to tollgate, trusting its serving CA.
    pub fn via_tollgate(&self) -> anyhow::Result<Http> {
        let ca = self
            .tollgate
            .serving_ca_file()?
            .context("tollgate serves TLS")?;
        Ok(Http::new(&self.tollgate.url, &self.scratch()).with_cacert(ca))
    }

    /// curl straight to the apiserver.
    pub fn direct(&self) -> anyhow::Result<Http> {
        Ok(Http::new(&self.kube.url, &self.scratch()).with_cacert(self.kube.file("KUBE_CA_CERT")?))
    }

    pub fn admin_cert(&self, h: Http) -> anyhow::Result<Http> {
        Ok(h.with_cert(
            self.kube.file("KUBE_ADMIN_CERT")?,
            self.kube.file("KUBE_ADMIN_KEY")?,
        ))
    }

    pub fn user_cert(&self, h: Http) -> anyhow::Result<Http> {
        Ok(h.with_cert(
            self.kube.file("KUBE_USER_CERT")?,
            self.kube.file("KUBE_USER_KEY")?,
        ))
    }

    /// kubectl through tollgate as `user`.
    pub fn kubectl(&self, name: &str, user: &KubeUser) -> anyhow::Result<Kubectl> {
        self.tollgate.kubectl_as(name, user)
    }

    /// Both processes must outlive every request.
    pub fn still_running(mut self) -> anyhow::Result<()> {
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
pub fn forbidden_as(k: &Kubectl, args: &[&str], user: &str) -> anyhow::Result<()> {
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
pub fn forbidden_reply(r: &Reply, user: &str, what: &str) -> anyhow::Result<()> {
    anyhow::ensure!(r.code == 403, "{what}: HTTP {}: {}", r.code, r.text());
    let status = r.json()?;
    let message = status["message"].as_str().unwrap_or("");
    anyhow::ensure!(
        message.contains(&format!("User \"{user}\"")),
        "{what}: the apiserver saw someone other than {user}: {message}"
    );
    Ok(())
}
