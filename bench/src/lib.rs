//! hostwire-bench: the relay load generator, the bare forwarder and the
//! benchmark report, as a library for the binary and the smoke test.
//! Linux only (`/proc`, epoll, io_uring): empty elsewhere.
#![cfg(target_os = "linux")]

pub mod churn;
pub mod failover;
pub mod floor;
pub mod forwarder;
pub mod load;
pub mod p3match;
pub mod procstat;
pub mod report;
pub mod report_churn;
pub mod report_cluster;
pub mod report_delta;
pub mod report_ggui;
pub mod report_match;
pub mod report_reference;
pub mod report_sessions;
pub mod results;
pub mod sessions;
