//! A Go `text/template` subset, enough for kwok's Stage templates and
//! ClusterLoader2's configs: gtmpl 0.7
//! cannot assign variables (`{{ $x = … }}`, which kwok's `node-initialize`
//! uses), so this is our own. See `loadgen/STAGES.md` for what is supported.
//!
//! - [`parse`]: source → tree; unknown functions are refused here.
//! - [`exec`]: tree + JSON value → text.
//! - [`funcs`]: the builtins, sprig's few, kwok's helpers.
//! - [`cl2`]: ClusterLoader2's helpers, for CL2 configs and object templates.
//! - [`value`]: a value's truth and printed form, as Go's templates see them.

pub mod cl2;
pub mod exec;
pub mod funcs;
pub mod parse;
pub mod value;

use serde_json::Value;

pub use exec::ExecError;
pub use funcs::Env;
pub use parse::ParseError;

/// A parsed template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    nodes: Vec<parse::Node>,
}

impl Template {
    /// Parses `src`, refusing functions that do not exist by name.
    pub fn parse(src: &str) -> Result<Template, ParseError> {
        let funcs = funcs::all();
        let known = |name: &str| funcs.contains_key(name);
        Ok(Template {
            nodes: parse::parse(src, &known)?,
        })
    }

    /// Renders against `data` (both `.` and `$`).
    pub fn render(&self, data: &Value, env: &Env) -> Result<String, ExecError> {
        let mut st = exec::State {
            root: data,
            vars: Vec::new(),
            funcs: funcs::all(),
            env,
            out: String::new(),
        };
        st.run(&self.nodes, data)?;
        Ok(st.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(src: &str, data: Value) -> String {
        Template::parse(src)
            .unwrap()
            .render(&data, &Env::default())
            .unwrap()
    }

    #[test]
    fn pipelines_variables_and_control() {
        let d = json!({"a": {"b": "x"}, "l": [1, 2, 3], "e": []});
        assert_eq!(
            render("{{ .a.b }}-{{ .a.b | Quote }}", d.clone()),
            "x-\"x\""
        );
        assert_eq!(
            render(
                "{{ $n := 0 }}{{ range .l }}{{ $n = . }}{{ end }}{{ $n }}",
                d.clone()
            ),
            "3"
        );
        assert_eq!(
            render(
                "{{ range $i, $v := .l }}{{ $i }}={{ $v }};{{ end }}",
                d.clone()
            ),
            "0=1;1=2;2=3;"
        );
        assert_eq!(
            render("{{ range .e }}x{{ else }}none{{ end }}", d.clone()),
            "none"
        );
        assert_eq!(
            render(
                "{{ if eq .a.b \"y\" }}1{{ else if eq .a.b \"x\" }}2{{ else }}3{{ end }}",
                d.clone()
            ),
            "2"
        );
        assert_eq!(
            render("{{ with .missing }}a{{ else }}b{{ end }}", d.clone()),
            "b"
        );
        assert_eq!(render("{{ with .a }}{{ .b }}{{ end }}", d.clone()), "x");
        assert_eq!(
            render(
                "{{ with .none }}1{{ else with .a.b }}{{ . }}{{ else }}3{{ end }}",
                d.clone()
            ),
            "x"
        );
        assert_eq!(
            render(
                "{{ $x := 1 }}{{ if true }}{{ $x := 2 }}{{ end }}{{ $x }}",
                d.clone()
            ),
            "1"
        );
        assert_eq!(render("{{ or .missing `dflt` }}", d.clone()), "dflt");
        assert_eq!(render("{{ printf \"k-%s\" .a.b }}", d.clone()), "k-x");
        assert_eq!(render("a  {{- .a.b -}}  b", d.clone()), "axb");
        assert_eq!(
            render("{{/* note */}}{{ index (dict \"k\" 5) \"k\" }}", d.clone()),
            "5"
        );
        assert_eq!(render("{{ not (and true .e) }}", d), "true");
    }

    #[test]
    fn unknown_functions_and_syntax_errors_are_refused_at_parse() {
        let e = Template::parse("x\n{{ Frobnicate . }}").unwrap_err();
        assert!(e.message.contains("\"Frobnicate\""), "{e}");
        assert_eq!(e.line, 2);
        assert!(Template::parse("{{ if .a }}open").is_err());
        assert!(Template::parse("{{ end }}").is_err());
        let undeclared = Template::parse("{{ $x = 1 }}").unwrap();
        assert!(undeclared.render(&json!({}), &Env::default()).is_err());
    }

    #[test]
    fn yaml_indents_under_a_key() {
        let out = render("capacity:\n{{ YAML .c 1 }}", json!({"c": {"cpu": "1"}}));
        let v: Value = serde_saphyr::from_str(&out).unwrap();
        assert_eq!(v, json!({"capacity": {"cpu": "1"}}));
    }
}
