//! Go's heap as the kernel sees it, which is what a real kube-apiserver's RSS
//! (and so its OOM kill) follows. Measured against kube-apiserver 1.20, the
//! RSS grows with the LIST rate far more than the memory LISTs keep alive:
//! what a finished LIST allocated stays until the next collection, which
//! starts only when the heap reaches `GOGC`% above what the last one found
//! live (a LIST in flight at that moment raises the next goal too), and the
//! pages freed go back to the kernel slowly (the background scavenger, capped
//! at 1% of the CPU, keeps 10% above the goal). Collections are instant here:
//! a concurrent mark, during which allocations survive, was tried and, with a
//! request's garbage allocated at once rather than as it is made, overshot
//! at 240 LISTs/min while gaining nothing at 60–120 (bench/MODEL.md).
//! Pure: time is passed in (seconds), no clock, no I/O.

/// Go runtime settings the model follows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeapParams {
    /// `GOGC`: a collection starts when the heap is this many percent above
    /// what the previous collection found live (kube-apiserver keeps Go's 100).
    pub gc_percent: f64,
    /// Bytes per second the background scavenger gives back to the kernel.
    pub scavenge_per_second: f64,
}

/// The heap goal never falls below Go's minimum (4 MB).
const MIN_GOAL: f64 = 4e6;
/// The scavenger keeps this much above the heap goal (Go's `retainExtraPercent`).
const RETAIN_EXTRA: f64 = 0.10;

#[derive(Debug, Clone)]
pub struct GoHeap {
    params: HeapParams,
    /// Live for the process's life: binary, caches, the watch cache's objects.
    base: f64,
    /// Live while requests are in flight.
    held: f64,
    /// Allocated, unreachable, not yet collected.
    garbage: f64,
    /// The heap size that starts the next collection.
    goal: f64,
    /// Pages mapped at the last collection (the heap's peak), and when.
    retained: f64,
    retained_at: f64,
}

impl GoHeap {
    /// A new process whose live memory is `base` at `now`.
    pub fn new(params: HeapParams, base: f64, now: f64) -> GoHeap {
        let base = base.max(0.0);
        GoHeap {
            params,
            base,
            held: 0.0,
            garbage: 0.0,
            goal: goal_for(params, base),
            retained: base,
            retained_at: now,
        }
    }

    pub fn live(&self) -> f64 {
        self.base + self.held
    }

    /// Bytes in use by the heap: live plus garbage not yet collected.
    pub fn heap(&self) -> f64 {
        self.live() + self.garbage
    }

    /// The resident set at `now`: the heap, or what the scavenger has not
    /// yet given back of the pages mapped at the last collection.
    pub fn rss(&self, now: f64) -> f64 {
        let elapsed = (now - self.retained_at).max(0.0);
        let floor = self.goal * (1.0 + RETAIN_EXTRA);
        let scavenged = (self.retained - self.params.scavenge_per_second * elapsed).max(floor);
        self.heap().max(self.retained.min(scavenged))
    }

    /// A request allocates `live` bytes it keeps until [`GoHeap::release`]
    /// and `garbage` bytes it drops as it goes. Returns the RSS the
    /// allocation reached (before any collection it set off), which is what an
    /// OOM kill sees.
    pub fn allocate(&mut self, live: f64, garbage: f64, now: f64) -> f64 {
        self.held += live.max(0.0);
        self.garbage += garbage.max(0.0);
        let rss = self.rss(now);
        if self.heap() >= self.goal {
            self.collect(now);
        }
        rss
    }

    /// A request ends: what it kept becomes garbage.
    pub fn release(&mut self, live: f64) {
        let live = live.max(0.0).min(self.held);
        self.held -= live;
        self.garbage += live;
    }

    /// The long-lived memory changed (the watch cache grew or shrank): growth
    /// is an allocation, shrinkage leaves garbage. Returns the RSS reached.
    pub fn set_base(&mut self, base: f64, now: f64) -> f64 {
        let base = base.max(0.0);
        if base < self.base {
            self.garbage += self.base - base;
            self.base = base;
            return self.rss(now);
        }
        self.base = base;
        self.allocate(0.0, 0.0, now)
    }

    fn collect(&mut self, now: f64) {
        self.retained = self.rss(now);
        self.retained_at = now;
        self.garbage = 0.0;
        self.goal = goal_for(self.params, self.live());
    }
}

fn goal_for(params: HeapParams, live: f64) -> f64 {
    (live * (1.0 + params.gc_percent.max(0.0) / 100.0)).max(MIN_GOAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: HeapParams = HeapParams {
        gc_percent: 100.0,
        scavenge_per_second: 64e6,
    };

    #[test]
    fn garbage_accumulates_until_the_heap_reaches_twice_the_live_memory() {
        let mut h = GoHeap::new(P, 300e6, 0.0);
        // Three LISTs allocating 200 MB each: the heap passes 600 MB at the second.
        assert_eq!(h.allocate(50e6, 150e6, 0.0), 500e6);
        h.release(50e6);
        assert_eq!(h.heap(), 500e6);
        let peak = h.allocate(50e6, 150e6, 1.0);
        assert_eq!(peak, 700e6);
        // Collected: only the live memory (base + the LIST in flight) is left,
        // and the next goal is twice that.
        assert_eq!(h.heap(), 350e6);
        assert_eq!(h.goal, 700e6);
        // The pages stay resident until the scavenger gives them back.
        assert_eq!(h.rss(1.0), 700e6);
    }

    #[test]
    fn the_scavenger_gives_pages_back_slowly_down_to_ten_percent_over_the_goal() {
        let mut h = GoHeap::new(P, 100e6, 0.0);
        h.allocate(0.0, 900e6, 0.0); // a burst: heap 1 GB, collected at once
        assert_eq!(h.rss(0.0), 1000e6);
        assert!((h.rss(5.0) - (1000e6 - 5.0 * 64e6)).abs() < 1.0);
        // Never below the heap goal plus 10%.
        assert!((h.rss(1000.0) - 220e6).abs() < 1.0);
    }

    #[test]
    fn more_in_flight_at_a_collection_raises_the_next_goal() {
        let mut quiet = GoHeap::new(P, 300e6, 0.0);
        let mut busy = GoHeap::new(P, 300e6, 0.0);
        quiet.allocate(0.0, 400e6, 0.0);
        for _ in 0..10 {
            busy.allocate(50e6, 0.0, 0.0);
        }
        busy.allocate(0.0, 400e6, 0.0);
        assert_eq!(quiet.goal, 600e6);
        assert_eq!(busy.goal, 1600e6);
    }

    #[test]
    fn releasing_more_than_was_held_is_harmless() {
        let mut h = GoHeap::new(P, 100e6, 0.0);
        h.allocate(10e6, 0.0, 0.0);
        h.release(50e6);
        assert_eq!(h.live(), 100e6);
    }

    #[test]
    fn the_watch_cache_shrinking_leaves_garbage_and_growing_allocates() {
        let mut h = GoHeap::new(P, 300e6, 0.0);
        h.set_base(200e6, 0.0);
        assert_eq!((h.live(), h.heap()), (200e6, 300e6));
        h.set_base(700e6, 1.0); // past the goal (600 MB): collected
        assert_eq!(h.heap(), 700e6);
        assert_eq!(h.goal, 1400e6);
    }
}
