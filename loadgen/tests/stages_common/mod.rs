//! What the Stage tests share: kwok's Stage documents (byte-identical copies in
//! tests/testdata/kwok), loading them, and a strategic merge good enough to play
//! the server's part.

use std::path::PathBuf;

use loadgen::stages::StageSet;
use serde_json::Value;

/// A file of tests/testdata/kwok.
pub fn testdata(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/testdata/kwok")
        .join(rel)
}

/// The Stages of these testdata files, in order.
pub fn load(rels: &[&str]) -> StageSet {
    let mut set = StageSet::default();
    for rel in rels {
        let path = testdata(rel);
        let more = StageSet::load_file(&path)
            .unwrap_or_else(|e| panic!("{} does not load: {e}", path.display()));
        set.stages.extend(more.stages);
    }
    set
}

/// A strategic merge good enough for status: maps merged, lists of maps
/// merged by `type` or `name`, other lists replaced, null removes.
pub fn merge(doc: &mut Value, patch: &Value) {
    match (doc, patch) {
        (Value::Object(d), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    d.remove(k);
                    continue;
                }
                let slot = d.entry(k.clone()).or_insert(Value::Null);
                if slot.is_null() {
                    *slot = v.clone();
                } else {
                    merge(slot, v);
                }
            }
        }
        (Value::Array(d), Value::Array(p)) => {
            let key = |v: &Value| {
                ["type", "name"].iter().find_map(|k| {
                    v.get(*k)
                        .and_then(Value::as_str)
                        .map(|s| (*k, s.to_string()))
                })
            };
            if p.iter().all(|v| key(v).is_some()) {
                for item in p {
                    let k = key(item);
                    match d.iter_mut().find(|x| key(x) == k) {
                        Some(x) => merge(x, item),
                        None => d.push(item.clone()),
                    }
                }
            } else {
                *d = p.clone();
            }
        }
        (d, p) => *d = p.clone(),
    }
}
