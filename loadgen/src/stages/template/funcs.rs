//! The template functions: Go's builtins, the sprig ones kwok's Stages use
//! (`dict`, `list`, `default`, `hasKey`), and kwok's own helpers (`Now`,
//! `Quote`, `YAML`, `Version`, `NodeConditions`, `NodeIP`, `NodeName`,
//! `NodePort`, `NodeIPWith`, `NodeIPsWith`, `PodIPWith`, `PodIPsWith`), and
//! ClusterLoader2's helpers (see [`super::cl2`]).
//!
//! kwok's node helpers answer with the controller's configured node; here a
//! node's IP is derived from its name (stable, distinct per node) and
//! `NodeName` is the node the rendered object is on.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde_json::{json, Map, Value};

use super::value::{print, truthy};

/// What the node helpers need to know about the object being rendered.
#[derive(Debug, Clone, Default)]
pub struct Env {
    /// The node: a Node's own name, a Pod's `spec.nodeName`.
    pub node_name: String,
    /// Where CL2's `IncludeFile`/`IncludeEmbedFile` read relative paths (the config's directory).
    pub include_dir: Option<std::path::PathBuf>,
}

pub type Func = fn(&Env, Vec<Value>) -> Result<Value, String>;
pub type Funcs = HashMap<&'static str, Func>;

/// The kubelet's port kwok reports for every node.
pub const NODE_PORT: u16 = 10250;

/// Every function a template may call.
pub fn all() -> &'static Funcs {
    static FUNCS: OnceLock<Funcs> = OnceLock::new();
    FUNCS.get_or_init(|| {
        let list: &[(&'static str, Func)] = &[
            ("and", and),
            ("or", or),
            ("not", not),
            ("eq", eq),
            ("ne", ne),
            ("lt", |_, a| cmp(a, |o| o.is_lt())),
            ("le", |_, a| cmp(a, |o| o.is_le())),
            ("gt", |_, a| cmp(a, |o| o.is_gt())),
            ("ge", |_, a| cmp(a, |o| o.is_ge())),
            ("len", len),
            ("index", index),
            ("print", |_, a| Ok(Value::String(print_all(&a, false)))),
            ("println", |_, a| {
                Ok(Value::String(print_all(&a, true) + "\n"))
            }),
            ("printf", printf),
            ("dict", dict),
            ("list", |_, a| Ok(Value::Array(a))),
            ("default", default),
            ("hasKey", has_key),
            ("Now", |_, _| Ok(Value::String(now_rfc3339_nanos()))),
            ("Quote", quote),
            ("YAML", yaml),
            ("Version", |_, _| {
                Ok(Value::String(env!("CARGO_PKG_VERSION").into()))
            }),
            ("NodeConditions", |_, _| Ok(node_conditions())),
            ("NodeIP", |env, _| {
                Ok(Value::String(node_ip(&env.node_name)))
            }),
            ("NodeName", |env, _| {
                Ok(Value::String(env.node_name.clone()))
            }),
            ("NodePort", |_, _| Ok(Value::from(NODE_PORT))),
            ("NodeIPWith", |_, a| {
                Ok(Value::String(node_ip(&str_arg(&a, 0))))
            }),
            ("NodeIPsWith", |_, a| Ok(json!([node_ip(&str_arg(&a, 0))]))),
            ("PodIPWith", |_, a| Ok(Value::String(pod_ip(&a)))),
            ("PodIPsWith", |_, a| Ok(json!([pod_ip(&a)]))),
        ];
        list.iter().chain(super::cl2::all()).copied().collect()
    })
}

fn str_arg(a: &[Value], i: usize) -> String {
    match a.get(i) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(v) => v.to_string(),
    }
}

fn print_all(a: &[Value], spaced: bool) -> String {
    let mut s = String::new();
    for (i, v) in a.iter().enumerate() {
        // Go's Print puts spaces only between operands that are not strings.
        let both_non_str = i > 0 && !a[i - 1].is_string() && !v.is_string();
        if i > 0 && (spaced || both_non_str) {
            s.push(' ');
        }
        print(v, &mut s);
    }
    s
}

fn and(_: &Env, a: Vec<Value>) -> Result<Value, String> {
    if a.is_empty() {
        return Err("wrong number of args: want at least 1".into());
    }
    let n = a.len();
    for (i, v) in a.into_iter().enumerate() {
        if !truthy(&v) || i + 1 == n {
            return Ok(v);
        }
    }
    Ok(Value::Null)
}

