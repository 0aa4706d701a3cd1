//! kubeconfig exec credential plugins (`users[].user.exec`), as client-go runs
//! them: the command with its args and env plus `KUBERNETES_EXEC_INFO` (an
//! `ExecCredential` with `spec.interactive: false` and, with
//! `provideClusterInfo`, `spec.cluster`), stdout parsed as an `ExecCredential`
//! of the configured `apiVersion` (`client.authentication.k8s.io/v1` or
//! `v1beta1`): `status.token` or `status.clientCertificateData` and
//! `clientKeyData`, valid until `status.expirationTimestamp` if given.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde::Deserialize;

/// The API versions of `ExecCredential` this reader speaks.
pub const API_VERSIONS: [&str; 2] = [
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
];
/// Most of the plugin's stderr quoted in an error.
const MAX_STDERR_QUOTED: usize = 2000;

/// `users[].user.exec` of a kubeconfig.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecConfig {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<ExecEnv>,
    #[serde(default)]
    pub install_hint: Option<String>,
    #[serde(default)]
    pub provide_cluster_info: bool,
    #[serde(default)]
    pub interactive_mode: Option<String>,
}

/// One `env` entry of an exec config.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ExecEnv {
    pub name: String,
    #[serde(default)]
    pub value: String,
}

/// What the cluster looks like, for `provideClusterInfo` (client-go's `Cluster`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterInfo {
    pub server: String,
    pub tls_server_name: Option<String>,
    pub insecure_skip_tls_verify: bool,
    pub ca_pem: Option<Vec<u8>>,
}

/// What one plugin run returned.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecOutput {
    pub token: Option<String>,
    /// PEM certificate chain and key, when the plugin authenticates by certificate.
    pub client_cert: Option<(Vec<u8>, Vec<u8>)>,
    /// When to run the plugin again; `None`: the credential does not expire.
    pub expires: Option<SystemTime>,
}

