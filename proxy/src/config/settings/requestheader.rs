//! The trusted request-header names configured (`upstream.requestHeaders`);
//! what they are used for is in [`crate::requestheader`].

use serde::Deserialize;

/// Configured names, beside those learned from the ConfigMap. Each list is
/// what the apiservers' flag of the same name says, in its order.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Settings {
    /// `--requestheader-username-headers`. Default: none.
    pub username_headers: Vec<String>,
    /// `--requestheader-group-headers`. Default: none.
    pub group_headers: Vec<String>,
    /// `--requestheader-extra-headers-prefix`. Default: none.
    pub extra_headers_prefixes: Vec<String>,
    /// `--requestheader-uid-headers`; for an apiserver without that flag (before
    /// 1.32) any name, e.g. `X-Remote-Uid`. Default: none.
    pub uid_headers: Vec<String>,
    /// Seconds a watch of the ConfigMap runs before it is listed again, and the
    /// longest wait between reads that fail. Default `60`.
    pub refresh_seconds: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            username_headers: Vec::new(),
            group_headers: Vec::new(),
            extra_headers_prefixes: Vec::new(),
            uid_headers: Vec::new(),
            refresh_seconds: 60.0,
        }
    }
}
