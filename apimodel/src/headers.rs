//! Response headers tollgate adds, or kube-apiserver sends, that clients read.

/// The lane a request was served in (set by tollgate on every response it
/// forwards or rejects; loadgen splits its results by it).
pub const LANE_HEADER: &str = "x-tollgate-lane";

/// The UID of the API Priority and Fairness priority level kube-apiserver
/// served a request in (loadgen splits its results by it, as by lane).
pub const PRIORITY_LEVEL_HEADER: &str = "x-kubernetes-pf-prioritylevel-uid";

#[cfg(test)]
mod tests {
    #[test]
    fn header_names_are_lowercase_tokens() {
        // HTTP/2 requires lowercase names; `HeaderName::from_static` panics otherwise.
        let name = super::LANE_HEADER;
        assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'));
    }
}
