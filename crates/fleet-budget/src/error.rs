//! Errors of the budget machinery. A denied retry is a [`crate::Decision`], never an error.

use std::time::Duration;

use thiserror::Error;

use crate::dependency::InvalidName;

/// A failure of a budget store (Redis or local).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store did not answer within its deadline.
    #[error("budget store did not answer within {0:?}")]
    Timeout(Duration),
    /// Redis returned an error or the connection failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Redis answered with something the scripts never send.
    #[error("unexpected reply from the {script} script: {detail}")]
    BadReply {
        /// Which script.
        script: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// The dependency's key cannot be used: it is of another type, or a budget field was
    /// tampered with (not an integer). The scripts refuse it before any write; other
    /// dependencies are unaffected.
    #[error("budget key {key} cannot be used: {detail}")]
    BadKey {
        /// The key.
        key: String,
        /// What the script found (`is not a budget hash: WRONGTYPE ...`, `field cr is not an
        /// integer`).
        detail: String,
    },
}

impl StoreError {
    /// Whether the store ran out of time.
    #[must_use]
    pub fn is_timeout(&self) -> bool {
        match self {
            Self::Timeout(_) => true,
            Self::Redis(e) => e.is_timeout(),
            Self::BadReply { .. } | Self::BadKey { .. } => false,
        }
    }

    /// Why the TLS handshake with the store failed, when that is what happened (a plaintext
    /// server behind `rediss://`, an untrusted certificate, another host's certificate).
    #[must_use]
    pub fn tls_failure(&self) -> Option<crate::tls::TlsFailure> {
        match self {
            Self::Redis(e) => crate::tls::TlsFailure::of(e),
            Self::Timeout(_) | Self::BadReply { .. } | Self::BadKey { .. } => None,
        }
    }

    /// Whether the connection to the store is down or was refused.
    #[must_use]
    pub fn is_connection_error(&self) -> bool {
        match self {
            Self::Redis(e) => {
                e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
            }
            Self::Timeout(_) | Self::BadReply { .. } | Self::BadKey { .. } => false,
        }
    }

    /// Whether Redis refused a write because its memory is full (`OOM command not allowed
    /// when used memory > 'maxmemory'`: `maxmemory-policy noeviction`, or nothing left to
    /// evict). Scripts that write fail so, at their first write, having written nothing.
    #[must_use]
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            Self::Redis(e) => {
                e.code() == Some("OOM")
                    || e.detail()
                        .is_some_and(|d| d.contains("OOM command not allowed"))
                    || e.to_string().contains("OOM command not allowed")
            }
            Self::Timeout(_) | Self::BadReply { .. } | Self::BadKey { .. } => false,
        }
    }

    /// A short label for metrics: `timeout`, `connection`, `oom`, `server`, `bad_reply` or
    /// `bad_key`.
    #[must_use]
    pub fn kind_label(&self) -> &'static str {
        if self.is_timeout() {
            "timeout"
        } else if self.is_connection_error() {
            "connection"
        } else if self.is_out_of_memory() {
            "oom"
        } else if matches!(self, Self::BadReply { .. }) {
            "bad_reply"
        } else if matches!(self, Self::BadKey { .. }) {
            "bad_key"
        } else {
            "server"
        }
    }
}

/// Errors of the worker-facing API.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// A task name that is not mapped and cannot be its own dependency.
    #[error("task {task:?} has no dependency mapping and its name {source}")]
    InvalidTask {
        /// The task.
        task: String,
        /// What is wrong with the name.
        source: InvalidName,
    },
    /// A task name that is not mapped, while unmapped tasks are refused
    /// (`[unmapped_tasks] policy = "reject"`).
    #[error(
        "task {task:?} has no dependency mapping, and unmapped tasks are rejected ([unmapped_tasks] policy = \"reject\")"
    )]
    UnmappedTask {
        /// The task.
        task: String,
    },
    /// A failure names a dependency ([`crate::Failure::in_dependency`], a fan-out branch) that
    /// no section configures, is to be its own dependency, and cannot be a dependency name.
    #[error("the failure names dependency {dependency:?}, whose name {source}")]
    InvalidDependency {
        /// The name the failure gave.
        dependency: String,
        /// What is wrong with the name.
        source: InvalidName,
    },
    /// A failure names a dependency that no section configures, while unmapped names are
    /// refused (`[unmapped_tasks] policy = "reject"`).
    #[error(
        "the failure names dependency {dependency:?}, which no [dependencies.*] section configures, and unmapped names are rejected ([unmapped_tasks] policy = \"reject\")"
    )]
    UnmappedDependency {
        /// The name the failure gave.
        dependency: String,
    },
    /// The store failed and the fallback is disabled.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}
