//! The server's blocking work. Every closure the server gives tokio's
//! blocking pool runs in a store blocking section
//! ([`hostwire_store::blocking_section`]): a PostgreSQL store call in it
//! then runs on the pool's thread, not on a thread started for each call
//! (measured in docs/BENCHMARKS.md, "A PostgreSQL call without a thread of
//! its own"). `crates/server/clippy.toml` refuses `tokio::task::spawn_blocking` anywhere
//! else.

use tokio::task::JoinHandle;

/// `tokio::task::spawn_blocking`, with `f` in a store blocking section.
pub fn spawn<F, R>(f: F) -> JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    #[allow(clippy::disallowed_methods)] // the one place it is called
    tokio::task::spawn_blocking(move || hostwire_store::blocking_section(f))
}
