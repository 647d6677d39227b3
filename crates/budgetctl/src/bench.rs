//! stub
use fleet_budget::Config;
pub(crate) async fn run(_c: &Config, _a: &crate::cli::BenchArgs) -> anyhow::Result<()> { anyhow::bail!("not yet") }
