//! The Stage document as kwok publishes it, read strictly: every field kwok
//! defines that loadgen supports is here, anything else (a typo, or a field
//! loadgen does not implement such as `impersonation`) is refused by name.

use std::collections::BTreeMap;

use serde::Deserialize;

pub const API_VERSION: &str = "kwok.x-k8s.io/v1alpha1";
pub const KIND: &str = "Stage";

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StageDoc {
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: StageSpec,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Metadata {
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StageSpec {
    pub resource_ref: ResourceRef,
    #[serde(default)]
    pub selector: Option<Selector>,
    #[serde(default)]
    pub weight: Option<i64>,
    #[serde(default)]
    pub weight_from: Option<ExpressionFrom>,
    #[serde(default)]
    pub delay: Option<Delay>,
    pub next: Next,
    #[serde(default)]
    pub immediate_next_stage: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ResourceRef {
    /// `v1` for the core group (kwok's spelling), else `group/version` or the group.
    pub api_group: String,
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Selector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub match_annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub match_expressions: Vec<Expression>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Expression {
    /// A jq expression evaluated on the object.
    pub key: String,
    pub operator: Operator,
    #[serde(default)]
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExpressionFrom {
    pub expression_from: String,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Delay {
    #[serde(default)]
    pub duration_milliseconds: Option<i64>,
    #[serde(default)]
    pub duration_from: Option<ExpressionFrom>,
    #[serde(default)]
    pub jitter_duration_milliseconds: Option<i64>,
    #[serde(default)]
    pub jitter_duration_from: Option<ExpressionFrom>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Next {
    #[serde(default)]
    pub status_template: Option<String>,
    #[serde(default)]
    pub delete: Option<bool>,
    #[serde(default)]
    pub event: Option<Event>,
    #[serde(default)]
    pub finalizers: Option<Finalizers>,
    #[serde(default)]
    pub patches: Vec<Patch>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Event {
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Finalizers {
    #[serde(default)]
    pub add: Vec<FinalizerItem>,
    #[serde(default)]
    pub remove: Vec<FinalizerItem>,
    #[serde(default)]
    pub empty: bool,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FinalizerItem {
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Patch {
    /// `status` or empty (the object itself).
    #[serde(default)]
    pub subresource: String,
    /// Where the rendered template goes, dotted (`status`); empty: the top.
    #[serde(default)]
    pub root: String,
    pub template: String,
    #[serde(default, rename = "type")]
    pub type_: PatchType,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PatchType {
    Json,
    #[default]
    Merge,
    Strategic,
}

impl PatchType {
    pub fn content_type(self) -> &'static str {
        match self {
            PatchType::Json => "application/json-patch+json",
            PatchType::Merge => "application/merge-patch+json",
            PatchType::Strategic => "application/strategic-merge-patch+json",
        }
    }
}

/// Every Stage document in `text` (YAML, `---`-separated).
pub fn parse_all(text: &str) -> Result<Vec<StageDoc>, String> {
    serde_saphyr::from_multiple::<StageDoc>(text).map_err(|e| e.to_string())
}
