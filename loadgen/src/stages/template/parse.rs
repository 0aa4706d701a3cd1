//! Go `text/template` source → a tree: text, actions (pipelines with `|`,
//! variables declared with `:=` and assigned with `=`), `if`/`else if`/`else`,
//! `range` (with `$i, $v :=`), `with`/`else with`, comments and the `{{-`/`-}}`
//! trim markers. Function names are checked against the known ones here, so an
//! unsupported function is refused when the Stage is loaded, not when it fires.

use serde_json::Value;

/// Why a template does not parse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

/// One piece of a template.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Text(String),
    Action(Pipe),
    If {
        cond: Pipe,
        then: Vec<Node>,
        otherwise: Vec<Node>,
    },
    With {
        cond: Pipe,
        then: Vec<Node>,
        otherwise: Vec<Node>,
    },
    Range {
        pipe: Pipe,
        body: Vec<Node>,
        otherwise: Vec<Node>,
    },
}

/// `$a, $b := cmd | cmd …` or `$a = cmd | …` or just `cmd | …`.
#[derive(Debug, Clone, PartialEq)]
pub struct Pipe {
    pub vars: Vec<String>,
    /// `=` (assign to an existing variable) rather than `:=` (declare).
    pub assign: bool,
    pub cmds: Vec<Vec<Term>>,
    pub line: usize,
}

/// An operand or function name in a command.
#[derive(Debug, Clone, PartialEq)]
pub enum Term {
    /// `.` or `.a.b`.
    Dot(Vec<String>),
    /// `$x.a.b` (`$` is the root).
    Var(String, Vec<String>),
    Func(String),
    Lit(Value),
    /// `(pipeline).a.b`.
    Sub(Box<Pipe>, Vec<String>),
}

// === lexing of one action ===

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Dot,
    Field(String),
    Var(String),
    Ident(String),
    Lit(Value),
    LParen,
    RParen,
    Pipe,
    Declare,
    Assign,
    Comma,
}

/// Tokens, each with whether whitespace came before it (`.a .b` is two
/// operands, `.a.b` one).
fn lex(src: &str, line: usize) -> Result<Vec<(Tok, bool)>, ParseError> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut spaced = true;
    while i < b.len() {
        if (b[i] as char).is_whitespace() {
            spaced = true;
            i += 1;
            continue;
        }
        let (tok, next) = lex_token(src, i).map_err(|message| ParseError { line, message })?;
        i = next;
        out.push((tok, spaced));
        spaced = false;
    }
    Ok(out)
}

/// The token that starts at byte `i` (not whitespace), and the byte after it.
fn lex_token(src: &str, i: usize) -> Result<(Tok, usize), String> {
    let b = src.as_bytes();
    let c = b[i] as char;
    let tok = match c {
        '(' => (Tok::LParen, i + 1),
        ')' => (Tok::RParen, i + 1),
        '|' => (Tok::Pipe, i + 1),
        ',' => (Tok::Comma, i + 1),
        ':' if b.get(i + 1) == Some(&b'=') => (Tok::Declare, i + 2),
        '=' => (Tok::Assign, i + 1),
        '.' => {
            let j = ident_end(b, i + 1);
            let name = &src[i + 1..j];
            if name.is_empty() {
                (Tok::Dot, j)
            } else {
                (Tok::Field(name.to_string()), j)
            }
        }
        '$' => {
            let j = ident_end(b, i + 1);
            (Tok::Var(src[i + 1..j].to_string()), j)
        }
        '"' => lex_quoted(src, i)?,
        '`' => {
            let Some(end) = src[i + 1..].find('`') else {
                return Err("unterminated raw string".into());
            };
            let s = src[i + 1..i + 1 + end].to_string();
            (Tok::Lit(Value::String(s)), i + end + 2)
        }
        c if c.is_ascii_digit() || (c == '-' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) => {
            lex_number(src, i)?
        }
        c if c.is_ascii_alphabetic() || c == '_' => {
            let j = ident_end(b, i);
            let tok = match &src[i..j] {
                "true" => Tok::Lit(Value::Bool(true)),
                "false" => Tok::Lit(Value::Bool(false)),
                "nil" => Tok::Lit(Value::Null),
                name => Tok::Ident(name.to_string()),
            };
            (tok, j)
        }
        other => return Err(format!("unexpected {other:?} in action")),
    };
    Ok(tok)
}

/// The end of the identifier that starts at byte `j`.
fn ident_end(b: &[u8], mut j: usize) -> usize {
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
        j += 1;
    }
    j
}

