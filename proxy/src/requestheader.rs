//! The request headers the apiservers take as front-proxy identity: which
//! names they are, learning them, and rewriting them on every forwarded request.
//!
//! On a connection whose client certificate its front-proxy CA signed (tollgate's
//! front-proxy certificate), kube-apiserver takes the user from the first of
//! `--requestheader-username-headers` that is set, the groups from *all* of
//! `--requestheader-group-headers`, extras from `--requestheader-extra-headers-prefix`
//! and (recent releases) a uid from `--requestheader-uid-headers`. Operators extend
//! those lists (`X-Forwarded-User,X-Remote-User`), so stripping `X-Remote-*` alone
//! let a certificate client's `X-Forwarded-Groups: system:masters` join the groups
//! tollgate forwarded. Every forwarded request loses any header named in:
//! - `X-Remote-*` (kube-apiserver's and kubeadm's names), always;
//! - `upstream.requestHeaders` (configured, [`Settings`]; a reload adds names);
//! - ConfigMap `kube-system/extension-apiserver-authentication`, which
//!   kube-apiserver publishes with its `--requestheader-*` lists, read with
//!   tollgate's own identity before serving ([`learn_at_start`]) and watched
//!   from then on ([`learn_loop`], a list and a watch, listed again when the watch
//!   ends or fails), when tollgate has a front-proxy certificate: without one the
//!   apiserver reads no identity header from tollgate's connections, and
//!   `X-Remote-*` and the configured names are stripped anyway. Names once learned
//!   stay stripped: several apiservers may have published different lists, and a
//!   stale name costs nothing.
//!
//! **Fail closed.** With a front-proxy certificate, a kind of name (user, group,
//! extra, uid) neither learned nor configured is stripped by a wildcard: any
//! `X-*-User`, `X-*-Group`, `X-*-Groups`, `X-*-Extra-*`, `X-*-Uid` (names are
//! lower case in `http`, whatever case the client sent, HTTP/1.1 or HTTP/2), and
//! tollgate is not ready ([`Trusted::readiness`]) until it knows every kind, in
//! every mode: an apiserver may trust names tollgate has never heard of.
//!
//! A certificate client's identity is forwarded only under the names the apiserver
//! reads first: the first username and group header of the last learned lists, else
//! of the configured ones, else `X-Remote-User` / `X-Remote-Group`.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;

use crate::config::{Config, Mode};
use crate::forward::UpstreamPool;
use crate::identity::Identity;
use crate::metrics::{Metrics, ResultLabel};
use crate::snapshot::Snapshot;

/// The ConfigMap kube-apiserver publishes its client-authentication settings in.
pub const CONFIGMAP_PATH: &str =
    "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication";

/// Prefix of the names stripped whatever the lists say.
const ALWAYS_STRIPPED_PREFIX: &str = "x-remote-";

/// Most names (and prefixes) kept; a ConfigMap listing more is cut short (logged).
const MAX_NAMES: usize = 64;

/// Most bytes read of the ConfigMap (it also holds CA bundles).
const MAX_CONFIGMAP_BYTES: usize = 1 << 20;

use crate::config::settings::requestheader::header_name;
pub use crate::config::settings::requestheader::{HeaderNames, Settings};

impl Settings {
    /// Warn when some lists are set and others not (at start and on reload): the
    /// kinds left out are stripped by the wildcard rule, and tollgate is not ready
    /// until it has learned the apiserver's lists.
    pub fn warn_if_incomplete(&self, front_proxy: bool) {
        let missing = self.missing();
        if front_proxy && self.any() && !missing.is_empty() {
            tracing::warn!(
                missing = %missing.join(", "),
                "upstream.requestHeaders is incomplete: the kinds it leaves out are stripped by \
                 the wildcard rule (X-*-User, X-*-Group(s), X-*-Extra-*, X-*-Uid) and tollgate is \
                 not ready until it reads the apiserver's lists from {CONFIGMAP_PATH}"
            );
        }
    }
}

