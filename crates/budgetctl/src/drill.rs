//! stub
use fleet_budget::Config;
pub(crate) async fn demo_command(_c: &Config, _g: &crate::cli::GlobalArgs, _a: &crate::cli::DemoArgs) -> anyhow::Result<()> { anyhow::bail!("not yet") }
