//! What is wrong with a configuration: the error, and each invalid value as a [`Problem`].
//!
//! Other crates that own a section of the same file (the `[amqp]` section of
//! `fleet-budget-amqp`) build their problems with [`Problem::new`] and report them together with
//! the core's in one [`ConfigError::invalid`].

use std::fmt;

use thiserror::Error;

/// A configuration that cannot be used.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read configuration file {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The text is not TOML, has unknown keys or values of the wrong type.
    #[error("{origin}: {message}")]
    Parse {
        /// The file.
        origin: String,
        /// The parser's message (it names the line, the key, and the known keys).
        message: String,
    },
    /// Values out of range or contradicting each other.
    #[error("{origin}: invalid configuration:\n{}", ProblemList(problems))]
    Invalid {
        /// The file.
        origin: String,
        /// Each problem.
        problems: Vec<Problem>,
    },
}

impl ConfigError {
    /// Invalid values of the configuration read from `origin` (a path, or `<inline>`).
    #[must_use]
    pub fn invalid(origin: &str, problems: Vec<Problem>) -> Self {
        Self::Invalid {
            origin: origin.to_owned(),
            problems,
        }
    }

    /// The problems, when the error is about values.
    #[must_use]
    pub fn problems(&self) -> &[Problem] {
        match self {
            Self::Invalid { problems, .. } => problems,
            _ => &[],
        }
    }

    /// The problems when the error is about values; any other error as it is.
    ///
    /// # Errors
    /// The error itself when it is not about values (the file cannot be read or parsed).
    pub fn into_problems(self) -> Result<Vec<Problem>, Self> {
        match self {
            Self::Invalid { problems, .. } => Ok(problems),
            other => Err(other),
        }
    }
}

/// One invalid value: the key, the value found, and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted key, e.g. `dependencies.mail.ratio`.
    pub key: String,
    /// The value found, as written (URLs with their password redacted).
    pub value: String,
    /// What is allowed.
    pub allowed: String,
}

impl Problem {
    /// The value `value` of `key` is not allowed; `expected` says what is.
    #[must_use]
    pub fn new(key: &str, value: impl fmt::Display, expected: impl Into<String>) -> Self {
        Self {
            key: key.to_owned(),
            value: value.to_string(),
            allowed: expected.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {}: {}", self.key, self.value, self.allowed)
    }
}

struct ProblemList<'a>(&'a [Problem]);

impl fmt::Display for ProblemList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "  - {p}")?;
        }
        Ok(())
    }
}