// === impl HeaderNames ===

/// The keys of the ConfigMap read here; each value is a JSON list of strings.
#[derive(Debug, Default, Deserialize)]
struct ConfigMapData {
    #[serde(rename = "requestheader-username-headers")]
    user: Option<String>,
    #[serde(rename = "requestheader-group-headers")]
    group: Option<String>,
    #[serde(rename = "requestheader-extra-headers-prefix")]
    extra: Option<String>,
    #[serde(rename = "requestheader-uid-headers")]
    uid: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ConfigMap {
    #[serde(default)]
    data: ConfigMapData,
}

impl HeaderNames {
    /// The lists of `extension-apiserver-authentication` (a ConfigMap as JSON). A
    /// ConfigMap without them is an apiserver that trusts no identity headers.
    pub fn from_configmap(body: &[u8]) -> Result<HeaderNames, String> {
        let cm: ConfigMap =
            serde_json::from_slice(body).map_err(|e| format!("not a ConfigMap: {e}"))?;
        let list = |key: &str, value: &Option<String>| -> Result<Vec<HeaderName>, String> {
            let Some(text) = value else {
                return Ok(Vec::new());
            };
            let names: Vec<String> = serde_json::from_str(text)
                .map_err(|e| format!("{key} is not a JSON list of strings: {e}"))?;
            names
                .iter()
                .map(|n| header_name(n).ok_or_else(|| format!("{key}: {n:?} is not a header name")))
                .collect()
        };
        let d = &cm.data;
        Ok(HeaderNames {
            user: list("requestheader-username-headers", &d.user)?,
            group: list("requestheader-group-headers", &d.group)?,
            extra_prefixes: list("requestheader-extra-headers-prefix", &d.extra)?
                .into_iter()
                .map(|n| n.as_str().to_string())
                .collect(),
            uid: list("requestheader-uid-headers", &d.uid)?,
        })
    }
}

// === impl TrustedHeaders ===

/// What every forwarded request's headers are rewritten by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedHeaders {
    /// Stripped exactly (lower case, as `http` keeps names).
    names: Vec<HeaderName>,
    /// Stripped by prefix (lower case); `x-remote-` first.
    prefixes: Vec<String>,
    /// The certificate client's user goes under this name.
    user: HeaderName,
    /// Its groups go under this name.
    group: HeaderName,
    /// The forward names came from a ConfigMap.
    learned: bool,
    /// The kinds whose names are not known ([`Kind`] bits): stripped by the
    /// wildcard rule when the request goes through the front-proxy certificate.
    unknown: u8,
}

/// A kind of identity header, as the apiserver's four lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    User = 1,
    Group = 2,
    Extra = 4,
    Uid = 8,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::User, Kind::Group, Kind::Extra, Kind::Uid];
    const EVERY: u8 = 15;

    /// The configuration field naming this kind.
    pub fn field(self) -> &'static str {
        match self {
            Kind::User => "usernameHeaders",
            Kind::Group => "groupHeaders",
            Kind::Extra => "extraHeadersPrefixes",
            Kind::Uid => "uidHeaders",
        }
    }

    /// Whether `name` (lower case) is one the apiserver might trust for this
    /// kind under a name tollgate does not know: `X-*-User`, `X-*-Group`,
    /// `X-*-Groups`, `X-*-Extra-*`, `X-*-Uid` (the `*` may be empty: `X-User`).
    pub fn wildcard(self, name: &str) -> bool {
        let Some(rest) = name.strip_prefix("x-") else {
            return false;
        };
        // `x-user` and `x-remote-user` alike.
        let dashed =
            |word: &str| rest == word || rest.strip_suffix(word).is_some_and(|r| r.ends_with('-'));
        match self {
            Kind::User => dashed("user"),
            Kind::Group => dashed("group") || dashed("groups"),
            Kind::Uid => dashed("uid"),
            Kind::Extra => rest.starts_with("extra-") || rest.contains("-extra-"),
        }
    }
}

