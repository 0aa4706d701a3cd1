//! Certificates for the simulated apiserver: a throw-away certificate authority that issues
//! the serving certificate (`--tls`) and client certificates whose CN/O are the Kubernetes
//! user and groups, as kube-apiserver's `--client-ca-file` and front-proxy CAs expect.
//!
//! Everything is generated in memory with rcgen (ECDSA P-256, ring) and handed out as PEM, the
//! form kubeconfigs, `--*-ca-file` flags and rustls all take. Nothing here is meant to protect
//! real secrets: the sim's CA lives as long as the process (or the directory it is written to).

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

/// How long issued leaf certificates are valid (a CA lives ten times as long).
const LEAF_VALIDITY: Duration = Duration::days(365);
/// Validity starts this long before "now", so a slightly skewed clock still accepts the cert.
const BACKDATE: Duration = Duration::hours(1);
/// rcgen keeps one value per attribute type, so a subject carries the Organization attribute
/// under its named type and once more under its raw OID: two groups per client certificate.
pub const MAX_ORGANIZATIONS: usize = 2;
const ORGANIZATION_OID: [u64; 4] = [2, 5, 4, 10];

/// Why a certificate could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("generating the {what}")]
    Generate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error(
        "a client certificate carries at most {MAX_ORGANIZATIONS} organizations (groups), got {0}"
    )]
    TooManyOrganizations(usize),
    #[error("a serving certificate needs at least one DNS name or IP address")]
    NoServerNames,
    #[error("writing {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A certificate and its private key, both PEM (the key is PKCS#8 `PRIVATE KEY`).
#[derive(Clone, PartialEq, Eq)]
pub struct CertKeyPem {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for CertKeyPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertKeyPem")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"[elided]")
            .finish()
    }
}

// === impl CertKeyPem ===

impl CertKeyPem {
    /// Writes `<dir>/<stem>.crt` and `<dir>/<stem>.key` (the key readable by its owner only),
    /// creating `dir` if needed, and returns the two paths.
    pub fn write_to_dir(&self, dir: &Path, stem: &str) -> Result<(PathBuf, PathBuf), PkiError> {
        fs::create_dir_all(dir).map_err(|source| PkiError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
        let cert_path = dir.join(format!("{stem}.crt"));
        let key_path = dir.join(format!("{stem}.key"));
        for (path, contents, mode) in [
            (&cert_path, &self.cert_pem, 0o644),
            (&key_path, &self.key_pem, 0o600),
        ] {
            write_file(path, contents.as_bytes(), mode).map_err(|source| PkiError::Write {
                path: path.clone(),
                source,
            })?;
        }
        Ok((cert_path, key_path))
    }
}

/// Writes `contents` to `path` with `mode` (on Unix) — set at creation, so a key is never
/// readable by others even for a moment.
pub(crate) fn write_file(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        options.mode(mode);
        let mut file = options.open(path)?;
        // `mode` only applies to new files; an existing file keeps its bits unless reset.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(contents)
    }
    #[cfg(not(unix))]
    {
        let _ = mode;
        options.open(path)?.write_all(contents)
    }
}

/// A self-signed certificate authority that can issue serving and client certificates.
#[derive(Debug)]
pub struct CertAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

// === impl CertAuthority ===

impl CertAuthority {
    /// A new CA with a fresh key, subject `CN=<common_name>`, valid for ten years.
    pub fn generate(common_name: &str) -> Result<Self, PkiError> {
        let what = "certificate authority";
        let key = KeyPair::generate().map_err(|source| PkiError::Generate { what, source })?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params, LEAF_VALIDITY * 10);
        let cert = params
            .self_signed(&key)
            .map_err(|source| PkiError::Generate { what, source })?;
        Ok(Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA certificate (what clients trust, what `--client-ca-file` holds).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate and its private key, e.g. to write them next to issued certs.
    pub fn cert_key_pem(&self) -> CertKeyPem {
        CertKeyPem {
            cert_pem: self.cert_pem.clone(),
            key_pem: self.issuer.key().serialize_pem(),
        }
    }

    /// A serving certificate for `names`: each is an IP address ("127.0.0.1", "::1") or a DNS
    /// name ("localhost"); the first one is also the subject CN.
    pub fn issue_server(&self, names: &[&str]) -> Result<CertKeyPem, PkiError> {
        let what = "serving certificate";
        let first = names.first().ok_or(PkiError::NoServerNames)?;
        let sans: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params =
            CertificateParams::new(sans).map_err(|source| PkiError::Generate { what, source })?;
        params.distinguished_name = name(first);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params, what)
    }

