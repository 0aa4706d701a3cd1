//! An error and its sources on one line, for logs, reports and Status
//! messages (`thiserror` types keep the cause out of their own message, so
//! printing only the top level would lose it).

/// `error: cause: cause of cause`.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading config")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn every_cause_once_in_order() {
        let e = Outer(std::io::Error::other("disk gone"));
        assert_eq!(error_chain(&e), "reading config: disk gone");
        assert_eq!(error_chain(&std::io::Error::other("alone")), "alone");
    }
}
