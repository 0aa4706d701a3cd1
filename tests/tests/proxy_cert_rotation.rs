//! Certificates rotated under a running tollgate (issue 18), as kubeadm's renewals and
//! cert-manager do it: the real binary serves TLS with a client CA; its serving certificate and
//! key files are rewritten with ones from another CA, then its client CA file. Each time, a new
//! TLS connection sees the new files within the poll, while an HTTP/1.1 keep-alive connection
//! opened before the rotation keeps working on the same socket (none is dropped), and
//! `tollgate_certificate_reloads_total` counts the reload.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bench::sim::auth::tls::{client_config, parse_certs};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConnection, StreamOwned};
use tests::{eventually, CertAuthority, CertKeyPem, SimProcess, TollgateOptions, TollgateProcess};

/// How long a rotation may take to be served (the files are polled every 2 s).
const ROTATION_TIMEOUT: Duration = Duration::from_secs(30);

// === impl KeepAlive ===

/// One HTTP/1.1 connection over TLS, kept open between requests.
struct KeepAlive {
    stream: BufReader<StreamOwned<ClientConnection, TcpStream>>,
    host: String,
}

impl KeepAlive {
    /// Connect to `addr` (`127.0.0.1:PORT`) trusting the CAs in `ca_pem`, with `identity` as
    /// the client certificate if given; the handshake is completed before returning.
    fn connect(addr: &str, ca_pem: &str, identity: Option<&CertKeyPem>) -> anyhow::Result<Self> {
        bench::sim::auth::tls::install_crypto_provider();
        let mut config = client_config(ca_pem, identity)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = ServerName::try_from("127.0.0.1")?.to_owned();
        let conn = ClientConnection::new(Arc::new(config), name)?;
        let tcp = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
        tcp.set_write_timeout(Some(Duration::from_secs(10)))?;
        let mut stream = StreamOwned::new(conn, tcp);
        while stream.conn.is_handshaking() {
            stream
                .conn
                .complete_io(&mut stream.sock)
                .context("TLS handshake")?;
        }
        Ok(KeepAlive {
            stream: BufReader::new(stream),
            host: addr.to_string(),
        })
    }

