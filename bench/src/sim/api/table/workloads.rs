//! The cells of the workload and Service tables, as 1.20's printers fill them.

use serde_json::Value;

fn containers(spec: &Value) -> (String, String) {
    let cs = spec["template"]["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = cs.iter().filter_map(|c| c["name"].as_str()).collect();
    let images: Vec<&str> = cs.iter().filter_map(|c| c["image"].as_str()).collect();
    (names.join(","), images.join(","))
}

/// `matchLabels` (and `matchExpressions`' keys) as a selector string, or `<none>`.
fn selector(sel: &Value) -> String {
    let mut parts: Vec<String> = sel["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let vals: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let key = e["key"].as_str().unwrap_or_default();
        parts.push(match e["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({})", vals.join(",")),
            "NotIn" => format!("{key} notin ({})", vals.join(",")),
            "Exists" => key.to_string(),
            _ => format!("!{key}"),
        });
    }
    if parts.is_empty() {
        "<none>".into()
    } else {
        parts.join(",")
    }
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

/// NAME READY UP-TO-DATE AVAILABLE AGE CONTAINERS IMAGES SELECTOR.
pub fn deployment(v: &Value, name: Value, age: String) -> Vec<Value> {
    let (c, i) = containers(&v["spec"]);
    let st = &v["status"];
    vec![
        name,
        format!(
            "{}/{}",
            int(&st["readyReplicas"]),
            int(&v["spec"]["replicas"])
        )
        .into(),
        int(&st["updatedReplicas"]).into(),
        int(&st["availableReplicas"]).into(),
        age.into(),
        c.into(),
        i.into(),
        selector(&v["spec"]["selector"]).into(),
    ]
}

/// NAME TYPE CLUSTER-IP EXTERNAL-IP PORT(S) AGE SELECTOR.
pub fn service(v: &Value, name: Value, age: String) -> Vec<Value> {
    let spec = &v["spec"];
    let ports: Vec<String> = spec["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let proto = p["protocol"].as_str().unwrap_or("TCP");
            match p["nodePort"].as_i64() {
                Some(n) => format!("{}:{n}/{proto}", int(&p["port"])),
                None => format!("{}/{proto}", int(&p["port"])),
            }
        })
        .collect();
    let external: Vec<&str> = spec["externalIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let sel: Vec<String> = spec["selector"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, x)| format!("{k}={}", x.as_str().unwrap_or_default()))
        .collect();
    let or_none = |s: String| {
        if s.is_empty() {
            "<none>".to_string()
        } else {
            s
        }
    };
    vec![
        name,
        spec["type"].as_str().unwrap_or("ClusterIP").into(),
        or_none(spec["clusterIP"].as_str().unwrap_or_default().to_string()).into(),
        or_none(external.join(",")).into(),
        or_none(ports.join(",")).into(),
        age.into(),
        or_none(sel.join(",")).into(),
    ]
}

/// NAME COMPLETIONS DURATION AGE CONTAINERS IMAGES SELECTOR.
pub fn job(v: &Value, name: Value, age: String, now: i64) -> Vec<Value> {
    let (c, i) = containers(&v["spec"]);
    let completions = match v["spec"]["completions"].as_i64() {
        Some(n) => format!("{}/{n}", int(&v["status"]["succeeded"])),
        None => format!(
            "{}/1 of {}",
            int(&v["status"]["succeeded"]),
            int(&v["spec"]["parallelism"])
        ),
    };
    let start = v["status"]["startTime"]
        .as_str()
        .and_then(crate::sim::clock::parse_rfc3339);
    let end = v["status"]["completionTime"]
        .as_str()
        .and_then(crate::sim::clock::parse_rfc3339)
        .unwrap_or(now);
    let duration = start
        .map(|s| crate::sim::clock::human_duration(end - s))
        .unwrap_or_default();
    vec![
        name,
        completions.into(),
        duration.into(),
        age.into(),
        c.into(),
        i.into(),
        selector(&v["spec"]["selector"]).into(),
    ]
}
