//! Label and field selectors with the apiserver's grammar.
//!
//! Label selectors (`app=web,tier!=db,env in (a,b),!legacy`) follow
//! apimachinery's `labels.Parse`; field selectors (`spec.nodeName=n1,status.phase!=Failed`)
//! follow `fields.ParseSelector`, including its `\,` `\=` `\\` escapes. Which
//! fields a resource supports is the server's business, not the parser's.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// Why a selector string was refused; the message is what the apiserver says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("unable to parse requirement: {0}")]
    Label(String),
    #[error("invalid field selector: {0}")]
    Field(String),
}

/// Anything labels can be read from.
pub trait Labels {
    fn label(&self, key: &str) -> Option<&str>;
}

impl Labels for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl Labels for HashMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl Labels for serde_json::Map<String, serde_json::Value> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(|v| v.as_str())
    }
}

/// Operators of a label requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelOp {
    Equals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

/// One comma-separated term of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelRequirement {
    pub key: String,
    pub op: LabelOp,
    pub values: Vec<String>,
}

impl LabelRequirement {
    fn matches(&self, labels: &dyn Labels) -> bool {
        let v = labels.label(&self.key);
        match self.op {
            LabelOp::Equals | LabelOp::In => v.is_some_and(|v| self.values.iter().any(|x| x == v)),
            LabelOp::NotEquals | LabelOp::NotIn => {
                !v.is_some_and(|v| self.values.iter().any(|x| x == v))
            }
            LabelOp::Exists => v.is_some(),
            LabelOp::DoesNotExist => v.is_none(),
            LabelOp::GreaterThan | LabelOp::LessThan => {
                let (Some(have), Some(bound)) = (
                    v.and_then(|v| v.parse::<i64>().ok()),
                    self.values.first().and_then(|b| b.parse::<i64>().ok()),
                ) else {
                    return false;
                };
                if self.op == LabelOp::GreaterThan {
                    have > bound
                } else {
                    have < bound
                }
            }
        }
    }
}

/// A parsed label selector: all requirements must hold. Empty selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    pub requirements: Vec<LabelRequirement>,
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        LabelParser { s, pos: 0 }.parse()
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, labels: &dyn Labels) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// The keys the selector looks at, sorted and deduplicated: what a pattern
    /// key keeps once values are dropped.
    pub fn keys(&self) -> Vec<String> {
        let mut k: Vec<String> = self.requirements.iter().map(|r| r.key.clone()).collect();
        k.sort();
        k.dedup();
        k
    }
}

struct LabelParser<'a> {
    s: &'a str,
    pos: usize,
}

