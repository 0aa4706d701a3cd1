//! The request classifier: any method, path and query either parses or is
//! refused with an error, never a panic — apimodel's parser on any UTF-8
//! (more than a URI may hold), and tollgate's classify step and pattern key
//! on what `http::Uri` accepts, as a request reaches them. The first byte
//! picks the method, the rest is the request target (`path?query`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate::identity::ClientClass;

const METHODS: [&str; 8] = [
    "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "CONNECT",
];

fuzz_target!(|data: &[u8]| {
    let Some((&m, rest)) = data.split_first() else {
        return;
    };
    let Ok(target) = std::str::from_utf8(rest) else {
        return;
    };
    let method = METHODS[usize::from(m) % METHODS.len()];
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    if let Ok(info) = apimodel::RequestInfo::parse(method, path, query) {
        let _ = (info.is_resource(), info.scope(), info.is_long_running());
        let _ = apimodel::ConsistencyClass::of(&info);
    }
    let (Ok(method), Ok(uri)) = (
        http::Method::from_bytes(method.as_bytes()),
        target.parse::<http::Uri>(),
    ) else {
        return;
    };
    if let Ok(c) = tollgate::classify::classify(&method, &uri, &http::HeaderMap::new()) {
        let key = tollgate::pattern::PatternKey::new(&c, ClientClass::User);
        let _ = key.to_string();
    }
});