    /// The certificate the server presented.
    fn server_leaf(&self) -> Option<CertificateDer<'static>> {
        let conn = &self.stream.get_ref().conn;
        conn.peer_certificates()?
            .first()
            .map(|c| c.clone().into_owned())
    }

    /// `GET path` on this connection: the status code and body (fixed length or chunked).
    fn get(&mut self, path: &str) -> anyhow::Result<(u16, String)> {
        let request = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", self.host);
        let s = self.stream.get_mut();
        s.write_all(request.as_bytes())?;
        s.flush()?;
        let mut status_line = String::new();
        self.stream.read_line(&mut status_line)?;
        let code: u16 = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("status line {status_line:?}"))?;
        let (mut length, mut chunked) = (None, false);
        loop {
            let mut line = String::new();
            anyhow::ensure!(
                self.stream.read_line(&mut line)? > 0,
                "closed in the headers"
            );
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = Some(v.trim().parse::<usize>()?);
            }
            chunked |= lower.starts_with("transfer-encoding:") && lower.contains("chunked");
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                let mut size = String::new();
                self.stream.read_line(&mut size)?;
                let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16)
                    .with_context(|| format!("chunk size {size:?}"))?;
                let mut chunk = vec![0; size + 2];
                self.stream.read_exact(&mut chunk)?;
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        } else if let Some(n) = length {
            body.resize(n, 0);
            self.stream.read_exact(&mut body)?;
        }
        Ok((code, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// `series` in `/metrics` text, as a number.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A GET on a new connection (new handshake) with `identity`: the status code.
fn fresh_get(
    addr: &str,
    ca_pem: &str,
    identity: Option<&CertKeyPem>,
) -> anyhow::Result<(u16, Option<CertificateDer<'static>>)> {
    let mut c = KeepAlive::connect(addr, ca_pem, identity)?;
    let (code, _) = c.get("/version")?;
    Ok((code, c.server_leaf()))
}

#[test]
fn rotated_serving_certificates_and_client_cas_are_served_without_dropping_connections(
) -> anyhow::Result<()> {
    let sim = SimProcess::start(&[])?;
    let client_ca = CertAuthority::generate("rotation-client-ca-1")?;
    let options = TollgateOptions {
        tls: true,
        client_ca_pem: Some(client_ca.cert_pem().to_string()),
        ..TollgateOptions::in_front_of(&sim)
    };
    let tg = TollgateProcess::start(&options)?;
    let addr = tg
        .url
        .strip_prefix("https://")
        .context("tollgate serves TLS here")?
        .to_string();
    let old_ca = tg.serving_ca_pem.clone().context("a serving CA")?;

    // A connection opened before the rotation, used once.
    let mut kept = KeepAlive::connect(&addr, &old_ca, None)?;
    let (code, body) = kept.get("/version")?;
    anyhow::ensure!(code == 200, "GET /version: {code}: {body}");

    // The serving certificate and key rewritten with ones from another CA.
    let new_ca = CertAuthority::generate("rotation-serving-ca-2")?;
    let new_serving = new_ca.issue_server(&["127.0.0.1", "localhost"])?;
    let new_leaf = parse_certs(&new_serving.cert_pem, "new serving certificate")?
        .remove(0)
        .into_owned();
    new_serving.write_to_dir(&tg.pki_file(""), "serving")?;
    let both_cas = format!("{old_ca}\n{}", new_ca.cert_pem());
    eventually(
        ROTATION_TIMEOUT,
        "a new connection served the new certificate",
        || {
            let (_, leaf) = fresh_get(&addr, &both_cas, None)?;
            Ok((leaf.as_ref() == Some(&new_leaf)).then_some(()))
        },
    )
    .map_err(|e| e.context(tg.log()))?;
    // Trusting only the new CA works now; the old CA no longer verifies a new connection.
    let (code, _) = fresh_get(&addr, new_ca.cert_pem(), None)?;
    anyhow::ensure!(code == 200, "new CA only: {code}");
    anyhow::ensure!(
        fresh_get(&addr, &old_ca, None).is_err(),
        "the old certificate is still served"
    );
    // The connection opened before the rotation still works, on the same socket.
    let (code, body) = kept
        .get("/version")
        .context("the kept connection after the rotation")?;
    anyhow::ensure!(code == 200, "kept connection: {code}: {body}");
    anyhow::ensure!(
        kept.server_leaf().as_ref() != Some(&new_leaf),
        "the kept connection is the one made with the old certificate"
    );

    // The client CA: a certificate from a new CA is no identity (401) until the file says so.
    let next_client_ca = CertAuthority::generate("rotation-client-ca-2")?;
    let carol = next_client_ca.issue_client("carol", &["team-a"])?;
    let alice = client_ca.issue_client("alice", &["team-a"])?;
    let (code, _) = fresh_get(&addr, new_ca.cert_pem(), Some(&carol))?;
    anyhow::ensure!(
        code == 401,
        "a certificate of the next CA before the rotation: {code}"
    );
    let (code, _) = fresh_get(&addr, new_ca.cert_pem(), Some(&alice))?;
    anyhow::ensure!(code == 200, "a certificate of the current CA: {code}");
    std::fs::write(tg.pki_file("client-ca.crt"), next_client_ca.cert_pem())?;
    eventually(
        ROTATION_TIMEOUT,
        "a certificate of the new client CA accepted",
        || Ok((fresh_get(&addr, new_ca.cert_pem(), Some(&carol))?.0 == 200).then_some(())),
    )
    .map_err(|e| e.context(tg.log()))?;
    let (code, _) = fresh_get(&addr, new_ca.cert_pem(), Some(&alice))?;
    anyhow::ensure!(
        code == 401,
        "a certificate of the old client CA after the rotation: {code}"
    );
    let (code, _) = kept
        .get("/version")
        .context("the kept connection after both rotations")?;
    anyhow::ensure!(code == 200, "kept connection after the client CA: {code}");

    // Counted and logged; a broken file is refused and the running certificate stays.
    let reloads = |result: &str| -> anyhow::Result<f64> {
        let text = tg.admin_ok("/metrics")?;
        let series = format!(
            "tollgate_certificate_reloads_total{{listener=\"client\",result=\"{result}\"}}"
        );
        metric(&text, &series).with_context(|| format!("no {series} in\n{text}"))
    };
    anyhow::ensure!(
        reloads("ok")? >= 2.0,
        "two rotations, {} reloads",
        reloads("ok")?
    );
    let refused_before = reloads("error")?;
    std::fs::write(tg.pki_file("serving.crt"), "not a certificate")?;
    eventually(ROTATION_TIMEOUT, "the broken certificate refused", || {
        Ok((reloads("error")? > refused_before).then_some(()))
    })?;
    let (code, _) = fresh_get(&addr, new_ca.cert_pem(), None)?;
    anyhow::ensure!(
        code == 200,
        "after a refused file the last good certificate: {code}"
    );
    let log = tg.log();
    anyhow::ensure!(
        log.contains("reloaded") && log.contains("do not load"),
        "the reloads and the refusal are logged:\n{log}"
    );
    Ok(())
}