impl LabelParser<'_> {
    fn err(&self, what: &str) -> SelectorError {
        SelectorError::Label(format!("{what} at position {} in {:?}", self.pos, self.s))
    }

    fn skip_ws(&mut self) {
        while let Some(c) = self.peek().filter(|c| c.is_whitespace()) {
            self.pos += c.len_utf8();
        }
    }

    fn peek(&self) -> Option<char> {
        self.s[self.pos..].chars().next()
    }

    fn eat(&mut self, token: &str) -> bool {
        if self.s[self.pos..].starts_with(token) {
            self.pos += token.len();
            true
        } else {
            false
        }
    }

    /// A key or value: everything up to whitespace or a delimiter.
    fn word(&mut self) -> &str {
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_whitespace() || matches!(c, ',' | '=' | '!' | '(' | ')' | '<' | '>') {
                break;
            }
            self.pos += c.len_utf8();
        }
        &self.s[start..self.pos]
    }

    fn parse(mut self) -> Result<LabelSelector, SelectorError> {
        let mut requirements = Vec::new();
        self.skip_ws();
        if self.pos == self.s.len() {
            return Ok(LabelSelector { requirements });
        }
        loop {
            requirements.push(self.requirement()?);
            self.skip_ws();
            if self.pos == self.s.len() {
                break;
            }
            if !self.eat(",") {
                return Err(self.err("expected ','"));
            }
        }
        Ok(LabelSelector { requirements })
    }

    fn requirement(&mut self) -> Result<LabelRequirement, SelectorError> {
        self.skip_ws();
        if self.eat("!") {
            self.skip_ws();
            let key = self.word().to_string();
            validate_key(&key).map_err(|e| self.err(&e))?;
            return Ok(LabelRequirement {
                key,
                op: LabelOp::DoesNotExist,
                values: vec![],
            });
        }
        let key = self.word().to_string();
        if key.is_empty() {
            return Err(self.err("expected a label key"));
        }
        validate_key(&key).map_err(|e| self.err(&e))?;
        self.skip_ws();
        let op = if self.pos == self.s.len() || self.peek() == Some(',') {
            return Ok(LabelRequirement {
                key,
                op: LabelOp::Exists,
                values: vec![],
            });
        } else if self.eat("==") || self.eat("=") {
            LabelOp::Equals
        } else if self.eat("!=") {
            LabelOp::NotEquals
        } else if self.eat(">") {
            LabelOp::GreaterThan
        } else if self.eat("<") {
            LabelOp::LessThan
        } else {
            match self.word() {
                "in" => LabelOp::In,
                "notin" => LabelOp::NotIn,
                _ => {
                    return Err(self.err("expected one of '=', '==', '!=', 'in', 'notin', '>', '<'"))
                }
            }
        };
        self.skip_ws();
        let values = if matches!(op, LabelOp::In | LabelOp::NotIn) {
            self.value_set()?
        } else {
            let v = self.word().to_string();
            if matches!(op, LabelOp::GreaterThan | LabelOp::LessThan) && v.parse::<i64>().is_err() {
                return Err(self.err(&format!(
                    "for 'Gt', 'Lt' operators, the value must be an integer, got {v:?}"
                )));
            }
            validate_value(&v).map_err(|e| self.err(&e))?;
            vec![v]
        };
        Ok(LabelRequirement { key, op, values })
    }

    fn value_set(&mut self) -> Result<Vec<String>, SelectorError> {
        if !self.eat("(") {
            return Err(self.err("expected '(' after 'in'/'notin'"));
        }
        let mut values = Vec::new();
        loop {
            self.skip_ws();
            let v = self.word().to_string();
            validate_value(&v).map_err(|e| self.err(&e))?;
            values.push(v);
            self.skip_ws();
            if self.eat(")") {
                break;
            }
            if !self.eat(",") {
                return Err(self.err("expected ',' or ')' in value set"));
            }
        }
        if values.iter().all(String::is_empty) && values.len() == 1 {
            return Err(self.err("for 'in', 'notin' operators, values set can't be empty"));
        }
        values.sort();
        values.dedup();
        Ok(values)
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// A label name part: up to 63 alphanumerics, '-', '_', '.', starting and ending alphanumeric.
fn validate_name(n: &str) -> Result<(), String> {
    if n.is_empty() || n.len() > 63 {
        return Err(format!("name part must be 1-63 characters: {n:?}"));
    }
    let ok_ends = n.starts_with(|c: char| c.is_ascii_alphanumeric())
        && n.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !ok_ends || !n.chars().all(is_name_char) {
        return Err(format!(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character: {n:?}"
        ));
    }
    Ok(())
}

fn validate_key(k: &str) -> Result<(), String> {
    match k.split_once('/') {
        Some((prefix, name)) => {
            let dns_ok = !prefix.is_empty()
                && prefix.len() <= 253
                && prefix.split('.').all(|l| {
                    !l.is_empty()
                        && l.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                });
            if !dns_ok {
                return Err(format!(
                    "prefix part must be a lowercase DNS subdomain: {prefix:?}"
                ));
            }
            validate_name(name)
        }
        None => validate_name(k),
    }
}

fn validate_value(v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Ok(());
    }
    validate_name(v).map_err(|e| e.replacen("name part", "label value", 1))
}

// === Field selectors ===

/// Operators a field selector term may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldOp {
    Equals,
    NotEquals,
}

/// One `field=value` or `field!=value` term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    pub field: String,
    pub op: FieldOp,
    pub value: String,
}

