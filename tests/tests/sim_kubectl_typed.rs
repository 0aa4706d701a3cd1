//! kubectl commands that use typed clients send protobuf bodies: the
//! simulator decodes them, so `kubectl create configmap`, `create namespace`,
//! `run`, and `create secret|serviceaccount|role|deployment|job|service` work as
//! against a real apiserver.

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
    // The kinds served generically (issue 19), created from protobuf bodies.
    k.ok(&[
        "create",
        "secret",
        "generic",
        "s",
        "-n",
        "team-a",
        "--from-literal=a=b",
    ])?;
    assert_eq!(
        k.ok(&[
            "get",
            "secret",
            "s",
            "-n",
            "team-a",
            "-o",
            "jsonpath={.data.a} {.type}"
        ])?,
        "Yg== Opaque"
    );
    k.ok(&["create", "serviceaccount", "robot", "-n", "team-a"])?;
    k.ok(&[
        "create",
        "role",
        "reader",
        "-n",
        "team-a",
        "--verb=get,list",
        "--resource=pods",
    ])?;
    assert_eq!(
        k.ok(&[
            "get",
            "role",
            "reader",
            "-n",
            "team-a",
            "-o",
            "jsonpath={.rules[0].verbs}"
        ])?,
        r#"["get","list"]"#
    );
    k.ok(&[
        "create",
        "deployment",
        "api",
        "-n",
        "team-a",
        "--image=nginx:1.27",
        "--replicas=2",
    ])?;
    assert_eq!(
        k.ok(&["get", "deployment", "api", "-n", "team-a", "-o", "jsonpath={.spec.replicas} {.spec.template.spec.containers[0].image} {.metadata.generation}"])?,
        "2 nginx:1.27 1"
    );
    k.ok(&[
        "create",
        "service",
        "clusterip",
        "api",
        "-n",
        "team-a",
        "--tcp=80:8080",
    ])?;
    let svc = k.ok(&[
        "get",
        "service",
        "api",
        "-n",
        "team-a",
        "-o",
        "jsonpath={.spec.clusterIP} {.spec.ports[0].targetPort}",
    ])?;
    assert!(svc.starts_with("10.96.") && svc.ends_with(" 8080"), "{svc}");
    k.ok(&["create", "job", "once", "-n", "team-a", "--image=busybox"])?;
    assert_eq!(
        k.ok(&[
            "get",
            "job",
            "once",
            "-n",
            "team-a",
            "-o",
            "jsonpath={.spec.template.spec.restartPolicy} {.spec.completions}"
        ])?,
        "Never 1"
    );
    // A kind whose protobuf body the simulator does not read is refused, naming it.
    let refused = k.fails(&["create", "quota", "q", "-n", "team-a", "--hard=pods=1"])?;
    assert!(
        refused.contains("not \"ResourceQuota\"; send JSON"),
        "{refused}"
    );
    Ok(())
}
