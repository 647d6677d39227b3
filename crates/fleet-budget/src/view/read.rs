//! Reading the fleet's views from Redis: which dependencies there are (configured, and found
//! by their budget keys), and each one's budget, overrides, breaker and calls in flight, many
//! dependencies at once on the shared connection. The budget, its overrides and the
//! enforcement switch are one round trip per dependency (one pipeline); a breaker and calls in
//! flight, where configured, one more each.
//!
//! A key the scripts refuse is listed as [`Unusable`], not fatal: the other dependencies are
//! still shown, and so is what could be read of that one (a budget with an unreadable breaker is
//! shown without its breaker).

use futures::StreamExt;

use super::{BreakerView, DependencyView, FleetView, InFlight, Unusable};
use crate::breaker::status_on;
use crate::config::Config;
use crate::control::enforcement::{self, EnforcementSwitch, FIELDS as SWITCH_FIELDS};
use crate::control::overrides::FIELDS as OVERRIDE_FIELDS;
use crate::control::{FleetStatus, Overrides, fleet_status, status};
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::metrics::READ_CONCURRENCY;
use crate::policy::BudgetPolicy;
use crate::redact::redact_text;
use crate::store::{DiscoveryError, RedisStore};

/// The dependencies configured in `config` and those with a budget key in the store, by name.
///
/// # Errors
/// A node could not be scanned (the error names it).
pub async fn dependencies(
    store: &RedisStore,
    config: &Config,
) -> Result<Vec<Dependency>, DiscoveryError> {
    let mut deps: Vec<Dependency> = config.policies.keys().cloned().collect();
    deps.extend(store.discover_dependencies().await?);
    deps.sort();
    deps.dedup();
    Ok(deps)
}

/// Reads the view of each of `dependencies` (in that order), at most
/// [`READ_CONCURRENCY`] dependencies at once.
///
/// # Errors
/// Redis failed or passed the store's deadline (a key of another type is listed in
/// [`FleetView::unusable`] instead).
pub async fn read_fleet(
    store: &RedisStore,
    config: &Config,
    dependencies: &[Dependency],
) -> Result<FleetView, StoreError> {
    // Boxed with their type spelled out: a closure in `stream::iter(...).map(...)` makes a
    // caller's future (an axum handler's, a spawned task's) fail the `Send` check over a
    // higher-ranked lifetime.
    let futures: Vec<Read<'_>> = dependencies
        .iter()
        .map(|d| -> Read<'_> { Box::pin(read_dependency(store, config, d)) })
        .collect();
    let reads: Vec<_> = futures::stream::iter(futures)
        .buffered(READ_CONCURRENCY)
        .collect()
        .await;
    let mut fleet = FleetView::default();
    for read in reads {
        let (view, unusable) = read?;
        fleet.dependencies.extend(view);
        fleet.unusable.extend(unusable);
    }
    Ok(fleet)
}

/// One dependency's read, boxed.
type Read<'a> = std::pin::Pin<
    Box<
        dyn Future<Output = Result<(Option<DependencyView>, Vec<Unusable>), StoreError>>
            + Send
            + 'a,
    >,
>;

/// Reads one dependency's view: its budget (with the policy `config` gives it, which only
/// counts while Redis holds none), its breaker and its calls in flight when `config` has them.
/// `None` when its budget key cannot be used; each refused key listed.
///
/// # Errors
/// Redis failed or passed the store's deadline.
pub async fn read_dependency(
    store: &RedisStore,
    config: &Config,
    dependency: &Dependency,
) -> Result<(Option<DependencyView>, Vec<Unusable>), StoreError> {
    let mut unusable = Vec::new();
    let policy = config.policy(dependency);
    let (fleet, switch) = match status_and_switch(store, dependency, &policy).await {
        Ok(read) => read,
        Err(e) => {
            refused::<()>(e, dependency, &mut unusable)?;
            return Ok((None, unusable));
        }
    };
    let breaker = match config.breakers.get(dependency) {
        Some(p) => match status_on(store, dependency, p).await {
            Ok(b) => Some(BreakerView::new(&b)),
            Err(e) => refused(e, dependency, &mut unusable)?,
        },
        None => None,
    };
    let in_flight = match config.concurrency.get(dependency) {
        Some(p) => match store.leases_in_flight(dependency, fleet.now_ms).await {
            Ok(n) => Some(InFlight {
                in_flight: n,
                cap: p.cap,
            }),
            Err(e) => refused(e, dependency, &mut unusable)?,
        },
        None => None,
    };
    // An operator's switch, else the configuration (a switch written by hand in a form this
    // build does not know is ignored, as the workers ignore it).
    let enforcement = switch
        .as_ref()
        .map_or_else(|| config.enforcement.of(dependency), |s| s.enforcement);
    let mut view =
        DependencyView::new(dependency, &fleet, breaker, in_flight).with_enforcement(enforcement);
    view.enforcement_switch = switch;
    Ok((Some(view), unusable))
}

/// The budget, its overrides and the enforcement switch of `dependency` in one round trip
/// (one pipeline), or one by one when Redis refused the pipeline (the status script not
/// loaded yet, a key of another type: the one-by-one reads load it and name the key).
async fn status_and_switch(
    store: &RedisStore,
    dependency: &Dependency,
    policy: &BudgetPolicy,
) -> Result<(FleetStatus, Option<EnforcementSwitch>), StoreError> {
    if let Some(read) = store
        .read_status_with_fields(dependency, policy, &OVERRIDE_FIELDS, &SWITCH_FIELDS)
        .await?
    {
        let fleet = status::from_reads(
            read.status,
            &read.reply,
            Overrides::from_values(&read.budget),
        )?;
        return Ok((fleet, EnforcementSwitch::from_values(&read.enforcement)));
    }
    let fleet = fleet_status(store, dependency, policy).await?;
    let switch = enforcement::read(store, dependency).await?;
    Ok((fleet, switch))
}

/// A key the scripts refuse listed in `unusable` (what was read of it then shows nothing);
/// any other error returned.
fn refused<T>(
    e: StoreError,
    dependency: &Dependency,
    unusable: &mut Vec<Unusable>,
) -> Result<Option<T>, StoreError> {
    match e {
        StoreError::BadKey { key, detail } => {
            unusable.push(Unusable {
                dependency: dependency.clone(),
                key,
                detail: redact_text(&detail),
            });
            Ok(None)
        }
        e => Err(e),
    }
}
