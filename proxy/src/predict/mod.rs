//! The pattern cache and cost predictor. Pure: no I/O, no clock; `now` is
//! passed in, so tests advance time by hand and get exact numbers.
//!
//! Per pattern it keeps exponentially decayed statistics (half-life
//! configurable): a weighted mean and a log-bucket histogram of response
//! bytes (uncompressed estimate) and latency, a decayed request count (→ rate),
//! and plain counts. Per (resource, scope) it keeps a prior learned from
//! observed full LISTs, so an unseen pattern gets a sensible prediction from
//! its first request and a filtered LIST is charged for what the apiserver
//! reads.
//!
//! Cost, following Tess.IO's model, is bytes the apiserver reads from etcd
//! plus bytes it sends: `cost = response_bytes + read_bytes`, where
//! `read_bytes` is zero when the consistency class is served from the watch
//! cache, the response itself for an unfiltered etcd read, and the whole
//! resource (the prior) for a filtered etcd read.

use std::collections::HashMap;
use std::time::Duration;

use apimodel::request::Scope;
use apimodel::ConsistencyClass;
use tokio::time::Instant;

use crate::decay::decay_factor;
pub use crate::decay::DecayedHistogram;
use crate::pattern::{Narrow, PatternKey, PatternVerb};

pub mod charge;
pub mod release;
/// The settings live with the configuration; this path stays for code (and
/// tests) that name it here.
pub use crate::config::settings::predict as settings;
mod store;
mod view;

pub use release::Release;
pub use settings::{Patterns, Store, StoreSetting};
pub use store::PatternStore;
pub use view::PatternView;

/// Most clients remembered per pattern.
const TOP_CLIENTS: usize = 5;

// === impl PatternStats ===

/// What is known about one pattern.
#[derive(Debug, Clone)]
pub struct PatternStats {
    last: Instant,
    /// Decayed number of requests (→ rate).
    weight: f64,
    /// Decayed weight and sum of responses whose bytes were learned.
    bytes_weight: f64,
    bytes_sum: f64,
    bytes_hist: DecayedHistogram,
    latency_weight: f64,
    latency_sum_ms: f64,
    latency_hist: DecayedHistogram,
    pub count: u64,
    pub errors: u64,
    pub cancelled: u64,
    /// Rejected in enforce, with who sent them.
    pub rejected: u64,
    /// Would have been rejected (dryRun), with who sent them.
    pub would_reject: u64,
    clients: Vec<(String, f64)>,
    rejected_clients: Vec<(String, f64)>,
}

impl PatternStats {
    fn new(now: Instant) -> Self {
        PatternStats {
            last: now,
            weight: 0.0,
            bytes_weight: 0.0,
            bytes_sum: 0.0,
            bytes_hist: DecayedHistogram::default(),
            latency_weight: 0.0,
            latency_sum_ms: 0.0,
            latency_hist: DecayedHistogram::default(),
            count: 0,
            errors: 0,
            cancelled: 0,
            rejected: 0,
            would_reject: 0,
            clients: Vec::new(),
            rejected_clients: Vec::new(),
        }
    }

    fn decay_to(&mut self, now: Instant, half_life: f64) {
        let f = decay_factor(now.saturating_duration_since(self.last), half_life);
        if f < 1.0 {
            self.weight *= f;
            self.bytes_weight *= f;
            self.bytes_sum *= f;
            self.bytes_hist.scale(f);
            self.latency_weight *= f;
            self.latency_sum_ms *= f;
            self.latency_hist.scale(f);
            for c in self.clients.iter_mut().chain(&mut self.rejected_clients) {
                c.1 *= f;
            }
        }
        self.last = self.last.max(now);
    }

    /// Decayed mean of response bytes, if any were learned.
    pub fn bytes_mean(&self) -> Option<f64> {
        (self.bytes_weight > 1e-9).then(|| self.bytes_sum / self.bytes_weight)
    }

    pub fn bytes_p95(&self) -> f64 {
        self.bytes_hist.quantile(0.95)
    }

