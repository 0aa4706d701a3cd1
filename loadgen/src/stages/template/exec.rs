//! Runs a parsed template against a JSON value, as Go's `text/template` runs
//! against the `map[string]interface{}` kwok makes of an object. Lenient where
//! kwok's inputs need it: a field of a missing value is missing (Go would fail
//! on a nil map only when it is typed; kwok's objects never are), and
//! `index` of a missing list is missing.

use serde_json::Value;

use super::funcs::{self, Funcs};
use super::parse::{Node, Pipe, Term};
use super::value::{print, truthy};

/// Why rendering failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ExecError {
    pub line: usize,
    pub message: String,
}

pub(super) struct State<'a> {
    pub root: &'a Value,
    pub vars: Vec<(String, Value)>,
    pub funcs: &'a Funcs,
    pub env: &'a funcs::Env,
    pub out: String,
}

fn field(mut v: &Value, path: &[String]) -> Value {
    for f in path {
        match v.get(f) {
            Some(next) => v = next,
            None => return Value::Null,
        }
    }
    v.clone()
}

impl State<'_> {
    pub fn run(&mut self, nodes: &[Node], dot: &Value) -> Result<(), ExecError> {
        for n in nodes {
            match n {
                Node::Text(t) => self.out.push_str(t),
                Node::Action(p) => {
                    let v = self.pipe(p, dot)?;
                    if p.vars.is_empty() {
                        let mut s = std::mem::take(&mut self.out);
                        print(&v, &mut s);
                        self.out = s;
                    }
                }
                Node::If {
                    cond,
                    then,
                    otherwise,
                } => {
                    let mark = self.vars.len();
                    let c = self.pipe(cond, dot)?;
                    let r = if truthy(&c) {
                        self.run(then, dot)
                    } else {
                        self.run(otherwise, dot)
                    };
                    self.vars.truncate(mark);
                    r?;
                }
                Node::With {
                    cond,
                    then,
                    otherwise,
                } => {
                    let mark = self.vars.len();
                    let c = self.pipe(cond, dot)?;
                    let r = if truthy(&c) {
                        self.run(then, &c)
                    } else {
                        self.run(otherwise, dot)
                    };
                    self.vars.truncate(mark);
                    r?;
                }
                Node::Range {
                    pipe,
                    body,
                    otherwise,
                } => self.range(pipe, body, otherwise, dot)?,
            }
        }
        Ok(())
    }

    fn range(
        &mut self,
        pipe: &Pipe,
        body: &[Node],
        otherwise: &[Node],
        dot: &Value,
    ) -> Result<(), ExecError> {
        let mark = self.vars.len();
        let decl = Pipe {
            vars: Vec::new(),
            ..pipe.clone()
        };
        let over = self.pipe(&decl, dot)?;
        let items: Vec<(Value, Value)> = match over {
            Value::Array(a) => a
                .into_iter()
                .enumerate()
                .map(|(i, v)| (Value::from(i), v))
                .collect(),
            // Go ranges over a map in key order.
            Value::Object(o) => {
                let mut kv: Vec<(String, Value)> = o.into_iter().collect();
                kv.sort_by(|a, b| a.0.cmp(&b.0));
                kv.into_iter().map(|(k, v)| (Value::String(k), v)).collect()
            }
            Value::Null => Vec::new(),
            Value::Number(n) => {
                let count = n.as_u64().unwrap_or(0);
                (0..count)
                    .map(|i| (Value::from(i), Value::from(i)))
                    .collect()
            }
            other => {
                return Err(ExecError {
                    line: pipe.line,
                    message: format!("range can't iterate over {other}"),
                })
            }
        };
        if items.is_empty() {
            self.run(otherwise, dot)?;
            self.vars.truncate(mark);
            return Ok(());
        }
        for (k, v) in items {
            match pipe.vars.as_slice() {
                [] => {}
                [one] => self.vars.push((one.clone(), v.clone())),
                [a, b, ..] => {
                    self.vars.push((a.clone(), k));
                    self.vars.push((b.clone(), v.clone()));
                }
            }
            let r = self.run(body, &v);
            self.vars.truncate(mark);
            r?;
        }
        Ok(())
    }

    fn err(&self, line: usize, message: String) -> ExecError {
        ExecError { line, message }
    }

    fn pipe(&mut self, p: &Pipe, dot: &Value) -> Result<Value, ExecError> {
        let mut last: Option<Value> = None;
        for cmd in &p.cmds {
            last = Some(self.cmd(cmd, dot, last, p.line)?);
        }
        let v = last.unwrap_or(Value::Null);
        if let Some(name) = p.vars.first() {
            if p.assign {
                let Some(slot) = self.vars.iter_mut().rev().find(|(n, _)| n == name) else {
                    return Err(self.err(p.line, format!("undefined variable ${name}")));
                };
                slot.1 = v.clone();
            } else {
                self.vars.push((name.clone(), v.clone()));
            }
        }
        Ok(v)
    }

    fn cmd(
        &mut self,
        cmd: &[Term],
        dot: &Value,
        piped: Option<Value>,
        line: usize,
    ) -> Result<Value, ExecError> {
        if let Some(Term::Func(name)) = cmd.first() {
            let mut args = Vec::with_capacity(cmd.len());
            for t in &cmd[1..] {
                args.push(self.term(t, dot, line)?);
            }
            if let Some(v) = piped {
                args.push(v);
            }
            let f = self
                .funcs
                .get(name.as_str())
                .ok_or_else(|| self.err(line, format!("unsupported template function {name:?}")))?;
            return f(self.env, args).map_err(|m| self.err(line, format!("{name}: {m}")));
        }
        if cmd.len() > 1 || piped.is_some() {
            return Err(self.err(line, "can't give argument to non-function".into()));
        }
        self.term(&cmd[0], dot, line)
    }

    fn term(&mut self, t: &Term, dot: &Value, line: usize) -> Result<Value, ExecError> {
        Ok(match t {
            Term::Dot(path) => field(dot, path),
            Term::Var(name, path) => {
                if name.is_empty() {
                    field(self.root, path)
                } else {
                    let Some((_, v)) = self.vars.iter().rev().find(|(n, _)| n == name) else {
                        return Err(self.err(line, format!("undefined variable ${name}")));
                    };
                    field(v, path)
                }
            }
            Term::Lit(v) => v.clone(),
            Term::Func(name) => self
                .cmd(std::slice::from_ref(t), dot, None, line)
                .map_err(|e| self.err(line, format!("calling {name}: {}", e.message)))?,
            Term::Sub(p, path) => {
                let v = self.pipe(p, dot)?;
                field(&v, path)
            }
        })
    }
}
