//! `kubectl apply -f` of the kinds the simulator serves generically (issue 19): a Deployment,
//! a Service and a ConfigMap created, then configured by a second apply; a CRD, then one of
//! its custom objects, validated against the CRD's schema, and removed with the CRD.

use super::*;

const WORKLOAD: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: REPLICAS
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx:1.19
        ports: [{containerPort: 80}]
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 80}]
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: web-config
data:
  index.html: hello
"#;

const CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer}
"#;

const WIDGET: &str = r#"apiVersion: example.com/v1
kind: Widget
metadata:
  name: w1
spec:
  size: SIZE
"#;

pub(crate) fn apply_workload_and_custom_resource(
    scheme: Scheme,
    store: Store,
) -> anyhow::Result<()> {
    let sim = SimProcess::start_on(store, scheme.sim_args())?;
    let k = sim.kubectl();
    let dir = tempfile::tempdir()?;
    let write = |name: &str, text: String| -> anyhow::Result<String> {
        let path = dir.path().join(name);
        std::fs::write(&path, text)?;
        Ok(path.display().to_string())
    };

    let first = write("workload.yaml", WORKLOAD.replace("REPLICAS", "2"))?;
    let out = k.ok(&["apply", "-f", &first])?;
    let lines: BTreeSet<&str> = out.lines().collect();
    let want: BTreeSet<&str> = [
        "deployment.apps/web created",
        "service/web created",
        "configmap/web-config created",
    ]
    .into();
    assert_eq!(lines, want, "{out}");
    // kubectl's tables: the real columns for these kinds.
    let shown = k.ok(&["get", "deployments"])?;
    let (header, rows) = table(&shown)?;
    assert_eq!(
        header,
        ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"],
        "{shown}"
    );
    assert_eq!(&rows[0][..4], ["web", "0/2", "0", "0"], "{shown}");
    let shown = k.ok(&["get", "service", "web"])?;
    let (header, rows) = table(&shown)?;
    assert_eq!(
        header,
        [
            "NAME",
            "TYPE",
            "CLUSTER-IP",
            "EXTERNAL-IP",
            "PORT(S)",
            "AGE"
        ]
    );
    assert_eq!(rows[0][1], "ClusterIP");
    assert!(rows[0][2].starts_with("10.96."), "{shown}");
    assert_eq!(rows[0][4], "80/TCP");
    assert_eq!(
        k.ok(&[
            "get",
            "configmap",
            "web-config",
            "-o",
            "jsonpath={.data.index\\.html}"
        ])?,
        "hello"
    );

    // A second apply changes only the Deployment, and bumps its generation.
    let second = write("workload2.yaml", WORKLOAD.replace("REPLICAS", "3"))?;
    let out = k.ok(&["apply", "-f", &second])?;
    let lines: BTreeSet<&str> = out.lines().collect();
    let want: BTreeSet<&str> = [
        "deployment.apps/web configured",
        "service/web unchanged",
        "configmap/web-config unchanged",
    ]
    .into();
    assert_eq!(lines, want, "{out}");
    let deploy = k.json(&["get", "deployment", "web", "-o", "json"])?;
    assert_eq!(deploy["spec"]["replicas"], 3);
    assert_eq!(deploy["metadata"]["generation"], 2);
    assert_eq!(
        k.ok(&["scale", "deployment", "web", "--replicas=5"])?
            .trim(),
        "deployment.apps/web scaled"
    );
    assert_eq!(
        k.ok(&[
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.spec.replicas}"
        ])?,
        "5"
    );

    // A CRD, then its custom object: served, checked against the schema, shown in a table.
    let crd = write("crd.yaml", CRD.to_string())?;
    assert_eq!(
        k.ok(&["apply", "-f", &crd])?.trim(),
        "customresourcedefinition.apiextensions.k8s.io/widgets.example.com created"
    );
    let widget = write("widget.yaml", WIDGET.replace("SIZE", "3"))?;
    assert_eq!(
        k.ok(&["apply", "-f", &widget])?.trim(),
        "widget.example.com/w1 created"
    );
    let shown = k.ok(&["get", "wd"])?;
    let (header, rows) = table(&shown)?;
    assert_eq!(header, ["NAME", "AGE"], "{shown}");
    assert_eq!(rows[0][0], "w1");
    let bad = write("bad.yaml", WIDGET.replace("SIZE", "big"))?;
    let refused = k.fails(&["apply", "-f", &bad])?;
    assert!(
        refused.contains("spec.size in body must be of type integer"),
        "{refused}"
    );
    assert_eq!(
        k.ok(&["get", "widget", "w1", "-o", "jsonpath={.spec.size}"])?,
        "3"
    );

    // Deleting the CRD takes its objects and its resource with it.
    k.ok(&["delete", "-f", &crd])?;
    let gone = k.fails(&[
        "get",
        "--raw",
        "/apis/example.com/v1/namespaces/default/widgets",
    ])?;
    assert!(
        gone.contains("NotFound") || gone.contains("not found"),
        "{gone}"
    );
    still_running(sim)
}
