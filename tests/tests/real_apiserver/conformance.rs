//! Differential conformance: the same requests, in the same order, against the real
//! kube-apiserver and against `tollgate-bench sim`, each reply normalized (uids, resource
//! versions, timestamps, continue tokens) and compared whole: status code, Status bodies,
//! List and object shapes, watch event sequences, selector results.
//!
//! The table of cases is [`cases`]; `tests/CONFORMANCE.md` publishes it, and the test checks
//! that the published table says what the code does (regenerate it from the failure message).
//! A case either passes (identical after normalization) or is a deliberate difference: the
//! listed JSON pointers are left out of the comparison, for the reason given; the rest must
//! still agree, and a difference that disappears must be taken off the list.
//!
//! The sim answers as the release it is compared with (`--kube-version 1.20` or `1.37`); against
//! the current release a case may still differ ([`OnCurrent`]: what a newer apiserver does
//! that the sim does not model), which the table's last column gives, and a LIST case may name
//! the store that serves it there ([`Store`]), checked on both servers by their
//! `apiserver_storage_list_total`. A case may run against one release only (`only`).

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use serde_json::Value;
use tests::{KubeVersion, RealApiserver, SimProcess};

use super::{Http, Reply};

mod cases;
use cases::cases;

/// How the replies of a case are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// One JSON document (object, List or Status).
    Json,
    /// A watch stream: the sequence of events, each normalized.
    Watch,
}

/// One request, sent to both servers.
#[derive(Debug, Clone)]
struct Case {
    name: &'static str,
    area: &'static str,
    method: &'static str,
    /// With `${var}` placeholders, filled from each server's own captures.
    path: &'static str,
    body: Option<(&'static str, &'static str)>,
    shape: Shape,
    /// JSON pointers (into the normalized reply; into each event for watches) left out.
    ignore: &'static [&'static str],
    /// Why the ignored parts differ: set exactly when `ignore` is, or when only the status
    /// codes are compared (`codes_only`).
    difference: Option<&'static str>,
    /// The difference is a known bug of the sim (not deliberate), not fixed yet.
    sim_bug: bool,
    codes_only: bool,
    /// Not even the status codes are compared (a sim bug that changes them).
    uncompared: bool,
    /// Items (or events) sorted by name first: kube-apiserver's watch cache serves
    /// `resourceVersion=0` in no particular order.
    unordered: bool,
    /// `(var, pointer)`: values of this reply kept for later cases' `${var}`.
    capture: &'static [(&'static str, &'static str)],
    /// Sent this many times (`${i}` in the body is the round), the last reply compared.
    times: usize,
    /// Sent again (within [`POLL_DEADLINE`]) until the status code is this one: for what the
    /// real apiserver does on its own clock (etcd compaction).
    until_code: Option<u16>,
    /// How the current release differs beyond the above.
    on_current: Option<OnCurrent>,
    /// Run against this release only, because (the other answers otherwise, and the sim
    /// does not model that).
    only: Option<(KubeVersion, &'static str)>,
    /// On the current release: `(resource, store)` that serves this LIST, checked on both
    /// servers by their `apiserver_storage_list_total{resource, storage}` growing for that
    /// store only.
    served_from: Option<(&'static str, Store)>,
}

/// Which store served a LIST, as `apiserver_storage_list_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    Etcd,
    WatchCache,
}

impl Store {
    fn label(self) -> &'static str {
        match self {
            Store::Etcd => "etcd",
            Store::WatchCache => "watchcache",
        }
    }
}

/// A difference only the current release has, on top of the case's own.
#[derive(Debug, Clone, Copy)]
struct OnCurrent {
    /// More JSON pointers left out.
    ignore: &'static [&'static str],
    /// Only the status codes are compared.
    codes_only: bool,
    /// Not even the status codes are compared.
    uncompared: bool,
    why: &'static str,
}

