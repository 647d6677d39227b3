//! stub
use crate::cli::{MigrateArgs, ReplayArgs};
use fleet_budget::Config;
pub(crate) async fn replay(_c: &Config, _a: &ReplayArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
pub(crate) async fn dlq_stats(_c: &Config, _j: bool) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
pub(crate) async fn migrate(_c: &Config, _a: &MigrateArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
