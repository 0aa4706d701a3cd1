//! Response headers tollgate adds and its clients read.

/// The lane a request was served in (set by tollgate on every response it
/// forwards or rejects; loadgen splits its results by it).
pub const LANE_HEADER: &str = "x-tollgate-lane";

#[cfg(test)]
mod tests {
    #[test]
    fn header_names_are_lowercase_tokens() {
        // HTTP/2 requires lowercase names; `HeaderName::from_static` panics otherwise.
        let name = super::LANE_HEADER;
        assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'));
    }
}