/// How a case is compared against one version: the case's own difference, and on the current
/// release its [`OnCurrent`] too.
#[derive(Debug)]
struct Verdict {
    ignore: Vec<&'static str>,
    difference: bool,
    codes_only: bool,
    uncompared: bool,
}

/// How long a case with `until_code` may keep asking.
const POLL_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

impl Case {
    fn body(mut self, content_type: &'static str, body: &'static str) -> Self {
        self.body = Some((content_type, body));
        self
    }
    fn unordered(mut self) -> Self {
        self.unordered = true;
        self
    }
    fn watch(mut self) -> Self {
        self.shape = Shape::Watch;
        self
    }
    fn capture(mut self, capture: &'static [(&'static str, &'static str)]) -> Self {
        self.capture = capture;
        self
    }
    fn differs(mut self, ignore: &'static [&'static str], reason: &'static str) -> Self {
        self.ignore = ignore;
        self.difference = Some(reason);
        self
    }
    fn times(mut self, n: usize) -> Self {
        self.times = n;
        self
    }
    fn until_code(mut self, code: u16) -> Self {
        self.until_code = Some(code);
        self
    }
    /// On the current release, `ignore` is left out too, because `why`.
    fn differs_on_current(mut self, ignore: &'static [&'static str], why: &'static str) -> Self {
        self.on_current = Some(OnCurrent {
            ignore,
            codes_only: false,
            uncompared: false,
            why,
        });
        self
    }
    /// On the current release, only the status codes are compared, because `why`.
    fn codes_only_on_current(mut self, why: &'static str) -> Self {
        self.on_current = Some(OnCurrent {
            ignore: &[],
            codes_only: true,
            uncompared: false,
            why,
        });
        self
    }
    /// On the current release, nothing is compared (the status codes differ), because `why`.
    fn uncompared_on_current(mut self, why: &'static str) -> Self {
        self.on_current = Some(OnCurrent {
            ignore: &[],
            codes_only: true,
            uncompared: true,
            why,
        });
        self
    }
    /// Run against the current release only, because `why`.
    fn only_current(mut self, why: &'static str) -> Self {
        self.only = Some((KubeVersion::Current, why));
        self
    }
    /// On the current release, served from `store` (checked on both servers).
    fn served_from(mut self, resource: &'static str, store: Store) -> Self {
        self.served_from = Some((resource, store));
        self
    }
    fn runs_on(&self, version: KubeVersion) -> bool {
        self.only.is_none_or(|(v, _)| v == version)
    }
    /// How it is compared against `version`.
    fn verdict(&self, version: KubeVersion) -> Verdict {
        let mut v = Verdict {
            ignore: self.ignore.to_vec(),
            difference: self.difference.is_some(),
            codes_only: self.codes_only,
            uncompared: self.uncompared,
        };
        if let (KubeVersion::Current, Some(more)) = (version, self.on_current) {
            v.ignore.extend_from_slice(more.ignore);
            v.difference = true;
            v.codes_only |= more.codes_only;
            v.uncompared |= more.uncompared;
        }
        v
    }
    /// A known bug of the sim, left out of the comparison until it is fixed. Every bug the
    /// table found so far is fixed; the next one found is listed with this.
    #[allow(dead_code)]
    fn sim_bug(mut self, ignore: &'static [&'static str], what: &'static str) -> Self {
        self.ignore = ignore;
        self.difference = Some(what);
        self.sim_bug = true;
        self
    }
}

/// What a server answered, normalized for comparison.
#[derive(Debug)]
struct Normalized {
    code: u16,
    value: Value,
}

/// Per-server state: the endpoint and its captures.
struct Side {
    name: &'static str,
    http: Http,
    vars: HashMap<String, String>,
}

impl Side {
    fn fill(&self, template: &str) -> anyhow::Result<String> {
        let mut out = template.to_string();
        while let Some(start) = out.find("${") {
            let end = out[start..].find('}').context("unclosed ${")? + start;
            let var = &out[start + 2..end];
            let value = self
                .vars
                .get(var)
                .with_context(|| format!("{}: no captured ${{{var}}}", self.name))?;
            out.replace_range(start..=end, value);
        }
        Ok(out)
    }

