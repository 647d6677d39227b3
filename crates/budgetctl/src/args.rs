//! Argument parsers and argument groups that several commands share.

use std::ops::RangeInclusive;

use clap::Args;

/// Parses a flag's number, which must be finite and in `range`; `must_be` completes the
/// message "`<value>` must be ..." otherwise.
pub(crate) fn number_in(s: &str, range: RangeInclusive<f64>, must_be: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if v.is_finite() && range.contains(&v) {
        Ok(v)
    } else {
        Err(format!("`{s}` must be {must_be}"))
    }
}

/// A lone `--json`.
#[derive(Debug, Args)]
pub(crate) struct JsonArg {
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}