    pub fn latency_mean_ms(&self) -> Option<f64> {
        (self.latency_weight > 1e-9).then(|| self.latency_sum_ms / self.latency_weight)
    }

    pub fn latency_p99_ms(&self) -> f64 {
        self.latency_hist.quantile(0.99)
    }

    /// Requests per second: with half-life `h`, a steady rate `r` keeps the
    /// decayed count at `r·h/ln 2`.
    pub fn rate(&self, half_life: f64) -> f64 {
        self.weight * std::f64::consts::LN_2 / half_life
    }

    pub fn top_clients(&self) -> Vec<String> {
        ranked(&self.clients)
    }

    /// The clients whose requests of this pattern were rejected most.
    pub fn top_rejected_clients(&self) -> Vec<String> {
        ranked(&self.rejected_clients)
    }
}

fn ranked(clients: &[(String, f64)]) -> Vec<String> {
    let mut c = clients.to_vec();
    c.sort_by(|a, b| b.1.total_cmp(&a.1));
    c.into_iter().map(|c| c.0).collect()
}

/// Count `client` in a bounded top list (space-saving: a newcomer replaces
/// the least frequent, keeping its weight).
fn note_client(clients: &mut Vec<(String, f64)>, client: &str) {
    if let Some(c) = clients.iter_mut().find(|c| c.0 == client) {
        c.1 += 1.0;
    } else if clients.len() < TOP_CLIENTS {
        clients.push((client.to_string(), 1.0));
    } else if let Some(min) = clients.iter_mut().min_by(|a, b| a.1.total_cmp(&b.1)) {
        *min = (client.to_string(), min.1 + 1.0);
    }
}

// === impl ResourcePrior ===

/// What a full LIST of a resource (in a scope) returns, learned from observed ones.
#[derive(Debug, Clone)]
pub struct ResourcePrior {
    last: Instant,
    plain_weight: f64,
    plain_sum: f64,
    gzip_weight: f64,
    gzip_sum: f64,
}

impl ResourcePrior {
    fn decay_to(&mut self, now: Instant, half_life: f64) {
        // Priors decay four times slower than patterns: resources change size slowly.
        let f = decay_factor(now.saturating_duration_since(self.last), half_life * 4.0);
        self.plain_weight *= f;
        self.plain_sum *= f;
        self.gzip_weight *= f;
        self.gzip_sum *= f;
        self.last = self.last.max(now);
    }

    /// Uncompressed/compressed, once both kinds of full LIST were seen.
    fn gzip_ratio(&self) -> Option<f64> {
        (self.plain_weight > 1e-9 && self.gzip_weight > 1e-9 && self.gzip_sum > 0.0)
            .then(|| (self.plain_sum / self.plain_weight) / (self.gzip_sum / self.gzip_weight))
    }
}

// === impl PatternCache ===

/// How a response ended, as the counting body saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// The body was sent whole.
    End,
    /// The upstream or the stream failed.
    Error,
    /// The client went away first.
    Cancelled,
}

/// One finished request, as the cache learns it.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub status: u16,
    /// Bytes on the wire (compressed if `gzip`).
    pub bytes: u64,
    pub gzip: bool,
    pub latency: Duration,
    pub completion: Completion,
    /// A full LIST (no selector, limit or continue): teaches the resource prior.
    pub full_list: bool,
    /// Display name of the client (never a token).
    pub client: String,
    /// For a streaming list: the bytes of its initial state, if its end was seen.
    pub initial_bytes: Option<u64>,
}

/// Where a prediction came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    Pattern,
    Prior,
    Default,
}

/// The kubelet's default `--max-pods`: what one node holds at most unless
/// its operator raised it.
const MAX_PODS_PER_NODE: f64 = 110.0;

/// A predicted cost in bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// Bytes the response will carry (uncompressed).
    pub response_bytes: f64,
    /// Bytes the apiserver reads from etcd to serve it.
    pub read_bytes: f64,
    pub source: Source,
}

impl Prediction {
    pub fn cost(&self) -> f64 {
        self.response_bytes + self.read_bytes
    }
}

