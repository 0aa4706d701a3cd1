//! The two stations a request waits at, driven by one event-driven task:
//! the apiserver's CPU (processor sharing over `--virtual-cpus`, with a
//! scheduler time slice) and etcd (processor sharing over its own cores,
//! behind the backend lock, after a WAL fsync for writes). A request waits
//! on a timer or a wake-up from the scheduler task; nothing spins or burns
//! CPU, so the machine stays idle while the modeled control plane is busy.

use super::costs::round_wait;
use super::lock::{BackendLock, Mode};
use super::ps::ProcessorSharing;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Station {
    Cpu,
    Etcd,
}

/// The stations' sizes and the constants the stations themselves apply.
#[derive(Debug, Clone, Copy)]
pub struct StationConfig {
    pub cpus: f64,
    pub etcd_cpus: f64,
    pub quantum: f64,
    pub etcd_range_lock_fraction: f64,
    pub etcd_fsync: f64,
}

struct Inner {
    cpu: ProcessorSharing,
    etcd: ProcessorSharing,
    waiters: HashMap<(Station, u64), oneshot::Sender<()>>,
    lock: BackendLock,
    lock_waiters: HashMap<u64, oneshot::Sender<Mode>>,
    next_ticket: u64,
    /// CPU-seconds served by apiserver instances that crashed (their stations were reset).
    cpu_served_before: f64,
}

/// The apiserver's CPU and etcd, shared by every request of the simulator.
pub struct Stations {
    config: StationConfig,
    origin: Instant,
    inner: Mutex<Inner>,
    wake: Notify,
}

/// Jobs finishing within this much of `now` are finished now: keeps float
/// rounding from waking the scheduler again for a nanosecond's worth of work.
const EPSILON: f64 = 1e-7;

impl Stations {
    pub fn new(config: StationConfig) -> Arc<Stations> {
        Arc::new(Stations {
            config,
            origin: Instant::now(),
            inner: Mutex::new(Inner {
                cpu: ProcessorSharing::new(config.cpus),
                etcd: ProcessorSharing::new(config.etcd_cpus),
                waiters: HashMap::new(),
                lock: BackendLock::default(),
                lock_waiters: HashMap::new(),
                next_ticket: 0,
                cpu_served_before: 0.0,
            }),
            wake: Notify::new(),
        })
    }

    fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain numbers behind: keep going.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Brings both stations to `now` and wakes the requests whose work is done.
    fn advance(inner: &mut Inner, now: f64) {
        for (station, ps) in [
            (Station::Cpu, &mut inner.cpu),
            (Station::Etcd, &mut inner.etcd),
        ] {
            for id in ps.advance(now + EPSILON) {
                if let Some(tx) = inner.waiters.remove(&(station, id)) {
                    let _ = tx.send(());
                }
            }
        }
    }

    /// The scheduler: sleeps until the next job finishes or a job arrives.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let next = {
                let mut g = self.lock();
                Self::advance(&mut g, self.now());
                match (g.cpu.next_finish(), g.etcd.next_finish()) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            };
            let sleep = async {
                match next {
                    Some(t) => {
                        let at = self.origin + Duration::from_secs_f64(t.max(0.0));
                        tokio::time::sleep_until(at).await
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = sleep => {}
                _ = self.wake.notified() => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Waits while `work` CPU-seconds are served at `station`.
    async fn serve(&self, station: Station, work: f64) {
        if work <= 0.0 {
            return;
        }
        let rx = {
            let mut g = self.lock();
            let now = self.now();
            Self::advance(&mut g, now);
            let id = match station {
                Station::Cpu => g.cpu.arrive(now, work),
                Station::Etcd => g.etcd.arrive(now, work),
            };
            let (tx, rx) = oneshot::channel();
            g.waiters.insert((station, id), tx);
            rx
        };
        self.wake.notify_one();
        // An error means the station was reset (a modeled crash): nothing left to wait for.
        let _ = rx.await;
    }

    /// apiserver CPU: a request that becomes runnable while the cores are
    /// taken first waits for its turn in the scheduler's round, then shares them.
    pub async fn cpu(&self, work: f64) {
        if work <= 0.0 {
            return;
        }
        let wait = {
            let mut g = self.lock();
            Self::advance(&mut g, self.now());
            round_wait(
                self.config.quantum,
                self.config.cpus,
                g.cpu.in_service(),
                rand::random::<f64>(),
            )
        };
        if wait > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
        self.serve(Station::Cpu, work).await;
    }

    /// An etcd range read: the locked part (reading the backend) then the rest
    /// (marshalling and sending the response).
    pub async fn etcd_read(&self, work: f64) {
        if work <= 0.0 {
            return;
        }
        let locked = work * self.config.etcd_range_lock_fraction.clamp(0.0, 1.0);
        {
            let _held = self.acquire(Mode::Read).await;
            self.serve(Station::Etcd, locked).await;
        }
        self.serve(Station::Etcd, work - locked).await;
    }

    /// An etcd write: the WAL fsync (disk time, exponentially distributed),
    /// then the apply under the backend lock.
    pub async fn etcd_write(&self, work: f64) {
        if work <= 0.0 {
            return;
        }
        let u: f64 = rand::random();
        let fsync = -self.config.etcd_fsync * (1.0 - u).ln();
        if fsync > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(fsync)).await;
        }
        let _held = self.acquire(Mode::Write).await;
        self.serve(Station::Etcd, work).await;
    }

    async fn acquire(&self, mode: Mode) -> Held<'_> {
        let (ticket, rx) = {
            let mut g = self.lock();
            let ticket = g.next_ticket;
            g.next_ticket += 1;
            if g.lock.acquire(mode, ticket) {
                return Held { st: self, mode };
            }
            let (tx, rx) = oneshot::channel();
            g.lock_waiters.insert(ticket, tx);
            (ticket, rx)
        };
        let mut pending = Pending {
            st: self,
            ticket,
            rx: Some(rx),
        };
        let granted = match pending.rx.as_mut() {
            Some(rx) => rx.await.unwrap_or(mode),
            None => mode,
        };
        pending.rx = None;
        Held {
            st: self,
            mode: granted,
        }
    }

    fn release(&self, mode: Mode) {
        let mut g = self.lock();
        let mut granted = g.lock.release(mode);
        // A waiter that went away gives its grant straight back.
        while let Some((ticket, m)) = granted.pop() {
            let delivered = g
                .lock_waiters
                .remove(&ticket)
                .is_some_and(|tx| tx.send(m).is_ok());
            if !delivered {
                granted.extend(g.lock.release(m));
            }
        }
    }

    /// A modeled crash: the apiserver's CPU starts empty (etcd carries on).
    pub fn reset_cpu(&self) {
        let mut g = self.lock();
        Self::advance(&mut g, self.now());
        g.cpu_served_before += g.cpu.served();
        g.cpu = ProcessorSharing::new(self.config.cpus);
        g.waiters.retain(|(s, _), _| *s != Station::Cpu);
    }

    /// CPU-seconds served so far: (apiserver, etcd).
    pub fn served(&self) -> (f64, f64) {
        let mut g = self.lock();
        Self::advance(&mut g, self.now());
        (g.cpu_served_before + g.cpu.served(), g.etcd.served())
    }

    /// Jobs in service: (apiserver, etcd).
    pub fn in_service(&self) -> (usize, usize) {
        let g = self.lock();
        (g.cpu.in_service(), g.etcd.in_service())
    }
}

