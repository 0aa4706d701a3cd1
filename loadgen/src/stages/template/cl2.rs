//! ClusterLoader2's template helpers (`pkg/config/template_functions.go`),
//! so CL2 test configs and object templates render unchanged: arithmetic on
//! ints and floats (numbers or numeric strings, as CL2's `toFloat64`),
//! `DefaultParam`, `IfThenElse`, `Seq`/`SliceOfZeros`/`Loop`, `StringSplit`,
//! `Lowercase`, `Concat`, `Ceil`, `Mod`, `RandInt`, `RandIntRange`, `RandData`,
//! `RandDataWithSeed`, `YamlQuote`, `ExpandEnv`, `IncludeFile` and `IncludeEmbedFile` (also
//! spelled `IncludeEmbeddedFile`).
//!
//! Differences: both include helpers read relative paths from the config's
//! directory ([`Env::include_dir`]); CL2's `IncludeFile` reads them relative to
//! its binary, which has no meaning for loadgen. A float that is a whole
//! number prints without a fraction (`MultiplyFloat 2 1.5` → `3`), where Go
//! would print large ones in exponent form. `RandDataWithSeed` gives the same
//! string for the same seed, as CL2's does, but not CL2's bytes (its generator
//! is Go's `math/rand`).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::funcs::{Env, Func};

/// The CL2 helpers, by name.
pub fn all() -> &'static [(&'static str, Func)] {
    &[
        ("AddFloat", |_, a| {
            float(a.iter().map(num).sum::<Result<f64, _>>()?)
        }),
        ("AddInt", |_, a| {
            int(a.iter().map(num).sum::<Result<f64, _>>()?)
        }),
        ("SubtractFloat", |_, a| {
            two(&a).and_then(|(x, y)| float(x - y))
        }),
        ("SubtractInt", |_, a| two(&a).and_then(|(x, y)| int(x - y))),
        ("MultiplyFloat", |_, a| {
            float(a.iter().map(num).product::<Result<f64, _>>()?)
        }),
        ("MultiplyInt", |_, a| {
            int(a.iter().map(num).product::<Result<f64, _>>()?)
        }),
        ("DivideFloat", |_, a| {
            two(&a).and_then(|(x, y)| divide(x, y).and_then(float))
        }),
        ("DivideInt", |_, a| {
            two(&a).and_then(|(x, y)| divide(x, y).and_then(int))
        }),
        ("MaxFloat", |_, a| extreme(&a, f64::max).and_then(float)),
        ("MaxInt", |_, a| extreme(&a, f64::max).and_then(int)),
        ("MinFloat", |_, a| extreme(&a, f64::min).and_then(float)),
        ("MinInt", |_, a| extreme(&a, f64::min).and_then(int)),
        ("Mod", |_, a| {
            let (x, y) = two(&a)?;
            let (x, y) = (x as i64, y as i64);
            if y == 0 {
                return Err("Mod: division by zero".into());
            }
            Ok(Value::from(x % y))
        }),
        ("Ceil", |_, a| one(&a).and_then(|x| float(x.ceil()))),
        ("DefaultParam", |_, a| match a.as_slice() {
            [Value::Null, d] => Ok(d.clone()),
            [v, _] => Ok(v.clone()),
            _ => Err(format!("DefaultParam: want 2 arguments, got {}", a.len())),
        }),
        ("IfThenElse", |_, a| match a.as_slice() {
            [Value::Bool(c), then, other] => Ok(if *c { then.clone() } else { other.clone() }),
            [c, _, _] => Err(format!("IfThenElse: the condition {c} is not a bool")),
            _ => Err(format!("IfThenElse: want 3 arguments, got {}", a.len())),
        }),
        ("Seq", |_, a| zeros(&a)),
        ("SliceOfZeros", |_, a| zeros(&a)),
        ("Loop", |_, a| {
            let n = size(&a)?;
            Ok(Value::Array((0..n).map(Value::from).collect()))
        }),
        ("StringSplit", |_, a| {
            let s = text(&a, "StringSplit")?;
            Ok(Value::Array(
                s.split(',').map(|p| Value::String(p.into())).collect(),
            ))
        }),
        ("Lowercase", |_, a| {
            Ok(Value::String(text(&a, "Lowercase")?.to_lowercase()))
        }),
        ("RandInt", |_, a| {
            let n = one(&a)? as i64;
            Ok(Value::from(rand::rng().random_range(0..=n.max(0))))
        }),
        ("RandIntRange", |_, a| {
            let (lo, hi) = two(&a)?;
            let (lo, hi) = (lo as i64, hi as i64);
            Ok(Value::from(if lo >= hi {
                lo
            } else {
                rand::rng().random_range(lo..=hi)
            }))
        }),
        ("RandData", |_, a| {
            let n = size(&a)?;
            Ok(Value::String(rand_string(&mut rand::rng(), n)))
        }),
        ("RandDataWithSeed", |_, a| match a.as_slice() {
            [n, Value::String(seed)] => {
                let n = size(std::slice::from_ref(n))?;
                // The same seed gives the same data (CL2's promise); the
                // generator is ours, so the bytes differ from CL2's.
                let digest = Sha256::digest(seed.as_bytes());
                let mut first = [0u8; 8];
                first.copy_from_slice(&digest[..8]);
                let mut rng = StdRng::seed_from_u64(u64::from_be_bytes(first));
                Ok(Value::String(rand_string(&mut rng, n)))
            }
            _ => Err("RandDataWithSeed: want a length and a string seed".into()),
        }),
        ("Concat", |_, a| {
            let mut out = String::new();
            for v in &a {
                match v {
                    Value::String(s) => out.push_str(s),
                    other => return Err(format!("Concat: {other} is not a string")),
                }
            }
            Ok(Value::String(out))
        }),
        ("YamlQuote", |_, a| match a.as_slice() {
            [Value::String(s), tabs] => {
                let indent = "  ".repeat(num(tabs)? as usize);
                // A JSON string is a YAML double-quoted scalar.
                let quoted = serde_json::to_string(s).map_err(|e| e.to_string())?;
                Ok(Value::String(quoted.replace('\n', &format!("\n{indent}"))))
            }
            _ => Err("YamlQuote: want a string and a number of tabs".into()),
        }),
        ("ExpandEnv", |_, a| {
            Ok(Value::String(expand_env(&text(&a, "ExpandEnv")?)))
        }),
        ("IncludeFile", include),
        ("IncludeEmbedFile", include),
        ("IncludeEmbeddedFile", include),
    ]
}