/// The maps a request looks up (two or three times each): foldhash instead of std's SipHash,
/// which hashed each `PatternKey` field by field, costly on every request. Still seeded per
/// map at random, so keys a
/// client chooses (resources, selector fields) cannot be aimed at one bucket in advance;
/// the cache is bounded besides.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The bounded pattern cache with its resource priors.
#[derive(Debug)]
pub struct PatternCache {
    settings: Patterns,
    patterns: FastMap<PatternKey, PatternStats>,
    priors: FastMap<(String, Scope), ResourcePrior>,
    /// Object counts per resource scraped from the apiserver's metrics, and
    /// bytes per object learned from full cluster LISTs.
    objects: FastMap<String, ObjectCount>,
    /// Consistent LISTs forwarded per resource, ever: evidence for [`Self::learn_store`].
    consistent_lists: HashMap<String, u64>,
    /// Which store serves consistent LISTs of a resource, as learned.
    learned_store: FastMap<String, Store>,
    /// The upstream's release, once its `/version` was read: the prior of
    /// `consistentStore: auto`.
    release: Option<Release>,
}

/// Why a pattern is priced as served by its store (`storeReason` in `/debug/patterns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StoreReason {
    /// Learned for the resource from the apiserver's etcd LIST counter.
    Learned,
    /// Set in `patterns.*Store`.
    Configured,
    /// `consistentStore: auto`, by the upstream's release.
    VersionPrior,
    /// `consistentStore: auto` with the release unknown: etcd, the dearer guess.
    UnknownVersion,
}

#[derive(Debug, Clone, Copy)]
struct ObjectCount {
    count: f64,
    bytes_per_object: Option<f64>,
}

impl PatternCache {
    pub fn new(settings: Patterns) -> Self {
        PatternCache {
            settings,
            patterns: FastMap::default(),
            priors: FastMap::default(),
            objects: FastMap::default(),
            consistent_lists: HashMap::new(),
            learned_store: FastMap::default(),
            release: None,
        }
    }

    /// The upstream's release, as its `/version` says (`None`: unknown).
    pub fn set_release(&mut self, release: Option<Release>) {
        self.release = release;
    }

    pub fn release(&self) -> Option<Release> {
        self.release
    }

    /// Take new settings (a reload); learned statistics are kept.
    pub fn set_settings(&mut self, settings: Patterns) {
        self.settings = settings;
    }

