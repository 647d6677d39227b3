//! `budgetctl console`: starts the incident console (`fleet-budget-console`) and serves until
//! interrupted. The CLI only reads the tokens and the flags; the console is the library's.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_console::{ConsoleSettings, NetLimits, Prometheus, PublicUrl, Token, Viewers};

use crate::exit::usage;

/// The variable operator tokens are read from unless `--operator-token-var` names another.
const OPERATOR_VAR: &str = "FLEET_BUDGET_CONSOLE_OPERATOR_TOKEN";
/// The variable viewer tokens are read from unless `--viewer-token-var` names another.
const VIEWER_VAR: &str = "FLEET_BUDGET_CONSOLE_VIEWER_TOKEN";

/// `console`.
#[derive(Debug, Args)]
pub(crate) struct ConsoleArgs {
    /// Where to listen. Anything but a loopback address exposes the console: put it behind TLS.
    #[arg(long, default_value = "127.0.0.1:8089", value_name = "ADDR")]
    bind: SocketAddr,
    /// The address browsers use, when not the bind address (`https://console.example.com`
    /// behind a TLS proxy): its host is answered beside the bind address's (other `Host`
    /// headers are refused), and `https://` marks the cookies `Secure`.
    #[arg(long, value_name = "URL")]
    public_url: Option<String>,
    /// A proxy in front of the console (repeatable): from it, the client is the last address
    /// of `X-Forwarded-For`, for the login and connection limits.
    #[arg(long = "trusted-proxy", value_name = "IP")]
    trusted_proxies: Vec<IpAddr>,
    /// A file of operator tokens (they may change things), one a line: `TOKEN` or
    /// `LABEL:TOKEN`; the label is what the audit trail records.
    #[arg(long, value_name = "FILE")]
    operator_token_file: Option<PathBuf>,
    /// The NAME of the environment variable holding operator tokens (same form as the file);
    /// default FLEET_BUDGET_CONSOLE_OPERATOR_TOKEN. Never the tokens themselves: the command
    /// line is visible to every user of the host (`ps`).
    #[arg(long, value_name = "NAME")]
    operator_token_var: Option<String>,
    /// Refused: a token given here would be in the command line, where `ps` shows it.
    #[arg(long = "operator-token-env", hide = true, value_name = "NEVER")]
    operator_token_on_command_line: Option<String>,
    /// A file of viewer tokens (they only read), in the same form.
    #[arg(long, value_name = "FILE", conflicts_with = "no_viewer_token")]
    viewer_token_file: Option<PathBuf>,
    /// The NAME of the environment variable holding viewer tokens; default
    /// FLEET_BUDGET_CONSOLE_VIEWER_TOKEN.
    #[arg(long, value_name = "NAME", conflicts_with = "no_viewer_token")]
    viewer_token_var: Option<String>,
    /// Refused: a token given here would be in the command line, where `ps` shows it.
    #[arg(long = "viewer-token-env", hide = true, value_name = "NEVER")]
    viewer_token_on_command_line: Option<String>,
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
    /// Seconds a request's head may take to arrive (and a keep-alive connection may idle);
    /// then the connection is closed.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    header_timeout_secs: u64,
    /// Seconds a request's body may take to arrive after its head; then 408.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    body_timeout_secs: u64,
    /// Connections open at once (keep it under the open-file limit, `ulimit -n`); when full, a
    /// new one closes the one that has waited longest for a request.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    max_connections: u64,
    /// Connections open at once from one client address (IPv6: one /64).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    max_connections_per_address: u64,
    /// Prometheus's HTTP API (`http://[user:password@]host[:port][/path]`): the overview's
    /// sparklines from the counters the workers export, instead of the console's own readings
    /// (which it falls back to, saying so, while Prometheus fails).
    #[arg(long, value_name = "URL")]
    prometheus_url: Option<String>,
    /// Seconds between the points of the sparklines read from Prometheus (each counts over
    /// its step).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    prometheus_step_secs: u64,
}

