//! Object templates: YAML or JSON text with `{{ }}` expressions, evaluated
//! once per object (so `{{RAND%3+5}}` differs between replicas).
//!
//! # Grammar
//! ```text
//! template := ( text | "{{" expr "}}" )*          (blanks inside {{ }} are ignored)
//! expr     := field | sum
//! field    := "." IDENT                          .Name, .Namespace or a scenario parameter
//! sum      := product ( "+" product )*
//! product  := atom ( "%" atom )*                 % binds tighter than +, as in Go
//! atom     := "N" | "RAND" | INTEGER | "." IDENT (a parameter whose value is an integer)
//! IDENT    := [A-Za-z_][A-Za-z0-9_]*
//! ```
//! - `.Name` is the object's name, `<basename>-<N>`; `.Namespace` its namespace
//!   (empty for cluster-scoped objects); any other `.Param` is a scenario parameter,
//!   written as is (a string without quotes, a number as a number).
//! - `N` is the object's replica number (0-based, the `N` of `<basename>-<N>`);
//!   `RAND` a fresh non-negative random integer at each use; integers are
//!   unsigned 64-bit, `+` saturates and `x % 0` is refused when the template is read.
//! - Text outside `{{ }}` is copied (a `}}` with no `{{` before it too, as YAML
//!   flow maps end that way); there is no escape for a literal `{{`.

use std::collections::BTreeMap;

use rand::Rng;

/// A parsed template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq)]
enum Segment {
    Text(String),
    Field(String),
    Int(Sum),
}

/// `product ("+" product)*`.
#[derive(Debug, Clone, PartialEq)]
struct Sum(Vec<Product>);

/// `atom ("%" atom)*`.
#[derive(Debug, Clone, PartialEq)]
struct Product(Vec<Atom>);

#[derive(Debug, Clone, PartialEq)]
enum Atom {
    N,
    Rand,
    Int(u64),
    Param(String),
}

/// What a template is evaluated against.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub n: u64,
    pub params: &'a BTreeMap<String, serde_json::Value>,
}

/// Why a template does not parse or evaluate: the line and the reason.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct TemplateError {
    pub line: usize,
    pub reason: String,
}

impl Template {
    /// Parses `text`, checking that every parameter it names is in `params`
    /// (and, where used in arithmetic, is an integer).
    pub fn parse(
        text: &str,
        params: &BTreeMap<String, serde_json::Value>,
    ) -> Result<Template, TemplateError> {
        let mut segments = Vec::new();
        let mut rest = text;
        let mut consumed = 0usize;
        let line_at = |offset: usize| text[..offset].matches('\n').count() + 1;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                segments.push(Segment::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 2..];
            let line = line_at(consumed + open);
            let Some(close) = after.find("}}") else {
                return Err(TemplateError {
                    line,
                    reason: "`{{` without a closing `}}`".into(),
                });
            };
            let expr = &after[..close];
            let seg = parse_expr(expr, params).map_err(|reason| TemplateError {
                line,
                reason: format!("`{{{{{expr}}}}}`: {reason}"),
            })?;
            segments.push(seg);
            let used = open + 2 + close + 2;
            consumed += used;
            rest = &rest[used..];
        }
        if !rest.is_empty() {
            segments.push(Segment::Text(rest.to_string()));
        }
        Ok(Template { segments })
    }

    /// The text with every expression evaluated; `RAND` draws from `rng`.
    pub fn render(&self, ctx: &Context<'_>, rng: &mut impl Rng) -> String {
        let mut out = String::new();
        for seg in &self.segments {
            match seg {
                Segment::Text(t) => out.push_str(t),
                Segment::Field(f) => out.push_str(&field(ctx, f)),
                Segment::Int(sum) => out.push_str(&sum.eval(ctx, rng).to_string()),
            }
        }
        out
    }

    /// True if the template mentions `N`, `RAND`, `.Name` or `.Namespace`
    /// (then each object renders differently).
    pub fn is_per_object(&self) -> bool {
        self.segments.iter().any(|s| match s {
            Segment::Text(_) => false,
            Segment::Field(f) => f == "Name" || f == "Namespace",
            Segment::Int(_) => true,
        })
    }
}

