//! Scenario files refused before anything runs — each error names the file,
//! the path inside it and the reason — and every shipped example accepted.

use std::path::{Path, PathBuf};

use loadgen::scenario::{load, ScenarioError};

const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {{.Name}}\nspec:\n  containers:\n  - {name: c, image: pause}\n";

/// Writes `scenario` (and a pod template) into a fresh dir; returns the dir and the file.
fn write(scenario: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("pod.yaml"), POD).expect("template");
    let file = dir.path().join("s.yaml");
    std::fs::write(&file, scenario).expect("scenario");
    (dir, file)
}

/// Loads `scenario` expecting a refusal; returns (path, reason) after checking the file is named.
fn refused(scenario: &str) -> (String, String) {
    let (_dir, file) = write(scenario);
    match load(&file, &[]) {
        Ok(_) => panic!("accepted:\n{scenario}"),
        Err(ScenarioError::Invalid {
            file: f,
            path,
            reason,
        }) => {
            assert_eq!(f, file);
            let shown = ScenarioError::Invalid {
                file: f.clone(),
                path: path.clone(),
                reason: reason.clone(),
            }
            .to_string();
            assert!(
                shown.starts_with(&format!("{}: {path}: ", file.display())),
                "{shown}"
            );
            (path, reason)
        }
        Err(e) => panic!("refused for another reason: {e}"),
    }
}

const OBJECTS: &str = "namespaces: 1\ntuningSets:\n- {name: u, qpsLoad: {qps: 10}}\nsteps:\n";

fn phase(replicas: u32, template: &str, tuning: &str) -> String {
    format!("- phases:\n  - namespaceRange: {{min: 1, max: 1}}\n    replicasPerNamespace: {replicas}\n    tuningSet: {tuning}\n    objectBundle:\n    - {{basename: web, objectTemplatePath: {template}}}\n")
}

#[test]
fn unknown_fields_are_refused_with_their_path() {
    let (path, reason) = refused(&format!(
        "{OBJECTS}{}",
        phase(1, "pod.yaml", "u").replace("tuningSet: u", "tuningSet: u\n    replicas: 3")
    ));
    assert_eq!(path, "steps[0].phases[0].replicas");
    assert!(reason.contains("unknown field `replicas`"), "{reason}");
    let (path, _) = refused("steps:\n- measurements:\n  - {method: APIResponsiveness, action: start, params: {thresold: {}}}\n");
    assert_eq!(path, "steps[0].measurements[0].params.thresold");
}

#[test]
fn changing_replicas_and_template_in_one_phase_is_refused() {
    let (dir, _) = write("");
    std::fs::write(
        dir.path().join("pod-v2.yaml"),
        POD.replace("c, image", "d, image"),
    )
    .expect("v2");
    let text = format!(
        "{OBJECTS}{}{}",
        phase(2, "pod.yaml", "u"),
        phase(3, "pod-v2.yaml", "u")
    );
    let file = dir.path().join("s.yaml");
    std::fs::write(&file, &text).expect("write");
    let err = load(&file, &[]).expect_err("replicas and template at once");
    let shown = err.to_string();
    assert!(shown.contains("steps[1].phases[0]"), "{shown}");
    assert!(
        shown.contains("replicasPerNamespace (2 → 3) and objectTemplatePath"),
        "{shown}"
    );
    // One at a time is fine: the update, then the scale.
    let ok = format!(
        "{OBJECTS}{}{}{}",
        phase(2, "pod.yaml", "u"),
        phase(2, "pod-v2.yaml", "u"),
        phase(3, "pod-v2.yaml", "u")
    );
    std::fs::write(&file, ok).expect("write");
    load(&file, &[]).expect("one change per phase");
}

#[test]
fn a_tuning_set_that_does_not_exist_is_refused() {
    let (path, reason) = refused(&format!("{OBJECTS}{}", phase(1, "pod.yaml", "fast")));
    assert_eq!(path, "steps[0].phases[0].tuningSet");
    assert!(
        reason.contains("no tuning set named `fast` (defined: u)"),
        "{reason}"
    );
    let (path, reason) = refused("tuningSets:\n- {name: u, qpsLoad: {qps: 1}, steppedLoad: {burstSize: 1, stepDelay: 1s}}\nsteps:\n- measurements: [{method: apiresponsiveness, action: start}]\n");
    assert_eq!(path, "tuningSets[0]");
    assert!(reason.contains("exactly one of"), "{reason}");
}

