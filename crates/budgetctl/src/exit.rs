//! Exit codes and the error that means "the command line or configuration is wrong".

use std::fmt;

/// A runtime failure: a service unreachable, a broker error.
pub(crate) const FAILURE: u8 = 1;
/// A usage or configuration error.
pub(crate) const USAGE: u8 = 2;

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
