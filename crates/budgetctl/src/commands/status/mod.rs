//! `budgetctl status`: live per-dependency budget state, read from Redis.
//!
//! [`args`] parses, [`collect`](mod@collect) reads the library's read model
//! (`fleet_budget::view`: every figure and alert computed there) into the `--json` shape of
//! [`view`], [`render`](mod@render) draws it for people (with the [`breaker`] line),
//! [`trend`] keeps `--watch`'s sparkline; this file runs the loop.

mod args;
mod breaker;
mod collect;
mod render;
mod trend;
mod view;

use std::io::{IsTerminal, Write};
use std::time::Duration;

use fleet_budget::{Config, Dependency};

pub(crate) use self::args::StatusArgs;
use self::collect::collect;
use self::render::render;
use self::trend::Trend;
use crate::exit::usage;
use crate::output::print_json;
use crate::redis_conn;

/// The version of this command's `--json` shape (`docs/schemas/status.schema.json`).
const JSON_SCHEMA_VERSION: u32 = 1;

/// Runs the command.
pub(crate) async fn run(config: &Config, args: &StatusArgs) -> anyhow::Result<()> {
    let only = match &args.dependency {
        Some(d) => Some(
            Dependency::new(d)
                .map_err(|e| usage(format!("--dependency {d:?}: a dependency name {e}")))?,
        ),
        None => None,
    };
    let store = redis_conn::connect(config, redis_conn::cli_timeout(config)).await?;
    let mut first = true;
    let mut trend = Trend::default();
    loop {
        let report = collect(config, &store, only.as_ref()).await?;
        if args.json {
            print_json(JSON_SCHEMA_VERSION, &report)?;
            return report.failure();
        }
        let mut text = render(&report);
        if args.watch {
            trend.record(&report.dependencies);
            text.push_str(&trend.render());
        }
        let mut out = std::io::stdout().lock();
        if args.watch && std::io::stdout().is_terminal() {
            // Clear the screen and redraw in place.
            write!(out, "\x1b[2J\x1b[H")?;
        } else if args.watch && !first {
            writeln!(out)?;
        }
        write!(out, "{text}")?;
        out.flush()?;
        drop(out);
        first = false;
        if !args.watch {
            return report.failure();
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}
