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
    apply(kind, doc, p.to_string().as_bytes())
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
        apply(PatchType::Json, &mut d, b"not json"),
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
