//! `kube-system/extension-apiserver-authentication`: the ConfigMap kube-apiserver's
//! `ca-registration` post-start hook writes, from which aggregated apiservers and front
//! proxies (tollgate among them) learn which client CA and front-proxy headers the apiserver
//! trusts. Written at start from the simulator's own settings, as 1.20's
//! `ClientCARegistrationHook` writes it: `client-ca-file` (the PEM) with `--client-ca-file`;
//! with `--requestheader-client-ca-file`, that PEM and the header and name lists, each a JSON
//! array as Go's `json.Marshal` of a `[]string` writes it (`null` for none); no `data` at all
//! when neither is set (an empty map is `omitempty`).

use super::authn::AuthnConfig;
use serde_json::{json, Map, Value};

pub const NAMESPACE: &str = "kube-system";
pub const NAME: &str = "extension-apiserver-authentication";

/// A `[]string` as encoding/json writes it.
fn go_strings(v: &[String]) -> String {
    if v.is_empty() {
        "null".into()
    } else {
        serde_json::to_string(v).unwrap_or_else(|_| "null".into())
    }
}

/// The ConfigMap's `data`, or `None` when kube-apiserver would write none.
pub fn data(a: &AuthnConfig) -> Option<Map<String, Value>> {
    let mut d = Map::new();
    if let Some(ca) = &a.client_ca_pem {
        d.insert("client-ca-file".into(), ca.clone().into());
    }
    if let Some(ca) = &a.requestheader_client_ca_pem {
        d.insert(
            "requestheader-username-headers".into(),
            go_strings(&a.requestheader_username_headers).into(),
        );
        d.insert(
            "requestheader-group-headers".into(),
            go_strings(&a.requestheader_group_headers).into(),
        );
        d.insert(
            "requestheader-extra-headers-prefix".into(),
            go_strings(&a.requestheader_extra_headers_prefix).into(),
        );
        d.insert("requestheader-client-ca-file".into(), ca.clone().into());
        d.insert(
            "requestheader-allowed-names".into(),
            go_strings(&a.requestheader_allowed_names).into(),
        );
    }
    (!d.is_empty()).then_some(d)
}

/// The ConfigMap as stored (uid and creation time given by the caller).
pub fn configmap(a: &AuthnConfig, uid: &str, created: &str) -> Value {
    let mut v = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": uid, "creationTimestamp": created}});
    if let Some(d) = data(a) {
        v["data"] = Value::Object(d);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_as_the_ca_registration_hook_writes_it() {
        let none = AuthnConfig::default();
        assert_eq!(data(&none), None);
        let a = AuthnConfig {
            client_ca_pem: Some("CLIENT".into()),
            requestheader_client_ca_pem: Some("FRONT".into()),
            requestheader_allowed_names: vec!["front-proxy-client".into()],
            ..AuthnConfig::default()
        };
        let d = data(&a).unwrap();
        assert_eq!(d["client-ca-file"], "CLIENT");
        assert_eq!(d["requestheader-client-ca-file"], "FRONT");
        assert_eq!(
            d["requestheader-allowed-names"],
            r#"["front-proxy-client"]"#
        );
        assert_eq!(d["requestheader-username-headers"], r#"["X-Remote-User"]"#);
        assert_eq!(d["requestheader-group-headers"], r#"["X-Remote-Group"]"#);
        assert_eq!(
            d["requestheader-extra-headers-prefix"],
            r#"["X-Remote-Extra-"]"#
        );
        assert_eq!(d.len(), 6);
        // Any CN accepted: Go's nil slice.
        let any = AuthnConfig {
            requestheader_client_ca_pem: Some("FRONT".into()),
            ..AuthnConfig::default()
        };
        let d = data(&any).unwrap();
        assert_eq!(d["requestheader-allowed-names"], "null");
        assert!(!d.contains_key("client-ca-file"));
    }
}
