//! jq expressions (kwok's selector keys, `weightFrom`, `durationFrom`,
//! `jitterDurationFrom`), compiled once at load time with jaq.

use jaq_core::data::JustLut;
use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Compiler, Ctx, Native, Vars};
use jaq_json::Val;
use serde::Deserialize;
use serde_json::Value;

type Filter = jaq_core::compile::Filter<Native<JustLut<Val>>>;

/// An object converted for jq, shared by every query run on it.
pub struct Input(Val);

impl Input {
    pub fn new(v: &Value) -> Option<Input> {
        Val::deserialize(v).ok().map(Input)
    }
}

/// A compiled jq expression.
pub struct Query {
    pub source: String,
    filter: Filter,
}

impl std::fmt::Debug for Query {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Query").field(&self.source).finish()
    }
}

impl PartialEq for Query {
    fn eq(&self, other: &Query) -> bool {
        self.source == other.source
    }
}

impl Query {
    /// Compiles `source`; the error says why it is not jq.
    pub fn compile(source: &str) -> Result<Query, String> {
        let defs = jaq_core::defs()
            .chain(jaq_std::defs())
            .chain(jaq_json::defs());
        let funs = jaq_core::funs()
            .chain(jaq_std::funs())
            .chain(jaq_json::funs());
        let arena = Arena::default();
        let modules = Loader::new(defs)
            .load(
                &arena,
                File {
                    code: source,
                    path: (),
                },
            )
            .map_err(|errs| format!("not a jq expression ({} error(s))", errs.len()))?;
        let filter = Compiler::default()
            .with_funs(funs)
            .compile(modules)
            .map_err(|errs| format!("jq expression does not compile ({} error(s))", errs.len()))?;
        Ok(Query {
            source: source.to_string(),
            filter,
        })
    }

    /// Every output of the expression on `input`, errors dropped (a query
    /// that fails on an object, as `.a[]` on a missing `a` in some jq
    /// versions, simply finds nothing).
    pub fn run(&self, input: &Value) -> Vec<Value> {
        match Input::new(input) {
            Some(i) => self.run_on(&i),
            None => Vec::new(),
        }
    }

    /// [`Query::run`] on an object already converted (once for all of a
    /// Stage set's queries: the conversion costs more than most queries).
    pub fn run_on(&self, input: &Input) -> Vec<Value> {
        let val = input.0.clone();
        let ctx = Ctx::<JustLut<Val>>::new(&self.filter.lut, Vars::new([]));
        self.filter
            .id
            .run((ctx, val))
            .map(jaq_core::unwrap_valr)
            .filter_map(Result::ok)
            .filter_map(|v| serde_json::from_str(&v.to_string()).ok())
            .collect()
    }

    /// The outputs as strings, as kwok compares them: strings as they are,
    /// anything else as JSON; `null`s left out.
    pub fn strings(&self, input: &Value) -> Vec<String> {
        match Input::new(input) {
            Some(i) => self.strings_on(&i),
            None => Vec::new(),
        }
    }

    /// [`Query::strings`] on an object already converted.
    pub fn strings_on(&self, input: &Input) -> Vec<String> {
        self.run_on(input)
            .into_iter()
            .filter_map(|v| match v {
                Value::Null => None,
                Value::String(s) => Some(s),
                other => Some(other.to_string()),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kwok_style_expressions_run() {
        let node = json!({"status": {"conditions": [
            {"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"}]},
            "metadata": {"labels": {"a.b/c": "x"}}});
        let q = Query::compile(r#".status.conditions.[] | select( .type == "Ready" ) | .status"#)
            .unwrap();
        assert_eq!(q.strings(&node), ["True"]);
        let q = Query::compile(r#".metadata.labels["a.b/c"]"#).unwrap();
        assert_eq!(q.strings(&node), ["x"]);
        let q = Query::compile(".metadata.deletionTimestamp").unwrap();
        assert!(q.strings(&node).is_empty());
        let q = Query::compile(".status.podIP.[]").unwrap();
        assert!(q.strings(&node).is_empty());
        assert!(Query::compile(".a | | b").is_err());
    }
}