    /// A client certificate for Kubernetes user `common_name` in groups `organizations`
    /// (at most [`MAX_ORGANIZATIONS`]).
    pub fn issue_client(
        &self,
        common_name: &str,
        organizations: &[&str],
    ) -> Result<CertKeyPem, PkiError> {
        if organizations.len() > MAX_ORGANIZATIONS {
            return Err(PkiError::TooManyOrganizations(organizations.len()));
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name);
        let types = [
            DnType::OrganizationName,
            DnType::CustomDnType(ORGANIZATION_OID.to_vec()),
        ];
        for (ty, org) in types.into_iter().zip(organizations) {
            params.distinguished_name.push(ty, *org);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params, "client certificate")
    }

    fn sign(
        &self,
        mut params: CertificateParams,
        what: &'static str,
    ) -> Result<CertKeyPem, PkiError> {
        // ECDSA keys sign; they never encipher, so no keyEncipherment.
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, LEAF_VALIDITY);
        let key = KeyPair::generate().map_err(|source| PkiError::Generate { what, source })?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|source| PkiError::Generate { what, source })?;
        Ok(CertKeyPem {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

fn set_validity(params: &mut CertificateParams, validity: Duration) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + validity;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may unwrap
mod tests {
    use super::*;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    use x509_parser::prelude::*;

    fn parse(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    #[test]
    fn client_cert_carries_user_and_groups() {
        let ca = CertAuthority::generate("test-ca").unwrap();
        let client = ca
            .issue_client("alice", &["system:masters", "dev"])
            .unwrap();
        let der = parse(&client.cert_pem);
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let cn: Vec<_> = cert.subject().iter_common_name().collect();
        assert_eq!(cn[0].as_str().unwrap(), "alice");
        let orgs: Vec<_> = cert
            .subject()
            .iter_organization()
            .map(|o| o.as_str().unwrap().to_string())
            .collect();
        assert_eq!(orgs, ["system:masters", "dev"]);
        assert_eq!(
            cert.issuer().iter_common_name().next().unwrap().as_str(),
            Ok("test-ca")
        );
        assert!(matches!(
            ca.issue_client("bob", &["a", "b", "c"]),
            Err(PkiError::TooManyOrganizations(3))
        ));
    }

    #[test]
    fn server_cert_has_dns_and_ip_names() {
        let ca = CertAuthority::generate("test-ca").unwrap();
        let server = ca.issue_server(&["localhost", "127.0.0.1", "::1"]).unwrap();
        let der = parse(&server.cert_pem);
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        let names: Vec<String> = san
            .value
            .general_names
            .iter()
            .map(|n| format!("{n}"))
            .collect();
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(names[0].contains("localhost"), "{names:?}");
        assert!(matches!(ca.issue_server(&[]), Err(PkiError::NoServerNames)));
    }

    #[test]
    fn writes_cert_and_private_key() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertAuthority::generate("test-ca").unwrap();
        let pair = ca.cert_key_pem();
        let (crt, key) = pair.write_to_dir(&dir.path().join("pki"), "ca").unwrap();
        assert_eq!(fs::read_to_string(&crt).unwrap(), ca.cert_pem());
        assert!(fs::read_to_string(&key)
            .unwrap()
            .starts_with("-----BEGIN PRIVATE KEY-----"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(!format!("{pair:?}").contains("PRIVATE"));
    }
}
