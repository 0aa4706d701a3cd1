//! The admin listener over TLS with a client CA (issue 20), as the real `tollgate` binary
//! serves it with `--admin-tls-cert`, `--admin-tls-key` and `--admin-client-ca` and curl
//! sees it: `/metrics` and `/debug/patterns` answer 401 without a certificate, 401 with one
//! from another CA, 200 with one the admin CA signed; `/healthz` and `/readyz` answer
//! everyone (probes send no certificate); plain HTTP gets no HTTP answer. The client CA file
//! rewritten with another CA is picked up without a restart.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::Context;
use tests::{
    eventually, fresh_workspace_binary, CertAuthority, LineReader, SimProcess,
    TOLLGATE_START_TIMEOUT,
};

/// Our own child, killed by its handle and reaped when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `curl` to `url` trusting `ca`, with a client certificate if given: the HTTP code, or
/// `None` when no HTTP answer came.
fn curl(url: &str, ca: &Path, cert: Option<&(PathBuf, PathBuf)>) -> anyhow::Result<Option<u16>> {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "10",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
    ])
    .arg("--cacert")
    .arg(ca);
    if let Some((c, k)) = cert {
        cmd.arg("--cert").arg(c).arg("--key").arg(k);
    }
    let out = cmd.arg(url).output().context("running curl")?;
    let code: u16 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    Ok((out.status.success() && code != 0).then_some(code))
}

#[test]
fn the_admin_listener_over_tls_wants_a_certificate_its_ca_signed() -> anyhow::Result<()> {
    let sim = SimProcess::start(&[])?;
    let dir = tempfile::Builder::new()
        .prefix("tollgate-e2e-admin-tls-")
        .tempdir()?;
    let serving_ca = CertAuthority::generate("admin-serving-ca")?;
    let (cert, key) = serving_ca
        .issue_server(&["127.0.0.1", "localhost"])?
        .write_to_dir(dir.path(), "admin")?;
    let serving_ca_file = dir.path().join("serving-ca.crt");
    std::fs::write(&serving_ca_file, serving_ca.cert_pem())?;
    let admin_ca = CertAuthority::generate("tollgate-admin-ca")?;
    let admin_ca_file = dir.path().join("admin-ca.crt");
    std::fs::write(&admin_ca_file, admin_ca.cert_pem())?;
    let prometheus = admin_ca
        .issue_client("prometheus", &[])?
        .write_to_dir(dir.path(), "prometheus")?;
    let stranger = CertAuthority::generate("stranger-ca")?
        .issue_client("prometheus", &[])?
        .write_to_dir(dir.path(), "stranger")?;

    let log = std::fs::File::create(dir.path().join("tollgate.log"))?;
    let mut child = Command::new(fresh_workspace_binary(
        "tollgate",
        &["proxy", "kubeio", "apimodel"],
    ))
    .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
    .args(["--upstream", &sim.url])
    .arg("--admin-tls-cert")
    .arg(&cert)
    .arg("--admin-tls-key")
    .arg(&key)
    .arg("--admin-client-ca")
    .arg(&admin_ca_file)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(log)
    .spawn()
    .context("starting tollgate")?;
    let stdout = child.stdout.take().context("tollgate's stdout")?;
    let _tollgate = Killed(child);
    let mut lines = LineReader::spawn("tollgate stdout", stdout);
    let ready = lines.wait_for(TOLLGATE_START_TIMEOUT, "its addresses", |l| {
        l.contains("(admin ")
    })?;
    let admin = ready
        .split_once("(admin https://")
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .with_context(|| format!("the admin listener is not https: {ready}"))?
        .to_string();
    let url = |path: &str| format!("https://{admin}{path}");

    // The health endpoints answer anyone; /readyz once the simulator is seen healthy.
    eventually(TOLLGATE_START_TIMEOUT, "/readyz answers 200", || {
        Ok((curl(&url("/readyz"), &serving_ca_file, None)? == Some(200)).then_some(()))
    })?;
    for path in ["/healthz", "/readyz"] {
        for cert in [None, Some(&stranger), Some(&prometheus)] {
            let code = curl(&url(path), &serving_ca_file, cert)?;
            anyhow::ensure!(code == Some(200), "{path} with {cert:?}: {code:?}");
        }
    }
    for path in ["/metrics", "/debug/patterns"] {
        for (who, cert, want) in [
            ("no certificate", None, 401),
            ("another CA's certificate", Some(&stranger), 401),
            ("the admin CA's certificate", Some(&prometheus), 200),
        ] {
            let code = curl(&url(path), &serving_ca_file, cert)?;
            anyhow::ensure!(
                code == Some(want),
                "{path} with {who}: {code:?}, want {want}"
            );
        }
    }
    let plain = curl(&format!("http://{admin}/metrics"), &serving_ca_file, None)?;
    anyhow::ensure!(
        plain.is_none(),
        "plain HTTP to the TLS admin listener answered {plain:?}"
    );

    // The admin client CA rotated in its file: the next CA's scraper is let in without a
    // restart, the old one's no longer.
    let next_ca = CertAuthority::generate("tollgate-admin-ca-2")?;
    let next = next_ca
        .issue_client("prometheus", &[])?
        .write_to_dir(dir.path(), "prometheus-2")?;
    std::fs::write(&admin_ca_file, next_ca.cert_pem())?;
    eventually(
        TOLLGATE_START_TIMEOUT,
        "the rotated admin CA's certificate let in",
        || Ok((curl(&url("/metrics"), &serving_ca_file, Some(&next))? == Some(200)).then_some(())),
    )?;
    let code = curl(&url("/metrics"), &serving_ca_file, Some(&prometheus))?;
    anyhow::ensure!(
        code == Some(401),
        "the old admin CA's certificate after the rotation: {code:?}"
    );
    Ok(())
}
