//! Kubernetes `Status` objects: the body of every error the apiserver, the
//! simulator or tollgate itself sends, so clients (kubectl, client-go, loadgen)
//! can read the reason and, for 429s, how long to wait.

use serde::{Deserialize, Serialize};

/// A `meta/v1 Status`, field for field as the apiserver serializes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub kind: String,
    pub api_version: String,
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<StatusDetails>,
    /// 0 only in a registry's `Success` for a delete, which omits it as Go's `omitempty` does.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub code: u16,
}

fn is_zero(code: &u16) -> bool {
    *code == 0
}

/// `Status.details`: which object the status is about and, for 429s, when to retry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDetails {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<StatusCause>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
}

/// One cause of a failure, e.g. the field a validation error is about.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusCause {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field: String,
}

impl Status {
    /// A failure with the given HTTP code, machine-readable reason and message.
    pub fn failure(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Status {
            kind: "Status".into(),
            api_version: "v1".into(),
            metadata: Default::default(),
            status: "Failure".into(),
            message: message.into(),
            reason: reason.into(),
            details: None,
            code,
        }
    }

    /// The body of a successful delete of a collection or of an object that is gone.
    pub fn success() -> Self {
        Status {
            status: "Success".into(),
            code: 200,
            reason: String::new(),
            ..Status::failure(200, "", "")
        }
    }

    /// 404 for a named object: `pods "x" not found`, as the apiserver words it.
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        Status::failure(404, "NotFound", format!("{qualified} \"{name}\" not found"))
            .with_details(group, resource, name)
    }

    /// 404 for a path that names no resource the server serves.
    pub fn resource_not_found() -> Self {
        // kube-apiserver's words, with empty (not absent) details.
        let mut s = Status::failure(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
        s.details = Some(StatusDetails::default());
        s
    }

    /// 409 AlreadyExists on create.
    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        Status::failure(
            409,
            "AlreadyExists",
            format!("{qualified} \"{name}\" already exists"),
        )
        .with_details(group, resource, name)
    }

    /// 409 Conflict on a write with a stale resourceVersion.
    pub fn conflict(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        Status::failure(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {qualified} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        )
        .with_details(group, resource, name)
    }

    /// 400 BadRequest naming what is wrong.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Status::failure(400, "BadRequest", message)
    }

    /// 422 Invalid: the object does not validate.
    pub fn invalid(group: &str, resource: &str, name: &str, message: impl Into<String>) -> Self {
        Status::failure(422, "Invalid", message).with_details(group, resource, name)
    }

    /// 405 for a verb the resource does not support.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Status::failure(405, "MethodNotAllowed", message)
    }

    /// 410 Expired: a continue token or watch resourceVersion older than the history kept.
    pub fn expired(message: impl Into<String>) -> Self {
        Status::failure(410, "Expired", message)
    }

    /// 413 for a body larger than the server accepts.
    pub fn too_large(limit_bytes: u64) -> Self {
        Status::failure(
            413,
            "RequestEntityTooLarge",
            format!("the request body is larger than the server accepts ({limit_bytes} bytes)"),
        )
    }

    /// 415 for a content type the server cannot decode.
    pub fn unsupported_media_type() -> Self {
        // kube-apiserver 1.20 names neither the type it got nor those it accepts.
        let mut s = Status::failure(415, "UnsupportedMediaType", "415: Unsupported Media Type");
        s.details = Some(StatusDetails::default());
        s
    }

    /// 401 for credentials the server does not accept.
    pub fn unauthorized() -> Self {
        Status::failure(401, "Unauthorized", "Unauthorized")
    }

    /// 429 with the seconds a client should wait, in the body and for the `Retry-After` header.
    pub fn too_many_requests(message: impl Into<String>, retry_after_seconds: u64) -> Self {
        let mut s = Status::failure(429, "TooManyRequests", message);
        s.details = Some(StatusDetails {
            retry_after_seconds: Some(retry_after_seconds),
            ..Default::default()
        });
        s
    }

    /// 503 ServiceUnavailable.
    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Status::failure(503, "ServiceUnavailable", message)
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Status::failure(500, "InternalError", message)
    }

    /// 504 Timeout.
    pub fn timeout(message: impl Into<String>) -> Self {
        Status::failure(504, "Timeout", message)
    }

    /// Names the object the status is about.
    pub fn with_details(mut self, group: &str, resource: &str, name: &str) -> Self {
        let d = self.details.get_or_insert_with(Default::default);
        d.group = group.into();
        d.kind = resource.into();
        d.name = name.into();
        self
    }

    /// `retryAfterSeconds` from the details, if any.
    pub fn retry_after_seconds(&self) -> Option<u64> {
        self.details.as_ref().and_then(|d| d.retry_after_seconds)
    }

    /// The JSON body.
    pub fn to_json(&self) -> String {
        // A Status is plain strings and integers: serializing it cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }

    /// Parses a Status body; `None` when the body is not one (e.g. a plain-text 429).
    pub fn from_body(body: &[u8]) -> Option<Status> {
        let s: Status = serde_json::from_slice(body).ok()?;
        (s.kind == "Status").then_some(s)
    }
}

fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_many_requests_has_the_contract_shape() {
        let s = Status::too_many_requests("slow down", 7);
        let v: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
        assert_eq!(v["kind"], "Status");
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["metadata"], serde_json::json!({}));
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["reason"], "TooManyRequests");
        assert_eq!(v["details"]["retryAfterSeconds"], 7);
        assert_eq!(v["code"], 429);
    }

    #[test]
    fn not_found_words_like_the_apiserver() {
        let s = Status::not_found("coordination.k8s.io", "leases", "n1");
        assert_eq!(s.message, "leases.coordination.k8s.io \"n1\" not found");
        assert_eq!(s.code, 404);
    }

    #[test]
    fn parses_only_status_bodies() {
        assert!(Status::from_body(b"Too many requests, please try again later.\n").is_none());
        assert!(Status::from_body(br#"{"kind":"Pod"}"#).is_none());
        let s = Status::from_body(Status::expired("old").to_json().as_bytes()).unwrap();
        assert_eq!(s.code, 410);
    }
}
