//! Exit codes and the error that means "the command line or configuration is wrong".

use std::fmt;

/// A runtime failure: a service unreachable, a broker error.
pub(crate) const FAILURE: u8 = 1;
/// A usage or configuration error.
pub(crate) const USAGE: u8 = 2;
/// `doctor`: a check found a risk.
pub(crate) const RISK: u8 = 3;
/// `doctor`: no check found a risk, and some could not check.
pub(crate) const NOT_CHECKED: u8 = 4;

/// A command that ran and printed its result, and whose result is an exit code of its own
/// ([`RISK`], [`NOT_CHECKED`]): `main` exits with it and prints nothing more.
#[derive(Debug)]
pub(crate) struct Verdict(pub(crate) u8);

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "exit {}", self.0)
    }
}

impl std::error::Error for Verdict {}

/// A usage or configuration error (exit code 2). The message names the flag or key at fault.
#[derive(Debug)]
pub(crate) struct UsageError(pub(crate) String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// A usage error as an `anyhow::Error`.
pub(crate) fn usage(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(message.into()))
}
