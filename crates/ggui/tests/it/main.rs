//! hostwire-ggui's integration tests, one binary (the memory test
//! `pending_memory` is a binary of its own: its global allocator counts
//! every thread of the process).

mod channel;
mod durable;
mod golden;
mod properties;