    fn run(&mut self, c: &Case, ignore: &[&str]) -> anyhow::Result<(Reply, Normalized)> {
        let path = self.fill(c.path)?;
        let deadline = std::time::Instant::now() + POLL_DEADLINE;
        let mut round = 0;
        let reply = loop {
            self.vars.insert("i".into(), round.to_string());
            let body = c
                .body
                .map(|(t, b)| self.fill(b).map(|b| (t, b)))
                .transpose()?;
            let body = body.as_ref().map(|(t, b)| (*t, b.as_str()));
            let reply = self.http.send(c.method, &path, body, &[])?;
            round += 1;
            let again = match c.until_code {
                Some(code) => reply.code != code && std::time::Instant::now() < deadline,
                None => round < c.times,
            };
            if !again {
                break reply;
            }
            if c.until_code.is_some() {
                // The apiserver compacts on its own clock: ask again a little later.
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
        };
        let value = match c.shape {
            Shape::Json => reply.json().unwrap_or_else(|_| Value::String(reply.text())),
            Shape::Watch => Value::Array(reply.events()?),
        };
        if reply.code < 300 {
            for (var, pointer) in c.capture {
                let v = value
                    .pointer(pointer)
                    .and_then(Value::as_str)
                    .with_context(|| {
                        format!("{}: no {pointer} to capture in {value}", self.name)
                    })?;
                self.vars.insert(var.to_string(), v.to_string());
            }
        }
        let mut value = normalize(value);
        if c.unordered {
            sort_by_name(&mut value);
        }
        for pointer in ignore {
            match c.shape {
                Shape::Json => remove_pointer(&mut value, pointer),
                Shape::Watch => {
                    if let Value::Array(events) = &mut value {
                        events.iter_mut().for_each(|e| remove_pointer(e, pointer));
                    }
                }
            }
        }
        Ok((
            reply.clone(),
            Normalized {
                code: reply.code,
                value,
            },
        ))
    }
}

/// Values that differ between any two servers by nature, replaced by placeholders; and the
/// differences every case shares (listed in CONFORMANCE.md as global deliberate differences).
fn normalize(mut v: Value) -> Value {
    walk(&mut v, None);
    v
}

fn walk(v: &mut Value, key: Option<&str>) {
    match v {
        Value::Object(map) => {
            for (k, placeholder) in [
                ("uid", "<uid>"),
                ("resourceVersion", "<rv>"),
                ("creationTimestamp", "<time>"),
                ("continue", "<continue>"),
                ("renewTime", "<time>"),
                ("acquireTime", "<time>"),
                ("lastTransitionTime", "<time>"),
                ("deletionTimestamp", "<time>"),
            ] {
                if let Some(x) = map.get_mut(k) {
                    if x.is_string() && !x.as_str().is_some_and(str::is_empty) {
                        *x = Value::String(placeholder.into());
                    }
                }
            }
            // A Service's addresses come from each server's own range: the shape is compared.
            for k in ["clusterIP", "clusterIPs"] {
                match map.get_mut(k) {
                    Some(Value::String(ip)) if ip.parse::<std::net::IpAddr>().is_ok() => {
                        *ip = "<cluster-ip>".into();
                    }
                    Some(Value::Array(ips)) => ips.iter_mut().for_each(|x| {
                        if x.as_str()
                            .is_some_and(|ip| ip.parse::<std::net::IpAddr>().is_ok())
                        {
                            *x = "<cluster-ip>".into();
                        }
                    }),
                    _ => {}
                }
            }
            // Global: server-side apply's field manager records (1.18+), not modelled by the sim.
            map.remove("managedFields");
            for (k, child) in map.iter_mut() {
                walk(child, Some(k));
            }
            // Global: the namespace name label is 1.21+; the sim speaks a newer API than 1.20.
            if let Some(Value::Object(labels)) = map.get_mut("labels") {
                labels.remove("kubernetes.io/metadata.name");
                if labels.is_empty() {
                    map.remove("labels");
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| walk(i, key)),
        // A uid quoted elsewhere (a Job's `controller-uid` label and selector).
        Value::String(s) if is_uuid(s.as_bytes()) => *s = "<uid>".into(),
        Value::String(s) if key == Some("message") => {
            // Messages quote resource versions and uids; the words must match.
            *s = mask_numbers(s);
        }
        _ => {}
    }
}

/// Items of a List, or the events of a watch, in name order.
fn sort_by_name(v: &mut Value) {
    let name = |x: &Value| {
        let meta = x.pointer("/object/metadata").unwrap_or(&x["metadata"]);
        meta["name"].as_str().unwrap_or("").to_string()
    };
    let items = match v {
        Value::Array(events) => Some(events),
        Value::Object(list) => list.get_mut("items").and_then(Value::as_array_mut),
        _ => None,
    };
    if let Some(items) = items {
        items.sort_by_key(name);
    }
}

/// UUIDs replaced by `<uid>`, then digit runs by `N`.
fn mask_numbers(s: &str) -> String {
    let mut s = s.to_string();
    let mut i = 0;
    while i + 36 <= s.len() {
        if s.is_char_boundary(i) && s.is_char_boundary(i + 36) && is_uuid(&s.as_bytes()[i..i + 36])
        {
            s.replace_range(i..i + 36, "<uid>");
        }
        i += 1;
    }
    let mut out = String::new();
    let mut in_digits = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('N');
            }
            in_digits = true;
        } else {
            in_digits = false;
            out.push(c);
        }
    }
    out
}