/// The backend lock, held; released on drop (also when the request is cancelled).
struct Held<'a> {
    st: &'a Stations,
    mode: Mode,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.st.release(self.mode);
    }
}

/// A wait for the backend lock; if the request goes away while waiting, the
/// ticket is withdrawn or, if it was granted meanwhile, given back.
struct Pending<'a> {
    st: &'a Stations,
    ticket: u64,
    rx: Option<oneshot::Receiver<Mode>>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        rx.close();
        match rx.try_recv() {
            Ok(mode) => self.st.release(mode),
            Err(_) => {
                let mut g = self.st.lock();
                g.lock.cancel(self.ticket);
                g.lock_waiters.remove(&self.ticket);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> StationConfig {
        StationConfig {
            cpus: 1.0,
            etcd_cpus: 1.0,
            quantum: 0.0,
            etcd_range_lock_fraction: 1.0,
            etcd_fsync: 0.0,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn jobs_wait_their_processor_share_on_timers() {
        let st = Stations::new(config());
        let stop = CancellationToken::new();
        tokio::spawn(st.clone().run(stop.clone()));
        let t0 = Instant::now();
        // Two 1 s jobs on one core: both end at 2 s.
        let (a, b) = tokio::join!(st.cpu(1.0), st.cpu(1.0));
        let _ = (a, b);
        let took = t0.elapsed().as_secs_f64();
        assert!((took - 2.0).abs() < 0.01, "{took}");
        let (cpu, etcd) = st.served();
        assert!((cpu - 2.0).abs() < 0.01 && etcd == 0.0, "{cpu} {etcd}");
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_waits_for_the_range_read_holding_the_lock() {
        let st = Stations::new(config());
        let stop = CancellationToken::new();
        tokio::spawn(st.clone().run(stop.clone()));
        let t0 = Instant::now();
        let read = st.etcd_read(0.5);
        let write = async {
            // Arrives just after the read took the lock.
            tokio::time::sleep(Duration::from_millis(10)).await;
            st.etcd_write(0.001).await;
            t0.elapsed().as_secs_f64()
        };
        let ((), wrote_at) = tokio::join!(read, write);
        assert!(wrote_at >= 0.5, "the write finished at {wrote_at}");
        assert!(wrote_at < 0.52, "{wrote_at}");
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_does_not_keep_the_lock() {
        let st = Stations::new(config());
        let stop = CancellationToken::new();
        tokio::spawn(st.clone().run(stop.clone()));
        // A write waiting behind a read is abandoned; the next read must not wait forever.
        let read = st.etcd_read(0.1);
        let abandoned = tokio::time::timeout(Duration::from_millis(20), st.etcd_write(0.001));
        let (_, r) = tokio::join!(read, abandoned);
        assert!(r.is_err());
        tokio::time::timeout(Duration::from_secs(1), st.etcd_read(0.1))
            .await
            .expect("the lock is free");
        stop.cancel();
    }
}
