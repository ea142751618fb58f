//! The `hostwire` binary.

fn main() -> std::process::ExitCode {
    hostwire::cli::main()
}
