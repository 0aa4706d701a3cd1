//! Who a client is and how it proves it, as kube-apiserver sees it.
//!
//! - [`authn`]: the authenticator: front-proxy headers, client certificates, bearer tokens, anonymous.
//! - [`token_file`]: `--token-auth-file`'s static tokens.
//! - [`user`]: `UserInfo`, who a request is once authenticated.
//! - [`pki`]: a throw-away CA, serving and client certificates.
//! - [`tls`]: the rustls server config (ALPN, optional client certificates).
//! - [`kubeconfig`]: the kubeconfig `--kubeconfig-out` writes for kubectl and loadgen.

pub mod authn;
pub mod kubeconfig;
pub mod pki;
pub mod published;
pub mod tls;
pub mod token_file;
pub mod user;
