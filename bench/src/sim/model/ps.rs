//! Egalitarian processor sharing: the pure core of the simulated control
//! plane's CPU. `capacity` cores are shared by the jobs in service; with n
//! jobs each progresses at min(1, capacity / n) CPU-seconds per second, as
//! goroutines share an apiserver's cores. Time is passed in (seconds on any
//! monotonic axis), so the model is exact and testable; nothing is burned.
//!
//! Implementation: every job in service has attained the same service since
//! it arrived, so one "virtual time" V (service per job) is tracked and a job
//! that arrives at V0 with work w finishes when V reaches V0 + w (its tag).

use std::collections::BTreeMap;

/// A tag ordered as f64 (never NaN: work and time are finite and non-negative).
#[derive(Debug, Clone, Copy)]
struct Tag(f64);
impl PartialEq for Tag {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o).is_eq()
    }
}
impl Eq for Tag {}
impl PartialOrd for Tag {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Tag {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// The shared CPU.
#[derive(Debug)]
pub struct ProcessorSharing {
    capacity: f64,
    /// Service attained by any job in service since time 0.
    v: f64,
    /// The time `v` was last brought up to date.
    at: f64,
    jobs: BTreeMap<(Tag, u64), ()>,
    next_id: u64,
    /// CPU-seconds served so far (for `tollgate_sim_virtual_cpu_seconds_total`).
    served: f64,
}

impl ProcessorSharing {
    pub fn new(capacity: f64) -> Self {
        ProcessorSharing {
            capacity: capacity.max(1e-9),
            v: 0.0,
            at: 0.0,
            jobs: BTreeMap::new(),
            next_id: 0,
            served: 0.0,
        }
    }

    fn rate(&self) -> f64 {
        let n = self.jobs.len() as f64;
        if n == 0.0 {
            0.0
        } else {
            (self.capacity / n).min(1.0)
        }
    }

    /// Brings the model to time `now`; returns the jobs finished by then, in finishing order.
    pub fn advance(&mut self, now: f64) -> Vec<u64> {
        let mut done = Vec::new();
        while let Some((&(Tag(tag), _), _)) = self.jobs.first_key_value() {
            let rate = self.rate();
            let finish_at = self.at + (tag - self.v) / rate;
            if finish_at > now {
                break;
            }
            self.served += rate * self.jobs.len() as f64 * (finish_at - self.at).max(0.0);
            self.v = tag;
            self.at = finish_at.max(self.at);
            while let Some((&(Tag(t), id), _)) = self.jobs.first_key_value() {
                if t > self.v {
                    break;
                }
                self.jobs.pop_first();
                done.push(id);
            }
        }
        if now > self.at {
            let rate = self.rate();
            self.served += rate * self.jobs.len() as f64 * (now - self.at);
            self.v += rate * (now - self.at);
            self.at = now;
        }
        done
    }

    /// A job needing `work` CPU-seconds arrives at `now`; returns its id.
    pub fn arrive(&mut self, now: f64, work: f64) -> u64 {
        self.advance(now);
        let id = self.next_id;
        self.next_id += 1;
        self.jobs.insert((Tag(self.v + work.max(0.0)), id), ());
        id
    }

    /// When the next job finishes if nothing else arrives.
    pub fn next_finish(&self) -> Option<f64> {
        self.jobs
            .first_key_value()
            .map(|(&(Tag(tag), _), _)| self.at + (tag - self.v) / self.rate())
    }

    pub fn in_service(&self) -> usize {
        self.jobs.len()
    }

    /// CPU-seconds served up to the last `advance`.
    pub fn served(&self) -> f64 {
        self.served
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn alone_a_job_takes_its_work() {
        let mut ps = ProcessorSharing::new(2.0);
        let a = ps.arrive(0.0, 0.5);
        assert!(close(ps.next_finish().unwrap(), 0.5));
        assert!(ps.advance(0.49).is_empty());
        assert_eq!(ps.advance(0.5), vec![a]);
        assert!(close(ps.served(), 0.5));
    }

    #[test]
    fn jobs_beyond_the_cores_share_them() {
        // 4 jobs of 1 s on 2 cores: each runs at half speed, all finish at 2 s.
        let mut ps = ProcessorSharing::new(2.0);
        let ids: Vec<u64> = (0..4).map(|_| ps.arrive(0.0, 1.0)).collect();
        assert!(close(ps.next_finish().unwrap(), 2.0));
        assert_eq!(ps.advance(2.0), ids);
        assert!(close(ps.served(), 4.0));
    }

    #[test]
    fn a_short_job_behind_long_ones_is_slowed_not_blocked() {
        // Two 10 s LISTs on one core, then a 10 ms PATCH: it gets a third of the core.
        let mut ps = ProcessorSharing::new(1.0);
        ps.arrive(0.0, 10.0);
        ps.arrive(0.0, 10.0);
        let patch = ps.arrive(1.0, 0.01);
        let t = ps.next_finish().unwrap();
        assert!(close(t, 1.03), "{t}");
        assert_eq!(ps.advance(t), vec![patch]);
        // The LISTs had 0.5 s each by t=1, then a third of the core for 0.03 s.
        assert!(close(ps.served(), 1.0 + 0.03));
    }

    #[test]
    fn departures_speed_up_the_rest() {
        let mut ps = ProcessorSharing::new(1.0);
        let short = ps.arrive(0.0, 1.0);
        let long = ps.arrive(0.0, 3.0);
        // Both at half speed until 2 s (short done), then long alone: 2 s more.
        assert_eq!(ps.advance(2.0), vec![short]);
        assert!(close(ps.next_finish().unwrap(), 4.0));
        assert_eq!(ps.advance(10.0), vec![long]);
        assert!(close(ps.served(), 4.0));
        assert_eq!(ps.in_service(), 0);
    }
}
