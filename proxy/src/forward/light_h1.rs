//! Light requests over HTTP/1.1 (`upstream.lightProtocol: http1`): a pool
//! of kept-alive HTTP/1.1 connections per apiserver instead of HTTP/2
//! streams. HTTP/1.1 carries one request at a time per connection, so the
//! connections open are what is in flight, and that is capped: past
//! `upstream.maxLightConnections` requests in flight, a light request goes
//! over HTTP/2 as it would with `http2` (it never waits for a connection).
//!
//! Why at all: with HTTP/2 on both legs the `h2` crate's framing, HPACK and
//! stream bookkeeping is paid twice per request; HTTP/1.1 to the upstream is
//! what nginx and HAProxy do (bench/RESULTS.md, issue 21). Bulk requests
//! (LISTs, watches, long-running) stay on HTTP/2, on connections of their
//! own, so head-of-line isolation from them is as before.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::h2_spread::{client_builder, connector, Connect, HttpClient, StreamSlot};

/// Idle HTTP/1.1 connections are closed after this: below the 90 s
/// `IdleTimeout` of recent kube-apiservers' HTTP server, so that tollgate,
/// not the apiserver, ends an idle connection, and a request is seldom
/// written onto one the apiserver is closing (hyper sends such a request
/// again on another connection when none of it was written).
const IDLE: Duration = Duration::from_secs(60);

/// The HTTP/1.1 client of one identity (anonymous or front-proxy) and the
/// cap it shares with the other.
#[derive(Debug)]
pub(crate) struct LightH1 {
    client: Arc<HttpClient>,
    in_flight: Arc<AtomicUsize>,
    max: usize,
}

impl LightH1 {
    /// `in_flight` is shared by the clients of both identities, so at most
    /// `max` HTTP/1.1 requests are in flight in all, hence at most `max`
    /// busy connections to any apiserver. Idle ones are kept up to `max`
    /// per apiserver and identity, for [`IDLE`]; hyper may finish a
    /// connection it began while an idle one came free, into that idle set.
    pub(crate) fn new(config: Connect, in_flight: Arc<AtomicUsize>, max: usize) -> LightH1 {
        let mut builder = client_builder(&config);
        builder.pool_max_idle_per_host(max).pool_idle_timeout(IDLE);
        LightH1 {
            client: Arc::new(builder.build(connector(config, false))),
            in_flight,
            max,
        }
    }

    /// The client and a slot counting this request, or `None` at the cap.
    pub(crate) fn acquire(&self) -> Option<(Arc<HttpClient>, StreamSlot)> {
        let taken = self
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max).then_some(n + 1)
            });
        match taken {
            Ok(_) => Some((
                self.client.clone(),
                StreamSlot::counted(self.in_flight.clone()),
            )),
            Err(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_in_flight_and_a_slot_frees_on_drop() {
        crate::install_crypto_provider();
        let connect = Connect {
            tls: crate::tls::client_config(None, None).expect("tls"),
            timeout: Duration::from_secs(1),
            ping: (Duration::from_secs(30), Duration::from_secs(20)),
            read_pace: None,
        };
        let shared = Arc::new(AtomicUsize::new(0));
        let a = LightH1::new(connect.clone(), shared.clone(), 2);
        let b = LightH1::new(connect, shared.clone(), 2);
        let first = a.acquire().expect("one");
        let _second = b.acquire().expect("two, the other identity");
        assert!(a.acquire().is_none(), "the cap is shared");
        assert!(b.acquire().is_none());
        drop(first);
        assert_eq!(shared.load(Ordering::Relaxed), 1);
        assert!(a.acquire().is_some(), "a slot came free");
    }
}
