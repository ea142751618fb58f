//! The memory tests, a binary of their own: they count the bytes in use
//! with a global allocator, which sees every thread of the process, so
//! tests running beside them in one binary would distort their figures.
//! Within this binary they run one at a time (see `counting::alone`).

#[path = "../support/mod.rs"]
mod support;

mod counting;
mod relay_durable_memory;
mod session_memory;
mod ws_memory;

#[global_allocator]
static A: counting::Counting = counting::Counting;