#[test]
fn templates_that_do_not_parse_are_refused_with_the_template_line() {
    let (dir, _) = write("");
    std::fs::write(
        dir.path().join("bad.yaml"),
        "kind: Pod\napiVersion: v1\nmetadata:\n  name: {{.Name}}-{{N%}}\n",
    )
    .expect("bad");
    let file = dir.path().join("s.yaml");
    std::fs::write(&file, format!("{OBJECTS}{}", phase(1, "bad.yaml", "u"))).expect("write");
    let shown = load(&file, &[]).expect_err("bad template").to_string();
    assert!(
        shown.contains("steps[0].phases[0].objectBundle[0].objectTemplatePath"),
        "{shown}"
    );
    assert!(shown.contains("bad.yaml: line 4"), "{shown}");
    assert!(shown.contains("both sides"), "{shown}");
    // A parameter the scenario does not define.
    let (path, reason) = refused(
        "params: {Rate: 5/s}\nsteps:\n- phases:\n  - {loadgen: '--lists {{.Rat}}', duration: 1s}\n",
    );
    assert_eq!(path, "(template)");
    assert!(
        reason.contains("line 4") && reason.contains("unknown parameter `Rat`"),
        "{reason}"
    );
}

#[test]
fn phase_flags_and_measurements_are_checked() {
    let (path, reason) =
        refused("steps:\n- phases:\n  - {loadgen: '--lists 5/fortnight', duration: 1s}\n");
    assert_eq!(path, "steps[0].phases[0].loadgen");
    assert!(reason.contains("fortnight"), "{reason}");
    let (path, reason) = refused(
        "steps:\n- phases:\n  - {loadgen: '--lists 5/s --server http://x', duration: 1s}\n",
    );
    assert_eq!(path, "steps[0].phases[0].loadgen");
    assert!(
        reason.contains("--server is set by `loadgen run`"),
        "{reason}"
    );
    let (path, _) = refused("steps:\n- phases:\n  - {loadgen: '--lists 5/s'}\n");
    assert_eq!(path, "steps[0].phases[0]");
    let (path, reason) = refused(
        "steps:\n- measurements: [{method: APIResponsiveness, identifier: a, action: gather}]\n",
    );
    assert_eq!(path, "steps[0].measurements[0]");
    assert!(reason.contains("not started"), "{reason}");
    let (path, reason) = refused(
        "steps:\n- measurements: [{method: APIResponsiveness, identifier: a, action: start}]\n",
    );
    assert_eq!(path, "steps[0].measurements[0]");
    assert!(reason.contains("never gathered"), "{reason}");
    let (path, _) = refused("steps:\n- measurements: [{method: Bogus, action: start}]\n");
    assert_eq!(path, "steps[0].measurements[0].method");
}

#[test]
fn keys_are_case_insensitive_and_params_can_be_overridden() {
    let text = "Name: ci\nParams: {Replicas: 5}\nNamespaces: 2\nTuningSets:\n- {Name: u, QpsLoad: {Qps: 10}}\nSteps:\n- Phases:\n  - NamespaceRange: {Min: 1, Max: 2}\n    ReplicasPerNamespace: {{.Replicas}}\n    TuningSet: u\n    ObjectBundle:\n    - {Basename: web, ObjectTemplatePath: pod.yaml}\n";
    let (_dir, file) = write(text);
    let s = load(&file, &[]).expect("capitalized keys");
    assert_eq!(
        s.namespaces,
        vec!["loadgen-ci-1".to_string(), "loadgen-ci-2".to_string()]
    );
    let replicas = |s: &loadgen::scenario::Scenario| match &s.steps[0].body {
        loadgen::scenario::validate::StepBody::Phases(p) => match &p[0].kind {
            loadgen::scenario::validate::PhaseKind::Objects(o) => o.replicas,
            _ => panic!("objects"),
        },
        _ => panic!("phases"),
    };
    assert_eq!(replicas(&s), 5);
    let s = load(&file, &[("Replicas".into(), "2".into())]).expect("override");
    assert_eq!(replicas(&s), 2);
}

#[test]
fn every_shipped_example_is_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("scenarios dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml" || e == "json") {
            if let Err(e) = load(&path, &[]) {
                panic!("{e}");
            }
            seen += 1;
        }
    }
    assert!(seen >= 6, "only {seen} example scenarios");
}

#[test]
fn json_files_are_read_too() {
    let text = r#"{"name": "j", "namespaces": {"count": 1, "basename": "jj"},
      "Steps": [{"phases": [{"namespaceRange": {"min": 1, "max": 1},
        "replicasPerNamespace": 2,
        "objectBundle": [{"basename": "web", "objectTemplatePath": "pod.yaml"}]}]}]}"#;
    let (_dir, file) = write(text);
    let s = load(&file, &[]).expect("JSON scenario");
    assert_eq!(s.namespaces, vec!["jj-1".to_string()]);
    let (path, reason) = refused(r#"{"steps": [{"phases": [], "measurements": []}]}"#);
    assert_eq!(path, "steps[0]");
    assert!(
        reason.contains("needs `phases` or `measurements`"),
        "{reason}"
    );
}
