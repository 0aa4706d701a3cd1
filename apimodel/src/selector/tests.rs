use super::*;
use proptest::prelude::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn label_selector_table() {
    let l = labels(&[
        ("app", "web"),
        ("tier", "front"),
        ("n", "5"),
        ("example.com/team", "a"),
    ]);
    let cases: &[(&str, bool)] = &[
        ("", true),
        ("app=web", true),
        ("app==web", true),
        ("app = web", true),
        ("app=db", false),
        ("app!=db", true),
        ("missing!=x", true),
        ("app in (web,db)", true),
        ("app in (db)", false),
        ("app notin (db, cache)", true),
        ("missing notin (x)", true),
        ("app", true),
        ("missing", false),
        ("!missing", true),
        ("!app", false),
        ("n>4", true),
        ("n<5", false),
        ("app=web,tier=front", true),
        ("app=web,tier=back", false),
        ("example.com/team=a", true),
        ("missing=", false),
    ];
    for (sel, want) in cases {
        let s = LabelSelector::parse(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
        assert_eq!(s.matches(&l), *want, "selector {sel:?}");
    }
}

#[test]
fn label_selector_errors() {
    for bad in [
        "app=",
        "=web",
        "app in web",
        "app in ()",
        "app==",
        "app=web,",
        "a b",
        "app>x",
        "-app=x",
        "Bad_/x=y",
        "app=(x",
    ] {
        if bad == "app=" || bad == "app==" {
            // An empty value is legal: `app=` selects labels whose value is "".
            assert!(LabelSelector::parse(bad).is_ok(), "{bad}");
            continue;
        }
        assert!(
            LabelSelector::parse(bad).is_err(),
            "{bad:?} should be refused"
        );
    }
}

#[test]
fn label_selector_keys_drop_values() {
    let s = LabelSelector::parse("tier in (a,b),app=web,app!=x").unwrap();
    assert_eq!(s.keys(), vec!["app".to_string(), "tier".to_string()]);
    assert_eq!(s.to_string(), "tier in (a,b),app=web,app!=x");
}

#[test]
fn field_selector_table() {
    let get = |f: &str| match f {
        "spec.nodeName" => Some("node-1".to_string()),
        "status.phase" => Some("Running".to_string()),
        "metadata.name" => Some("a,b=c".to_string()),
        _ => None,
    };
    let cases: &[(&str, bool)] = &[
        ("", true),
        ("spec.nodeName=node-1", true),
        ("spec.nodeName==node-1", true),
        ("spec.nodeName!=node-1", false),
        ("spec.nodeName=node-2", false),
        ("spec.nodeName=node-1,status.phase!=Failed", true),
        ("spec.nodeName=", false),
        ("spec.missing=", true),
        (r"metadata.name=a\,b\=c", true),
    ];
    for (sel, want) in cases {
        let s = FieldSelector::parse(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
        assert_eq!(s.matches(&get), *want, "selector {sel:?}");
    }
}

#[test]
fn field_selector_errors_and_shape() {
    for bad in ["spec.nodeName", "=x", r"a=b\", r"a=\q"] {
        assert!(FieldSelector::parse(bad).is_err(), "{bad:?}");
    }
    let s = FieldSelector::parse("status.phase!=Failed,spec.nodeName=n7").unwrap();
    assert_eq!(
        s.shape(),
        vec!["spec.nodeName=".to_string(), "status.phase!=".to_string()]
    );
    assert_eq!(s.exact("spec.nodeName"), Some("n7"));
    assert_eq!(s.exact("status.phase"), None);
}

#[test]
fn non_ascii_whitespace_is_skipped_by_characters_not_bytes() {
    // U+00A0 is whitespace two bytes long: stepping one byte split it (found by proptest).
    let s = LabelSelector::parse("\u{a0}app=web\u{2003},\u{a0}tier").unwrap();
    assert_eq!(s.keys(), vec!["app".to_string(), "tier".to_string()]);
    assert!(LabelSelector::parse("\u{a0}\u{a0}").unwrap().is_empty());
}

#[test]
fn a_value_set_of_only_the_empty_value_prints_as_it_parses_back() {
    for text in ["x notin (,)", "x in (,)", "x in (, )", "x notin (,,a)"] {
        let s = LabelSelector::parse(text).unwrap();
        let printed = s.to_string();
        assert_eq!(
            LabelSelector::parse(&printed).ok(),
            Some(s),
            "{text} printed as {printed}"
        );
    }
    assert_eq!(
        LabelSelector::parse("x notin (,)").unwrap().to_string(),
        "x notin (,)"
    );
}

/// Selector text from the grammar: requirements of every operator, values
/// often empty, spaces around the punctuation.
fn selector_text() -> impl Strategy<Value = String> {
    let key = "[a-z]([a-z0-9.-]{0,6}[a-z0-9])?";
    let value = "([a-z0-9]([a-z0-9._-]{0,4}[a-z0-9])?)?";
    let ws = "[ ]{0,1}";
    let requirement = (
        key,
        0..8usize,
        prop::collection::vec(value, 1..4),
        ws,
        "(-?[0-9]{1,3})",
    )
        .prop_map(|(k, op, values, w, int)| match op {
            0 => format!("{k}{w}={w}{}", values[0]),
            1 => format!("{k}=={}", values[0]),
            2 => format!("{k}{w}!={w}{}", values[0]),
            3 => format!("{k} in{w}({w}{}{w})", values.join(&format!("{w},{w}"))),
            4 => format!("{k} notin ({})", values.join(",")),
            5 => k,
            6 => format!("!{k}"),
            _ => format!("{k}{}{int}", if int.len() % 2 == 0 { ">" } else { "<" }),
        });
    prop::collection::vec(requirement, 1..4).prop_map(|r| r.join(","))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    /// Whatever parses prints as text that parses to the same selector.
    #[test]
    fn any_label_selector_that_parses_round_trips(text in selector_text()) {
        if let Ok(s) = LabelSelector::parse(&text) {
            let printed = s.to_string();
            prop_assert_eq!(LabelSelector::parse(&printed).ok(), Some(s), "{} printed as {}", text, printed);
        }
    }
}

proptest! {
    // A parser's guard: many cases are cheap (the fuzz target goes further).
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn parsers_never_panic(s in ".{0,64}") {
        let _ = LabelSelector::parse(&s);
        let _ = FieldSelector::parse(&s);
    }

    #[test]
    fn label_selector_round_trips(key in "[a-z][a-z0-9]{0,8}", val in "[a-z0-9]{1,8}") {
        let text = format!("{key}={val},{key} notin (x{val})");
        let s = LabelSelector::parse(&text).unwrap();
        prop_assert_eq!(LabelSelector::parse(&s.to_string()).unwrap(), s);
    }
}