/// CL2's `toFloat64`: numbers, and strings that parse as one.
fn num(v: &Value) -> Result<f64, String> {
    match v {
        Value::Number(n) => n
            .as_f64()
            .ok_or_else(|| format!("cannot cast {n} to float64")),
        Value::String(s) => s
            .trim()
            .parse()
            .map_err(|_| format!("cannot cast {s:?} to float64")),
        Value::Null => {
            Err("cannot cast <no value> to float64 (a parameter without DefaultParam?)".into())
        }
        other => Err(format!("cannot cast {other} to float64")),
    }
}

fn one(a: &[Value]) -> Result<f64, String> {
    match a {
        [x] => num(x),
        _ => Err(format!("want 1 argument, got {}", a.len())),
    }
}

fn two(a: &[Value]) -> Result<(f64, f64), String> {
    match a {
        [x, y] => Ok((num(x)?, num(y)?)),
        _ => Err(format!("want 2 arguments, got {}", a.len())),
    }
}

fn divide(x: f64, y: f64) -> Result<f64, String> {
    if y == 0.0 {
        return Err("division by zero".into());
    }
    Ok(x / y)
}

fn extreme(a: &[Value], pick: fn(f64, f64) -> f64) -> Result<f64, String> {
    let mut it = a.iter().map(num);
    let first = it.next().ok_or("want at least 1 argument")??;
    it.try_fold(first, |m, x| Ok(pick(m, x?)))
}

/// Go's `int(f)`: truncated toward zero.
fn int(f: f64) -> Result<Value, String> {
    if !f.is_finite() {
        return Err(format!("{f} is not a number"));
    }
    Ok(Value::from(f.trunc() as i64))
}

fn float(f: f64) -> Result<Value, String> {
    if f.fract() == 0.0 && f.abs() < 1e15 {
        return Ok(Value::from(f as i64));
    }
    serde_json::Number::from_f64(f)
        .map(Value::Number)
        .ok_or_else(|| format!("{f} is not a number"))
}

fn size(a: &[Value]) -> Result<usize, String> {
    let n = one(a)?;
    // Bounded: a typo must not allocate the machine away.
    if !(0.0..=1e6).contains(&n) {
        return Err(format!("size {n} is outside 0..=1000000"));
    }
    Ok(n as usize)
}

/// `n` characters of CL2's alphabet (digits and ASCII letters).
fn rand_string(rng: &mut impl Rng, n: usize) -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    (0..n)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

fn zeros(a: &[Value]) -> Result<Value, String> {
    Ok(Value::Array(vec![Value::from(0); size(a)?]))
}

