//! The `hostwire` binary.

/// jemalloc, not the system allocator: measured cheaper per relay frame and
/// per routed call, and smaller per idle connection (docs/BENCHMARKS.md).
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    hostwire::cli::main()
}
