//! The `hostwire` binary.

use clap::{Parser, Subcommand};
use hostwire::{check, server};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "hostwire",
    version,
    about = "Server and tools for host ↔ guest wire protocols"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server: the Memizy relay (protocol 1) on HTTP + WebSocket,
    /// with rooms stored in an embedded SQLite database.
    ///
    /// Every option can also be set by the environment variable shown.
    Serve(server::ServeArgs),
    /// Check a Memizy plugin file: its manifest, the content policy a host
    /// would apply, and (with --set) whether it can play a set.
    ///
    /// Exit status: 0 valid, 1 invalid, 2 unreadable input.
    Check(check::CheckArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check(args) => check::run(&args),
        Command::Serve(args) => match server::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(1)
            }
        },
    }
}