/// A `"…"` string with Go's common escapes, starting at the quote at `i`.
fn lex_quoted(src: &str, i: usize) -> Result<(Tok, usize), String> {
    let b = src.as_bytes();
    let mut j = i + 1;
    let mut s = String::new();
    loop {
        match b.get(j) {
            None => return Err("unterminated quoted string".into()),
            Some(b'"') => break,
            Some(b'\\') => {
                let e = b.get(j + 1).copied().unwrap_or(b'\\');
                s.push(match e {
                    b'n' => '\n',
                    b't' => '\t',
                    b'r' => '\r',
                    other => other as char,
                });
                j += 2;
            }
            Some(_) => {
                let ch = src[j..].chars().next().unwrap_or('?');
                s.push(ch);
                j += ch.len_utf8();
            }
        }
    }
    Ok((Tok::Lit(Value::String(s)), j + 1))
}

/// An integer or float literal starting at `i` (a leading `-` included).
fn lex_number(src: &str, i: usize) -> Result<(Tok, usize), String> {
    let b = src.as_bytes();
    let mut j = i + 1;
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'.') {
        j += 1;
    }
    let text = &src[i..j];
    let v = if let Ok(n) = text.parse::<i64>() {
        Value::from(n)
    } else if let Ok(f) = text.parse::<f64>() {
        Value::from(f)
    } else {
        return Err(format!("bad number {text:?}"));
    };
    Ok((Tok::Lit(v), j))
}

// === parsing of one action's tokens ===

struct Toks<'a> {
    toks: &'a [(Tok, bool)],
    pos: usize,
    line: usize,
    known: &'a dyn Fn(&str) -> bool,
}

impl Toks<'_> {
    fn err(&self, m: impl Into<String>) -> ParseError {
        ParseError {
            line: self.line,
            message: m.into(),
        }
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.0)
    }

    /// `.a.b` directly after an operand (no space before).
    fn fields(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Some((Tok::Field(f), false)) = self.toks.get(self.pos) {
            out.push(f.clone());
            self.pos += 1;
        }
        out
    }

    fn pipe(&mut self, in_parens: bool) -> Result<Pipe, ParseError> {
        let mut vars = Vec::new();
        let mut assign = false;
        // A declaration: `$x :=`, `$x =`, `$i, $v :=`.
        let save = self.pos;
        let mut names = Vec::new();
        while let Some(Tok::Var(v)) = self.peek() {
            names.push(v.clone());
            self.pos += 1;
            match self.peek() {
                Some(Tok::Comma) => self.pos += 1,
                Some(Tok::Declare) => {
                    self.pos += 1;
                    vars = names.clone();
                    break;
                }
                Some(Tok::Assign) => {
                    self.pos += 1;
                    vars = names.clone();
                    assign = true;
                    break;
                }
                _ => break,
            }
        }
        if vars.is_empty() {
            self.pos = save;
        }
        let mut cmds = Vec::new();
        loop {
            let mut cmd = Vec::new();
            loop {
                match self.peek() {
                    None => break,
                    Some(Tok::Pipe) => break,
                    Some(Tok::RParen) if in_parens => break,
                    Some(_) => cmd.push(self.term()?),
                }
            }
            if cmd.is_empty() {
                return Err(self.err("missing command in pipeline"));
            }
            cmds.push(cmd);
            match self.peek() {
                Some(Tok::Pipe) => self.pos += 1,
                _ => break,
            }
        }
        Ok(Pipe {
            vars,
            assign,
            cmds,
            line: self.line,
        })
    }

    fn term(&mut self) -> Result<Term, ParseError> {
        let Some((tok, _)) = self.toks.get(self.pos).cloned() else {
            return Err(self.err("unexpected end of action"));
        };
        self.pos += 1;
        Ok(match tok {
            Tok::Dot => Term::Dot(Vec::new()),
            Tok::Field(f) => {
                let mut path = vec![f];
                path.extend(self.fields());
                Term::Dot(path)
            }
            Tok::Var(v) => Term::Var(v, self.fields()),
            Tok::Lit(v) => Term::Lit(v),
            Tok::Ident(name) => {
                if !(self.known)(&name) {
                    return Err(self.err(format!("unsupported template function {name:?}")));
                }
                Term::Func(name)
            }
            Tok::LParen => {
                let p = self.pipe(true)?;
                if self.peek() != Some(&Tok::RParen) {
                    return Err(self.err("unclosed parenthesis"));
                }
                self.pos += 1;
                Term::Sub(Box::new(p), self.fields())
            }
            other => return Err(self.err(format!("unexpected {other:?} in operand"))),
        })
    }
}

fn parse_pipe(src: &str, line: usize, known: &dyn Fn(&str) -> bool) -> Result<Pipe, ParseError> {
    let toks = lex(src, line)?;
    let mut t = Toks {
        toks: &toks,
        pos: 0,
        line,
        known,
    };
    let p = t.pipe(false)?;
    if t.pos != toks.len() {
        return Err(t.err(format!("unexpected {:?} after pipeline", toks[t.pos].0)));
    }
    Ok(p)
}

// === splitting text and actions; the control structures ===

enum Seg {
    Text(String),
    Action(String, usize),
}

