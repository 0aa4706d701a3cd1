//! What clients read from the simulator, compared with the real kube-apiserver 1.20.2
//! (issue 35): Status bodies byte for byte (encoding/json ends them with a newline); a
//! strategic merge patch of a Service's `ports` merged by `port` (its type's merge key, not a
//! container port's `containerPort`); a pod status written without `imageID`, `lastState`
//! or `lastProbeTime` read back with them, as Go always serializes them; and the
//! `kube-system/extension-apiserver-authentication` ConfigMap, the simulator started with
//! the real apiserver's own CA files and `--requestheader-*` flags (start.sh's).

use anyhow::Context;
use serde_json::{json, Value};
use tests::{RealApiserver, SimProcess};

use super::Http;

const SERVICE: &str = r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"web"},
 "spec":{"ports":[{"name":"http","port":80,"targetPort":8080},{"name":"https","port":443,"targetPort":8443}],
 "selector":{"app":"web"}}}"#;
const PORT_PATCH: &str = r#"{"spec":{"ports":[{"port":80,"targetPort":9090}]}}"#;
const POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},
 "spec":{"containers":[{"name":"c","image":"nginx:1.19"}]}}"#;
/// What kwok's pod-ready Stage writes: no imageID, no lastState, no lastProbeTime.
const STATUS_PATCH: &str = r#"{"status":{"phase":"Running",
 "conditions":[{"type":"Ready","status":"True","lastTransitionTime":"2021-01-01T00:00:00Z"}],
 "containerStatuses":[{"name":"c","image":"nginx:1.19","ready":true,"restartCount":0,
   "state":{"running":{"startedAt":"2021-01-01T00:00:00Z"}}}]}}"#;

struct Both {
    real: Http,
    sim: Http,
}

impl Both {
    /// The same request to both: (real, sim) replies, each of the expected code.
    fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, &str)>,
        code: u16,
    ) -> anyhow::Result<(super::Reply, super::Reply)> {
        // Not curl's User-Agent: kube-apiserver pretty-prints for curl.
        let ua = &["User-Agent: tollgate-e2e/1.0"];
        let r = self
            .real
            .send(method, path, body, ua)?
            .expect(code, "kube-apiserver")?;
        let s = self.sim.send(method, path, body, ua)?.expect(code, "sim")?;
        Ok((r, s))
    }
}

#[test]
fn sim_serves_what_the_real_apiserver_serves() -> anyhow::Result<()> {
    let kube = RealApiserver::start(&[])?;
    let ca = kube.file("KUBE_CA_CERT")?.display().to_string();
    let front_ca = kube.file("KUBE_FRONT_PROXY_CA_CERT")?.display().to_string();
    // start.sh's --requestheader-* flags, and the same CA files.
    let sim = SimProcess::start(&[
        "--tls",
        "--client-ca-file",
        &ca,
        "--requestheader-client-ca-file",
        &front_ca,
        "--requestheader-allowed-names",
        "front-proxy-client",
        "--requestheader-username-headers",
        "X-Remote-User",
        "--requestheader-group-headers",
        "X-Remote-Group",
        "--requestheader-extra-headers-prefix",
        "X-Remote-Extra-",
    ])?;
    let scratch = tempfile::tempdir()?;
    let sim_ca = scratch.path().join("sim-ca.crt");
    std::fs::write(
        &sim_ca,
        sim.server_ca_pem.as_deref().context("the sim's CA")?,
    )?;
    let both = Both {
        real: Http::new(&kube.url, &scratch.path().join("real"))
            .with_cacert(kube.file("KUBE_CA_CERT")?)
            .with_cert(kube.file("KUBE_ADMIN_CERT")?, kube.file("KUBE_ADMIN_KEY")?),
        sim: Http::new(&sim.url, &scratch.path().join("sim")).with_cacert(sim_ca),
    };

    // Status bodies, byte for byte.
    let (r, s) = both.send(
        "GET",
        "/api/v1/namespaces/default/configmaps/nope",
        None,
        404,
    )?;
    assert_eq!(s.text(), r.text(), "a 404's body");
    assert!(r.body.ends_with(b"}\n"), "{:?}", r.text());
    let (r, s) = both.send(
        "POST",
        "/api/v1/namespaces/default/services",
        Some(("application/json", SERVICE)),
        201,
    )?;
    let (r2, s2) = both.send(
        "POST",
        "/api/v1/namespaces/default/services",
        Some(("application/json", SERVICE)),
        409,
    )?;
    assert_eq!(s2.text(), r2.text(), "a 409's body");

    // A Service's ports merge by `port`.
    let ports = |v: &Value| v["spec"]["ports"].clone();
    assert_eq!(ports(&s.json()?), ports(&r.json()?));
    let smp = Some(("application/strategic-merge-patch+json", PORT_PATCH));
    let (r, s) = both.send("PATCH", "/api/v1/namespaces/default/services/web", smp, 200)?;
    let want = ports(&r.json()?);
    assert_eq!(want.as_array().map(Vec::len), Some(2), "{want}");
    assert_eq!(ports(&s.json()?), want);

    // A pod status without the fields Go always writes, read back with them.
    both.send(
        "POST",
        "/api/v1/namespaces/default/pods",
        Some(("application/json", POD)),
        201,
    )?;
    let status = Some(("application/strategic-merge-patch+json", STATUS_PATCH));
    let (r, s) = both.send(
        "PATCH",
        "/api/v1/namespaces/default/pods/p/status",
        status,
        200,
    )?;
    let read = |v: &Value| json!([v["status"]["containerStatuses"], v["status"]["conditions"]]);
    let (rv, sv) = (r.json()?, s.json()?);
    assert_eq!(read(&sv), read(&rv));
    assert_eq!(rv["status"]["containerStatuses"][0]["imageID"], "");

    // The authentication ConfigMap, from the same files and flags.
    let path = "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication";
    let (r, s) = both.send("GET", path, None, 200)?;
    let (rd, sd) = (r.json()?["data"].clone(), s.json()?["data"].clone());
    assert_eq!(sd, rd);
    assert_eq!(
        rd["requestheader-allowed-names"],
        r#"["front-proxy-client"]"#
    );
    Ok(())
}
