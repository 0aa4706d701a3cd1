//! Hop-by-hop headers (RFC 9110 §7.6.1): what belongs to one connection and is never
//! forwarded, and whether a request asks for an upgrade.

use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue};

/// How many names [`HOP_BY_HOP`] holds.
const HOP_BY_HOP_LEN: usize = 8;
/// Headers that belong to one connection and are never forwarded. A `static`, not a
/// `const`: a `const` array of `HeaderName`s is built and dropped again at every use.
static HOP_BY_HOP: [HeaderName; HOP_BY_HOP_LEN] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Where `name` is in [`HOP_BY_HOP`]. A `match` on the name's text is a length check and
/// one compare, not eight `HeaderName` comparisons.
fn hop_by_hop_index(name: &HeaderName) -> Option<usize> {
    Some(match name.as_str() {
        "connection" => 0,
        "keep-alive" => 1,
        "proxy-connection" => 2,
        "proxy-authenticate" => 3,
        "proxy-authorization" => 4,
        "te" => 5,
        "trailer" => 6,
        "transfer-encoding" => 7,
        _ => return None,
    })
}

/// Is this an HTTP/1.1 upgrade request (SPDY, WebSocket)?
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && connection_tokens(headers).any(|t| t.eq_ignore_ascii_case("upgrade"))
}

fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// The Connection header is one `keep-alive` (what nginx and other HTTP/1.1 servers send on
/// every response): it names nothing that is not removed anyway, so its tokens need no parsing.
fn only_keep_alive(headers: &HeaderMap) -> bool {
    let mut values = headers.get_all(header::CONNECTION).iter();
    matches!(
        (values.next(), values.next()),
        (Some(v), None) if v.as_bytes().eq_ignore_ascii_case(b"keep-alive")
    )
}

/// Remove hop-by-hop headers, including those the Connection header names.
/// For an upgrade, `Connection: Upgrade` and `Upgrade` are kept.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    // Almost every request carries none of them, and a response from an HTTP/1.1 upstream
    // only `Connection: keep-alive`: one pass over the few headers there are, then removing
    // just what is present, is much cheaper than ten hashed removals and a `Vec` each time.
    let mut present = [false; HOP_BY_HOP_LEN];
    let mut any = false;
    let mut has_upgrade = false;
    for name in headers.keys() {
        if let Some(i) = hop_by_hop_index(name) {
            present[i] = true;
            any = true;
        } else if name == header::UPGRADE {
            has_upgrade = true;
        }
    }
    if !upgrade && !any && !has_upgrade {
        return;
    }
    if present[0] && !only_keep_alive(headers) {
        // Names the Connection header lists that are not removed below anyway (rare).
        let named: Vec<HeaderName> = connection_tokens(headers)
            .filter(|t| !(upgrade && t.eq_ignore_ascii_case("upgrade")))
            .filter(|t| {
                !HOP_BY_HOP
                    .iter()
                    .any(|h| t.eq_ignore_ascii_case(h.as_str()))
            })
            .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for (name, _) in HOP_BY_HOP.iter().zip(present).filter(|(_, p)| *p) {
        headers.remove(name);
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    } else if has_upgrade {
        headers.remove(header::UPGRADE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hop_by_hop_index_matches_the_list() {
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_index(name), Some(i), "{name}");
        }
        assert_eq!(hop_by_hop_index(&header::UPGRADE), None);
        assert_eq!(hop_by_hop_index(&header::CONTENT_LENGTH), None);
    }

    #[test]
    fn hop_by_hop_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-custom"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-custom", HeaderValue::from_static("1"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("upgrade", HeaderValue::from_static("h2c"));
        h.insert("accept-encoding", HeaderValue::from_static("gzip"));
        assert!(!is_upgrade(&h));
        strip_hop_by_hop(&mut h, false);
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["accept-encoding"]);

        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("Upgrade"));
        h.insert("upgrade", HeaderValue::from_static("SPDY/3.1"));
        assert!(is_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h["connection"], "Upgrade");
        assert_eq!(h["upgrade"], "SPDY/3.1");

        // `Connection: Keep-Alive` alone (the fast path), and beside a second Connection value.
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("Keep-Alive"));
        h.insert("x-custom", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["x-custom"]);
        h.append("connection", HeaderValue::from_static("keep-alive"));
        h.append("connection", HeaderValue::from_static("x-custom"));
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
    }
}
