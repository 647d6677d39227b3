//! stub
pub(crate) fn run(_a: &crate::cli::ConfigCheckArgs) -> anyhow::Result<()> { anyhow::bail!("not yet") }
