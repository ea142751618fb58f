//! Every open socket of one server in one registry, so that a shutdown
//! closes each with 1001 and waits for them, and one sweep a second for
//! the whole registry finds the silent sockets and pings the others: no
//! timer per connection, and no clock read per frame (a frame sets its
//! socket's flag; the sweep reads and clears it).

use super::config::{Config, IDLE, SHUTTING_DOWN};
use super::writer::{Outbound, Parked};
use crate::outbound;
use slab::Slab;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::time::Instant;
use tungstenite::Utf8Bytes;

/// How often the registry looks at its sockets: an idle timeout closes a
/// socket between its length and its length plus two of these after its
/// last frame, and pings leave within one of their interval.
pub const SWEEP_TICK: Duration = Duration::from_secs(1);

/// Every open socket of one server, so that shutdown closes each with
/// 1001 and waits for them (attached to a room, session or match or not).
#[derive(Clone, Default)]
pub struct Sockets(Arc<SocketsInner>);

pub(super) struct SocketsInner {
    /// A slab, not a map: a socket's key is its slot, reused once it
    /// ends (a key is let go only by its own socket's `deregister`, while
    /// that socket's queue is alive, or by the sweep once the queue is
    /// gone), so an entry costs its 24 bytes and no key or hash.
    pub(super) live: Mutex<Slab<Entry>>,
    pub(super) closing: AtomicBool,
    pub(super) gone: tokio::sync::Notify,
    /// The sweep's task runs (only while some socket is open).
    sweeping: AtomicBool,
    /// Socket times are milliseconds since this.
    epoch: Instant,
}

impl Default for SocketsInner {
    fn default() -> Self {
        SocketsInner {
            live: Mutex::default(),
            closing: AtomicBool::new(false),
            gone: tokio::sync::Notify::new(),
            sweeping: AtomicBool::new(false),
            epoch: Instant::now(),
        }
    }
}

/// One socket in the registry: what the sweep needs, in milliseconds
/// since the registry's epoch. Its idle timeout and ping interval are its
/// socket's [`Config`]'s, read through the closer: held once per
/// endpoint, not per socket.
pub(super) struct Entry {
    closer: outbound::Closer<Utf8Bytes, Parked>,
    /// The registration, or the last sweep that found a frame since the
    /// one before: never before the frame, so a close is never early.
    heard: u64,
    next_ping: u64,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A socket's ping interval in milliseconds (at least one).
fn ping_ms(config: &Config) -> u64 {
    ms(config.ping_interval).max(1)
}

impl SocketsInner {
    fn now(&self) -> u64 {
        ms(Instant::now().saturating_duration_since(self.epoch))
    }

    /// Closes the sockets silent for their idle timeout, pings those due,
    /// and forgets those whose connection is gone without saying so (its
    /// task dropped before it could deregister). `false` once no socket is
    /// open: the sweep's task then ends.
    fn sweep(&self) -> bool {
        let now = self.now();
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let before = live.len();
        live.retain(|_, e| {
            let Some((heard, idle, ping)) = e.closer.with_parked(|p| {
                let heard = p.active.swap(false, Relaxed);
                (heard, ms(p.config.idle_timeout), ping_ms(&p.config))
            }) else {
                return false;
            };
            if heard {
                e.heard = now;
            } else if now >= e.heard.saturating_add(idle) {
                e.closer.with_parked(|p| p.expired.store(true, Relaxed));
                // Wakes the reader, which finds the flag and ends.
                e.closer.close(IDLE);
                return true;
            } else {
                // Silent for a tick: its WebSocket state is let go until
                // the next frame (an idle socket holds no read buffer).
                e.closer.with_parked(|p| p.shed());
            }
            if now >= e.next_ping {
                e.next_ping = now.saturating_add(ping);
                e.closer.ping();
            }
            true
        });
        if !live.is_empty() {
            return true;
        }
        // Under the lock that `register` holds while it looks.
        self.sweeping.store(false, Relaxed);
        if before > 0 {
            self.gone.notify_waiters();
        }
        false
    }
}

/// Sweeps while some socket is open; lets its registry go between ticks.
async fn sweep(inner: Weak<SocketsInner>) {
    /// A task dropped with its runtime leaves the registry able to start
    /// another on the next runtime (the process-wide registry, in tests).
    struct Running(Weak<SocketsInner>);
    impl Drop for Running {
        fn drop(&mut self) {
            if let Some(i) = self.0.upgrade() {
                i.sweeping.store(false, Relaxed);
            }
        }
    }
    let _running = Running(inner.clone());
    let mut tick = tokio::time::interval(SWEEP_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match inner.upgrade() {
            Some(i) if i.sweep() => {}
            _ => return,
        }
    }
}

impl Sockets {
    pub(super) fn live(&self) -> std::sync::MutexGuard<'_, Slab<Entry>> {
        self.0.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The registry of sockets served outside a server's (a pipe before
    /// its node has one, a test's): swept like any, closed by no shutdown.
    pub(super) fn detached() -> Sockets {
        static DETACHED: OnceLock<Sockets> = OnceLock::new();
        DETACHED.get_or_init(Sockets::default).clone()
    }

