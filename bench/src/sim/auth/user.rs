//! Who a request is once authenticated: kube-apiserver's `UserInfo`, shared by the
//! authenticator and the token file it reads.

use std::collections::BTreeMap;

/// Members bypass authorization.
pub const MASTERS_GROUP: &str = "system:masters";

/// An authenticated identity; serializes as `authentication.k8s.io/v1` `UserInfo` (the
/// `status.userInfo` of a `SelfSubjectReview`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct UserInfo {
    #[serde(rename = "username")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    pub groups: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Whether `user` bypasses authorization, as `system:masters` members do.
pub fn is_admin(user: &UserInfo) -> bool {
    user.groups.iter().any(|g| g == MASTERS_GROUP)
}
