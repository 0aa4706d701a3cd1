//! The driver's own HTTP/1.1 client path: its idle connections and the
//! requests waiting for one, and one attempt (write, read the response to its
//! end) done by the request future itself on the driver's thread. No
//! connection task, no channel, no timer per request (the driver keeps the
//! deadlines, see [`super::deadline`]); the request bytes are written into the
//! connection's reused buffer from headers serialized once.
//!
//! Used for every scheduled request operation unless HTTP/2 is in use (asked
//! for, or chosen by ALPN with `--http-version auto`, in which case the
//! connection is handed to hyper's HTTP/2 client in [`Conns`]).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::poll_fn;
use std::ops::{Deref, DerefMut};
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Instant;

use super::deadline::{with_deadline, Deadlines};
use crate::conn::h1::{self, Conn};
use crate::conn::{Conns, Dialed, MAX_OPENING};
use crate::ops::Planned;
use crate::record::ErrorClass;
use crate::send::{self, Attempt, SendOptions, Sent};

/// One driver's HTTP/1.1 connections.
pub(crate) struct Pool<'a> {
    conns: &'a Conns,
    /// `host`, `accept` and `user-agent`, serialized once.
    fixed: Vec<u8>,
    state: RefCell<State>,
}

/// How many of the pool's connections exist (idle, carrying a request, or
/// handed to a waiting one). Shared with every [`Pooled`], whose drop counts
/// it down wherever that happens (a broken connection, a request a deadline
/// ended); the driver then passes the freed place on ([`Pool::reap`]).
#[derive(Default)]
struct Live {
    count: Cell<usize>,
    freed: Cell<bool>,
}

/// A connection of the pool, counted while it exists.
pub(crate) struct Pooled {
    conn: Conn,
    live: Rc<Live>,
}

impl Pooled {
    fn new(conn: Conn, live: &Rc<Live>) -> Pooled {
        live.count.set(live.count.get() + 1);
        Pooled {
            conn,
            live: live.clone(),
        }
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.live.count.set(self.live.count.get().saturating_sub(1));
        self.live.freed.set(true);
    }
}

impl Deref for Pooled {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        &self.conn
    }
}

impl DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut Conn {
        &mut self.conn
    }
}

#[derive(Default)]
struct State {
    /// Connections not carrying a request, most recently used last (so the
    /// busiest few stay warm). No more than requests were ever in flight at
    /// once, so bounded by `--max-in-flight` (and `--max-connections`).
    idle: Vec<Pooled>,
    /// Connections being opened, at most [`MAX_OPENING`].
    opening: usize,
    /// `--max-connections` (0: no limit but `--max-in-flight`).
    max_connections: usize,
    live: Rc<Live>,
    /// Requests waiting for a connection (all [`MAX_OPENING`] slots busy),
    /// oldest first, sorted by id; at most one entry per request in flight.
    waiters: VecDeque<Waiter>,
    next_waiter: u64,
}

/// A request waiting for a connection.
struct Waiter {
    id: u64,
    waker: Waker,
    /// A connection given back and handed straight to this request: the
    /// oldest waiter gets it, as in hyper's pool. (Left in the idle list,
    /// whichever request ran first took it, and under overload some waited
    /// for seconds behind newer ones.)
    handed: Option<Pooled>,
    /// Woken for a free connect slot and not yet run.
    woken: bool,
    /// Wants a new connection only (a retry after a kept-alive one broke).
    fresh: bool,
}

impl State {
    /// Whether one more connection may be opened now.
    fn may_open(&self) -> bool {
        self.opening < MAX_OPENING
            && (self.max_connections == 0
                || self.opening + self.live.count.get() < self.max_connections)
    }

    /// Where waiter `id` is queued.
    fn position(&self, id: u64) -> Option<usize> {
        self.waiters.binary_search_by_key(&id, |w| w.id).ok()
    }

    /// A connect slot freed: the oldest waiting request not yet told may use it.
    fn wake_for_slot(&mut self) {
        if let Some(w) = self
            .waiters
            .iter_mut()
            .find(|w| w.handed.is_none() && !w.woken)
        {
            w.woken = true;
            w.waker.wake_by_ref();
        }
    }

