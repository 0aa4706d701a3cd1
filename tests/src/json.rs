//! Reading API answers in tests: JSON pointers, short previews, and who a
//! SelfSubjectReview (`kubectl auth whoami`) says the caller is.

use crate::Kubectl;
use serde_json::Value;

/// The first 500 characters of a value, for assertion messages.
pub fn abbreviated(v: &Value) -> String {
    v.to_string().chars().take(500).collect()
}

/// The string at a JSON pointer, or `""`.
pub fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// `(user, uid, groups, extra)` from a SelfSubjectReview.
pub fn user_info(review: &Value) -> anyhow::Result<(String, String, Vec<String>, Value)> {
    anyhow::ensure!(
        review["kind"] == "SelfSubjectReview",
        "not a SelfSubjectReview: {}",
        abbreviated(review)
    );
    let info = &review["status"]["userInfo"];
    let groups = info["groups"]
        .as_array()
        .map(|g| {
            g.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    Ok((
        str_at(info, "/username").to_string(),
        str_at(info, "/uid").to_string(),
        groups,
        info.get("extra").cloned().unwrap_or(Value::Null),
    ))
}

/// `kubectl auth whoami -o json`: user, uid and groups.
pub fn whoami(k: &Kubectl) -> anyhow::Result<(String, String, Vec<String>)> {
    let (user, uid, groups, _) = user_info(&k.json(&["auth", "whoami", "-o", "json"])?)?;
    Ok((user, uid, groups))
}
