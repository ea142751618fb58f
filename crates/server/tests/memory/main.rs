//! The memory tests, a binary of their own: they count the bytes in use
//! with a global allocator, which sees every thread of the process, so
//! tests running beside them in one binary would distort their figures.
//! Within this binary they run one at a time (see `counting::alone`).
//! The log test runs here too, alone for another reason: `tracing` caches
//! per call site whether anyone listens, and a test elsewhere in the
//! process hitting a call site without a subscriber can make this one's
//! subscriber miss a line.

#[path = "../support/mod.rs"]
mod support;

mod big_frames;
mod counting;
mod idle_sockets;
mod logs;
mod relay_durable_memory;
mod session_memory;
mod ws_memory;

#[global_allocator]
static A: counting::Counting = counting::Counting;