fn is_uuid(w: &[u8]) -> bool {
    w.len() == 36
        && w.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

fn remove_pointer(v: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    if let Some(Value::Object(map)) = v.pointer_mut(parent) {
        map.remove(&last);
    }
}

/// The published table's rows for `cases`.
fn table(cases: &[Case]) -> String {
    let mut out = String::from(
        "| # | case | area | request | verdict (1.20.2) | on the current release |\n\
         |---|---|---|---|---|---|\n",
    );
    for (i, c) in cases.iter().enumerate() {
        let verdict = match (c.difference, c.codes_only) {
            _ if !c.runs_on(KubeVersion::V1_20) => {
                format!("not run: {}", c.only.map_or("", |(_, why)| why))
            }
            (None, _) => "pass".to_string(),
            (Some(why), _) if c.uncompared => {
                format!("**sim bug, not fixed** (not compared): {why}")
            }
            (Some(why), true) if c.sim_bug => {
                format!("**sim bug, not fixed** (status codes compared only): {why}")
            }
            (Some(why), _) if c.sim_bug => format!(
                "**sim bug, not fixed** (`{}` not compared): {why}",
                c.ignore.join("`, `")
            ),
            (Some(why), true) => {
                format!("deliberate difference (status codes compared only): {why}")
            }
            (Some(why), false) => format!(
                "deliberate difference (`{}` not compared): {why}",
                c.ignore.join("`, `")
            ),
        };
        let mut on_current = match c.on_current {
            None if !c.runs_on(KubeVersion::V1_20) => "pass".to_string(),
            None => "as on 1.20".to_string(),
            Some(d) if d.uncompared => format!("deliberate difference (not compared): {}", d.why),
            Some(d) if d.codes_only => format!(
                "deliberate difference (status codes compared only): {}",
                d.why
            ),
            Some(d) => format!(
                "deliberate difference (`{}` also not compared): {}",
                d.ignore.join("`, `"),
                d.why
            ),
        };
        if let Some((_, store)) = c.served_from {
            on_current.push_str(&format!(
                "; served from {} on both (`apiserver_storage_list_total`)",
                match store {
                    Store::Etcd => "etcd",
                    Store::WatchCache => "the watch cache",
                }
            ));
        }
        let request = format!("`{} {}`", c.method, c.path.replace('|', "%7C"));
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            i + 1,
            c.name,
            c.area,
            request,
            verdict,
            on_current
        ));
    }
    out
}