fn or(_: &Env, a: Vec<Value>) -> Result<Value, String> {
    if a.is_empty() {
        return Err("wrong number of args: want at least 1".into());
    }
    let n = a.len();
    for (i, v) in a.into_iter().enumerate() {
        if truthy(&v) || i + 1 == n {
            return Ok(v);
        }
    }
    Ok(Value::Null)
}

fn not(_: &Env, a: Vec<Value>) -> Result<Value, String> {
    match a.as_slice() {
        [v] => Ok(Value::Bool(!truthy(v))),
        _ => Err(format!("wrong number of args: want 1 got {}", a.len())),
    }
}

fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn eq(_: &Env, a: Vec<Value>) -> Result<Value, String> {
    let Some((first, rest)) = a.split_first() else {
        return Err("missing argument for comparison".into());
    };
    if rest.is_empty() {
        return Err("missing argument for comparison".into());
    }
    Ok(Value::Bool(rest.iter().any(|b| same(first, b))))
}

fn ne(_: &Env, a: Vec<Value>) -> Result<Value, String> {
    match a.as_slice() {
        [x, y] => Ok(Value::Bool(!same(x, y))),
        _ => Err(format!("wrong number of args: want 2 got {}", a.len())),
    }
}

fn cmp(a: Vec<Value>, ok: fn(std::cmp::Ordering) -> bool) -> Result<Value, String> {
    let [x, y] = a.as_slice() else {
        return Err(format!("wrong number of args: want 2 got {}", a.len()));
    };
    let o = match (x, y) {
        (Value::Number(p), Value::Number(q)) => p
            .as_f64()
            .partial_cmp(&q.as_f64())
            .ok_or("incomparable numbers")?,
        (Value::String(p), Value::String(q)) => p.cmp(q),
        _ => return Err(format!("incompatible types for comparison: {x} and {y}")),
    };
    Ok(Value::Bool(ok(o)))
}

fn len(_: &Env, a: Vec<Value>) -> Result<Value, String> {
    match a.as_slice() {
        [Value::String(s)] => Ok(Value::from(s.len())),
        [Value::Array(v)] => Ok(Value::from(v.len())),
        [Value::Object(m)] => Ok(Value::from(m.len())),
        [Value::Null] => Ok(Value::from(0)),
        [other] => Err(format!("len of {other}")),
        _ => Err(format!("wrong number of args: want 1 got {}", a.len())),
    }
}

fn index(_: &Env, a: Vec<Value>) -> Result<Value, String> {
    let mut it = a.into_iter();
    let mut v = it.next().ok_or("index of nothing")?;
    for k in it {
        v = match (&v, &k) {
            (Value::Object(m), Value::String(s)) => m.get(s).cloned().unwrap_or(Value::Null),
            (Value::Array(l), Value::Number(n)) => {
                let i = n.as_u64().ok_or_else(|| format!("bad index {n}"))?;
                l.get(usize::try_from(i).unwrap_or(usize::MAX))
                    .cloned()
                    .unwrap_or(Value::Null)
            }
            // kwok's templates index lists the object may not have yet.
            (Value::Null, _) => Value::Null,
            _ => return Err(format!("can't index {v} with {k}")),
        };
    }
    Ok(v)
}

fn printf(_: &Env, a: Vec<Value>) -> Result<Value, String> {
    let Some((Value::String(fmt), args)) = a.split_first() else {
        return Err("the first argument must be a format string".into());
    };
    let mut out = String::new();
    let mut args = args.iter();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some(verb @ ('s' | 'v' | 'd' | 'q' | 'f')) => {
                let Some(v) = args.next() else {
                    out.push_str(&format!("%!{verb}(MISSING)"));
                    continue;
                };
                match verb {
                    'q' => out.push_str(&quote_str(v)),
                    'f' => out.push_str(&format!("{:.6}", v.as_f64().unwrap_or(0.0))),
                    _ => print(v, &mut out),
                }
            }
            Some(other) => return Err(format!("unsupported printf verb %{other}")),
            None => out.push('%'),
        }
    }
    Ok(Value::String(out))
}

