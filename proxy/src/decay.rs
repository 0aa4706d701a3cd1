//! Exponentially decayed statistics: the decay factor and a decayed
//! log-bucket histogram (for high percentiles of bytes and latency).

use std::time::Duration;

/// Log buckets per doubling: ~9% resolution.
const SUB_BUCKETS: f64 = 8.0;
/// Most buckets kept; the lightest is dropped past it.
const MAX_BUCKETS: usize = 24;

/// The weight left after `dt` with half-life `half_life` seconds.
pub fn decay_factor(dt: Duration, half_life: f64) -> f64 {
    0.5f64.powf(dt.as_secs_f64() / half_life)
}

/// Decayed weights in logarithmic buckets; bucket `b >= 1` holds
/// `[2^((b-1)/8), 2^(b/8))`, bucket 0 holds `[0, 1)`.
#[derive(Debug, Clone, Default)]
pub struct DecayedHistogram {
    buckets: Vec<(u16, f64)>,
}

impl DecayedHistogram {
    fn bucket_of(x: f64) -> u16 {
        if x < 1.0 {
            0
        } else {
            ((x.log2() * SUB_BUCKETS).floor() as u16).saturating_add(1)
        }
    }

    fn upper(b: u16) -> f64 {
        2f64.powf(f64::from(b) / SUB_BUCKETS)
    }

    pub fn add(&mut self, x: f64, weight: f64) {
        let b = Self::bucket_of(x);
        match self.buckets.binary_search_by_key(&b, |e| e.0) {
            Ok(i) => self.buckets[i].1 += weight,
            Err(i) => {
                self.buckets.insert(i, (b, weight));
                if self.buckets.len() > MAX_BUCKETS {
                    let lightest = (0..self.buckets.len())
                        .min_by(|a, b| self.buckets[*a].1.total_cmp(&self.buckets[*b].1))
                        .unwrap_or(0);
                    self.buckets.remove(lightest);
                }
            }
        }
    }

    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    pub fn scale(&mut self, factor: f64) {
        for e in &mut self.buckets {
            e.1 *= factor;
        }
    }

    /// The upper bound of the bucket where the cumulative weight reaches `q`.
    pub fn quantile(&self, q: f64) -> f64 {
        let total: f64 = self.buckets.iter().map(|e| e.1).sum();
        if total <= 0.0 {
            return 0.0;
        }
        let mut seen = 0.0;
        for (b, w) in &self.buckets {
            seen += w;
            if seen >= q * total {
                return Self::upper(*b);
            }
        }
        self.buckets.last().map(|e| Self::upper(e.0)).unwrap_or(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_life_and_quantiles() {
        assert_eq!(decay_factor(Duration::from_secs(300), 300.0), 0.5);
        assert_eq!(decay_factor(Duration::ZERO, 300.0), 1.0);
        let mut h = DecayedHistogram::default();
        for _ in 0..99 {
            h.add(100.0, 1.0);
        }
        h.add(10_000.0, 1.0);
        // 100 lies in [2^(53/8), 2^(54/8)) ≈ [98.7, 107.6).
        assert_eq!(h.quantile(0.5), 2f64.powf(54.0 / 8.0));
        assert_eq!(h.quantile(1.0), 2f64.powf(107.0 / 8.0));
        h.scale(0.5);
        assert_eq!(
            h.quantile(0.5),
            2f64.powf(54.0 / 8.0),
            "scaling keeps shape"
        );
    }

    #[test]
    fn bounded_buckets() {
        let mut h = DecayedHistogram::default();
        for i in 0..100 {
            h.add(2f64.powi(i % 40) * 1.5, 1.0 + f64::from(i));
        }
        assert!(h.len() <= MAX_BUCKETS);
    }
}
