use super::*;
use serde_json::json;

fn node() -> Value {
    json!({"metadata":{"name":"n1","labels":{"a":"1","b":"2"},"finalizers":["x"]},
           "status":{"conditions":[
               {"type":"Ready","status":"True","lastHeartbeatTime":"t0"},
               {"type":"MemoryPressure","status":"False","lastHeartbeatTime":"t0"}],
             "addresses":[{"type":"InternalIP","address":"10.0.0.1"}]}})
}

fn run(kind: PatchType, doc: &mut Value, p: Value) -> Result<(), PatchError> {
    apply(
        kind,
        doc,
        p.to_string().as_bytes(),
        root_type("", "v1", "Node"),
    )
}

#[test]
fn merge_patch_sets_and_removes() {
    let mut d = node();
    run(
        PatchType::Merge,
        &mut d,
        json!({"metadata":{"labels":{"a":null,"c":"3"}}}),
    )
    .unwrap();
    assert_eq!(d["metadata"]["labels"], json!({"b":"2","c":"3"}));
    // Lists are replaced whole by a merge patch.
    run(
        PatchType::Merge,
        &mut d,
        json!({"status":{"conditions":[{"type":"Ready","status":"False"}]}}),
    )
    .unwrap();
    assert_eq!(d["status"]["conditions"].as_array().unwrap().len(), 1);
    assert!(matches!(
        run(PatchType::Merge, &mut d, json!([1])),
        Err(PatchError::Malformed(_))
    ));
}

#[test]
fn json_patch_ops_and_failures() {
    let mut d = node();
    run(PatchType::Json, &mut d, json!([{"op":"replace","path":"/metadata/labels/a","value":"9"},{"op":"add","path":"/metadata/labels/z","value":"0"}])).unwrap();
    assert_eq!(d["metadata"]["labels"]["a"], "9");
    assert_eq!(d["metadata"]["labels"]["z"], "0");
    assert!(matches!(
        run(
            PatchType::Json,
            &mut d,
            json!([{"op":"test","path":"/metadata/name","value":"other"}])
        ),
        Err(PatchError::Failed(_))
    ));
    assert!(matches!(
        run(PatchType::Json, &mut d, json!({"op":"add"})),
        Err(PatchError::Malformed(_))
    ));
    assert!(matches!(
        apply(PatchType::Json, &mut d, b"not json", None),
        Err(PatchError::Malformed(_))
    ));
}