fn dict(_: &Env, a: Vec<Value>) -> Result<Value, String> {
    let mut m = Map::new();
    let mut it = a.into_iter();
    while let Some(k) = it.next() {
        let key = match k {
            Value::String(s) => s,
            other => other.to_string(),
        };
        m.insert(key, it.next().unwrap_or(Value::String(String::new())));
    }
    Ok(Value::Object(m))
}

fn default(_: &Env, a: Vec<Value>) -> Result<Value, String> {
    match a.as_slice() {
        [d, v] => Ok(if truthy(v) { v.clone() } else { d.clone() }),
        [d] => Ok(d.clone()),
        _ => Err(format!("wrong number of args: want 1 or 2 got {}", a.len())),
    }
}

fn has_key(_: &Env, a: Vec<Value>) -> Result<Value, String> {
    match a.as_slice() {
        [Value::Object(m), Value::String(k)] => Ok(Value::Bool(m.contains_key(k))),
        [Value::Null, _] => Ok(Value::Bool(false)),
        _ => Err("want a map and a key".into()),
    }
}

fn quote_str(v: &Value) -> String {
    match v {
        Value::String(_) => v.to_string(),
        other => {
            let mut s = String::new();
            print(other, &mut s);
            Value::String(s).to_string()
        }
    }
}

/// kwok's `Quote`: JSON encoding (a JSON string is a YAML string too).
fn quote(_: &Env, a: Vec<Value>) -> Result<Value, String> {
    match a.as_slice() {
        [v] => Ok(Value::String(v.to_string())),
        _ => Err(format!("wrong number of args: want 1 got {}", a.len())),
    }
}

/// kwok's `YAML v [indent]`: `v` as YAML; with an indent, every line after a
/// leading newline is indented by two spaces per level, to sit under a key.
fn yaml(_: &Env, a: Vec<Value>) -> Result<Value, String> {
    let (v, indent) = match a.as_slice() {
        [v] => (v, 0),
        [v, Value::Number(n)] => (v, n.as_u64().unwrap_or(0)),
        _ => return Err("want a value and an optional indent".into()),
    };
    let mut text = serde_saphyr::to_string(v).map_err(|e| e.to_string())?;
    if !text.ends_with('\n') {
        text.push('\n');
    }
    if indent > 0 {
        let pad = " ".repeat(usize::try_from(indent * 2).unwrap_or(0));
        text = format!("\n{text}").replace('\n', &format!("\n{pad}"));
    }
    Ok(Value::String(text))
}

/// The conditions of a healthy node, as kwok's `NodeConditions`.
pub fn node_conditions() -> Value {
    let c = |t: &str, s: &str, r: &str, m: &str| json!({"type": t, "status": s, "reason": r, "message": m});
    json!([
        c(
            "Ready",
            "True",
            "KubeletReady",
            "kubelet is posting ready status"
        ),
        c(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available"
        ),
        c(
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure"
        ),
        c(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available"
        ),
        c(
            "NetworkUnavailable",
            "False",
            "RouteCreated",
            "RouteController created a route"
        ),
    ])
}

fn fnv(parts: &[&str]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0)) {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
    }
    h
}

/// A node's IP: in 10.0.0.0/10, derived from its name.
pub fn node_ip(node: &str) -> String {
    let h = fnv(&[node]);
    format!("10.{}.{}.{}", (h >> 16) & 63, (h >> 8) & 255, (h & 253) + 1)
}

/// `PodIPWith node hostNetwork uid name namespace`: the node's IP for a
/// host-network pod, else one in 10.64.0.0/10 derived from the pod.
fn pod_ip(a: &[Value]) -> String {
    let node = str_arg(a, 0);
    if a.get(1).is_some_and(truthy) {
        return node_ip(&node);
    }
    let h = fnv(&[&node, &str_arg(a, 2), &str_arg(a, 3), &str_arg(a, 4)]);
    format!(
        "10.{}.{}.{}",
        64 + ((h >> 16) & 63),
        (h >> 8) & 255,
        (h & 253) + 1
    )
}

/// Wall-clock time as Go's `time.RFC3339Nano` in UTC.
pub fn now_rfc3339_nanos() -> String {
    let nanos = crate::ops::unix_nanos();
    let secs = crate::ops::rfc3339(nanos);
    let frac = nanos % 1_000_000_000;
    if frac == 0 {
        return secs;
    }
    let digits = format!("{frac:09}");
    format!(
        "{}.{}Z",
        secs.trim_end_matches('Z'),
        digits.trim_end_matches('0')
    )
}