fn segments(src: &str) -> Result<Vec<Seg>, ParseError> {
    let mut out = Vec::new();
    let mut rest = src;
    let mut line = 1;
    let mut trim_next = false;
    while let Some(open) = rest.find("{{") {
        let mut text = &rest[..open];
        if trim_next {
            text = text.trim_start();
        }
        let after = &rest[open + 2..];
        let trim_before =
            after.starts_with("- ") || after.starts_with("-\t") || after.starts_with("-\n");
        if trim_before {
            text = text.trim_end();
        }
        line += rest[..open].matches('\n').count();
        out.push(Seg::Text(text.to_string()));
        let body_start = if trim_before { 1 } else { 0 };
        let Some(close) = after.find("}}") else {
            return Err(ParseError {
                line,
                message: "unclosed action".into(),
            });
        };
        let mut inner = &after[body_start..close];
        trim_next = false;
        if inner.ends_with(" -") || inner.ends_with("\t-") || inner.ends_with("\n-") {
            inner = &inner[..inner.len() - 1];
            trim_next = true;
        }
        let inner_t = inner.trim();
        if !(inner_t.starts_with("/*") && inner_t.ends_with("*/")) {
            out.push(Seg::Action(inner_t.to_string(), line));
        }
        line += after[..close].matches('\n').count();
        rest = &after[close + 2..];
    }
    let text = if trim_next { rest.trim_start() } else { rest };
    out.push(Seg::Text(text.to_string()));
    Ok(out)
}

/// Parses `src`; `known` says which function names exist.
pub fn parse(src: &str, known: &dyn Fn(&str) -> bool) -> Result<Vec<Node>, ParseError> {
    let segs = segments(src)?;
    let mut pos = 0;
    let (nodes, end) = list(&segs, &mut pos, known)?;
    if let Some((word, line)) = end {
        return Err(ParseError {
            line,
            message: format!("unexpected {{{{{word}}}}}"),
        });
    }
    Ok(nodes)
}

/// What ended a list: `end`, `else`, `else if …`, `else with …` (with its line).
type Ending = Option<(String, usize)>;

fn list(
    segs: &[Seg],
    pos: &mut usize,
    known: &dyn Fn(&str) -> bool,
) -> Result<(Vec<Node>, Ending), ParseError> {
    let mut nodes = Vec::new();
    while *pos < segs.len() {
        let seg = &segs[*pos];
        *pos += 1;
        let (action, line) = match seg {
            Seg::Text(t) => {
                if !t.is_empty() {
                    nodes.push(Node::Text(t.clone()));
                }
                continue;
            }
            Seg::Action(a, line) => (a.as_str(), *line),
        };
        let (word, rest) = match action.split_once(|c: char| c.is_whitespace()) {
            Some((w, r)) => (w, r.trim()),
            None => (action, ""),
        };
        match word {
            "end" | "else" => return Ok((nodes, Some((action.to_string(), line)))),
            "if" | "with" | "range" => {
                nodes.push(control(word, rest, line, segs, pos, known)?);
            }
            "break" | "continue" | "template" | "define" | "block" => {
                return Err(ParseError {
                    line,
                    message: format!("unsupported action {{{{{word}}}}}"),
                })
            }
            _ => nodes.push(Node::Action(parse_pipe(action, line, known)?)),
        }
    }
    Ok((nodes, None))
}

fn control(
    word: &str,
    rest: &str,
    line: usize,
    segs: &[Seg],
    pos: &mut usize,
    known: &dyn Fn(&str) -> bool,
) -> Result<Node, ParseError> {
    let pipe = parse_pipe(rest, line, known)?;
    let (body, end) = list(segs, pos, known)?;
    let unclosed = || ParseError {
        line,
        message: format!("{{{{{word}}}}} without {{{{end}}}}"),
    };
    let (ending, eline) = end.ok_or_else(unclosed)?;
    let otherwise = if ending == "end" {
        Vec::new()
    } else {
        let after_else = ending.trim_start_matches("else").trim();
        if after_else.is_empty() {
            let (other, end2) = list(segs, pos, known)?;
            match end2 {
                Some((e, _)) if e == "end" => other,
                _ => return Err(unclosed()),
            }
        } else {
            // `else if …` / `else with …`: a nested structure sharing this `end`.
            let (w2, r2) = after_else
                .split_once(|c: char| c.is_whitespace())
                .unwrap_or((after_else, ""));
            if w2 != "if" && w2 != "with" {
                return Err(ParseError {
                    line: eline,
                    message: format!("unexpected {{{{{ending}}}}}"),
                });
            }
            vec![control(w2, r2.trim(), eline, segs, pos, known)?]
        }
    };
    Ok(match word {
        "if" => Node::If {
            cond: pipe,
            then: body,
            otherwise,
        },
        "with" => Node::With {
            cond: pipe,
            then: body,
            otherwise,
        },
        _ => Node::Range {
            pipe,
            body,
            otherwise,
        },
    })
}
