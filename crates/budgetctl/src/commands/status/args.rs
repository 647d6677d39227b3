//! `status`'s arguments.

use clap::Args;

/// `status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Only this dependency.
    #[arg(long)]
    pub(super) dependency: Option<String>,
    /// Print one JSON object on stdout.
    #[arg(long, conflicts_with = "watch")]
    pub(super) json: bool,
    /// Redraw every second until interrupted.
    #[arg(long)]
    pub(super) watch: bool,
}
