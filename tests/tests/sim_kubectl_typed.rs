//! kubectl commands that use typed clients send protobuf bodies: the
//! simulator decodes them, so `kubectl create configmap`, `create namespace`
//! and `run` work as against a real apiserver.

use tests::SimProcess;

#[test]
fn kubectl_create_and_run_send_protobuf_and_work() -> anyhow::Result<()> {
    let sim = SimProcess::start(&["--nodes", "2"])?;
    let k = sim.kubectl();
    k.ok(&["create", "namespace", "team-a"])?;
    assert_eq!(
        k.ok(&[
            "get",
            "namespace",
            "team-a",
            "-o",
            "jsonpath={.status.phase}"
        ])?,
        "Active"
    );
    k.ok(&[
        "create",
        "configmap",
        "cfg",
        "-n",
        "team-a",
        "--from-literal=color=blue",
        "--from-literal=size=xl",
    ])?;
    assert_eq!(
        k.ok(&[
            "get",
            "cm",
            "cfg",
            "-n",
            "team-a",
            "-o",
            "jsonpath={.data.color},{.data.size}"
        ])?,
        "blue,xl"
    );
    k.ok(&[
        "run",
        "web",
        "-n",
        "team-a",
        "--image=nginx:1.27",
        "--port=8080",
        "--env=MODE=demo",
        "--labels=app=web",
    ])?;
    let spec = k.ok(&["get", "pod", "web", "-n", "team-a", "-o", "jsonpath={.spec.containers[0].image} {.spec.containers[0].ports[0].containerPort} {.spec.containers[0].env[0].value} {.metadata.labels.app}"])?;
    assert_eq!(spec, "nginx:1.27 8080 demo web");
    // Secrets are not served: 404, as for any resource the server lacks.
    let refused = k.fails(&["create", "secret", "generic", "s", "--from-literal=a=b"])?;
    assert!(
        refused.contains("the server could not find the requested resource"),
        "{refused}"
    );
    Ok(())
}
