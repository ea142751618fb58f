//! Placeholder replaced below.
use clap::Args;
#[derive(Args, Clone)]
pub struct ReportArgs {}
pub fn run(_: &ReportArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
