//! A Stage's selector: `matchLabels`, `matchAnnotations` and
//! `matchExpressions` whose keys are jq expressions, all of which must hold.
//!
//! Operators, on the expression's outputs (strings as they are, other values
//! as JSON, `null`s left out) as kwok evaluates them: `In` — some output is
//! one of the values; `NotIn` — none is (no output at all included);
//! `Exists` — there is an output; `DoesNotExist` — there is none.

use std::collections::BTreeMap;

use serde_json::Value;

use super::document::{Operator, Selector};
use super::jq::{Input, Query};

#[derive(Debug, PartialEq)]
pub struct Requirement {
    pub query: Query,
    pub operator: Operator,
    pub values: Vec<String>,
}

/// A compiled selector.
#[derive(Debug, Default, PartialEq)]
pub struct Matcher {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub requirements: Vec<Requirement>,
}

impl Matcher {
    /// Compiles `sel`; the error names the expression at fault.
    pub fn compile(sel: &Selector) -> Result<Matcher, String> {
        let mut requirements = Vec::new();
        for (i, e) in sel.match_expressions.iter().enumerate() {
            let query = Query::compile(&e.key)
                .map_err(|m| format!("selector.matchExpressions[{i}].key {:?}: {m}", e.key))?;
            let needs_values = matches!(e.operator, Operator::In | Operator::NotIn);
            if needs_values == e.values.is_empty() {
                return Err(format!(
                    "selector.matchExpressions[{i}]: operator {:?} {}",
                    e.operator,
                    if needs_values {
                        "needs values"
                    } else {
                        "takes no values"
                    }
                ));
            }
            requirements.push(Requirement {
                query,
                operator: e.operator,
                values: e.values.clone(),
            });
        }
        Ok(Matcher {
            labels: sel.match_labels.clone(),
            annotations: sel.match_annotations.clone(),
            requirements,
        })
    }

    /// Whether `obj` is selected.
    pub fn matches(&self, obj: &Value) -> bool {
        match Input::new(obj) {
            Some(input) => self.matches_on(obj, &input),
            None => false,
        }
    }

    /// [`Matcher::matches`] with `obj` already converted for jq.
    pub fn matches_on(&self, obj: &Value, input: &Input) -> bool {
        let meta = &obj["metadata"];
        let has = |field: &str, want: &BTreeMap<String, String>| {
            want.iter()
                .all(|(k, v)| meta[field][k].as_str() == Some(v.as_str()))
        };
        if !has("labels", &self.labels) || !has("annotations", &self.annotations) {
            return false;
        }
        self.requirements.iter().all(|r| {
            let out = r.query.strings_on(input);
            match r.operator {
                Operator::In => out.iter().any(|o| r.values.contains(o)),
                Operator::NotIn => !out.iter().any(|o| r.values.contains(o)),
                Operator::Exists => !out.is_empty(),
                Operator::DoesNotExist => out.is_empty(),
            }
        })
    }
}