impl Default for TrustedHeaders {
    /// Nothing known: `X-Remote-*` stripped, and every kind by the wildcard.
    fn default() -> Self {
        TrustedHeaders {
            names: Vec::new(),
            prefixes: vec![ALWAYS_STRIPPED_PREFIX.to_string()],
            user: HeaderName::from_static("x-remote-user"),
            group: HeaderName::from_static("x-remote-group"),
            learned: false,
            unknown: Kind::EVERY,
        }
    }
}

impl TrustedHeaders {
    /// `X-Remote-*` and the configured names; forwarded under the first configured ones.
    pub fn configured(settings: &Settings) -> Result<TrustedHeaders, (&'static str, String)> {
        let mut t = TrustedHeaders::default();
        t.add(&settings.names()?);
        Ok(t)
    }

    /// These names added to the stripped ones; forwarded under their first ones from now on.
    /// An apiserver's published lists are all it trusts: every kind is known.
    pub fn learned(&self, names: &HeaderNames) -> TrustedHeaders {
        let mut t = self.clone();
        t.add(names);
        t.learned = true;
        t.unknown = 0;
        if let Some(user) = names.user.first() {
            t.user = user.clone();
        }
        if let Some(group) = names.group.first() {
            t.group = group.clone();
        }
        t
    }

    /// Strip `names` too; when nothing was learned yet, forward under their first ones.
    /// A kind with a name is known from now on.
    fn add(&mut self, names: &HeaderNames) {
        for (kind, known) in [
            (Kind::User, !names.user.is_empty()),
            (Kind::Group, !names.group.is_empty()),
            (Kind::Extra, !names.extra_prefixes.is_empty()),
            (Kind::Uid, !names.uid.is_empty()),
        ] {
            if known {
                self.unknown &= !(kind as u8);
            }
        }
        if !self.learned {
            if let Some(user) = names.user.first() {
                self.user = user.clone();
            }
            if let Some(group) = names.group.first() {
                self.group = group.clone();
            }
        }
        for name in names.user.iter().chain(&names.group).chain(&names.uid) {
            if !self.strips(name) && self.names.len() < MAX_NAMES {
                self.names.push(name.clone());
            }
        }
        for prefix in &names.extra_prefixes {
            let covered = self.prefixes.iter().any(|p| prefix.starts_with(p.as_str()));
            if !covered && self.prefixes.len() < MAX_NAMES {
                self.prefixes.push(prefix.clone());
            }
        }
    }

    /// Whether the apiserver may take `name` as identity on a front-proxy connection.
    pub fn strips(&self, name: &HeaderName) -> bool {
        self.strips_known(name) || self.strips_wild(name)
    }

    /// A name learned or configured.
    fn strips_known(&self, name: &HeaderName) -> bool {
        let s = name.as_str();
        self.prefixes.iter().any(|p| s.starts_with(p.as_str())) || self.names.contains(name)
    }

    /// A name of an unknown kind's wildcard.
    fn strips_wild(&self, name: &HeaderName) -> bool {
        self.unknown != 0
            && Kind::ALL
                .iter()
                .any(|k| self.unknown & (*k as u8) != 0 && k.wildcard(name.as_str()))
    }

    /// The kinds whose names tollgate knows neither from a ConfigMap nor from its configuration.
    pub fn unknown(&self) -> Vec<Kind> {
        Kind::ALL
            .into_iter()
            .filter(|k| self.unknown & (*k as u8) != 0)
            .collect()
    }

    /// The names a certificate client's user and groups are forwarded under.
    pub fn forward_names(&self) -> (&HeaderName, &HeaderName) {
        (&self.user, &self.group)
    }

