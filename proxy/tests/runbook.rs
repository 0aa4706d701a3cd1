//! The alerts' runbook (dashboards/RUNBOOK.md) names settings an operator
//! will go and change: every one it names must be a real field of the
//! configuration file, and every alert's section must say what the operator
//! sees, what it means, and which settings change it.
#![allow(clippy::unwrap_used)]

use tollgate::Config;

const RUNBOOK: &str = include_str!("../../dashboards/RUNBOOK.md");
const RULES: &str = include_str!("../../dashboards/rules.yaml");

/// The configuration file's top-level fields: a backticked mention that starts with one of
/// them is a setting.
const TOP: [&str; 15] = [
    "mode",
    "listen",
    "maxConnections",
    "adminListen",
    "admin",
    "tls",
    "upstream",
    "timeouts",
    "patterns",
    "drain",
    "tokenReview",
    "lanes",
    "quota",
    "relistGuard",
    "kind",
];

/// Every `field.path` in backticks whose first part is a top-level field (a trailing `.*`
/// dropped).
fn mentioned_settings(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (i, part) in text.split('`').enumerate() {
        if i % 2 == 0 {
            continue;
        }
        let path = part.trim_end_matches(".*");
        let plain = !path.is_empty() && path.chars().all(|c| c.is_ascii_alphanumeric() || c == '.');
        let first = path.split('.').next().unwrap_or("");
        if plain && TOP.contains(&first) && !found.iter().any(|f| f == path) {
            found.push(path.to_string());
        }
    }
    found
}

/// Whether the configuration file knows `path` (`quota.adaptive.minBytesPerSecond`): a file
/// setting it to null is refused as an unknown field if not (every section denies unknown
/// fields); a wrong type says the field exists.
fn is_field(path: &str) -> Result<(), String> {
    let parts: Vec<&str> = path.split('.').collect();
    let mut yaml = String::new();
    for (depth, p) in parts.iter().enumerate() {
        yaml.push_str(&"  ".repeat(depth));
        yaml.push_str(p);
        yaml.push(':');
        yaml.push_str(if depth + 1 == parts.len() {
            " null\n"
        } else {
            "\n"
        });
    }
    match Config::from_yaml(&yaml) {
        Err(e) if e.contains("unknown field") => Err(e),
        _ => Ok(()),
    }
}

#[test]
fn the_field_check_tells_a_real_field_from_a_typo() {
    assert!(is_field("quota.adaptive.minBytesPerSecond").is_ok());
    assert!(is_field("lanes.maxInflight.self").is_ok());
    assert!(is_field("mode").is_ok());
    assert!(is_field("quota.adaptive.minBytesPerSecondd").is_err());
    assert!(is_field("quota.bytesPerSec").is_err());
    assert_eq!(
        mentioned_settings("raise `quota.bytesPerSecond`, not `quota.adaptive.*` or `foo.bar`"),
        vec!["quota.bytesPerSecond", "quota.adaptive"]
    );
}

#[test]
fn every_setting_the_runbook_names_exists() {
    let settings = mentioned_settings(RUNBOOK);
    assert!(settings.len() >= 30, "{settings:?}");
    let wrong: Vec<String> = settings
        .iter()
        .filter_map(|s| is_field(s).err().map(|e| format!("`{s}`: {e}")))
        .collect();
    assert!(
        wrong.is_empty(),
        "not in the configuration:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_alert_says_what_is_seen_what_it_means_and_which_settings() {
    let alerts: Vec<&str> = RULES
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 10, "{alerts:?}");
    for alert in alerts {
        let heading = format!("\n## {alert}\n");
        let start = RUNBOOK
            .find(&heading)
            .unwrap_or_else(|| panic!("no section {alert}"));
        let body = &RUNBOOK[start + heading.len()..];
        let body = &body[..body.find("\n## ").unwrap_or(body.len())];
        for part in ["**What you see**", "**What it means**", "**Settings"] {
            assert!(body.contains(part), "{alert}: no {part}");
        }
    }
    // The budget's alerts say what does nothing in the adaptive default.
    for alert in [
        "TollgateQuotaExhausted",
        "TollgateHeavyQueueBacklog",
        "TollgateHighRejectRate",
    ] {
        let start = RUNBOOK.find(&format!("## {alert}\n")).unwrap();
        let body = &RUNBOOK[start..];
        let body = &body[..body[3..].find("\n## ").map_or(body.len(), |e| e + 3)];
        assert!(
            body.contains("**Do nothing in adaptive mode**"),
            "{alert} says which settings do nothing in adaptive mode"
        );
    }
}
