//! hostwire-bench: the relay load generator, the bare forwarder and the
//! benchmark report, as a library for the binary and the smoke test.

pub mod floor;
pub mod forwarder;
pub mod load;
pub mod procstat;
pub mod report;
pub mod report_ggui;