    /// Remove every header the apiserver may take as identity, then, when
    /// `front_proxy` is set, add a certificate identity under the names it reads.
    /// Without a front-proxy certificate the apiserver reads no identity header
    /// from tollgate's connections: the known names go, the wildcard is not applied.
    pub fn rewrite(&self, headers: &mut HeaderMap, identity: &Identity, front_proxy: bool) {
        let strips = |n: &HeaderName| self.strips_known(n) || (front_proxy && self.strips_wild(n));
        // Almost no request carries one: look before allocating.
        if headers.keys().any(strips) {
            let spoofed: Vec<HeaderName> = headers.keys().filter(|n| strips(n)).cloned().collect();
            for name in spoofed {
                headers.remove(&name);
            }
        }
        if let (true, Identity::Certificate { user, groups }) = (front_proxy, identity) {
            if let Ok(v) = HeaderValue::from_str(user) {
                headers.insert(self.user.clone(), v);
            }
            for group in groups {
                if let Ok(v) = HeaderValue::from_str(group) {
                    headers.append(self.group.clone(), v);
                }
            }
        }
    }
}

// === the shared, refreshed names ===

/// The names in force, replaced whole when the ConfigMap teaches more; each
/// request takes an `Arc` of the version it started with.
#[derive(Debug)]
pub struct Trusted {
    headers: Snapshot<TrustedHeaders>,
    /// Why the last read of the ConfigMap failed (shown by `/readyz`).
    last_error: std::sync::Mutex<Option<String>>,
}

impl Trusted {
    pub fn new(headers: TrustedHeaders) -> Trusted {
        Trusted {
            headers: Snapshot::new(headers),
            last_error: std::sync::Mutex::new(None),
        }
    }

    pub fn get(&self) -> Arc<TrustedHeaders> {
        self.headers.get()
    }

    /// Note why a read of the ConfigMap failed; `None` after one succeeded.
    pub fn set_error(&self, why: Option<String>) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }

    /// Ready as far as identity goes: every kind of name known, or no front-proxy
    /// certificate (the apiserver then reads no identity header from tollgate).
    /// Otherwise why not, naming what is missing and the last read's error.
    pub fn readiness(&self, front_proxy: bool) -> Result<(), String> {
        let unknown = self.get().unknown();
        if !front_proxy || unknown.is_empty() {
            return Ok(());
        }
        let fields: Vec<&str> = unknown.iter().map(|k| k.field()).collect();
        let why = self
            .last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| "not read yet".into());
        Err(format!(
            "the identity headers the apiserver trusts are not known (reading {CONFIGMAP_PATH}: \
             {why}; upstream.requestHeaders lacks {}): X-*-User, X-*-Group(s), X-*-Extra-* and \
             X-*-Uid of unknown kinds are stripped from every request",
            fields.join(", ")
        ))
    }

    /// Add what an apiserver published; `true` if anything changed.
    pub fn learn(&self, names: &HeaderNames) -> bool {
        self.update(|t| t.learned(names))
    }

    /// Add a reloaded configuration's names (validated already; one that is
    /// not is left out). Names are never removed while tollgate runs.
    pub fn configure(&self, settings: &Settings) -> bool {
        match settings.names() {
            Ok(names) => self.update(|t| {
                let mut next = t.clone();
                next.add(&names);
                next
            }),
            Err(_) => false,
        }
    }

    fn update(&self, next: impl FnOnce(&TrustedHeaders) -> TrustedHeaders) -> bool {
        let mut changed = false;
        self.headers.update(|current| {
            let next = next(current);
            changed = next != *current;
            next
        });
        changed
    }
}

/// The ConfigMap read from the first upstream that answers, with tollgate's own identity.
pub(crate) async fn fetch(pool: &UpstreamPool, timeout: Duration) -> Result<HeaderNames, String> {
    let mut why = String::from("no upstream");
    // Healthy ones first; at start none has been checked yet and all count as healthy.
    let mut upstreams: Vec<_> = pool.upstreams().iter().collect();
    upstreams.sort_by_key(|u| !u.is_healthy());
    for u in upstreams {
        match pool
            .own_get(u, CONFIGMAP_PATH, MAX_CONFIGMAP_BYTES, timeout)
            .await
        {
            Ok(body) => return HeaderNames::from_configmap(&body),
            Err(e) => why = format!("{}: {e}", u.url),
        }
    }
    Err(why)
}

