//! hostwire-bench: a load generator for any relay protocol 1 server, the
//! bare forwarder it is compared with, and the benchmark report.
//!
//! Linux only: it reads CPU and memory from `/proc`, pins threads, and its
//! floor and forwarder use epoll and io_uring. Elsewhere it builds (so
//! `cargo test --workspace` passes on macOS) and says so when run.

#[cfg(target_os = "linux")]
mod cli;

#[cfg(target_os = "linux")]
fn main() -> anyhow::Result<()> {
    cli::main()
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("hostwire-bench runs on Linux only (it uses /proc, epoll and io_uring)");
    std::process::exit(2);
}