/// An object template: loadgen's own language, or (in a ClusterLoader2
/// config) a Go template with CL2's helpers over `.Name`, `.Index`,
/// `.Namespace`, `.BaseName` and the bundle entry's `templateFillMap`.
#[derive(Debug, Clone)]
pub enum ObjectTemplate {
    Loadgen(Template),
    Go {
        template: crate::stages::template::Template,
        fill: BTreeMap<String, serde_json::Value>,
        basename: String,
        /// Where `IncludeFile`/`IncludeEmbedFile` read from: the config's directory.
        dir: std::path::PathBuf,
    },
}

impl ObjectTemplate {
    /// The object's text for `ctx`; a Go template may fail (a helper's error).
    pub fn render(&self, ctx: &Context<'_>, rng: &mut impl Rng) -> Result<String, String> {
        match self {
            ObjectTemplate::Loadgen(t) => Ok(t.render(ctx, rng)),
            ObjectTemplate::Go {
                template,
                fill,
                basename,
                dir,
            } => {
                // As CL2's ExecuteObject: the test's values, then the bundle
                // entry's templateFillMap, then the object's own names.
                let mut data: serde_json::Map<String, serde_json::Value> = ctx
                    .params
                    .iter()
                    .chain(fill.iter())
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                data.insert("Name".into(), ctx.name.into());
                data.insert("Index".into(), ctx.n.into());
                data.insert("Namespace".into(), ctx.namespace.into());
                data.insert("BaseName".into(), basename.clone().into());
                let env = crate::stages::template::Env {
                    include_dir: Some(dir.clone()),
                    ..Default::default()
                };
                template
                    .render(&serde_json::Value::Object(data), &env)
                    .map_err(|e| e.to_string())
            }
        }
    }
}

fn field(ctx: &Context<'_>, name: &str) -> String {
    match name {
        "Name" => ctx.name.to_string(),
        "Namespace" => ctx.namespace.to_string(),
        // Parameters were checked at parse time.
        p => match ctx.params.get(p) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => String::new(),
        },
    }
}

impl Sum {
    fn eval(&self, ctx: &Context<'_>, rng: &mut impl Rng) -> u64 {
        self.0
            .iter()
            .fold(0u64, |acc, p| acc.saturating_add(p.eval(ctx, rng)))
    }
}

impl Product {
    fn eval(&self, ctx: &Context<'_>, rng: &mut impl Rng) -> u64 {
        let mut atoms = self.0.iter();
        let first = atoms.next().map(|a| a.eval(ctx, rng)).unwrap_or(0);
        // Divisors were checked non-zero at parse time, except parameters and
        // RAND; a zero divisor there leaves the value unchanged rather than panic.
        atoms.fold(first, |acc, a| {
            acc.checked_rem(a.eval(ctx, rng)).unwrap_or(acc)
        })
    }
}

impl Atom {
    fn eval(&self, ctx: &Context<'_>, rng: &mut impl Rng) -> u64 {
        match self {
            Atom::N => ctx.n,
            Atom::Rand => u64::from(rng.random::<u32>()),
            Atom::Int(i) => *i,
            Atom::Param(p) => ctx.params.get(p).and_then(int_param).unwrap_or(0),
        }
    }
}

