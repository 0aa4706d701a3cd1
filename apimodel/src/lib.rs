//! What tollgate, loadgen and the simulated apiserver must agree on about the
//! Kubernetes API. Pure: no I/O, no runtime, no clock.
//!
//! Layout:
//! - [`request`]: a request's method, path and query parsed into verb, group,
//!   version, resource, subresource, namespace, name and list options, as
//!   kube-apiserver's RequestInfoFactory reads them.
//! - [`selector`]: label and field selectors: parsing with the apiserver's
//!   grammar and error messages, and matching.
//! - [`consistency`]: what a LIST or WATCH asks for (cache, consistent, exact)
//!   and whether a watch starts with the full state.
//! - [`status`]: Kubernetes `Status` bodies for errors, 429s and 410s.
//! - [`headers`]: the response headers tollgate adds and its clients read.
#![forbid(unsafe_code)]

pub mod consistency;
pub mod headers;
pub mod request;
pub mod selector;
pub mod status;

pub use consistency::ConsistencyClass;
pub use request::{ListOptions, ParseError, RequestInfo, Verb};
pub use selector::{FieldSelector, LabelSelector, SelectorError};
pub use status::Status;
