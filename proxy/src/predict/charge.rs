//! What a request is charged, in bytes: the predicted cost at admission, the
//! actual cost when its response ended (sent plus weighted etcd reads).

use super::Prediction;

/// The bytes a prediction charges: sent plus weighted etcd reads.
pub fn charge(p: &Prediction, etcd_read_weight: f64) -> f64 {
    p.response_bytes + etcd_read_weight * p.read_bytes
}

/// The bytes read from etcd once the response ended: an unfiltered etcd
/// read reads what it sends; a filtered one what was predicted.
pub fn actual_read(p: &Prediction, filtered: bool, sent: f64) -> f64 {
    if p.read_bytes <= 0.0 {
        0.0
    } else if filtered {
        p.read_bytes
    } else {
        sent
    }
}

/// The actual charge once the response ended: the bytes sent (uncompressed
/// estimate) plus the etcd reads they imply (an unfiltered etcd read reads
/// what it sends; a filtered one reads what was predicted). A response cut
/// short is never refunded below its debit: the apiserver did the work.
pub fn actual_charge(
    p: &Prediction,
    filtered: bool,
    sent: f64,
    complete: bool,
    etcd_read_weight: f64,
    debited: f64,
) -> f64 {
    let actual = sent + etcd_read_weight * actual_read(p, filtered, sent);
    if complete {
        actual
    } else {
        actual.max(debited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::Source;

    #[test]
    fn charges_weigh_etcd_reads_and_never_refund_cut_responses() {
        let p = Prediction {
            response_bytes: 100.0,
            read_bytes: 100.0,
            source: Source::Pattern,
        };
        assert_eq!(charge(&p, 2.0), 300.0);
        assert_eq!(actual_charge(&p, false, 50.0, true, 2.0, 300.0), 150.0);
        let filtered = Prediction {
            read_bytes: 1000.0,
            ..p
        };
        assert_eq!(
            actual_charge(&filtered, true, 10.0, true, 2.0, 2100.0),
            2010.0
        );
        assert_eq!(actual_charge(&p, false, 10.0, false, 2.0, 300.0), 300.0);
    }
}
