//! hostwire-worker-rpc's integration tests, one binary (the memory test
//! `memory` is a binary of its own: its global allocator counts every
//! thread of the process).

mod every_call_ends;
mod frames;
mod hostile;
mod interleavings;
mod js_peer;
mod peer;
mod state;
mod transports;