/// Why tollgate will not start: what it could not learn and what to set.
pub fn refusal(why: &str) -> String {
    format!(
        "mode is enforce with a front-proxy certificate, and tollgate cannot learn which request \
         headers the apiserver takes as identity (GET {CONFIGMAP_PATH}: {why}); a client could \
         send one tollgate does not strip. Set upstream.requestHeaders.usernameHeaders, \
         groupHeaders, extraHeadersPrefixes and uidHeaders (--requestheader-username-headers, \
         --requestheader-group-headers, --requestheader-extra-headers-prefix, \
         --requestheader-uid-headers) to the apiserver's --requestheader-* flags (all four: \
         an apiserver without a uid flag trusts none, name any), or give tollgate an identity (upstream.clientCertFile or \
         upstream.kubeconfig) allowed to get that ConfigMap (kube-system Role \
         extension-apiserver-authentication-reader)"
    )
}

/// How long one read of the ConfigMap may take.
pub(crate) fn read_timeout(config: &Config) -> Duration {
    let up = &config.upstream;
    Duration::from_secs_f64(up.connect_timeout_seconds + up.health_check.timeout_seconds)
}

/// Learn the names once before serving, when they matter: with a front-proxy
/// certificate (without one the apiserver reads no identity header from
/// tollgate's connections, and tollgate does not ask).
/// Unlearned, tollgate strips `X-Remote-*`, the configured names and, for each
/// kind the configuration leaves out, its wildcard, and is not ready until
/// [`learn_loop`] learns the names. In enforce mode with the configuration
/// incomplete it refuses to start with [`refusal`]'s message.
pub async fn learn_at_start(
    config: &Config,
    pool: &UpstreamPool,
    trusted: &Trusted,
    metrics: &Metrics,
) -> Result<(), String> {
    if !pool.has_front_proxy() {
        return Ok(());
    }
    config.upstream.request_headers.warn_if_incomplete(true);
    match counted(fetch(pool, read_timeout(config)).await, metrics) {
        Ok(names) => {
            trusted.set_error(None);
            trusted.learn(&names);
            let t = trusted.get();
            let (user, group) = t.forward_names();
            tracing::info!(?names, %user, %group, "learned the identity headers the apiserver trusts");
            Ok(())
        }
        Err(why) => {
            let missing = config.upstream.request_headers.missing();
            if config.mode == Mode::Enforce && !missing.is_empty() {
                return Err(refusal(&why));
            }
            trusted.set_error(Some(why.clone()));
            if missing.is_empty() {
                tracing::warn!(error = %why,
                    "cannot read the identity headers the apiserver trusts: stripping X-Remote-* and the configured upstream.requestHeaders; watching for the apiserver's lists");
            } else {
                tracing::warn!(error = %why, missing = %missing.join(", "),
                    "cannot read the identity headers the apiserver trusts: NOT READY until they are read; meanwhile X-*-User, X-*-Group(s), X-*-Extra-*, X-*-Uid (of the kinds upstream.requestHeaders leaves out) are stripped from every request");
            }
            Ok(())
        }
    }
}

/// A read's result, counted in `tollgate_requestheader_reads_total`.
pub(crate) fn counted<T, E>(read: Result<T, E>, metrics: &Metrics) -> Result<T, E> {
    let result = if read.is_ok() { "ok" } else { "error" };
    metrics
        .requestheader_reads
        .get_or_create(&ResultLabel {
            result: result.into(),
        })
        .inc();
    read
}

#[path = "requestheader_watch.rs"]
mod watch;
pub use watch::learn_loop;

#[cfg(test)]
#[path = "requestheader_tests.rs"]
mod tests;