fn int_param(v: &serde_json::Value) -> Option<u64> {
    match v {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_expr(expr: &str, params: &BTreeMap<String, serde_json::Value>) -> Result<Segment, String> {
    let e: String = expr.chars().filter(|c| !c.is_whitespace()).collect();
    if e.is_empty() {
        return Err("empty expression".into());
    }
    if let Some(name) = e.strip_prefix('.') {
        if is_ident(name) {
            if name != "Name" && name != "Namespace" && !params.contains_key(name) {
                return Err(unknown_param(name, params));
            }
            return Ok(Segment::Field(name.to_string()));
        }
    }
    let mut products = Vec::new();
    for term in e.split('+') {
        let mut atoms = Vec::new();
        for (i, a) in term.split('%').enumerate() {
            let atom = parse_atom(a, params)?;
            if i > 0 && atom == Atom::Int(0) {
                return Err("`% 0`: modulo by zero".into());
            }
            atoms.push(atom);
        }
        products.push(Product(atoms));
    }
    Ok(Segment::Int(Sum(products)))
}

fn parse_atom(a: &str, params: &BTreeMap<String, serde_json::Value>) -> Result<Atom, String> {
    match a {
        "" => Err("an operator needs a value on both sides".into()),
        "N" => Ok(Atom::N),
        "RAND" => Ok(Atom::Rand),
        _ if a.chars().all(|c| c.is_ascii_digit()) => a
            .parse()
            .map(Atom::Int)
            .map_err(|_| format!("`{a}` does not fit in 64 bits")),
        _ => match a.strip_prefix('.').filter(|p| is_ident(p)) {
            Some(p) => match params.get(p) {
                None => Err(unknown_param(p, params)),
                Some(v) if int_param(v).is_none() => Err(format!(
                    "parameter `{p}` is {v}, not a non-negative integer, so it cannot be used with + or %"
                )),
                Some(_) => Ok(Atom::Param(p.to_string())),
            },
            None => Err(format!(
                "unexpected `{a}`: expected N, RAND, an integer, .Name, .Namespace or .Param, joined by + or %"
            )),
        },
    }
}

fn unknown_param(name: &str, params: &BTreeMap<String, serde_json::Value>) -> String {
    let known: Vec<&str> = params.keys().map(String::as_str).collect();
    format!(
        "unknown parameter `{name}` (known: .Name, .Namespace{}{})",
        if known.is_empty() { "" } else { ", ." },
        known.join(", .")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn params() -> BTreeMap<String, serde_json::Value> {
        let mut p = BTreeMap::new();
        p.insert("Image".into(), serde_json::json!("nginx:1.27"));
        p.insert("Replicas".into(), serde_json::json!(4));
        p
    }

    fn render(t: &str, n: u64) -> String {
        let params = params();
        let tpl = Template::parse(t, &params).expect("parses");
        let ctx = Context {
            name: "web-7",
            namespace: "ns-1",
            n,
            params: &params,
        };
        tpl.render(&ctx, &mut rand::rngs::StdRng::seed_from_u64(1))
    }

    #[test]
    fn fields_and_arithmetic() {
        assert_eq!(
            render("name: {{.Name}} ns: {{ .Namespace }} img: {{.Image}}", 0),
            "name: web-7 ns: ns-1 img: nginx:1.27"
        );
        assert_eq!(render("{{N}} {{N%3+5}} {{ N + .Replicas }}", 7), "7 6 11");
        assert_eq!(render("{{ 10 % 4 % 3 + 1 + N }}", 2), "5");
        for n in 0..50 {
            let v: u64 = render("{{RAND%3+5}}", n).parse().expect("int");
            assert!((5..8).contains(&v), "{v}");
        }
    }

    #[test]
    fn errors_say_where_and_why() {
        let p = params();
        let err = Template::parse("a: 1\nb: {{.Nope}}\n", &p).expect_err("unknown");
        assert_eq!(err.line, 2);
        assert!(err.reason.contains("unknown parameter `Nope`"), "{err}");
        let err = Template::parse("x: {{N%0}}", &p).expect_err("mod 0");
        assert!(err.reason.contains("modulo by zero"), "{err}");
        let err = Template::parse("x: {{N+}}", &p).expect_err("dangling");
        assert!(err.reason.contains("both sides"), "{err}");
        let err = Template::parse("\n\nx: {{N", &p).expect_err("open");
        assert_eq!(err.line, 3);
        let err = Template::parse("x: {{N*2}}", &p).expect_err("times");
        assert!(err.reason.contains("unexpected `N*2`"), "{err}");
        let err = Template::parse("x: {{.Image%2}}", &p).expect_err("string param");
        assert!(err.reason.contains("not a non-negative integer"), "{err}");
        // A lone `}}` is text: YAML flow maps end that way (`{a: {b: 1}}`).
        assert_eq!(render("a: {b: {c: 1}}", 0), "a: {b: {c: 1}}");
    }
}