#[test]
fn strategic_merges_conditions_by_type() {
    let mut d = node();
    // What a kubelet heartbeat sends.
    let p = json!({"status":{"$setElementOrder/conditions":[{"type":"Ready"},{"type":"MemoryPressure"}],
                   "conditions":[{"type":"Ready","lastHeartbeatTime":"t1"}]}});
    run(PatchType::Strategic, &mut d, p).unwrap();
    let c = d["status"]["conditions"].as_array().unwrap();
    assert_eq!(c.len(), 2);
    assert_eq!(
        c[0],
        json!({"type":"Ready","status":"True","lastHeartbeatTime":"t1"})
    );
    assert_eq!(c[1]["lastHeartbeatTime"], "t0");
    // A new condition type is appended; `$patch: delete` removes one.
    run(PatchType::Strategic, &mut d, json!({"status":{"conditions":[{"type":"DiskPressure","status":"False"},{"type":"MemoryPressure","$patch":"delete"}]}})).unwrap();
    let types: Vec<_> = d["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].clone())
        .collect();
    assert_eq!(types, vec![json!("Ready"), json!("DiskPressure")]);
}

#[test]
fn strategic_labels_finalizers_and_replace() {
    let mut d = node();
    run(
        PatchType::Strategic,
        &mut d,
        json!({"metadata":{"labels":{"a":null,"n":"x"},"finalizers":["y","x"]}}),
    )
    .unwrap();
    assert_eq!(d["metadata"]["labels"], json!({"b":"2","n":"x"}));
    assert_eq!(d["metadata"]["finalizers"], json!(["x", "y"]));
    run(
        PatchType::Strategic,
        &mut d,
        json!({"metadata":{"$deleteFromPrimitiveList/finalizers":["x"]}}),
    )
    .unwrap();
    assert_eq!(d["metadata"]["finalizers"], json!(["y"]));
    run(
        PatchType::Strategic,
        &mut d,
        json!({"metadata":{"labels":{"$patch":"replace","only":"1"}}}),
    )
    .unwrap();
    assert_eq!(d["metadata"]["labels"], json!({"only":"1"}));
    assert!(matches!(
        run(
            PatchType::Strategic,
            &mut d,
            json!({"status":{"conditions":[{"status":"x"}]}})
        ),
        Err(PatchError::Malformed(_))
    ));
}

/// Merge keys are the field's own type's, from 1.20's OpenAPI: a Service's ports by `port`,
/// a container's by `containerPort`, at any depth (a Deployment's pod template too), and a
/// list 1.20 gives no key (a pod's `containerStatuses`, `tolerations`) is replaced whole.
#[test]
fn strategic_merge_keys_are_per_type() {
    let service = root_type("", "v1", "Service");
    let mut svc = json!({"spec":{"ports":[
        {"name":"http","port":80,"targetPort":8080,"protocol":"TCP"},
        {"name":"https","port":443,"targetPort":8443,"protocol":"TCP"}]}});
    let p = json!({"spec":{"ports":[{"port":80,"targetPort":9090}]}});
    apply(
        PatchType::Strategic,
        &mut svc,
        p.to_string().as_bytes(),
        service,
    )
    .unwrap();
    let ports = svc["spec"]["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 2, "{svc}");
    assert_eq!(ports[0]["targetPort"], 9090);
    assert_eq!(ports[0]["name"], "http");
    assert_eq!(ports[1]["port"], 443);
    // Keyed by containerPort, a Service port would be refused: it has none.
    let p = json!({"spec":{"ports":[{"containerPort":80}]}});
    assert!(matches!(
        apply(
            PatchType::Strategic,
            &mut svc,
            p.to_string().as_bytes(),
            service
        ),
        Err(PatchError::Malformed(_))
    ));

    let deployment = root_type("apps", "v1", "Deployment");
    assert!(deployment.is_some());
    let mut d = json!({"spec":{"template":{"spec":{"containers":[{"name":"c","image":"i",
        "ports":[{"containerPort":80,"name":"a"},{"containerPort":81,"name":"b"}],
        "env":[{"name":"X","value":"1"}]}]}}}});
    let p = json!({"spec":{"template":{"spec":{"containers":[{"name":"c",
        "ports":[{"containerPort":81,"name":"bb"}],"env":[{"name":"Y","value":"2"}]}]}}}});
    apply(
        PatchType::Strategic,
        &mut d,
        p.to_string().as_bytes(),
        deployment,
    )
    .unwrap();
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "i");
    assert_eq!(
        c["ports"],
        json!([{"containerPort":80,"name":"a"},{"containerPort":81,"name":"bb"}])
    );
    assert_eq!(c["env"].as_array().unwrap().len(), 2);

    let pod = root_type("", "v1", "Pod");
    let mut p0 = json!({"spec":{"tolerations":[{"key":"a"},{"key":"b"}]},
        "status":{"containerStatuses":[{"name":"a","ready":false},{"name":"b","ready":false}]}});
    let p = json!({"spec":{"tolerations":[{"key":"c"}]},"status":{"containerStatuses":[{"name":"a","ready":true}]}});
    apply(PatchType::Strategic, &mut p0, p.to_string().as_bytes(), pod).unwrap();
    assert_eq!(p0["spec"]["tolerations"], json!([{"key":"c"}]));
    assert_eq!(
        p0["status"]["containerStatuses"],
        json!([{"name":"a","ready":true}])
    );
}
