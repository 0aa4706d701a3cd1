//! The trusted request-header names configured (`upstream.requestHeaders`);
//! what they are used for is in [`crate::requestheader`].

use http::HeaderName;
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

impl Settings {
    /// Any name configured.
    pub fn any(&self) -> bool {
        !(self.username_headers.is_empty()
            && self.group_headers.is_empty()
            && self.extra_headers_prefixes.is_empty()
            && self.uid_headers.is_empty())
    }

    /// The lists left empty (their field names): with any of them empty the
    /// configuration alone does not say every name the apiserver trusts.
    pub fn missing(&self) -> Vec<&'static str> {
        [
            ("usernameHeaders", &self.username_headers),
            ("groupHeaders", &self.group_headers),
            ("extraHeadersPrefixes", &self.extra_headers_prefixes),
            ("uidHeaders", &self.uid_headers),
        ]
        .into_iter()
        .filter(|(_, list)| list.is_empty())
        .map(|(field, _)| field)
        .collect()
    }

    /// Every name is a valid header name; the field at fault otherwise.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        self.names().map(|_| ())
    }

    /// The configured lists as header names.
    pub(crate) fn names(&self) -> Result<HeaderNames, (&'static str, String)> {
        let parse = |field: &'static str, list: &[String]| {
            list.iter()
                .map(|n| {
                    header_name(n).ok_or_else(|| (field, format!("{n:?} is not a header name")))
                })
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(HeaderNames {
            user: parse(
                "upstream.requestHeaders.usernameHeaders",
                &self.username_headers,
            )?,
            group: parse("upstream.requestHeaders.groupHeaders", &self.group_headers)?,
            extra_prefixes: parse(
                "upstream.requestHeaders.extraHeadersPrefixes",
                &self.extra_headers_prefixes,
            )?
            .into_iter()
            .map(|n| n.as_str().to_string())
            .collect(),
            uid: parse("upstream.requestHeaders.uidHeaders", &self.uid_headers)?,
        })
    }
}

/// A header name, lower-cased as HTTP/2 and `http` keep them; `None` if it is none.
pub(crate) fn header_name(name: &str) -> Option<HeaderName> {
    let name = name.trim();
    (!name.is_empty())
        .then(|| HeaderName::from_bytes(name.as_bytes()).ok())
        .flatten()
}

/// The `--requestheader-*` lists of one apiserver (or of the configuration), in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderNames {
    pub user: Vec<HeaderName>,
    pub group: Vec<HeaderName>,
    /// Lower case.
    pub extra_prefixes: Vec<String>,
    pub uid: Vec<HeaderName>,
}