    pub fn len(&self) -> usize {
        self.patterns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    pub fn get(&self, key: &PatternKey) -> Option<&PatternStats> {
        self.patterns.get(key)
    }

    /// The store serving a pattern: configured per consistency class; for
    /// consistent reads, what was learned for the resource wins, then the
    /// setting, and with `auto` the upstream's release.
    pub fn store(&self, key: &PatternKey) -> Store {
        self.store_and_reason(key).0
    }

    /// [`Self::store`] and why.
    pub fn store_and_reason(&self, key: &PatternKey) -> (Store, StoreReason) {
        match key.consistency {
            Some(ConsistencyClass::Cache) | None => {
                (self.settings.cache_store, StoreReason::Configured)
            }
            Some(ConsistencyClass::Consistent) => {
                if let Some(learned) = self.learned_store.get(&key.resource) {
                    return (*learned, StoreReason::Learned);
                }
                match (self.settings.consistent_store, self.release) {
                    (StoreSetting::WatchCache, _) => (Store::WatchCache, StoreReason::Configured),
                    (StoreSetting::Etcd, _) => (Store::Etcd, StoreReason::Configured),
                    (StoreSetting::Auto, Some(r)) => {
                        (r.consistent_store(), StoreReason::VersionPrior)
                    }
                    (StoreSetting::Auto, None) => (Store::Etcd, StoreReason::UnknownVersion),
                }
            }
            Some(ConsistencyClass::Exact) => (self.settings.exact_store, StoreReason::Configured),
        }
    }

    /// Consistent LISTs forwarded so far, per resource.
    pub fn consistent_lists(&self) -> &HashMap<String, u64> {
        &self.consistent_lists
    }

    /// Learn which store serves consistent LISTs of `resource` from the
    /// apiserver's count of LISTs served from etcd (`storage_lists`) over an
    /// interval in which tollgate forwarded `consistent` consistent LISTs of
    /// it. Other clients only add etcd LISTs, so far fewer etcd LISTs than
    /// consistent ones means the watch cache served them (1.31+). Needs at
    /// least `MIN_EVIDENCE` requests; returns what was learned.
    pub fn learn_store(
        &mut self,
        resource: &str,
        storage_lists: f64,
        consistent: u64,
    ) -> Option<Store> {
        const MIN_EVIDENCE: u64 = 5;
        if consistent < MIN_EVIDENCE || !storage_lists.is_finite() || storage_lists < 0.0 {
            return None;
        }
        let store = if storage_lists < 0.5 * consistent as f64 {
            Store::WatchCache
        } else {
            Store::Etcd
        };
        self.learned_store.insert(resource.to_string(), store);
        Some(store)
    }

    /// What a full LIST of the key's resource returns: the decayed mean of
    /// observed ones, else (cluster scope) the scraped object count times the
    /// learned (or default) bytes per object.
    pub fn prior_bytes(&self, key: &PatternKey) -> Option<f64> {
        let learned = self.priors.get(&key.prior_key()).and_then(|p| {
            let plain = (p.plain_weight > 1e-9).then(|| p.plain_sum / p.plain_weight);
            let gzip =
                (p.gzip_weight > 1e-9).then(|| p.gzip_sum / p.gzip_weight * self.gzip_ratio(key));
            plain.or(gzip)
        });
        learned.or_else(|| {
            if key.scope != Scope::Cluster {
                return None;
            }
            let o = self.objects.get(&key.resource)?;
            Some(
                o.count
                    * o.bytes_per_object
                        .unwrap_or(self.settings.default_object_bytes),
            )
        })
    }

    /// The share of the resource's full state (`full` bytes) a narrowed
    /// request answers: one object, or one node's share (by the scraped
    /// node count; before it is known, a full node's worth of pods). Only
    /// the response: read from etcd, it still reads every object.
    fn narrowed(&self, key: &PatternKey, full: f64) -> f64 {
        let count = |resource: &str| self.object_count(resource).filter(|n| *n >= 1.0);
        let per_object = count(&key.resource)
            .map(|n| full / n)
            .unwrap_or(self.settings.default_object_bytes);
        match key.narrows_to() {
            Some(Narrow::OneObject) => full.min(per_object),
            Some(Narrow::OneNode) => match count("nodes") {
                Some(nodes) => full / nodes,
                None => full.min(MAX_PODS_PER_NODE * per_object),
            },
            None => full,
        }
    }

    /// Bytes one object of the key's resource is taken to weigh: learned
    /// (a full cluster LIST over the scraped count), else the full state's
    /// prior over the scraped count, else `patterns.defaultObjectBytes`.
    pub fn bytes_per_object(&self, key: &PatternKey, full: Option<f64>) -> f64 {
        let o = self.objects.get(&key.resource);
        o.and_then(|o| o.bytes_per_object)
            .or_else(|| {
                let n = o.map(|o| o.count).filter(|n| *n >= 1.0)?;
                full.map(|f| f / n)
            })
            .unwrap_or(self.settings.default_object_bytes)
    }

    /// A page (`limit`, and every `continue` page after it) reads and
    /// returns at most its limit's objects, not the resource's whole state:
    /// the page's bound is the upper end of its limit bucket (`limit<=500`:
    /// 500 objects) times [`Self::bytes_per_object`]. kubectl's continue
    /// pages, a pattern of their own (`exact limit<=500`) unlearned at
    /// first, were priced as a whole LIST of every pod, and refused.
    fn page_bound(&self, key: &PatternKey, full: Option<f64>) -> Option<f64> {
        match key.limit.0 {
            0 | u64::MAX => None,
            objects => Some(objects as f64 * self.bytes_per_object(key, full)),
        }
    }

    /// How many objects of `resource` the apiserver stores, if scraped.
    pub fn object_count(&self, resource: &str) -> Option<f64> {
        self.objects.get(resource).map(|o| o.count)
    }

    /// Record how many objects of `resource` (`pods`, `apps/deployments`) the
    /// apiserver stores, as its metrics say.
    pub fn set_object_count(&mut self, resource: &str, count: f64) {
        if !(count.is_finite() && count >= 0.0) {
            return;
        }
        self.objects
            .entry(resource.to_string())
            .and_modify(|o| o.count = count)
            .or_insert(ObjectCount {
                count,
                bytes_per_object: None,
            });
    }

    fn gzip_ratio(&self, key: &PatternKey) -> f64 {
        self.priors
            .get(&key.prior_key())
            .and_then(ResourcePrior::gzip_ratio)
            .unwrap_or(self.settings.gzip_ratio)
    }

    /// Predict what a request of this pattern will cost. Pure; `now` only
    /// ages the statistics read.
    pub fn predict(&self, key: &PatternKey, _now: Instant) -> Prediction {
        let learned = self.patterns.get(key).and_then(PatternStats::bytes_mean);
        let prior = if key.is_list_like() {
            self.prior_bytes(key)
        } else {
            None
        };
        let (response_bytes, source) = match (key.verb, learned, prior) {
            (_, Some(b), _) => (b, Source::Pattern),
            (_, None, Some(p)) => (self.narrowed(key, p), Source::Prior),
            (_, None, None) if key.is_list_like() => {
                (self.settings.default_list_bytes, Source::Default)
            }
            (_, None, None) => (self.settings.default_request_bytes, Source::Default),
        };
        // Learned, a page's pattern has its own mean; unlearned, it is a page, not the whole.
        let response_bytes = match self.page_bound(key, prior) {
            Some(page) if source != Source::Pattern && key.is_list_like() => {
                response_bytes.min(page)
            }
            _ => response_bytes,
        };
        let read_bytes = if !key.is_list_like() || self.store(key) == Store::WatchCache {
            0.0
        } else if key.has_selector() {
            prior
                .unwrap_or(self.settings.default_list_bytes)
                .max(response_bytes)
        } else {
            response_bytes
        };
        Prediction {
            response_bytes,
            read_bytes,
            source,
        }
    }

    /// Bytes of a response as uncompressed (gzip scaled by the learned ratio).
    pub fn uncompressed(&self, key: &PatternKey, bytes: u64, gzip: bool) -> f64 {
        if gzip {
            bytes as f64 * self.gzip_ratio(key)
        } else {
            bytes as f64
        }
    }

    /// A request of this pattern was rejected (`dry`: would have been).
    pub fn note_rejected(&mut self, key: &PatternKey, client: &str, dry: bool, now: Instant) {
        if !self.patterns.contains_key(key) && self.patterns.len() >= self.settings.capacity {
            self.evict(now);
        }
        let half_life = self.settings.half_life_seconds;
        let stats = self
            .patterns
            .entry(key.clone())
            .or_insert_with(|| PatternStats::new(now));
        stats.decay_to(now, half_life);
        if dry {
            stats.would_reject += 1;
        } else {
            stats.rejected += 1;
        }
        note_client(&mut stats.rejected_clients, client);
    }

    /// Learn from a finished request.
    pub fn observe(&mut self, key: &PatternKey, outcome: &Outcome, now: Instant) {
        let half_life = self.settings.half_life_seconds;
        // Only gzipped bytes are scaled; the lookup costs a key copy and a hash.
        let ratio = if outcome.gzip {
            self.gzip_ratio(key)
        } else {
            1.0
        };
        // A full LIST, or the initial state of an unfiltered streaming list.
        let full_state = match (key.verb, outcome.initial_bytes) {
            (PatternVerb::WatchList, Some(initial)) if !key.has_selector() => Some(initial),
            (PatternVerb::WatchList, _) => None,
            _ => (outcome.full_list
                && outcome.completion == Completion::End
                && is_success(outcome.status))
            .then_some(outcome.bytes),
        };
        if let Some(full_bytes) = full_state {
            let prior = self.priors.entry(key.prior_key()).or_insert(ResourcePrior {
                last: now,
                plain_weight: 0.0,
                plain_sum: 0.0,
                gzip_weight: 0.0,
                gzip_sum: 0.0,
            });
            prior.decay_to(now, half_life);
            if outcome.gzip {
                prior.gzip_weight += 1.0;
                prior.gzip_sum += full_bytes as f64;
            } else {
                prior.plain_weight += 1.0;
                prior.plain_sum += full_bytes as f64;
            }
            let uncompressed = if outcome.gzip {
                full_bytes as f64 * ratio
            } else {
                full_bytes as f64
            };
            match self.objects.get_mut(&key.resource) {
                Some(o) if key.scope == Scope::Cluster && o.count >= 1.0 => {
                    o.bytes_per_object = Some(uncompressed / o.count);
                }
                _ => {}
            }
        }
        // A known pattern (nearly every request) is found with one hash and no key copy.
        if !self.patterns.contains_key(key) {
            if self.patterns.len() >= self.settings.capacity {
                self.evict(now);
            }
            self.patterns.insert(key.clone(), PatternStats::new(now));
        }
        let Some(stats) = self.patterns.get_mut(key) else {
            return;
        };
        stats.decay_to(now, half_life);
        stats.weight += 1.0;
        stats.count += 1;
        note_client(&mut stats.clients, &outcome.client);
        if key.verb == PatternVerb::Api(apimodel::Verb::List)
            && key.consistency == Some(ConsistencyClass::Consistent)
        {
            *self
                .consistent_lists
                .entry(key.resource.clone())
                .or_default() += 1;
        }
        let scale = |b: u64| {
            if outcome.gzip {
                b as f64 * ratio
            } else {
                b as f64
            }
        };
        let complete = outcome.completion == Completion::End && is_success(outcome.status);
        // A watch-list's stream goes on after its initial state: only the
        // initial state (when its end was seen) is its size as a LIST.
        let sample = match key.verb {
            PatternVerb::WatchList => outcome.initial_bytes.map(scale),
            _ => complete.then(|| scale(outcome.bytes)),
        };
        if let Some(bytes) = sample {
            stats.bytes_weight += 1.0;
            stats.bytes_sum += bytes;
            stats.bytes_hist.add(bytes, 1.0);
        }
        if complete && key.verb != PatternVerb::WatchList {
            let ms = outcome.latency.as_secs_f64() * 1000.0;
            stats.latency_weight += 1.0;
            stats.latency_sum_ms += ms;
            stats.latency_hist.add(ms, 1.0);
        }
        match outcome.completion {
            Completion::End => stats.errors += u64::from(outcome.status >= 500),
            Completion::Error => stats.errors += 1,
            Completion::Cancelled => stats.cancelled += 1,
        }
    }

    /// How much a pattern matters: predicted cost times rate, with a floor
    /// on the rate so a heavy pattern seen once is not the first to go.
    fn heat(&self, key: &PatternKey, stats: &PatternStats) -> f64 {
        let rate = stats.rate(self.settings.half_life_seconds).max(1e-6);
        self.predict(key, stats.last).cost() * rate
    }

    /// Drop the coldest 10% (at least one pattern).
    fn evict(&mut self, now: Instant) {
        let half_life = self.settings.half_life_seconds;
        for stats in self.patterns.values_mut() {
            stats.decay_to(now, half_life);
        }
        let mut scored: Vec<(f64, PatternKey)> = self
            .patterns
            .iter()
            .map(|(k, s)| (self.heat(k, s), k.clone()))
            .collect();
        scored.sort_by(|a, b| a.0.total_cmp(&b.0));
        let n = (self.patterns.len() / 10).max(1);
        for (_, key) in scored.into_iter().take(n) {
            self.patterns.remove(&key);
        }
    }
}

fn is_success(status: u16) -> bool {
    (200..300).contains(&status)
}

#[cfg(test)]
mod tests;