fn text(a: &[Value], f: &str) -> Result<String, String> {
    match a {
        [Value::String(s)] => Ok(s.clone()),
        _ => Err(format!("{f}: want one string")),
    }
}

/// `$VAR` and `${VAR}` replaced by the environment's value (empty if unset), as Go's `os.ExpandEnv`.
fn expand_env(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, used) = if let Some(braced) = after.strip_prefix('{') {
            match braced.find('}') {
                Some(end) => (&braced[..end], end + 2),
                None => ("", 0),
            }
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        if used == 0 {
            out.push('$');
            rest = after;
            continue;
        }
        out.push_str(&std::env::var(name).unwrap_or_default());
        rest = &after[used..];
    }
    out.push_str(rest);
    out
}

fn include(env: &Env, a: Vec<Value>) -> Result<Value, String> {
    let name = text(&a, "IncludeFile")?;
    let path = std::path::PathBuf::from(expand_env(&name));
    let path = match &env.include_dir {
        Some(dir) if path.is_relative() => dir.join(path),
        _ => path,
    };
    std::fs::read_to_string(&path)
        .map(Value::String)
        .map_err(|e| format!("unable to read file {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::stages::template::{Env, Template};

    fn render(src: &str, data: serde_json::Value) -> String {
        let env = Env {
            include_dir: Some(std::env::temp_dir()),
            ..Env::default()
        };
        Template::parse(src)
            .expect("parse")
            .render(&data, &env)
            .expect("render")
    }

    #[test]
    fn arithmetic_as_cl2_computes_it() {
        let d = json!({"Nodes": 100, "Ratio": "0.5"});
        assert_eq!(render("{{MultiplyInt .Nodes 3 .Ratio}}", d.clone()), "150");
        assert_eq!(render("{{DivideInt 7 2}}", d.clone()), "3");
        assert_eq!(render("{{DivideFloat 7 2}}", d.clone()), "3.5");
        assert_eq!(
            render("{{AddInt 1 2 3}} {{SubtractInt 10 .Nodes}}", d.clone()),
            "6 -90"
        );
        assert_eq!(
            render("{{MaxInt 3 9 4}} {{MinFloat 2.5 7}} {{Mod 7 3}}", d.clone()),
            "9 2.5 1"
        );
        assert_eq!(
            render("{{MultiplyFloat 2 1.25}} {{Ceil 2.1}}", d.clone()),
            "2.5 3"
        );
    }

    #[test]
    fn parameters_defaults_and_loops() {
        let d = json!({"CL2_SET": 7});
        let src =
            "{{$a := DefaultParam .CL2_SET 1}}{{$b := DefaultParam .CL2_UNSET 2}}{{$a}},{{$b}}";
        assert_eq!(render(src, d.clone()), "7,2");
        assert_eq!(
            render("{{range $i, $_ := Loop 3}}{{$i}}{{end}}", d.clone()),
            "012"
        );
        assert_eq!(render("{{len (Seq 4)}}", d.clone()), "4");
        assert_eq!(render("{{IfThenElse true \"a\" \"b\"}}", d.clone()), "a");
        assert_eq!(
            render("{{range StringSplit \"x,y\"}}[{{.}}]{{end}}", d),
            "[x][y]"
        );
    }

    #[test]
    fn concat_and_seeded_data() {
        let d = json!({"R": "registry.k8s.io"});
        assert_eq!(
            render("{{Concat .R \"/pause:3.9\"}}", d.clone()),
            "registry.k8s.io/pause:3.9"
        );
        let a = render("{{RandDataWithSeed 16 \"x\"}}", d.clone());
        let b = render("{{RandDataWithSeed 16 \"x\"}}", d.clone());
        let c = render("{{RandDataWithSeed 16 \"y\"}}", d.clone());
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()), "{a}");
        assert_eq!(a, b, "one seed, one string");
        assert_ne!(a, c, "another seed, another string");
        assert_eq!(render("{{RandDataWithSeed 0 \"x\"}}", d), "");
    }

    #[test]
    fn errors_are_named() {
        let t = Template::parse("{{DivideInt 1 0}}").expect("parse");
        let err = t.render(&json!({}), &Env::default()).expect_err("zero");
        assert!(err.to_string().contains("division by zero"), "{err}");
        let t = Template::parse("{{IncludeEmbedFile \"no-such-file\"}}").expect("parse");
        let err = t.render(&json!({}), &Env::default()).expect_err("missing");
        assert!(
            err.to_string().contains("unable to read file no-such-file"),
            "{err}"
        );
        assert!(Template::parse("{{NoSuchHelper 1}}").is_err());
    }
}
