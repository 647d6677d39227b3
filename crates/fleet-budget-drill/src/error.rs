//! Why a drill or a scenario failed: the machinery (Redis, RabbitMQ, a configuration the drill
//! builds), never a figure of the drill — a denied retry or a dead letter is what it measures.

use fleet_budget::redact::{redact_text, redact_url};

/// A drill or scenario that could not run to its end.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DrillError {
    /// A run failed on the broker: `run` names it (`the drill`, `scenario slow`), `url` is the
    /// broker's (password redacted), `detail` the failure with its causes (secrets redacted).
    #[error("{run} on RabbitMQ at {url} failed: {detail}")]
    Broker {
        /// The run that failed.
        run: String,
        /// The broker's URL, password redacted.
        url: String,
        /// What failed, with its causes, secrets redacted.
        detail: String,
    },
    /// A scenario was asked for without the services it runs on.
    #[error(
        "the scenarios run on Redis and RabbitMQ (the concurrency budget and the breaker keep their state in Redis): {notes}"
    )]
    ServicesMissing {
        /// Why each service was not used.
        notes: String,
    },
    /// The budget of a run could not be built or reached.
    #[error(transparent)]
    Budget(#[from] fleet_budget::Error),
    /// A name the drill configures was refused.
    #[error(transparent)]
    Name(#[from] fleet_budget::InvalidName),
    /// The concurrency policy of `--scenario slow` was refused.
    #[error(transparent)]
    Concurrency(#[from] fleet_budget::concurrency::ConcurrencyPolicyError),
    /// The breaker policy of `--scenario down` was refused.
    #[error(transparent)]
    Breaker(#[from] fleet_budget::breaker::BreakerPolicyError),
    /// A broker step failed.
    #[error(transparent)]
    Amqp(#[from] fleet_budget_amqp::AmqpError),
    /// A job was not known to be published.
    #[error(transparent)]
    Publish(#[from] fleet_budget_amqp::PublishError),
    /// A channel could not be opened on a connection that was open.
    #[error(transparent)]
    Channel(#[from] lapin::Error),
    /// A replay or purge of the run could not be audited (Redis failed): nothing is moved that
    /// the trail would not account for.
    #[error("the drill's audit trail could not be written: {0}")]
    Audit(fleet_budget::StoreError),
}

impl DrillError {
    /// `e`, failed in `run` on the broker at `url`: named as such, with its causes, secrets
    /// redacted.
    pub(crate) fn on_broker(run: &str, url: &str, e: &Self) -> Self {
        Self::Broker {
            run: run.to_owned(),
            url: redact_url(url),
            detail: redact_text(&chain(e)),
        }
    }
}

/// `e` and its causes, `: `-separated.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