/// A parsed field selector: all terms must hold. Empty selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    pub requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector { requirements });
        }
        for term in split_unescaped(s, ',')? {
            let (field, op, value) = if let Some(i) = find_unescaped(&term, "!=") {
                (&term[..i], FieldOp::NotEquals, &term[i + 2..])
            } else if let Some(i) = find_unescaped(&term, "==") {
                (&term[..i], FieldOp::Equals, &term[i + 2..])
            } else if let Some(i) = find_unescaped(&term, "=") {
                (&term[..i], FieldOp::Equals, &term[i + 1..])
            } else {
                return Err(SelectorError::Field(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                )));
            };
            let field = field.trim();
            if field.is_empty() {
                return Err(SelectorError::Field(format!(
                    "invalid selector: '{term}': empty field name"
                )));
            }
            requirements.push(FieldRequirement {
                field: unescape(field)?,
                op,
                value: unescape(value)?,
            });
        }
        Ok(FieldSelector { requirements })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// True when every term holds; `get` returns a field's value, `None` when the object lacks it
    /// (which compares as the empty string, as the apiserver does).
    pub fn matches(&self, get: &dyn Fn(&str) -> Option<String>) -> bool {
        self.requirements.iter().all(|r| {
            let have = get(&r.field).unwrap_or_default();
            (have == r.value) == (r.op == FieldOp::Equals)
        })
    }

    /// The value a field must equal, if the selector pins it (`spec.nodeName=n1`): what an index can serve.
    pub fn exact(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.field == field && r.op == FieldOp::Equals)
            .map(|r| r.value.as_str())
    }

    /// The fields named, with their operators and without values, sorted: e.g. `spec.nodeName=`.
    pub fn shape(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .requirements
            .iter()
            .map(|r| {
                format!(
                    "{}{}",
                    r.field,
                    if r.op == FieldOp::Equals { "=" } else { "!=" }
                )
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

fn split_unescaped(s: &str, sep: char) -> Result<Vec<String>, SelectorError> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            cur.push(c);
            match chars.next() {
                Some(n) => cur.push(n),
                None => {
                    return Err(SelectorError::Field(format!(
                        "invalid selector: '{s}': trailing backslash"
                    )))
                }
            }
        } else if c == sep {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    out.push(cur);
    Ok(out)
}

fn find_unescaped(term: &str, op: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in term.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if term[i..].starts_with(op) {
            return Some(i);
        }
    }
    None
}

fn unescape(s: &str) -> Result<String, SelectorError> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some(n @ ('\\' | ',' | '=')) => out.push(n),
            Some(n) => {
                return Err(SelectorError::Field(format!(
                    "invalid field selector: invalid escape sequence: \\{n}"
                )))
            }
            None => {
                return Err(SelectorError::Field(
                    "invalid field selector: trailing backslash".into(),
                ))
            }
        }
    }
    Ok(out)
}

/// A value set's inside, as it parses back: the set of only the empty value
/// is written `,` (`x notin (,)`), since `()` is refused as an empty set.
fn value_set(values: &[String]) -> String {
    match values {
        [only] if only.is_empty() => ",".to_string(),
        _ => values.join(","),
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .requirements
            .iter()
            .map(|r| match r.op {
                LabelOp::Equals => {
                    format!("{}={}", r.key, r.values.first().map_or("", String::as_str))
                }
                LabelOp::NotEquals => {
                    format!("{}!={}", r.key, r.values.first().map_or("", String::as_str))
                }
                LabelOp::In => format!("{} in ({})", r.key, value_set(&r.values)),
                LabelOp::NotIn => format!("{} notin ({})", r.key, value_set(&r.values)),
                LabelOp::Exists => r.key.clone(),
                LabelOp::DoesNotExist => format!("!{}", r.key),
                LabelOp::GreaterThan => {
                    format!("{}>{}", r.key, r.values.first().map_or("", String::as_str))
                }
                LabelOp::LessThan => {
                    format!("{}<{}", r.key, r.values.first().map_or("", String::as_str))
                }
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests;
