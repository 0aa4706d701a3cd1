//! Cluster-size scaling of the pool (KEP-5546's idea): rate and burst =
//! base + per unit × cluster size, where the size is the node count or the
//! count of containers (init, regular, ephemeral) in non-terminal pods. The
//! node count comes with the metrics scrape ([`crate::scrape`]), the
//! container count from its own paged LIST ([`crate::containers`]).

use super::settings::{Quota, ScalingMode};

/// Pool rate and burst for the current cluster size (`None`: not known
/// yet, use the base alone).
pub fn scaled(quota: &Quota, size: Option<f64>) -> (f64, f64) {
    let s = &quota.scaling;
    let units = match (s.mode, size) {
        (ScalingMode::Fixed, _) | (_, None) => 0.0,
        (_, Some(n)) => n.max(0.0),
    };
    (
        quota.bytes_per_second + s.bytes_per_second_per_unit * units,
        quota.burst_bytes + s.burst_bytes_per_unit * units,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_and_burst_grow_with_the_cluster() {
        let mut q = Quota {
            bytes_per_second: 100.0,
            burst_bytes: 1000.0,
            ..Quota::default()
        };
        q.scaling.bytes_per_second_per_unit = 2.0;
        q.scaling.burst_bytes_per_unit = 10.0;
        assert_eq!(scaled(&q, Some(50.0)), (100.0, 1000.0), "fixed");
        q.scaling.mode = ScalingMode::NodeProportional;
        assert_eq!(scaled(&q, Some(50.0)), (200.0, 1500.0));
        assert_eq!(scaled(&q, None), (100.0, 1000.0), "size not known yet");
    }
}
