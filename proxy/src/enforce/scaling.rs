//! Cluster-size scaling of the pool (KEP-5546's idea): rate and burst =
//! base + per unit × cluster size, where the size is the node count or the
//! count of containers (init, regular, ephemeral) in non-terminal pods. The
//! node count comes with the metrics scrape ([`crate::scrape`]), the
//! container count from its own paged LIST ([`crate::containers`]).

use crate::budget::heavy::Ceilings;
use crate::config::settings::enforce::{Quota, ScalingMode};

/// The static values for the current cluster size (`None`: not known
/// yet, the base alone). Scaled values count as set: scaling is the
/// operator's choice of pool.
pub fn ceilings(quota: &Quota, size: Option<f64>) -> Ceilings {
    let s = &quota.scaling;
    let scaling = s.mode != ScalingMode::Fixed;
    let units = match (s.mode, size) {
        (ScalingMode::Fixed, _) | (_, None) => 0.0,
        (_, Some(n)) => n.max(0.0),
    };
    let scaled = |set: Option<f64>, base: f64, per_unit: f64| {
        (set.is_some() || scaling).then_some(base + per_unit * units)
    };
    Ceilings {
        rate: scaled(
            quota.bytes_per_second,
            quota.bytes_per_second(),
            s.bytes_per_second_per_unit,
        ),
        burst: scaled(
            quota.burst_bytes,
            quota.burst_bytes(),
            s.burst_bytes_per_unit,
        ),
        inflight: quota.inflight_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_and_burst_grow_with_the_cluster() {
        let mut q = Quota {
            bytes_per_second: Some(100.0),
            burst_bytes: Some(1000.0),
            ..Quota::default()
        };
        q.scaling.bytes_per_second_per_unit = 2.0;
        q.scaling.burst_bytes_per_unit = 10.0;
        let pool = |q: &Quota, size| {
            let c = ceilings(q, size).static_limits();
            (c.rate, c.burst)
        };
        assert_eq!(pool(&q, Some(50.0)), (100.0, 1000.0), "fixed");
        q.scaling.mode = ScalingMode::NodeProportional;
        assert_eq!(pool(&q, Some(50.0)), (200.0, 1500.0));
        assert_eq!(pool(&q, None), (100.0, 1000.0), "size not known yet");
    }

    #[test]
    fn only_values_set_or_scaled_cap_the_adaptive_budget() {
        let mut q = Quota::default();
        let c = ceilings(&q, Some(50.0));
        assert_eq!((c.rate, c.burst, c.inflight), (None, None, None));
        assert_eq!(
            c.static_limits().rate,
            q.bytes_per_second(),
            "static mode: the default"
        );
        q.inflight_bytes = Some(5e8);
        q.bytes_per_second = Some(1e8);
        let c = ceilings(&q, Some(50.0));
        assert_eq!((c.rate, c.burst, c.inflight), (Some(1e8), None, Some(5e8)));
        q.bytes_per_second = None;
        q.scaling.mode = ScalingMode::NodeProportional;
        q.scaling.burst_bytes_per_unit = 10.0;
        let c = ceilings(&q, Some(50.0));
        assert_eq!(c.rate, Some(c.static_limits().rate), "scaled: set");
        assert_eq!(c.burst, Some(q.burst_bytes() + 500.0));
    }
}