    /// Takes waiter `i` out of the queue; a connect slot it was woken for
    /// and did not use is passed on. The connection handed to it, if any.
    fn remove_waiter(&mut self, i: usize) -> Option<Pooled> {
        let w = self.waiters.remove(i)?;
        if w.woken && self.may_open() {
            self.wake_for_slot();
        }
        w.handed
    }

    /// A connection is free: to the oldest waiting request that can use it, else idle.
    fn give_back(&mut self, conn: Pooled) {
        match self
            .waiters
            .iter_mut()
            .find(|w| w.handed.is_none() && !w.fresh)
        {
            Some(w) => {
                w.handed = Some(conn);
                w.waker.wake_by_ref();
            }
            None => self.idle.push(conn),
        }
    }
}

/// What a request got to send on.
enum Checkout {
    H1(Pooled),
    /// ALPN chose HTTP/2; [`Conns`] holds that connection now.
    H2,
}

impl<'a> Pool<'a> {
    /// `max_connections`: how many may exist at once (0: no limit but the
    /// requests in flight).
    pub(crate) fn new(conns: &'a Conns, max_connections: usize) -> Pool<'a> {
        Pool {
            fixed: conns.fixed_headers(),
            conns,
            state: RefCell::new(State {
                max_connections,
                ..State::default()
            }),
        }
    }

    /// Connections that closed since the last call leave room for new
    /// ones: as many waiting requests as fit are woken to open them. The
    /// driver calls it on every pass (a connection may close inside any
    /// request's poll, or with a request its deadline ended).
    pub(crate) fn reap(&self) {
        let mut st = self.state.borrow_mut();
        if !st.live.freed.replace(false) {
            return;
        }
        let mut room = MAX_OPENING.saturating_sub(st.opening);
        if st.max_connections > 0 {
            room = room.min(
                st.max_connections
                    .saturating_sub(st.opening + st.live.count.get()),
            );
        }
        let told = st.waiters.iter().filter(|w| w.woken).count();
        for w in st
            .waiters
            .iter_mut()
            .filter(|w| w.handed.is_none() && !w.woken)
            .take(room.saturating_sub(told))
        {
            w.woken = true;
            w.waker.wake_by_ref();
        }
    }

    /// A usable idle connection, else a new one (the request waits for a
    /// connect slot, or a connection given back, when [`MAX_OPENING`] are
    /// being opened). `fresh`: a new connection only.
    async fn checkout(&self, fresh: bool) -> Result<Checkout, ErrorClass> {
        // This request's place among the waiters, if it has one.
        let waiting = Cell::new(None);
        let _unqueue = Unqueue {
            pool: self,
            id: &waiting,
        };
        let connect = poll_fn(|cx| {
            let mut st = self.state.borrow_mut();
            let queued = waiting.get().and_then(|id| st.position(id));
            if let Some(i) = queued {
                if let Some(c) = st.waiters[i].handed.take() {
                    st.remove_waiter(i);
                    waiting.set(None);
                    return Poll::Ready(Ok(c));
                }
            }
            let mut got = None;
            if !fresh {
                while let Some(mut c) = st.idle.pop() {
                    if c.poll_usable(cx) {
                        got = Some(Ok(c));
                        break;
                    }
                }
            }
            if got.is_none() && fresh && !st.may_open() && !st.idle.is_empty() {
                // A retry that needs a new connection, at --max-connections: the
                // least recently used idle one makes room (none may ever be given back).
                drop(st.idle.remove(0));
            }
            if got.is_none() && st.may_open() {
                st.opening += 1;
                got = Some(Err(()));
            }
            if let Some(got) = got {
                // Out of the queue at once: nothing is handed to a request that has its own.
                if let Some(i) = queued {
                    st.remove_waiter(i);
                    waiting.set(None);
                }
                return Poll::Ready(got);
            }
            match queued {
                Some(i) => {
                    let w = &mut st.waiters[i];
                    w.waker.clone_from(cx.waker());
                    w.woken = false;
                }
                None => {
                    let id = st.next_waiter;
                    st.next_waiter += 1;
                    st.waiters.push_back(Waiter {
                        id,
                        waker: cx.waker().clone(),
                        handed: None,
                        woken: false,
                        fresh,
                    });
                    waiting.set(Some(id));
                }
            }
            Poll::Pending
        })
        .await;
        if let Ok(c) = connect {
            return Ok(Checkout::H1(c));
        }
        let _slot = OpeningSlot(self);
        // Boxed: a TLS handshake's state is large and rare.
        Ok(match Box::pin(self.conns.dial_h1()).await? {
            // Counted before the opening slot is given up.
            Dialed::H1(stream) => {
                let live = self.state.borrow().live.clone();
                Checkout::H1(Pooled::new(Conn::new(stream), &live))
            }
            Dialed::H2 => Checkout::H2,
        })
    }

    fn give_back(&self, conn: Pooled) {
        self.state.borrow_mut().give_back(conn);
    }

    /// One attempt: a connection, the request written, the response read to its end.
    async fn attempt(&self, planned: &Planned, want_meta: bool) -> Result<Attempt, ErrorClass> {
        // Only a GET may go out again after it was written: the server may
        // have acted on anything else before the connection broke.
        let safe = planned.method == http::Method::GET;
        let mut fresh = false;
        loop {
            let mut conn = match self.checkout(fresh).await? {
                Checkout::H1(c) => c,
                Checkout::H2 => {
                    return Box::pin(send::attempt(self.conns, planned, want_meta)).await
                }
            };
            let auth = self.conns.credentials().authorization();
            if let Err(e) = h1::write_request(
                conn.request_buf(),
                planned,
                self.conns.prefix(),
                &self.fixed,
                auth.as_ref(),
            ) {
                self.give_back(conn);
                return Err(e);
            }
            match conn
                .exchange(|status| send::kept_limit(status, want_meta), safe)
                .await
            {
                Ok((resp, reusable)) => {
                    if reusable {
                        self.give_back(conn);
                    }
                    if resp.status == 401 {
                        self.conns.unauthorized();
                    }
                    return Ok(Attempt::new(
                        resp.status,
                        resp.bytes,
                        resp.class,
                        resp.retry_after,
                        &resp.kept,
                        want_meta,
                    ));
                }
                Err(f) if f.fresh_retry && !fresh => fresh = true,
                Err(f) => return Err(f.class),
            }
        }
    }
}

/// Takes a request out of the waiters when it stops waiting for any reason
/// (a timeout drops it), passing on a connection handed to it meanwhile.
struct Unqueue<'p, 'a> {
    pool: &'p Pool<'a>,
    id: &'p Cell<Option<u64>>,
}

impl Drop for Unqueue<'_, '_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.get() {
            let mut st = self.pool.state.borrow_mut();
            let handed = match st.position(id) {
                Some(i) => st.remove_waiter(i),
                None => None,
            };
            // A connection handed to it goes to the next in line.
            if let Some(c) = handed {
                st.give_back(c);
            }
        }
    }
}

/// A connect slot, freed (and passed on to a waiting request) however the connect ends.
struct OpeningSlot<'p, 'a>(&'p Pool<'a>);

impl Drop for OpeningSlot<'_, '_> {
    fn drop(&mut self) {
        let mut st = self.0.state.borrow_mut();
        st.opening -= 1;
        if st.may_open() {
            st.wake_for_slot();
        }
    }
}

/// Sends `planned` on the driver's HTTP/1.1 path: each attempt ends at its
/// deadline (`opts.timeout` from its start), 429s are retried as
/// [`send::send`] does.
pub(crate) async fn send(
    pool: &Pool<'_>,
    deadlines: &RefCell<Deadlines>,
    planned: &Planned,
    opts: &SendOptions,
    want_meta: bool,
) -> Sent {
    send::retrying(opts, || async {
        let deadline = Instant::now() + opts.timeout;
        with_deadline(deadlines, deadline, pool.attempt(planned, want_meta))
            .await
            .unwrap_or(Err(ErrorClass::Timeout))
    })
    .await
}
