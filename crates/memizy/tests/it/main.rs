//! hostwire-memizy's integration tests, one binary: each module is one
//! part of the protocol, the hosted session's ones in `session`.

mod calls;
mod display_order;
mod manifest;
mod session;
mod support;
