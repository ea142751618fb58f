//! The `hostwire` binary.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod check;

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
    }
}