/// Tokens from a file, or from the environment variable `var` (the file wins).
fn tokens(
    file: Option<&PathBuf>,
    var: &str,
    var_named: bool,
    label: &str,
) -> anyhow::Result<Option<Vec<Token>>> {
    let (text, origin) = match file {
        Some(path) => (
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the token file {}", path.display()))
                .map_err(|e| usage(format!("{e:#}")))?,
            path.display().to_string(),
        ),
        None => match std::env::var(var) {
            Ok(text) => (text, var.to_owned()),
            // Not named back: a token typed where a name belongs would be printed.
            Err(_) if var_named => {
                return Err(usage(format!(
                    "the variable named by --{label}-token-var is not set (or not UTF-8)"
                )));
            }
            Err(_) => return Ok(None),
        },
    };
    Token::parse_list(&text, label, &origin)
        .map(Some)
        .map_err(|e| usage(e.to_string()))
}

/// The soft limit on open files of this process (Linux: `/proc/self/limits`), when readable.
fn open_file_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// A variable's name as given, refused (without printing it) unless it looks like one.
fn var_name<'a>(
    given: Option<&'a String>,
    default: &'a str,
    flag: &str,
) -> anyhow::Result<&'a str> {
    let Some(name) = given else {
        return Ok(default);
    };
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(name)
    } else {
        Err(usage(format!(
            "--{flag} takes the NAME of an environment variable (letters, digits, _), not a token"
        )))
    }
}

/// Runs the command.
pub(crate) async fn run(config: &WorkerConfig, args: &ConsoleArgs) -> anyhow::Result<()> {
    for (given, flag) in [
        (&args.operator_token_on_command_line, "operator"),
        (&args.viewer_token_on_command_line, "viewer"),
    ] {
        if given.is_some() {
            // The value is not printed: it is a token.
            return Err(usage(format!(
                "--{flag}-token-env is refused: a token on the command line is visible to every \
                 user of the host (ps). Put the tokens in a file (--{flag}-token-file) or in an \
                 environment variable (default {}; --{flag}-token-var NAME names another)",
                if flag == "operator" {
                    OPERATOR_VAR
                } else {
                    VIEWER_VAR
                }
            )));
        }
    }
    let operator_var = var_name(
        args.operator_token_var.as_ref(),
        OPERATOR_VAR,
        "operator-token-var",
    )?;
    let operators = tokens(
        args.operator_token_file.as_ref(),
        operator_var,
        args.operator_token_var.is_some(),
        "operator",
    )?
    .ok_or_else(|| {
        usage(format!(
            "the console needs an operator token: --operator-token-file FILE or {OPERATOR_VAR}"
        ))
    })?;
    let viewers = if args.no_viewer_token {
        Viewers::Open
    } else {
        let viewer_var = var_name(
            args.viewer_token_var.as_ref(),
            VIEWER_VAR,
            "viewer-token-var",
        )?;
        let list = tokens(
            args.viewer_token_file.as_ref(),
            viewer_var,
            args.viewer_token_var.is_some(),
            "viewer",
        )?;
        Viewers::Tokens(list.unwrap_or_default())
    };
    let public_url = args
        .public_url
        .as_deref()
        .map(PublicUrl::parse)
        .transpose()
        .map_err(|e| usage(e.to_string()))?;
    let mut settings = ConsoleSettings::new(config.clone(), operators, viewers);
    settings.bind = args.bind;
    settings.dead_letter_sample = args.dlq_sample;
    settings.dead_letter_refresh = Duration::from_secs(args.dlq_refresh_secs);
    settings.actions_per_minute = args.actions_per_minute;
    settings.trusted_proxies.clone_from(&args.trusted_proxies);
    settings.limits = NetLimits {
        header_timeout: Duration::from_secs(args.header_timeout_secs),
        body_timeout: Duration::from_secs(args.body_timeout_secs),
        max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
        max_connections_per_address: usize::try_from(args.max_connections_per_address)
            .unwrap_or(usize::MAX),
        ..NetLimits::default()
    };
    if let Some(files) = open_file_limit()
        && args.max_connections.saturating_add(64) > files
    {
        eprintln!(
            "warning: --max-connections {} is near the open-file limit ({files}, ulimit -n): \
             past it connections wait unanswered; lower it or raise the limit",
            args.max_connections
        );
    }
    settings.prometheus = args
        .prometheus_url
        .as_deref()
        .map(|url| Prometheus::parse(url, settings.upstream_timeout))
        .transpose()
        .map_err(|e| usage(format!("--prometheus-url {e}")))?;
    settings.prometheus_step = Duration::from_secs(args.prometheus_step_secs);
    let behind_tls = public_url.as_ref().is_some_and(PublicUrl::https);
    settings.public_url = public_url;
    if !args.bind.ip().is_loopback() && !behind_tls {
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
