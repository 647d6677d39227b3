//! Log lines carry colour codes only on a terminal, and never when `NO_COLOR` is set: a pipe or
//! a log file gets plain text. The terminal is a pseudo-terminal made by util-linux `script`;
//! the command is `migrate --dry-run` against a broker that refuses, which logs lapin's
//! `create channel` at `RUST_LOG=debug,lapin=debug` (lapin's log stays off unless `RUST_LOG`
//! names it) and exits by itself.

use std::process::Command;

use crate::{budgetctl, stderr};

const ESC: char = '\u{1b}';

/// Debug everywhere, lapin named so that its `create channel` line is written.
const LOG: &str = "debug,lapin=debug";

/// The command's stderr (with stdout) as a terminal shows it, `NO_COLOR` set or not.
fn on_a_terminal(no_color: Option<&str>) -> String {
    let mut c = Command::new("script");
    c.args([
        "-qec",
        r#""$FB_BUDGETCTL" --amqp-url amqp://127.0.0.1:1 migrate --dry-run"#,
        "/dev/null",
    ])
    .env("FB_BUDGETCTL", env!("CARGO_BIN_EXE_budgetctl"))
    .env("RUST_LOG", LOG)
    .env_remove("FLEET_BUDGET_AMQP_URL")
    .env_remove("NO_COLOR");
    if let Some(v) = no_color {
        c.env("NO_COLOR", v);
    }
    let o = c.output().expect("run script(1) from util-linux");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn logs_are_coloured_only_on_a_terminal_and_never_with_no_color() {
    let piped = budgetctl()
        .args(["--amqp-url", "amqp://127.0.0.1:1", "migrate", "--dry-run"])
        .env("RUST_LOG", LOG)
        .env_remove("NO_COLOR")
        .output()
        .expect("run budgetctl");
    let text = stderr(&piped);
    assert!(text.contains("DEBUG"), "a log line is written:\n{text}");
    assert!(!text.contains(ESC), "colour codes in a pipe:\n{text:?}");

    // The terminal does get colour (so the next check can fail)...
    let text = on_a_terminal(None);
    assert!(text.contains("DEBUG"), "a log line is written:\n{text}");
    assert!(text.contains(ESC), "no colour on a terminal:\n{text:?}");
    // ... and NO_COLOR turns it off there; set but empty, it does not (no-color.org).
    let text = on_a_terminal(Some("1"));
    assert!(text.contains("DEBUG"), "a log line is written:\n{text}");
    assert!(
        !text.contains(ESC),
        "colour codes with NO_COLOR=1:\n{text:?}"
    );
    let text = on_a_terminal(Some(""));
    assert!(text.contains(ESC), "NO_COLOR empty keeps colour:\n{text:?}");
}
