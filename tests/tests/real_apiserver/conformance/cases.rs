//! The table of differential cases, in the order they run: later cases read what earlier
//! ones wrote (`${var}` placeholders are filled from each server's own captures). A case is a
//! request and, when the servers differ, why (`differs`: deliberate; `sim_bug…`: a known bug
//! of the sim, listed in tests/CONFORMANCE.md).

use super::{Case, Shape, Store};

const JSON: &str = "application/json";
const MERGE: &str = "application/merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";

const CM: &str = "/api/v1/namespaces/conf/configmaps";
const DEPLOY: &str = "/apis/apps/v1/namespaces/conf/deployments";
const WIDGETS: &str = "/apis/example.com/v1/namespaces/conf/widgets";
const WIDGET_CRD: &str = r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"widgets.example.com"},"spec":{"group":"example.com","scope":"Namespaced","names":{"plural":"widgets","singular":"widget","kind":"Widget","shortNames":["wd"]},"versions":[{"name":"v1","served":true,"storage":true,"subresources":{"status":{}},"schema":{"openAPIV3Schema":{"type":"object","properties":{"spec":{"type":"object","required":["size"],"properties":{"size":{"type":"integer"},"color":{"type":"string"}}}}}}}]}}"#;

/// Why a case runs against the current release only: the sim answers with 1.37.2's documents
/// there (`--kube-version 1.37`), with its own 1.20-era `/version` on 1.20.
const CURRENT_DOCUMENTS: &str = "the current release's own document (captured by `scripts/sim-discovery.sh current`); the sim's 1.20 `/version` is its own and 1.20 has no such group";
/// Why `/version`'s `buildDate` is not compared.
const BUILD_DATE: &str = "the time `scripts/kube-current.sh` built the apiserver on this machine; the sim's capture has its own build's";
/// Why the streaming list runs against the current release only.
const WATCH_LIST_ONLY_CURRENT: &str = "streaming lists (`sendInitialEvents`, 1.27+) do not exist in 1.20, which refuses `resourceVersionMatch` on a watch; the sim serves them on both releases";
/// Why a Job differs on the current release.
const JOB_ON_CURRENT: &str = "the current release labels a Job and its template `batch.kubernetes.io/controller-uid` and `batch.kubernetes.io/job-name` too (1.27+) and selects on the former, and defaults `completionMode`, `suspend`, `podReplacementPolicy` and `manualSelector`; the sim writes 1.20's Job";
/// Why a Service differs on the current release.
const SERVICE_ON_CURRENT: &str = "dual-stack (GA in 1.23) and internal traffic policy (GA in 1.26) default `ipFamilies`, `ipFamilyPolicy` and `internalTrafficPolicy` on the current release; 1.20 sets none of them";

fn case(name: &'static str, area: &'static str, method: &'static str, path: &'static str) -> Case {
    Case {
        name,
        area,
        method,
        path,
        body: None,
        shape: Shape::Json,
        ignore: &[],
        difference: None,
        sim_bug: false,
        codes_only: false,
        uncompared: false,
        unordered: false,
        capture: &[],
        times: 1,
        until_code: None,
        on_current: None,
        only: None,
        served_from: None,
    }
}

fn get(name: &'static str, area: &'static str, path: &'static str) -> Case {
    case(name, area, "GET", path)
}