/// Why a plugin run gave no credential; every message names the kubeconfig
/// user and the command.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("kubeconfig user `{user}`: exec plugin `{command}`: {reason}")]
    Failed {
        user: String,
        command: String,
        reason: String,
    },
    #[error("kubeconfig user `{user}`: cannot run exec plugin `{command}`{hint}")]
    Spawn {
        user: String,
        command: String,
        hint: String,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExecCredential {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    status: Option<ExecStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExecStatus {
    #[serde(default)]
    token: String,
    #[serde(default)]
    expiration_timestamp: Option<String>,
    #[serde(default)]
    client_certificate_data: String,
    #[serde(default)]
    client_key_data: String,
}

/// One kubeconfig user's plugin, ready to run.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecPlugin {
    pub user: String,
    pub config: ExecConfig,
    /// The command, resolved like client-go: a relative path with a `/` is
    /// relative to the kubeconfig's directory; a bare name is looked up in PATH.
    pub program: PathBuf,
    pub cluster: ClusterInfo,
}

impl ExecPlugin {
    /// The command line, for messages.
    pub fn command_line(&self) -> String {
        std::iter::once(self.config.command.as_str())
            .chain(self.config.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn failed(&self, reason: impl Into<String>) -> ExecError {
        ExecError::Failed {
            user: self.user.clone(),
            command: self.command_line(),
            reason: reason.into(),
        }
    }

    /// Checks what can be checked before running: the API version and the
    /// interactive mode (our programs never give the plugin a terminal).
    pub fn validate(&self) -> Result<(), ExecError> {
        if !API_VERSIONS.contains(&self.config.api_version.as_str()) {
            return Err(self.failed(format!(
                "apiVersion `{}` is not supported (use {})",
                self.config.api_version,
                API_VERSIONS.join(" or ")
            )));
        }
        if self.config.interactive_mode.as_deref() == Some("Always") {
            return Err(self.failed(
                "interactiveMode Always needs a terminal, which is not given to plugins here",
            ));
        }
        Ok(())
    }

    /// `KUBERNETES_EXEC_INFO`, as client-go sets it.
    pub fn exec_info(&self) -> String {
        let mut spec = serde_json::json!({"interactive": false});
        if self.config.provide_cluster_info {
            let c = &self.cluster;
            let mut cluster = serde_json::json!({"server": c.server});
            if let Some(n) = &c.tls_server_name {
                cluster["tls-server-name"] = n.clone().into();
            }
            if c.insecure_skip_tls_verify {
                cluster["insecure-skip-tls-verify"] = true.into();
            }
            if let Some(ca) = &c.ca_pem {
                cluster["certificate-authority-data"] =
                    base64::engine::general_purpose::STANDARD.encode(ca).into();
            }
            spec["cluster"] = cluster;
        }
        serde_json::json!({
            "apiVersion": self.config.api_version,
            "kind": "ExecCredential",
            "spec": spec,
        })
        .to_string()
    }

    /// Runs the plugin once and reads its credential.
    pub fn run(&self) -> Result<ExecOutput, ExecError> {
        self.validate()?;
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.config.args)
            .envs(self.config.env.iter().map(|e| (&e.name, &e.value)))
            .env("KUBERNETES_EXEC_INFO", self.exec_info())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let out = cmd.output().map_err(|source| ExecError::Spawn {
            user: self.user.clone(),
            command: self.command_line(),
            hint: self
                .config
                .install_hint
                .as_deref()
                .map(|h| format!(" ({})", h.trim()))
                .unwrap_or_default(),
            source,
        })?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let stderr = stderr.trim();
            let quoted = match stderr.char_indices().nth(MAX_STDERR_QUOTED) {
                Some((cut, _)) => format!("{}…", &stderr[..cut]),
                None => stderr.to_string(),
            };
            return Err(self.failed(if quoted.is_empty() {
                format!("{}", out.status)
            } else {
                format!("{}: {quoted}", out.status)
            }));
        }
        self.parse(&out.stdout)
    }

    /// Reads the plugin's stdout.
    pub fn parse(&self, stdout: &[u8]) -> Result<ExecOutput, ExecError> {
        let cred: ExecCredential = serde_json::from_slice(stdout)
            .map_err(|e| self.failed(format!("output is not an ExecCredential: {e}")))?;
        if cred.kind != "ExecCredential" {
            return Err(self.failed(format!(
                "output has kind `{}`, expected ExecCredential",
                cred.kind
            )));
        }
        if cred.api_version != self.config.api_version {
            return Err(self.failed(format!(
                "configured for {} but the plugin returned {}",
                self.config.api_version, cred.api_version
            )));
        }
        let status = cred
            .status
            .ok_or_else(|| self.failed("output has no status"))?;
        let expires = match status.expiration_timestamp.as_deref() {
            None | Some("") => None,
            Some(ts) => Some(parse_rfc3339(ts).ok_or_else(|| {
                self.failed(format!("invalid status.expirationTimestamp `{ts}`"))
            })?),
        };
        let client_cert = match (
            status.client_certificate_data.is_empty(),
            status.client_key_data.is_empty(),
        ) {
            (true, true) => None,
            (false, false) => Some((
                status.client_certificate_data.into_bytes(),
                status.client_key_data.into_bytes(),
            )),
            _ => {
                return Err(
                    self.failed("status has only one of clientCertificateData and clientKeyData")
                )
            }
        };
        let token = Some(status.token).filter(|t| !t.is_empty());
        if token.is_none() && client_cert.is_none() {
            return Err(self
                .failed("status has neither a token nor clientCertificateData and clientKeyData"));
        }
        Ok(ExecOutput {
            token,
            client_cert,
            expires,
        })
    }
}

/// An RFC 3339 timestamp (`2026-11-22T10:00:00Z`, fractions and `±hh:mm`
/// offsets allowed), as Kubernetes writes `metav1.Time`.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<i64> {
        let part = s.get(from..to)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (y, mo, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, mi, sec) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut nanos = 0u32;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let kept = &frac[..digits.min(9)];
        nanos = kept.parse::<u32>().ok()? * 10u32.pow(9 - kept.len() as u32);
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && rest.as_bytes()[3] == b':' => {
            let sign = match rest.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let oh: i64 = rest.get(1..3)?.parse().ok()?;
            let om: i64 = rest.get(4..6)?.parse().ok()?;
            sign * (oh * 3600 + om * 60)
        }
        _ => return None,
    };
    // Howard Hinnant's days_from_civil.
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset;
    let secs = u64::try_from(secs).ok()?;
    UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin(api_version: &str) -> ExecPlugin {
        ExecPlugin {
            user: "eve".into(),
            config: ExecConfig {
                api_version: api_version.into(),
                command: "get-token".into(),
                args: vec!["--cluster".into(), "c1".into()],
                provide_cluster_info: true,
                ..Default::default()
            },
            program: "get-token".into(),
            cluster: ClusterInfo {
                server: "https://10.0.0.1:6443".into(),
                ca_pem: Some(b"CA".to_vec()),
                ..Default::default()
            },
        }
    }

    fn secs(t: SystemTime) -> u64 {
        t.duration_since(UNIX_EPOCH).expect("after 1970").as_secs()
    }

    #[test]
    fn parses_timestamps() {
        let t = |s| parse_rfc3339(s).map(secs);
        assert_eq!(t("2023-11-14T22:13:20Z"), Some(1_700_000_000));
        assert_eq!(t("2023-11-14T23:13:20+01:00"), Some(1_700_000_000));
        assert_eq!(t("2000-02-29T00:00:00.5Z"), Some(951_782_400));
        assert_eq!(t("1970-01-01T00:00:00Z"), Some(0));
        for bad in [
            "",
            "2023-11-14",
            "2023-13-14T22:13:20Z",
            "2023-11-14T22:13:20",
            "x023-11-14T22:13:20Z",
        ] {
            assert_eq!(t(bad), None, "{bad}");
        }
    }

    #[test]
    fn parses_tokens_certificates_and_refusals() {
        let p = plugin("client.authentication.k8s.io/v1");
        let out = p
            .parse(br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"t1","expirationTimestamp":"2023-11-14T22:13:20Z"}}"#)
            .expect("token");
        assert_eq!(out.token.as_deref(), Some("t1"));
        assert_eq!(out.expires.map(secs), Some(1_700_000_000));
        let out = p
            .parse(br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"clientCertificateData":"C","clientKeyData":"K"}}"#)
            .expect("cert");
        assert_eq!(out.client_cert, Some((b"C".to_vec(), b"K".to_vec())));
        assert_eq!(out.expires, None);
        let wrong = p
            .parse(br#"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"token":"t"}}"#)
            .expect_err("version");
        assert!(wrong.to_string().contains("user `eve`"), "{wrong}");
        assert!(
            wrong.to_string().contains("`get-token --cluster c1`"),
            "{wrong}"
        );
        for bad in [
            &br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential"}"#[..],
            br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{}}"#,
            br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"clientKeyData":"K"}}"#,
            b"not json",
        ] {
            assert!(p.parse(bad).is_err());
        }
        assert!(plugin("v2").validate().is_err());
    }

    #[test]
    fn exec_info_carries_the_cluster_when_asked() {
        let info: serde_json::Value =
            serde_json::from_str(&plugin("client.authentication.k8s.io/v1beta1").exec_info())
                .expect("json");
        assert_eq!(info["apiVersion"], "client.authentication.k8s.io/v1beta1");
        assert_eq!(info["kind"], "ExecCredential");
        assert_eq!(info["spec"]["interactive"], false);
        assert_eq!(info["spec"]["cluster"]["server"], "https://10.0.0.1:6443");
        assert_eq!(
            info["spec"]["cluster"]["certificate-authority-data"],
            "Q0E="
        );
    }
}