const TABLE_START: &str =
    "<!-- cases: generated from tests/tests/real_apiserver/conformance.rs -->";
const TABLE_END: &str = "<!-- end of cases -->";

per_version!(the_simulator_answers_as_the_real_apiserver);

fn the_simulator_answers_as_the_real_apiserver(version: KubeVersion) -> anyhow::Result<()> {
    let cases = cases();
    assert!(cases.len() >= 40, "{} cases", cases.len());
    for c in &cases {
        assert!(
            c.on_current
                .is_none_or(|d| d.uncompared || d.codes_only || !d.ignore.is_empty()),
            "{}: a difference on the current release leaves something out",
            c.name
        );
        assert_eq!(
            c.difference.is_some(),
            !c.ignore.is_empty() || c.codes_only,
            "{}",
            c.name
        );
    }
    // Both forget old revisions within the test: etcd compacted every 10 s (a revision goes
    // 10–20 s after it was written; the cases that need one are done well before), the sim
    // keeping 40 revisions (the 60 patches push the early ones out).
    let kube = RealApiserver::start_version(version, &["--etcd-compaction-interval=10s"])?;
    // The sim answers as the release it is compared with (`--kube-version`).
    let kube_version = match version {
        KubeVersion::V1_20 => "1.20",
        KubeVersion::Current => "1.37",
    };
    let sim = SimProcess::start(&["--history-window", "40", "--kube-version", kube_version])?;
    let scratch = tempfile::tempdir()?;
    let mut real = Side {
        name: "kube-apiserver",
        http: Http::new(&kube.url, scratch.path())
            .with_cacert(kube.file("KUBE_CA_CERT")?)
            .with_cert(kube.file("KUBE_ADMIN_CERT")?, kube.file("KUBE_ADMIN_KEY")?),
        vars: HashMap::new(),
    };
    let mut simulated = Side {
        name: "sim",
        http: Http::new(&sim.url, scratch.path()),
        vars: HashMap::new(),
    };

    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        if !c.runs_on(version) {
            continue;
        }
        let verdict = c.verdict(version);
        let store_check = c
            .served_from
            .filter(|_| version == KubeVersion::Current)
            .map(|(resource, store)| {
                anyhow::Ok((
                    resource,
                    store,
                    list_counts(&real.http, resource)?,
                    list_counts(&simulated.http, resource)?,
                ))
            })
            .transpose()?;
        // Both at once: watches last their timeoutSeconds.
        let (r, s) = std::thread::scope(|scope| {
            let r = scope.spawn(|| real.run(c, &verdict.ignore));
            let s = simulated.run(c, &verdict.ignore);
            (r.join(), s)
        });
        let r = r.map_err(|_| anyhow::anyhow!("case {} panicked", c.name))?;
        let ((real_reply, r), (sim_reply, s)) = (
            r.with_context(|| format!("case {} on kube-apiserver", c.name))?,
            s.with_context(|| format!("case {} on the sim", c.name))?,
        );
        let same = if verdict.uncompared {
            true
        } else if verdict.codes_only {
            r.code == s.code
        } else {
            r.code == s.code && r.value == s.value
        };
        let label = format!("#{} {}", i + 1, c.name);
        if let Some((resource, store, real_before, sim_before)) = store_check {
            for (side, http, before) in [
                ("kube-apiserver", &real.http, real_before),
                ("sim", &simulated.http, sim_before),
            ] {
                let after = list_counts(http, resource)?;
                let grew = |s: Store| {
                    after.get(s.label()).copied().unwrap_or(0.0)
                        - before.get(s.label()).copied().unwrap_or(0.0)
                };
                let other = match store {
                    Store::Etcd => Store::WatchCache,
                    Store::WatchCache => Store::Etcd,
                };
                if grew(store) < 1.0 || grew(other) != 0.0 {
                    failures.push(format!(
                        "{label}: {side} served it from {} LISTs from {} and {} from {} \
                         (apiserver_storage_list_total{{resource=\"{resource}\"}}), not from {} only",
                        grew(store),
                        store.label(),
                        grew(other),
                        other.label(),
                        store.label()
                    ));
                }
            }
        }
        if !same {
            failures.push(format!(
                "{label}: differs\n  kube-apiserver {}: {}\n  sim            {}: {}",
                r.code,
                compact(&r.value),
                s.code,
                compact(&s.value)
            ));
        } else if verdict.difference && !verdict.codes_only {
            // A deliberate difference that no longer differs must leave the list.
            let (full_r, full_s) = (
                normalize_reply(&real_reply, c.shape),
                normalize_reply(&sim_reply, c.shape),
            );
            if full_r == full_s {
                failures.push(format!(
                    "{label}: listed as a deliberate difference but identical now"
                ));
            }
        }
        // A difference listed for the current release must still be one: compared as on 1.20.
        if let (KubeVersion::Current, Some(_)) = (version, c.on_current) {
            let as_on_1_20 = |reply: &Reply| {
                let mut v = normalize_reply(reply, c.shape);
                if c.unordered {
                    sort_by_name(&mut v);
                }
                for pointer in c.ignore {
                    match (&mut v, c.shape) {
                        (Value::Array(events), Shape::Watch) => {
                            events.iter_mut().for_each(|e| remove_pointer(e, pointer))
                        }
                        (v, _) => remove_pointer(v, pointer),
                    }
                }
                (reply.code, v)
            };
            let old_verdict = c.verdict(KubeVersion::V1_20);
            let (old_r, old_s) = (as_on_1_20(&real_reply), as_on_1_20(&sim_reply));
            let still_same = if old_verdict.codes_only {
                old_r.0 == old_s.0
            } else {
                old_r == old_s
            };
            if still_same {
                failures.push(format!(
                    "{label}: listed as a difference on the current release but it answers as \
                     1.20 does now (take off its on_current)"
                ));
            }
        }
    }
    // The published table says what the code does.
    let published_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("CONFORMANCE.md");
    let published = std::fs::read_to_string(&published_path).unwrap_or_default();
    let expected = table(&cases);
    let current = published
        .split_once(TABLE_START)
        .and_then(|(_, rest)| rest.split_once(TABLE_END))
        .map(|(t, _)| t.trim().to_string());
    if current.as_deref() != Some(expected.trim()) {
        failures.push(format!(
            "{} is out of date; the table between its markers must be:\n{TABLE_START}\n{expected}{TABLE_END}",
            published_path.display()
        ));
    }

    anyhow::ensure!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    drop(sim);
    drop(kube);
    Ok(())
}

/// `apiserver_storage_list_total` for `resource`, by its `storage` label.
fn list_counts(http: &Http, resource: &str) -> anyhow::Result<HashMap<String, f64>> {
    let text = http.get("/metrics")?.expect(200, "/metrics")?.text();
    let mut out = HashMap::new();
    for s in kubeio::promtext::samples(&text) {
        if s.name == "apiserver_storage_list_total"
            && s.label("resource").is_some_and(|r| r == resource)
        {
            let store = s
                .label("storage")
                .map_or("etcd".to_string(), |x| x.to_string());
            *out.entry(store).or_default() += s.value;
        }
    }
    Ok(out)
}

fn normalize_reply(reply: &Reply, shape: Shape) -> Value {
    normalize(match shape {
        Shape::Json => reply.json().unwrap_or_else(|_| Value::String(reply.text())),
        Shape::Watch => Value::Array(reply.events().unwrap_or_default()),
    })
}

fn compact(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 1500 {
        format!(
            "{}…",
            &s[..s.char_indices().nth(1500).map_or(s.len(), |(i, _)| i)]
        )
    } else {
        s
    }
}
