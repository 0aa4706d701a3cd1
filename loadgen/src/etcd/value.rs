//! What loadgen writes into etcd: a small JSON object that carries the moment
//! it was sent (so a watcher can time the event without sharing state with the
//! writer, even from another process), padded to the requested size the way a
//! Tess.IO pod (~3.3 KB) fills a value.
//!
//! `{"loadgen_put_unix_nanos":N,"seq":S,"pad":"xxxx…"}` — the stamp comes
//! first so a reader only has to look at the value's head.

/// The value's fixed head, before the stamp's digits.
const HEAD: &str = "{\"loadgen_put_unix_nanos\":";

/// The smallest value `encode` can produce exactly: the head, 20 digits of
/// stamp, 20 of sequence and the padding's frame.
pub const MIN_SIZE: usize = 96;

/// A value of exactly `size` bytes (at least [`MIN_SIZE`]) stamped `unix_nanos`.
pub fn encode(size: usize, unix_nanos: u128, seq: u64) -> Vec<u8> {
    let mut v = format!("{HEAD}{unix_nanos},\"seq\":{seq},\"pad\":\"").into_bytes();
    // Closing `"}` takes two bytes.
    let pad = size.saturating_sub(v.len() + 2);
    v.resize(v.len() + pad, b'x');
    v.extend_from_slice(b"\"}");
    v
}

/// The stamp of a value written by [`encode`]; `None` for anyone else's value.
pub fn stamp(value: &[u8]) -> Option<u128> {
    let rest = value.strip_prefix(HEAD.as_bytes())?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 39 {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_have_the_asked_size_and_carry_their_stamp() {
        for size in [MIN_SIZE, 100, 3300, 100_000] {
            let v = encode(size, 1_763_800_000_123_456_789, u64::MAX);
            assert_eq!(v.len(), size, "size {size}");
            assert_eq!(stamp(&v), Some(1_763_800_000_123_456_789));
            let json: serde_json::Value = serde_json::from_slice(&v).expect("valid JSON");
            assert_eq!(json["seq"], serde_json::json!(u64::MAX));
        }
    }

    #[test]
    fn foreign_values_have_no_stamp() {
        assert_eq!(stamp(b"{\"kind\":\"Pod\"}"), None);
        assert_eq!(stamp(b""), None);
        assert_eq!(stamp(b"{\"loadgen_put_unix_nanos\":,"), None);
    }
}