/// The table. Order matters: later cases read what earlier ones wrote.
pub(super) fn cases() -> Vec<Case> {
    vec![
        // --- create ---
        case("create namespace", "create", "POST", "/api/v1/namespaces")
            .body(JSON, r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"conf"}}"#),
        get("list empty namespace", "list", CM).capture(&[("rv_start", "/metadata/resourceVersion")]),
        case("create configmap", "create", "POST", CM)
            .body(JSON, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","labels":{"app":"web","tier":"front"}},"data":{"k":"v"}}"#)
            .capture(&[("rv_a", "/metadata/resourceVersion"), ("uid_a", "/metadata/uid")]),
        case("create configmap b", "create", "POST", CM)
            .body(JSON, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"b","labels":{"app":"web","tier":"back"}},"data":{"k":"v"}}"#)
            .capture(&[("rv_b", "/metadata/resourceVersion")]),
        case("create configmap c", "create", "POST", CM)
            .body(JSON, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","labels":{"app":"db"}},"data":{"k":"v"}}"#),
        case("create configmap without labels", "create", "POST", CM)
            .body(JSON, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"d"},"data":{"k":"v"}}"#)
            .capture(&[("rv_d", "/metadata/resourceVersion")]),
        case("create existing name: 409 AlreadyExists", "errors", "POST", CM)
            .body(JSON, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}"#),
        case("create invalid name: 422 Invalid", "errors", "POST", CM)
            .body(JSON, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"Bad_Name"}}"#),
        case("create with other namespace in body: 400", "errors", "POST", CM)
            .body(JSON, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"other"}}"#),
        case("create in missing namespace: 404", "errors", "POST", "/api/v1/namespaces/nope/configmaps")
            .body(JSON, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}"#),
        case("create malformed JSON: 400", "errors", "POST", CM)
            .body(JSON, "{")
            .differs(&["/message"], "the message quotes the JSON decoder's own error text (Go's vs serde_json's)"),
        case("create node", "create", "POST", "/api/v1/nodes")
            .body(JSON, r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1","labels":{"zone":"a"}}}"#),
        case("create lease", "create", "POST", "/apis/coordination.k8s.io/v1/namespaces/conf/leases")
            .body(JSON, r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"l1"},"spec":{"holderIdentity":"h","leaseDurationSeconds":40}}"#),
        // --- discovery: served from each release's own documents (scripts/sim-discovery.sh) ---
        get("discovery /api/v1", "discovery", "/api/v1"),
        get("discovery /apis/apps/v1", "discovery", "/apis/apps/v1"),
        get("discovery /apis/batch/v1", "discovery", "/apis/batch/v1"),
        get("discovery /apis", "discovery", "/apis"),
        get("discovery /apis/batch", "discovery", "/apis/batch"),
        get("discovery of a group added since 1.20", "discovery", "/apis/discovery.k8s.io/v1").only_current(CURRENT_DOCUMENTS),
        get("version", "discovery", "/version")
            .only_current(CURRENT_DOCUMENTS)
            .differs_on_current(&["/buildDate"], BUILD_DATE),
        // --- get ---
        get("get configmap", "get", "/api/v1/namespaces/conf/configmaps/a"),
        get("get missing: 404 NotFound", "errors", "/api/v1/namespaces/conf/configmaps/nope"),
        get("get in missing namespace: 404", "errors", "/api/v1/namespaces/nope/configmaps/a"),
        get("get resourceVersion=0", "resource versions", "/api/v1/namespaces/conf/configmaps/a?resourceVersion=0"),
        get("get namespace", "get", "/api/v1/namespaces/conf"),
        get("get node", "get", "/api/v1/nodes/n1"),
        get("get lease", "get", "/apis/coordination.k8s.io/v1/namespaces/conf/leases/l1"),
        // --- list ---
        get("list configmaps", "list", CM).served_from("configmaps", Store::WatchCache),
        get("list across namespaces with label selector", "selectors", "/api/v1/configmaps?labelSelector=app"),
        get("list resourceVersion=0", "resource versions", "/api/v1/namespaces/conf/configmaps?resourceVersion=0").unordered()
            .served_from("configmaps", Store::WatchCache),
        get("list NotOlderThan", "resource versions", "/api/v1/namespaces/conf/configmaps?resourceVersion=${rv_d}&resourceVersionMatch=NotOlderThan").unordered(),
        get("list Exact at an older revision", "resource versions", "/api/v1/namespaces/conf/configmaps?resourceVersion=${rv_b}&resourceVersionMatch=Exact")
            .served_from("configmaps", Store::WatchCache),
        get("list resourceVersion=N with limit: exact", "resource versions", "/api/v1/namespaces/conf/configmaps?resourceVersion=${rv_b}&limit=1")
            .served_from("configmaps", Store::WatchCache),
        get("list resourceVersionMatch without resourceVersion", "errors", "/api/v1/namespaces/conf/configmaps?resourceVersionMatch=Exact"),
        get("list nodes with label selector", "selectors", "/api/v1/nodes?labelSelector=zone%3Da"),
        // --- selectors ---
        get("label =", "selectors", "/api/v1/namespaces/conf/configmaps?labelSelector=app%3Dweb"),
        get("label !=", "selectors", "/api/v1/namespaces/conf/configmaps?labelSelector=app!%3Dweb"),
        get("label in", "selectors", "/api/v1/namespaces/conf/configmaps?labelSelector=app%20in%20(web,db)"),
        get("label notin", "selectors", "/api/v1/namespaces/conf/configmaps?labelSelector=app%20notin%20(web)"),
        get("label exists", "selectors", "/api/v1/namespaces/conf/configmaps?labelSelector=tier"),
        get("label does not exist", "selectors", "/api/v1/namespaces/conf/configmaps?labelSelector=!app"),
        get("label conjunction", "selectors", "/api/v1/namespaces/conf/configmaps?labelSelector=app%3Dweb,tier%3Dback"),
        get("field metadata.name =", "selectors", "/api/v1/namespaces/conf/configmaps?fieldSelector=metadata.name%3Db"),
        get("field metadata.name !=", "selectors", "/api/v1/namespaces/conf/configmaps?fieldSelector=metadata.name!%3Db"),
        get("field metadata.namespace across namespaces", "selectors", "/api/v1/configmaps?fieldSelector=metadata.namespace%3Dconf"),
        get("invalid label selector: 400", "errors", "/api/v1/namespaces/conf/configmaps?labelSelector=app%20in%20(")
            .differs(&["/message"], "the selector parser's error text (apimodel's, shared with tollgate) is worded differently; reason and code agree"),
        get("unsupported field selector: 400", "errors", "/api/v1/namespaces/conf/configmaps?fieldSelector=data.k%3Dv"),
        // --- paging ---
        get("first page: continue and remainingItemCount", "paging", "/api/v1/namespaces/conf/configmaps?limit=2")
            .capture(&[("continue", "/metadata/continue")])
            .served_from("configmaps", Store::WatchCache),
        get("last page", "paging", "/api/v1/namespaces/conf/configmaps?limit=2&continue=${continue}")
            .served_from("configmaps", Store::WatchCache),
        get("invalid continue token: 400", "errors", "/api/v1/namespaces/conf/configmaps?limit=2&continue=garbage")
            .differs(&["/message"], "the message quotes the base64/JSON decoder's own error text"),
        get("limit with label selector", "paging", "/api/v1/namespaces/conf/configmaps?limit=1&labelSelector=app%3Dweb"),
        get("limit with resourceVersion=0 is ignored", "paging", "/api/v1/namespaces/conf/configmaps?limit=2&resourceVersion=0").unordered(),
        // --- update ---
        case("update with current resourceVersion", "update", "PUT", "/api/v1/namespaces/conf/configmaps/a")
            .body(JSON, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","resourceVersion":"${rv_a}","labels":{"app":"web","tier":"front"}},"data":{"k":"v2"}}"#),
        case("update with stale resourceVersion: 409 Conflict", "errors", "PUT", "/api/v1/namespaces/conf/configmaps/a")
            .body(JSON, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","resourceVersion":"${rv_a}"},"data":{"k":"v3"}}"#),
        case("update with name mismatch: 400", "errors", "PUT", "/api/v1/namespaces/conf/configmaps/a")
            .body(JSON, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"zz"},"data":{"k":"v3"}}"#),
        case("update missing object: 404", "errors", "PUT", "/api/v1/namespaces/conf/configmaps/nope")
            .body(JSON, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"nope"},"data":{"k":"v"}}"#),
        case("update without resourceVersion", "update", "PUT", "/api/v1/namespaces/conf/configmaps/b")
            .body(JSON, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"b","labels":{"app":"web","tier":"back"}},"data":{"k":"v2"}}"#),
        // --- patch ---
        case("merge patch", "patch", "PATCH", "/api/v1/namespaces/conf/configmaps/a")
            .body(MERGE, r#"{"metadata":{"labels":{"tier":null,"patched":"merge"}},"data":{"m":"1"}}"#),
        case("JSON patch", "patch", "PATCH", "/api/v1/namespaces/conf/configmaps/a")
            .body(JSON_PATCH, r#"[{"op":"add","path":"/data/j","value":"2"},{"op":"remove","path":"/data/m"}]"#),
        case("strategic merge patch", "patch", "PATCH", "/api/v1/namespaces/conf/configmaps/a")
            .body(STRATEGIC, r#"{"metadata":{"labels":{"patched":"strategic"}},"data":{"s":"3"}}"#),
        case("JSON patch failing test op", "errors", "PATCH", "/api/v1/namespaces/conf/configmaps/a")
            .body(JSON_PATCH, r#"[{"op":"test","path":"/data/k","value":"nope"}]"#),
        case("patch with unsupported content type: 415", "errors", "PATCH", "/api/v1/namespaces/conf/configmaps/a")
            .body(JSON, r#"{"data":{"x":"1"}}"#),
        case("patch missing object: 404", "errors", "PATCH", "/api/v1/namespaces/conf/configmaps/nope")
            .body(MERGE, r#"{"data":{"x":"1"}}"#),
        case("merge patch with stale resourceVersion: 409", "errors", "PATCH", "/api/v1/namespaces/conf/configmaps/a")
            .body(MERGE, r#"{"metadata":{"resourceVersion":"${rv_a}"},"data":{"x":"1"}}"#),
        // --- delete ---
        case("delete with wrong uid precondition: 409", "errors", "DELETE", "/api/v1/namespaces/conf/configmaps/d")
            .body(JSON, r#"{"kind":"DeleteOptions","apiVersion":"v1","preconditions":{"uid":"00000000-0000-0000-0000-000000000000"}}"#),
        case("delete configmap", "delete", "DELETE", "/api/v1/namespaces/conf/configmaps/d"),
        case("delete missing: 404", "errors", "DELETE", "/api/v1/namespaces/conf/configmaps/d"),
        case("deletecollection with label selector", "delete", "DELETE", "/api/v1/namespaces/conf/configmaps?labelSelector=app%3Ddb"),
        get("list after deletes", "list", CM),
        // --- watch ---
        get("watch from a resourceVersion: every change in order", "watch", "/api/v1/namespaces/conf/configmaps?watch=1&resourceVersion=${rv_start}&timeoutSeconds=1").watch(),
        get("watch with label selector: leaving objects are DELETED", "watch", "/api/v1/namespaces/conf/configmaps?watch=1&resourceVersion=${rv_start}&labelSelector=tier&timeoutSeconds=1")
            .watch(),
        get("watch with field selector", "watch", "/api/v1/namespaces/conf/configmaps?watch=1&resourceVersion=${rv_start}&fieldSelector=metadata.name%3Db&timeoutSeconds=1").watch(),
        get("watch resourceVersion=0: current state first", "watch", "/api/v1/namespaces/conf/configmaps?watch=1&resourceVersion=0&timeoutSeconds=1")
            .watch()
            .unordered(),
        get("streaming list: initial events, then the initial-events-end bookmark", "watch", "/api/v1/namespaces/conf/configmaps?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1")
            .watch()
            .unordered()
            .only_current(WATCH_LIST_ONLY_CURRENT),
        // --- errors ---
        get("unknown resource: 404", "errors", "/api/v1/namespaces/conf/widgets"),
        get("unknown API group: 404", "errors", "/apis/widgets.example.com/v1/widgets"),
        case("POST to a named object: 405", "errors", "POST", "/api/v1/namespaces/conf/configmaps/a")
            .body(JSON, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}"#),
        // --- history: the sim keeps --history-window revisions, kube-apiserver compacts etcd
        //     every --etcd-compaction-interval; both forget rv_start after these writes ---
        case("60 merge patches in a row", "patch", "PATCH", "/api/v1/namespaces/conf/configmaps/b")
            .body(MERGE, r#"{"data":{"round":"${i}"}}"#)
            .times(60),
        get("list Exact at a compacted revision: 410 Expired", "resource versions", "/api/v1/namespaces/conf/configmaps?resourceVersion=${rv_start}&resourceVersionMatch=Exact")
            .until_code(410),
        get("continue token at a compacted revision: 410 Expired", "paging", "/api/v1/namespaces/conf/configmaps?limit=2&continue=${continue}")
            .until_code(410),
        // --- built-in kinds served generically (issue 19) ---
        case("create deployment", "built-in kinds", "POST", DEPLOY)
            .body(JSON, r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","labels":{"app":"web"}},"spec":{"selector":{"matchLabels":{"app":"web"}},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"c","image":"nginx:1.19","ports":[{"containerPort":80}]}]}}}}"#),
        get("get deployment scale", "built-in kinds", "/apis/apps/v1/namespaces/conf/deployments/web/scale"),
        case("put deployment scale", "built-in kinds", "PUT", "/apis/apps/v1/namespaces/conf/deployments/web/scale")
            .body(JSON, r#"{"kind":"Scale","apiVersion":"autoscaling/v1","metadata":{"name":"web","namespace":"conf"},"spec":{"replicas":3}}"#),
        case("merge patch deployment scale", "built-in kinds", "PATCH", "/apis/apps/v1/namespaces/conf/deployments/web/scale")
            .body(MERGE, r#"{"spec":{"replicas":2}}"#),
        get("get scaled deployment: generation bumped", "built-in kinds", "/apis/apps/v1/namespaces/conf/deployments/web"),
        case("merge patch deployment status", "built-in kinds", "PATCH", "/apis/apps/v1/namespaces/conf/deployments/web/status")
            .body(MERGE, r#"{"status":{"replicas":2,"readyReplicas":1,"updatedReplicas":2,"availableReplicas":1,"observedGeneration":3}}"#),
        case("strategic merge patch deployment spec", "built-in kinds", "PATCH", "/apis/apps/v1/namespaces/conf/deployments/web")
            .body(STRATEGIC, r#"{"metadata":{"labels":{"tier":"front"}},"spec":{"revisionHistoryLimit":5}}"#),
        get("list deployments with label selector", "built-in kinds", "/apis/apps/v1/namespaces/conf/deployments?labelSelector=app%3Dweb"),
        case("create service: clusterIP allocated", "built-in kinds", "POST", "/api/v1/namespaces/conf/services")
            .body(JSON, r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"web"},"spec":{"selector":{"app":"web"},"ports":[{"name":"http","port":80,"targetPort":8080}]}}"#)
            .differs_on_current(&["/spec/ipFamilies", "/spec/ipFamilyPolicy", "/spec/internalTrafficPolicy"], SERVICE_ON_CURRENT),
        case("create headless service", "built-in kinds", "POST", "/api/v1/namespaces/conf/services")
            .body(JSON, r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"db"},"spec":{"clusterIP":"None","selector":{"app":"db"},"ports":[{"port":5432}]}}"#)
            .differs_on_current(&["/spec/ipFamilies", "/spec/ipFamilyPolicy", "/spec/internalTrafficPolicy"], SERVICE_ON_CURRENT),
        get("get service", "built-in kinds", "/api/v1/namespaces/conf/services/web")
            .differs_on_current(&["/spec/ipFamilies", "/spec/ipFamilyPolicy", "/spec/internalTrafficPolicy"], SERVICE_ON_CURRENT),
        case("deletecollection of services: 405", "errors", "DELETE", "/api/v1/namespaces/conf/services")
            .uncompared_on_current("the current release serves deletecollection on services (200, the deleted Services); 1.20 answers 405 and so does the sim"),
        case("create serviceaccount", "built-in kinds", "POST", "/api/v1/namespaces/conf/serviceaccounts")
            .body(JSON, r#"{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"robot","labels":{"team":"a"}}}"#),
        get("get serviceaccount", "built-in kinds", "/api/v1/namespaces/conf/serviceaccounts/robot"),
        case("create job", "built-in kinds", "POST", "/apis/batch/v1/namespaces/conf/jobs")
            .body(JSON, r#"{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"once"},"spec":{"template":{"spec":{"restartPolicy":"Never","containers":[{"name":"c","image":"busybox"}]}}}}"#)
            .codes_only_on_current(JOB_ON_CURRENT),
        get("get job", "built-in kinds", "/apis/batch/v1/namespaces/conf/jobs/once")
            .codes_only_on_current(JOB_ON_CURRENT),
        case("create role", "built-in kinds", "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/conf/roles")
            .body(JSON, r#"{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{"name":"reader","labels":{"team":"a"}},"rules":[{"apiGroups":[""],"resources":["pods"],"verbs":["get","list"]}]}"#),
        get("list roles with label selector", "built-in kinds", "/apis/rbac.authorization.k8s.io/v1/namespaces/conf/roles?labelSelector=team%3Da"),
        case("delete role", "built-in kinds", "DELETE", "/apis/rbac.authorization.k8s.io/v1/namespaces/conf/roles/reader"),
        // --- CustomResourceDefinitions ---
        case("create CRD", "custom resources", "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
            .body(JSON, WIDGET_CRD),
        case("create custom object (once served)", "custom resources", "POST", WIDGETS)
            .body(JSON, r#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w1"},"spec":{"size":3,"color":"red","unknown":true}}"#)
            .until_code(201),
        get("get CRD: established", "custom resources", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com"),
        get("custom group discovery", "custom resources", "/apis/example.com/v1"),
        case("custom object of the wrong type: 422", "errors", "POST", WIDGETS)
            .body(JSON, r#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w2"},"spec":{"size":"big"}}"#)
            .differs_on_current(&["/details/causes"], "the current release reports a value of the wrong type as cause `FieldValueTypeInvalid`; 1.20 (and the sim) as `FieldValueInvalid`"),
        case("custom object without a required field: 422", "errors", "POST", WIDGETS)
            .body(JSON, r#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w3"},"spec":{"color":"blue"}}"#),
        case("merge patch custom object: generation bumped", "custom resources", "PATCH", "/apis/example.com/v1/namespaces/conf/widgets/w1")
            .body(MERGE, r#"{"spec":{"size":4}}"#),
        get("list custom objects", "custom resources", WIDGETS),
        case("delete CRD", "custom resources", "DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com"),
        // The real apiserver deletes the CRD's objects before the CRD (a finalizer): until the CRD
        // itself is gone its objects answer a NotFound Status, after it "404 page not found".
        get("CRD gone", "custom resources", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com")
            .until_code(404),
        get("custom objects gone with their CRD", "custom resources", "/apis/example.com/v1/namespaces/conf/widgets/w1")
            .until_code(404),
    ]
}
