//! A JSON value as Go's templates see it: whether it is true, and how it prints. Shared by
//! the executor and the builtins.

use std::fmt::Write;

use serde_json::Value;

/// Go's truth: false, 0, nil, and empty strings, lists and maps are false.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// How `{{ x }}` prints a value (Go's `fmt.Print`; lists and maps as JSON).
pub fn print(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("<no value>"),
        Value::String(s) => out.push_str(s),
        Value::Bool(b) => {
            let _ = write!(out, "{b}");
        }
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        other => {
            let _ = write!(out, "{other}");
        }
    }
}
