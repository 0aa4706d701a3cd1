//! Reading Prometheus text exposition (`/metrics` of kube-apiserver, etcd,
//! the simulator, tollgate): one sample per line,
//! `name{label="value",...} value [timestamp]`, comments (`# HELP`, `# TYPE`)
//! skipped. Label values may hold escaped quotes, backslashes and newlines
//! (`\"`, `\\`, `\n`) and even `}` or `,`; values may be `+Inf`, `-Inf` or
//! `NaN`. A line that does not parse is skipped, as a scraper must not fail
//! on one odd series.
//!
//! The questions callers ask are helpers over [`samples`]: the sum over a
//! name's series ([`sum`]), the first series' value ([`first`]), the
//! unlabelled series ([`unlabelled`]), and the value per label ([`by_label`]).

use std::borrow::Cow;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    /// The text between `{` and `}` (empty without labels); see [`Sample::label`].
    pub raw_labels: &'a str,
    pub value: f64,
    /// Milliseconds since the epoch, when the line carries one.
    pub timestamp: Option<i64>,
}

impl<'a> Sample<'a> {
    /// The labels in order, values unescaped.
    pub fn labels(&self) -> impl Iterator<Item = (&'a str, Cow<'a, str>)> {
        Labels {
            rest: self.raw_labels,
        }
    }

    /// The value of label `name`, unescaped.
    pub fn label(&self, name: &str) -> Option<Cow<'a, str>> {
        self.labels().find(|(k, _)| *k == name).map(|(_, v)| v)
    }
}

/// Every sample in `text`, in order.
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines().filter_map(parse_line)
}

/// The sum of `name`'s series (labelled or not); `None` when it has none.
pub fn sum(text: &str, name: &str) -> Option<f64> {
    samples(text)
        .filter(|s| s.name == name)
        .fold(None, |acc, s| Some(acc.unwrap_or(0.0) + s.value))
}

/// The first of `names` present in `text`, with its [`sum`].
pub fn first_of(text: &str, names: &[&'static str]) -> Option<(&'static str, f64)> {
    names.iter().find_map(|n| sum(text, n).map(|v| (*n, v)))
}

/// The value of `name`'s first series, labelled or not.
pub fn first(text: &str, name: &str) -> Option<f64> {
    samples(text).find(|s| s.name == name).map(|s| s.value)
}

/// The value of `name`'s series without labels.
pub fn unlabelled(text: &str, name: &str) -> Option<f64> {
    samples(text)
        .find(|s| s.name == name && s.raw_labels.is_empty())
        .map(|s| s.value)
}

/// `(value of label, sample value)` for each series of any of `names` that has `label`.
pub fn by_label(text: &str, names: &[&str], label: &str) -> Vec<(String, f64)> {
    samples(text)
        .filter(|s| names.contains(&s.name))
        .filter_map(|s| Some((s.label(label)?.into_owned(), s.value)))
        .collect()
}

fn parse_line(line: &str) -> Option<Sample<'_>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line
        .find(|c: char| c == '{' || c.is_ascii_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() {
        return None;
    }
    let (raw_labels, rest) = match line[name_end..].strip_prefix('{') {
        Some(after) => {
            let close = label_block_end(after)?;
            (&after[..close], &after[close + 1..])
        }
        None => ("", &line[name_end..]),
    };
    let mut fields = rest.split_ascii_whitespace();
    let value = parse_value(fields.next()?)?;
    let timestamp = match fields.next() {
        Some(t) => Some(t.parse().ok()?),
        None => None,
    };
    Some(Sample {
        name,
        raw_labels,
        value,
        timestamp,
    })
}

/// Where the label block's `}` is, skipping quoted values.
fn label_block_end(s: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

fn parse_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => v.parse().ok(),
    }
}

struct Labels<'a> {
    rest: &'a str,
}

impl<'a> Iterator for Labels<'a> {
    type Item = (&'a str, Cow<'a, str>);

    fn next(&mut self) -> Option<Self::Item> {
        let s = self.rest.trim_start_matches([',', ' ', '\t']);
        let (key, after) = s.split_once('=')?;
        let body = after.trim_start().strip_prefix('"')?;
        let mut escaped = false;
        let mut plain = true;
        let mut end = None;
        for (i, c) in body.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => {
                    escaped = true;
                    plain = false;
                }
                '"' => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let end = end?;
        self.rest = &body[end + 1..];
        let raw = &body[..end];
        let value = if plain {
            Cow::Borrowed(raw)
        } else {
            Cow::Owned(unescape(raw))
        };
        Some((key.trim(), value))
    }
}

fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP process_cpu_seconds_total Total user and system CPU time.\n\
# TYPE process_cpu_seconds_total counter\n\
process_cpu_seconds_total 12.5\n\
process_resident_memory_bytes 1.048576e+08\n\
process_cpu_seconds_total_extra 99\n\
tollgate_sim_virtual_memory_bytes{instance=\"a\"} 100\n\
tollgate_sim_virtual_memory_bytes{instance=\"b\"} 50 1700000000\n";

    #[test]
    fn sums_firsts_and_unlabelled() {
        assert_eq!(sum(TEXT, "process_cpu_seconds_total"), Some(12.5));
        assert_eq!(sum(TEXT, "tollgate_sim_virtual_memory_bytes"), Some(150.0));
        assert_eq!(
            first(TEXT, "tollgate_sim_virtual_memory_bytes"),
            Some(100.0)
        );
        assert_eq!(unlabelled(TEXT, "tollgate_sim_virtual_memory_bytes"), None);
        assert_eq!(
            unlabelled(TEXT, "process_resident_memory_bytes"),
            Some(1.048576e8)
        );
        assert_eq!(
            first_of(TEXT, &["absent", "tollgate_sim_virtual_memory_bytes"]),
            Some(("tollgate_sim_virtual_memory_bytes", 150.0))
        );
        assert_eq!(sum(TEXT, "absent"), None);
        assert_eq!(sum(TEXT, "process_cpu"), None, "a prefix is not a name");
    }

    #[test]
    fn timestamps_and_comments() {
        let all: Vec<_> = samples(TEXT).collect();
        assert_eq!(all.len(), 5, "two comment lines skipped");
        assert_eq!(all[4].timestamp, Some(1_700_000_000));
        assert_eq!(all[0].timestamp, None);
        assert!(samples("x 1 notatime\n").next().is_none());
    }

    #[test]
    fn infinities_and_nan() {
        let text = "h_bucket{le=\"+Inf\"} +Inf\nlow -Inf\nodd NaN\n";
        assert_eq!(sum(text, "h_bucket"), Some(f64::INFINITY));
        assert_eq!(first(text, "low"), Some(f64::NEG_INFINITY));
        assert!(first(text, "odd").is_some_and(f64::is_nan));
        let b = samples(text).next().expect("bucket");
        assert_eq!(b.label("le").as_deref(), Some("+Inf"));
    }

    #[test]
    fn escaped_label_values() {
        let text = "m{path=\"/a\\\"b}\",msg=\"x,y=z\\\\\\n\",resource=\"pods\"} 3\n";
        let s = samples(text).next().expect("one sample");
        assert_eq!(s.value, 3.0);
        assert_eq!(s.label("path").as_deref(), Some("/a\"b}"));
        assert_eq!(s.label("msg").as_deref(), Some("x,y=z\\\n"));
        assert_eq!(s.label("resource").as_deref(), Some("pods"));
        assert_eq!(s.label("absent"), None);
        assert_eq!(s.labels().count(), 3);
    }

    #[test]
    fn values_by_label() {
        let text = "apiserver_storage_objects{resource=\"pods\"} 15000\n\
apiserver_storage_objects{resource=\"deployments.apps\"} 3.2e+03\n\
etcd_object_counts{resource=\"nodes\"} 5000\n\
apiserver_storage_objects_total{resource=\"x\"} 1\n\
apiserver_storage_objects 7\n";
        assert_eq!(
            by_label(
                text,
                &["apiserver_storage_objects", "etcd_object_counts"],
                "resource"
            ),
            vec![
                ("pods".to_string(), 15000.0),
                ("deployments.apps".to_string(), 3200.0),
                ("nodes".to_string(), 5000.0),
            ]
        );
    }

    #[test]
    fn odd_lines_are_skipped() {
        let text = "\n  \nno_value\nunclosed{a=\"b\" 1\nbad 1x\n{a=\"b\"} 2\ngood 4\n";
        let all: Vec<_> = samples(text).map(|s| (s.name, s.value)).collect();
        assert_eq!(all, vec![("good", 4.0)]);
    }
}