    /// Registers the socket of `out`, timed by its queue's `Config`; the
    /// key is for [`Sockets::deregister`].
    pub(super) fn register(&self, out: &Outbound) -> usize {
        let now = self.0.now();
        let ping = ping_ms(&out.0.parked().config);
        let mut live = self.live();
        let id = live.insert(Entry {
            closer: out.0.closer(),
            heard: now,
            next_ping: now.saturating_add(ping),
        });
        if !self.0.sweeping.swap(true, Relaxed) {
            tokio::spawn(sweep(Arc::downgrade(&self.0)));
        }
        drop(live);
        // Checked after the insert: a shutdown that began meanwhile either
        // saw this socket or is seen here.
        if self.0.closing.load(Relaxed) {
            out.close(SHUTTING_DOWN);
        }
        id
    }

    /// Lets the socket's key go. Called while its queue is alive (the sweep
    /// forgets only sockets whose queue is gone), so the key is still its.
    pub(super) fn deregister(&self, id: usize) {
        let mut live = self.live();
        live.try_remove(id);
        let empty = live.is_empty();
        drop(live);
        if empty {
            self.0.gone.notify_waiters();
        }
    }

    /// How many sockets are open.
    pub fn len(&self) -> usize {
        self.live().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes every socket with 1001 (after what is queued for it), and
    /// every socket opened from now on.
    pub fn close_all(&self) {
        self.0.closing.store(true, Relaxed);
        for (_, e) in self.live().iter() {
            e.closer.close(SHUTTING_DOWN);
        }
    }

    /// Waits until every socket has ended.
    pub async fn ended(&self) {
        loop {
            let gone = self.0.gone.notified();
            tokio::pin!(gone);
            gone.as_mut().enable();
            if self.is_empty() {
                return;
            }
            gone.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ws::{Config, Outbound};
    use std::sync::atomic::AtomicBool;
    use std::sync::Mutex;

    fn connection() -> (Outbound, outbound::Drain<Utf8Bytes, Parked>) {
        connection_with(Config::new(1024))
    }

    fn connection_with(config: Config) -> (Outbound, outbound::Drain<Utf8Bytes, Parked>) {
        let (out, drain) = outbound::queue(Parked {
            piped: false,
            socket: Mutex::new(None),
            config: Arc::new(config),
            active: AtomicBool::new(false),
            expired: AtomicBool::new(false),
        });
        (Outbound(out), drain)
    }

    /// A connection dropped without deregistering (its task dropped with
    /// its runtime, or aborted) is forgotten by the next sweep, and a
    /// shutdown waiting for every socket to end goes on.
    #[tokio::test(start_paused = true)]
    async fn a_connection_gone_without_deregistering_is_forgotten_by_the_sweep() {
        let sockets = Sockets::default();
        let (out, drain) = connection();
        sockets.register(&out);
        let (kept, _kept_drain) = connection();
        let kept_id = sockets.register(&kept);
        drop((out, drain));
        assert_eq!(sockets.len(), 2);
        assert!(sockets.0.sweep());
        assert_eq!(sockets.len(), 1, "the gone connection is forgotten");
        sockets.deregister(kept_id);
        tokio::time::timeout(Duration::from_secs(1), sockets.ended())
            .await
            .expect("every socket ended");
    }

    /// A socket heard from stays past its idle timeout counted from its
    /// registration; one silent for it is closed and its reader told.
    #[tokio::test(start_paused = true)]
    async fn a_silent_socket_is_expired_and_an_active_one_kept() {
        let sockets = Sockets::default();
        let config = Config {
            idle_timeout: Duration::from_secs(10),
            ..Config::new(1024)
        };
        let (silent, _d1) = connection_with(config);
        let (active, _d2) = connection_with(config);
        sockets.register(&silent);
        sockets.register(&active);
        for _ in 0..12 {
            tokio::time::advance(Duration::from_secs(1)).await;
            active.0.parked().active.store(true, Relaxed);
            sockets.0.sweep();
        }
        assert!(silent.0.parked().expired.load(Relaxed));
        assert!(!active.0.parked().expired.load(Relaxed));
    }
}
