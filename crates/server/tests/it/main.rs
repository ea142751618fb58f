//! The server's integration tests, one binary: each module is one
//! protocol's or one concern's tests, all on the shared [`support`].

#[path = "../support/mod.rs"]
mod support;

mod backup;
mod body_budget;
mod check;
mod cluster;
mod credential_attack;
mod failover;
mod failover_units;
mod front_door;
mod ggui;
mod limits;
mod playerthree;
mod postgres;
mod relay;
mod serve_cli;
mod session;
mod store_fairness;
mod tunnels;
mod ws_foundation;
