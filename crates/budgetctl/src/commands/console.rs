//! `budgetctl console`: starts the incident console (`fleet-budget-console`) and serves until
//! interrupted. The CLI only reads the tokens and the flags; the console is the library's.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_console::{ConsoleSettings, Token, Viewers};

use crate::exit::usage;

/// `console`.
#[derive(Debug, Args)]
pub(crate) struct ConsoleArgs {
    /// Where to listen. Anything but a loopback address exposes the console: put it behind TLS.
    #[arg(long, default_value = "127.0.0.1:8089", value_name = "ADDR")]
    bind: SocketAddr,
    /// A file of operator tokens (they may change things), one a line: `TOKEN` or
    /// `LABEL:TOKEN`; the label is what the audit trail records.
    #[arg(long, value_name = "FILE")]
    operator_token_file: Option<PathBuf>,
    /// Operator tokens themselves, in the same form (one a line); read only from the
    /// environment, never printed.
    #[arg(
        long = "operator-token-env",
        hide = true,
        env = "FLEET_BUDGET_CONSOLE_OPERATOR_TOKEN",
        hide_env_values = true
    )]
    operator_token_env: Option<String>,
    /// A file of viewer tokens (they only read), in the same form.
    #[arg(long, value_name = "FILE", conflicts_with = "no_viewer_token")]
    viewer_token_file: Option<PathBuf>,
    /// Viewer tokens themselves; read only from the environment, never printed.
    #[arg(
        long = "viewer-token-env",
        hide = true,
        env = "FLEET_BUDGET_CONSOLE_VIEWER_TOKEN",
        hide_env_values = true
    )]
    viewer_token_env: Option<String>,
    /// Anyone who reaches the console may read (changes still need an operator token).
    #[arg(long)]
    no_viewer_token: bool,
    /// Messages of each queue read per refresh of the dead-letter sample.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    dlq_sample: u64,
    /// Seconds between refreshes of the dead-letter sample.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    dlq_refresh_secs: u64,
    /// Actions (overrides, replays, purges) accepted per minute, all operators together.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    actions_per_minute: u32,
}

/// Tokens from a file or the environment (the file wins).
fn tokens(
    file: Option<&PathBuf>,
    env: Option<&String>,
    label: &str,
    env_name: &str,
) -> anyhow::Result<Option<Vec<Token>>> {
    let (text, origin) = match (file, env) {
        (Some(path), _) => (
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the token file {}", path.display()))
                .map_err(|e| usage(format!("{e:#}")))?,
            path.display().to_string(),
        ),
        (None, Some(text)) => (text.clone(), env_name.to_owned()),
        (None, None) => return Ok(None),
    };
    Token::parse_list(&text, label, &origin)
        .map(Some)
        .map_err(|e| usage(e.to_string()))
}

/// Runs the command.
pub(crate) async fn run(config: &WorkerConfig, args: &ConsoleArgs) -> anyhow::Result<()> {
    let operators = tokens(
        args.operator_token_file.as_ref(),
        args.operator_token_env.as_ref(),
        "operator",
        "FLEET_BUDGET_CONSOLE_OPERATOR_TOKEN",
    )?
    .ok_or_else(|| {
        usage(
            "the console needs an operator token: --operator-token-file FILE or \
             FLEET_BUDGET_CONSOLE_OPERATOR_TOKEN",
        )
    })?;
    let viewers = if args.no_viewer_token {
        Viewers::Open
    } else {
        let list = tokens(
            args.viewer_token_file.as_ref(),
            args.viewer_token_env.as_ref(),
            "viewer",
            "FLEET_BUDGET_CONSOLE_VIEWER_TOKEN",
        )?;
        Viewers::Tokens(list.unwrap_or_default())
    };
    let mut settings = ConsoleSettings::new(config.clone(), operators, viewers);
    settings.bind = args.bind;
    settings.dead_letter_sample = args.dlq_sample;
    settings.dead_letter_refresh = Duration::from_secs(args.dlq_refresh_secs);
    settings.actions_per_minute = args.actions_per_minute;
    if !args.bind.ip().is_loopback() {
        eprintln!(
            "warning: the console listens on {}, beyond this host: serve it behind TLS (tokens travel in a form and a cookie)",
            args.bind
        );
    }
    let console = fleet_budget_console::start(settings).await?;
    eprintln!(
        "console on http://{} (log in with a token; tokens are never printed). Ctrl-C stops it.",
        console.addr()
    );
    tokio::select! {
        r = console.wait() => r?,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
