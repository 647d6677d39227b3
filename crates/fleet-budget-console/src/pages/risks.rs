//! The settings of Redis and RabbitMQ that take budgets or messages away without an error, as
//! a banner on every page: the checks workers log at start-up (`fleet_budget::risks`: an
//! eviction policy, no persistence) and the broker's topology behind the migrations (a new
//! fleet whose `budgetctl migrate` was never run has no dead-letter queue to read), with what
//! each costs and what to do, as `budgetctl doctor` says it.
//!
//! Why on every page: an operator opens the console during an incident, not the workers' logs
//! of their last start; a freeze that Redis may evict is worth knowing before applying one.
//! The checks are read in the background ([`read`], every few minutes), never by a page view.

use fleet_budget::risks::{Finding, read_redis_risks_with_client_rights};
use fleet_budget::store::RedisStore;
use fleet_budget_amqp::{Migrations, Object, StepState, WorkerConfig};
use maud::{Markup, html};

use super::t;

/// One risk found: which service and setting, what was read, what it costs, what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Risk {
    /// `Redis` or `RabbitMQ`.
    pub(crate) service: &'static str,
    /// The check's name (`maxmemory_policy`, `persistence`, `topology`).
    pub(crate) check: &'static str,
    /// What was read.
    pub(crate) found: String,
    /// What it costs the fleet.
    pub(crate) cost: String,
    /// What to do.
    pub(crate) action: String,
}

/// Reads the risks of the fleet's Redis (as workers do at start-up: nothing asked under an
/// ACL user) and of its broker's topology (a dry run of `budgetctl migrate`: passive declares
/// only). What cannot be read is not a risk here (`budgetctl doctor` says why).
pub(crate) async fn read(store: &RedisStore, config: &WorkerConfig) -> Vec<Risk> {
    let mut out = Vec::new();
    for r in read_redis_risks_with_client_rights(store).await {
        if let Finding::Risk {
            found,
            cost,
            action,
        } = r.finding
        {
            out.push(Risk {
                service: "Redis",
                check: r.check.as_str(),
                found,
                cost: cost.to_owned(),
                action: action.to_owned(),
            });
        }
    }
    if let Some(r) = topology(config).await {
        out.push(r);
    }
    out
}

/// The broker's topology against the migrations: a risk when objects are missing.
async fn topology(config: &WorkerConfig) -> Option<Risk> {
    let migrations = Migrations::embedded().ok()?;
    let report = fleet_budget_amqp::migrate(&config.amqp.url, &config.amqp, &migrations, true)
        .await
        .ok()?;
    let missing: Vec<String> = report
        .steps
        .iter()
        .filter(|(op, s)| {
            !matches!(op.object, Object::Binding { .. }) && matches!(s, StepState::WouldCreate)
        })
        .map(|(op, _)| op.object.to_string())
        .collect();
    let first = missing.first()?;
    Some(Risk {
        service: "RabbitMQ",
        check: "topology",
        found: format!(
            "{} object(s) of the topology under {:?} are missing (first: {first})",
            missing.len(),
            config.amqp.prefix
        ),
        cost: "a missing queue or exchange: workers publishing a retry or a dead letter there \
               are refused or the message is routed nowhere, and this console has no \
               dead-letter queue to read"
            .to_owned(),
        action: "run `budgetctl migrate` (see `budgetctl migrate --dry-run` first)".to_owned(),
    })
}

/// The banner: nothing when there is no risk.
pub(crate) fn banner(risks: &[Risk]) -> Markup {
    html! {
        @if !risks.is_empty() {
            section.risks #risks role="alert" {
                strong { "Settings that lose budgets or messages without an error ("
                    (risks.len()) "):" }
                ul {
                    @for r in risks {
                        li data-check=(r.check) {
                            strong { (r.service) " " (r.check) }
                            ": " (t(&r.found)) ". "
                            details {
                                summary { "What it costs, what to do" }
                                p { (t(&r.cost)) "." }
                                p { "What to do: " (t(&r.action)) "." }
                            }
                        }
                    }
                }
                p.note { "The checks workers log when they start (" code { "budgetctl doctor" }
                    " checks them with the rest); read again every few minutes." }
            }
        }
    }
}
