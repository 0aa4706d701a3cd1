//! Label and field selectors: whatever parses prints as a string that
//! parses back to the same selector (the pattern cache, the relist guard's
//! rewrite and the simulator re-read what was printed). The first byte
//! picks the grammar.
#![no_main]

use apimodel::{FieldSelector, LabelSelector};
use libfuzzer_sys::fuzz_target;

/// A field selector written back with the escapes `fields.ParseSelector`
/// reads (`\,` `\=` `\\`); apimodel has no printer of its own for
/// them (pattern keys keep only their shape).
fn print_field(sel: &FieldSelector) -> String {
    let escape = |s: &str| {
        let mut out = String::with_capacity(s.len());
        for c in s.chars() {
            if matches!(c, '\\' | ',' | '=') {
                out.push('\\');
            }
            out.push(c);
        }
        out
    };
    sel.requirements
        .iter()
        .map(|r| {
            let op = match r.op {
                apimodel::selector::FieldOp::Equals => "=",
                apimodel::selector::FieldOp::NotEquals => "!=",
            };
            // `a!` `=` `b` written `a!=b` would read as `a` `!=` `b`; the
            // parser trims the field, so a space keeps them apart.
            let gap = if r.field.ends_with('!') { " " } else { "" };
            format!("{}{gap}{op}{}", escape(&r.field), escape(&r.value))
        })
        .collect::<Vec<_>>()
        .join(",")
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(s) = std::str::from_utf8(rest) else {
        return;
    };
    if which % 2 == 0 {
        if let Ok(sel) = LabelSelector::parse(s) {
            let printed = sel.to_string();
            let again = LabelSelector::parse(&printed)
                .unwrap_or_else(|e| panic!("{s:?} printed as {printed:?}, which fails: {e}"));
            assert_eq!(sel, again, "{s:?} printed as {printed:?}");
        }
    } else if let Ok(sel) = FieldSelector::parse(s) {
        let printed = print_field(&sel);
        let again = FieldSelector::parse(&printed)
            .unwrap_or_else(|e| panic!("{s:?} printed as {printed:?}, which fails: {e}"));
        assert_eq!(sel, again, "{s:?} printed as {printed:?}");
    }
});
