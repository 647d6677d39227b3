//! Applying a plan to the broker ([`migrate`]), and deleting a topology ([`delete_topology`]).
//!
//! Each object is probed first: an absent one is created (in a dry run, reported as "would
//! create"); an existing one is declared again with the migration's arguments, which the broker
//! refuses with `PRECONDITION_FAILED` when they differ. That refusal closes the channel and
//! names only the first difference, so the probe reopens the channel and declares again with
//! that argument set to the existing value, until it has every difference; the error names the
//! object and all of them ([`AmqpError::ArgumentsDiffer`]). [`migrate`] never deletes anything.

use std::collections::BTreeMap;
use std::fmt;

use fleet_budget::control::AuditEntry;
use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection};

use super::inspect::{
    Existing, NOT_FOUND, PRECONDITION_FAILED, exchange_exists, parse_inequivalent, queue_exists,
};
use super::names::{Topology, amqp_name};
use super::plan::{ArgumentValue, Migrations, Object, Operation, exchange_kind};
use crate::config::AmqpSettings;
use crate::connection::{ConnectionConfig, Timeouts, connect, process_wide};
use crate::error::{AmqpError, ArgumentDifference, protocol_message};

/// What [`migrate`] found or did for one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepState {
    /// It did not exist; it was created.
    Created,
    /// Dry run: it does not exist and would be created.
    WouldCreate,
    /// It exists with the same arguments; nothing changed.
    Unchanged,
    /// A binding was declared (idempotent; AMQP cannot tell whether it existed).
    Bound,
    /// Dry run: a binding would be declared.
    WouldBind,
    /// Arguments a later migration adds to a queue that already exists without them: RabbitMQ
    /// cannot change them, so they are to be set as a policy (the report prints the command).
    /// Not an error: the queue works as before.
    NeedsPolicy,
}

impl StepState {
    /// How the plan prints it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::WouldCreate => "would create",
            Self::Unchanged => "unchanged",
            Self::Bound => "bound",
            Self::WouldBind => "would bind",
            Self::NeedsPolicy => "needs policy",
        }
    }
}

/// The plan (dry run) or the outcome of [`migrate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// Each operation, in order, with its state.
    pub steps: Vec<(Operation, StepState)>,
}

impl MigrationReport {
    /// How many objects were (or would be) created (arguments added to a queue created in the
    /// same run are part of its creation, not an object of their own).
    #[must_use]
    pub fn created(&self) -> usize {
        self.steps
            .iter()
            .filter(|(op, _)| !matches!(op.object, Object::QueueArguments { .. }))
            .filter(|(_, s)| matches!(s, StepState::Created | StepState::WouldCreate))
            .count()
    }

    /// The audit entry of an applied migration (action `migrate`): before, the objects of the
    /// plan that existed; after, what was created (the first 100 named) and the latest version.
    /// `note` is the operator's why. Record it with `fleet_budget::control::AuditLog::record`.
    #[must_use]
    pub fn audit_entry(&self, actor: &str, note: &str, prefix: &str) -> AuditEntry {
        let created: Vec<String> = self
            .steps
            .iter()
            .filter(|(op, _)| !matches!(op.object, Object::QueueArguments { .. }))
            .filter(|(_, s)| matches!(s, StepState::Created | StepState::WouldCreate))
            .map(|(op, _)| op.object.to_string())
            .collect();
        let existing = self
            .steps
            .iter()
            .filter(|(_, s)| matches!(s, StepState::Unchanged))
            .count();
        let version = self.steps.iter().map(|(op, _)| op.version).max();
        let before = serde_json::json!({ "prefix": prefix, "existing_objects": existing });
        let after = serde_json::json!({
            "prefix": prefix,
            "created": created.len(),
            "created_objects": created.iter().take(100).collect::<Vec<_>>(),
            "latest_version": version,
        });
        AuditEntry::new(actor, "migrate", None, note).with_before_after(&before, &after)
    }
}

impl fmt::Display for MigrationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}",
            if self.dry_run {
                "migration plan (dry run, nothing changed):"
            } else {
                "migration applied:"
            }
        )?;
        for (op, state) in &self.steps {
            writeln!(
                f,
                "  v{:04}  {:<13} {}",
                op.version,
                state.as_str(),
                op.object
            )?;
            if let (StepState::NeedsPolicy, Some(command)) = (state, op.object.policy_command()) {
                writeln!(
                    f,
                    "         the queue exists without them and RabbitMQ cannot change a queue's \
                     arguments; set them as a policy (it replaces any other policy on the queue):\n         {command}"
                )?;
            }
        }
        Ok(())
    }
}

/// Applies `migrations` for `settings` to the broker at `url` (connected with the deadlines and
/// certificate files of `settings`), in version order, idempotently; with `dry_run`, only
/// probes and returns the plan.
///
/// # Errors
/// The broker cannot be reached; an existing object has different arguments
/// ([`AmqpError::ArgumentsDiffer`], naming all of them); a migration is invalid.
pub async fn migrate(
    url: &str,
    settings: &AmqpSettings,
    migrations: &Migrations,
    dry_run: bool,
) -> Result<MigrationReport, AmqpError> {
    let ops = migrations.operations(settings)?;
    // A node of the settings' cluster: the others are tried too when it is down; any other
    // broker alone.
    let cluster = settings.urls().any(|node| node == url);
    let to = ConnectionConfig {
        url: url.to_owned(),
        other_urls: settings
            .urls()
            .filter(|node| cluster && *node != url)
            .map(str::to_owned)
            .collect(),
        ..settings.connection()
    };
    let conn = connect(&to, "fleet-budget migrate").await?;
    let result = apply(&conn, to.timeouts, ops, dry_run).await;
    to.timeouts.close_connection(&conn, "migrated").await;
    result
}

async fn apply(
    conn: &Connection,
    timeouts: Timeouts,
    ops: Vec<Operation>,
    dry_run: bool,
) -> Result<MigrationReport, AmqpError> {
    let mut probe = Probe::new(conn, timeouts);
    let mut steps = Vec::new();
    // Arguments later migrations add to a queue: given at its creation when this run creates it.
    let mut added: BTreeMap<&str, BTreeMap<String, ArgumentValue>> = BTreeMap::new();
    let mut declared: BTreeMap<&str, &BTreeMap<String, ArgumentValue>> = BTreeMap::new();
    for op in &ops {
        match &op.object {
            Object::QueueArguments { name, arguments } => added
                .entry(name.as_str())
                .or_default()
                .extend(arguments.clone()),
            Object::Queue { name, arguments } => {
                declared.insert(name.as_str(), arguments);
            }
            _ => {}
        }
    }
    for op in &ops {
        let state = match &op.object {
            Object::Exchange { name, kind } => probe.exchange(name, kind, dry_run).await?,
            Object::Queue { name, arguments } => {
                let later = added.get(name.as_str());
                match probe.queue(name, arguments, later, dry_run).await {
                    // Arguments a later migration adds: that step reports them.
                    Err(AmqpError::ArgumentsDiffer { differences, .. })
                        if later.is_some_and(|l| {
                            differences.iter().all(|d| l.contains_key(&d.argument))
                        }) =>
                    {
                        StepState::Unchanged
                    }
                    other => other?,
                }
            }
            Object::QueueArguments { name, arguments } => {
                let mut full = declared
                    .get(name.as_str())
                    .copied()
                    .cloned()
                    .unwrap_or_default();
                full.extend(arguments.clone());
                match probe.queue(name, &full, None, dry_run).await {
                    Err(AmqpError::ArgumentsDiffer { differences, .. })
                        if differences
                            .iter()
                            .all(|d| arguments.contains_key(&d.argument)) =>
                    {
                        StepState::NeedsPolicy
                    }
                    other => other?,
                }
            }
            Object::Binding { .. } if dry_run => StepState::WouldBind,
            Object::Binding {
                exchange,
                queue,
                routing_key,
            } => {
                let ch = probe.channel().await?;
                timeouts
                    .within(
                        format!("bind {queue} to {exchange}"),
                        ch.queue_bind(
                            amqp_name("queue", queue)?,
                            amqp_name("exchange", exchange)?,
                            amqp_name("routing key", routing_key)?,
                            QueueBindOptions::default(),
                            FieldTable::default(),
                        ),
                    )
                    .await?;
                StepState::Bound
            }
        };
        steps.push((op.clone(), state));
    }
    probe.close().await;
    Ok(MigrationReport { dry_run, steps })
}

/// Deletes every queue, then every exchange, of `topology` (the messages in the queues go with
/// them), with the default deadlines ([`delete_topology_within`] takes the connection's).
///
/// # Errors
/// As [`delete_topology_within`].
pub async fn delete_topology(conn: &Connection, topology: &Topology) -> Result<(), AmqpError> {
    delete_topology_within(conn, topology, process_wide().0).await
}

/// Deletes every queue, then every exchange, of `topology` (the messages in the queues go with
/// them), opening channels within the operation deadline of `timeouts`. What is already gone
/// counts as deleted, so deleting twice is fine. Used by tests and demos that declared a
/// topology of their own.
///
/// # Errors
/// The connection failed, or the broker refused a deletion (the first refusal; the other
/// objects are still deleted).
pub async fn delete_topology_within(
    conn: &Connection,
    topology: &Topology,
    timeouts: Timeouts,
) -> Result<(), AmqpError> {
    let mut probe = Probe::new(conn, timeouts);
    let mut refused = None;
    let queues = topology.queues().into_iter().map(|q| (true, q));
    let exchanges = topology.exchanges().into_iter().map(|e| (false, e));
    for (is_queue, name) in queues.chain(exchanges) {
        let ch = probe.channel().await?;
        let deleted = if is_queue {
            ch.queue_delete(amqp_name("queue", &name)?, QueueDeleteOptions::default())
                .await
                .map(|_| ())
        } else {
            ch.exchange_delete(
                amqp_name("exchange", &name)?,
                ExchangeDeleteOptions::default(),
            )
            .await
        };
        match deleted {
            Ok(()) => {}
            Err(e) if protocol_message(&e).is_some_and(|(code, _)| code == NOT_FOUND) => {}
            Err(e) if crate::error::is_connection_error(&e) => {
                return Err(AmqpError::broker(format!("delete {name}"), e));
            }
            Err(e) => {
                refused.get_or_insert(AmqpError::broker(format!("delete {name}"), e));
            }
        }
    }
    probe.close().await;
    refused.map_or(Ok(()), Err)
}

/// A channel that is reopened after the broker closes it (a failed passive declare or a
/// `PRECONDITION_FAILED` closes it).
struct Probe<'a> {
    conn: &'a Connection,
    channel: Option<Channel>,
    timeouts: Timeouts,
}

impl<'a> Probe<'a> {
    fn new(conn: &'a Connection, timeouts: Timeouts) -> Self {
        Self {
            conn,
            channel: None,
            timeouts,
        }
    }

    async fn channel(&mut self) -> Result<Channel, AmqpError> {
        if let Some(ch) = &self.channel
            && ch.status().connected()
        {
            return Ok(ch.clone());
        }
        let ch = self
            .timeouts
            .within("open a channel", self.conn.create_channel())
            .await?;
        self.channel = Some(ch.clone());
        Ok(ch)
    }

    async fn close(mut self) {
        if let Some(ch) = self.channel.take() {
            self.timeouts.close_channel(&ch, "done").await;
        }
    }

    async fn exchange(
        &mut self,
        name: &str,
        kind: &str,
        dry_run: bool,
    ) -> Result<StepState, AmqpError> {
        let exists = exchange_exists(&self.channel().await?, name, self.timeouts).await?;
        if !exists && dry_run {
            return Ok(StepState::WouldCreate);
        }
        let kind_value = exchange_kind(kind).map_err(|message| AmqpError::Migration {
            file: name.to_owned(),
            message,
        })?;
        let ch = self.channel().await?;
        let opts = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        match self
            .timeouts
            .deadline(
                format!("declare exchange {name}"),
                ch.exchange_declare(
                    amqp_name("exchange", name)?,
                    kind_value,
                    opts,
                    FieldTable::default(),
                ),
            )
            .await?
        {
            Ok(()) => Ok(if exists {
                StepState::Unchanged
            } else {
                StepState::Created
            }),
            Err(e) => match protocol_message(&e) {
                Some((PRECONDITION_FAILED, text)) => {
                    let differences = parse_inequivalent(&text)
                        .map(|(d, _)| vec![d])
                        .unwrap_or_else(|| {
                            vec![ArgumentDifference {
                                argument: "(unknown)".into(),
                                declared: kind.to_owned(),
                                existing: text.clone(),
                            }]
                        });
                    Err(AmqpError::ArgumentsDiffer {
                        kind: "exchange",
                        name: name.to_owned(),
                        differences,
                    })
                }
                _ => Err(AmqpError::broker(format!("declare exchange {name}"), e)),
            },
        }
    }

    /// Declares queue `name` with `arguments` (and, when it does not exist yet, the arguments
    /// `later` migrations add to it).
    async fn queue(
        &mut self,
        name: &str,
        arguments: &BTreeMap<String, ArgumentValue>,
        later: Option<&BTreeMap<String, ArgumentValue>>,
        dry_run: bool,
    ) -> Result<StepState, AmqpError> {
        let exists = queue_exists(&self.channel().await?, name, self.timeouts).await?;
        if !exists && dry_run {
            return Ok(StepState::WouldCreate);
        }
        let mut table: BTreeMap<String, AMQPValue> = arguments
            .iter()
            .map(|(k, v)| (k.clone(), v.amqp()))
            .collect();
        if !exists {
            for (k, v) in later.into_iter().flatten() {
                table.insert(k.clone(), v.amqp());
            }
        }
        let mut durable = true;
        let mut differences = Vec::new();
        // Each refusal names one difference; set it to the existing value and ask again. The
        // queue exists, so these declarations create nothing, and the last one matches it.
        for _ in 0..32 {
            let ch = self.channel().await?;
            let mut args = FieldTable::default();
            for (k, v) in &table {
                args.insert(amqp_name("argument", k)?, v.clone());
            }
            let opts = QueueDeclareOptions {
                durable,
                ..QueueDeclareOptions::default()
            };
            match self
                .timeouts
                .deadline(
                    format!("declare queue {name}"),
                    ch.queue_declare(amqp_name("queue", name)?, opts, args),
                )
                .await?
            {
                Ok(_) => break,
                Err(e) => {
                    let Some((PRECONDITION_FAILED, text)) = protocol_message(&e) else {
                        return Err(AmqpError::broker(format!("declare queue {name}"), e));
                    };
                    if !exists {
                        return Err(AmqpError::broker(format!("declare queue {name}"), e));
                    }
                    let Some((difference, existing)) = parse_inequivalent(&text) else {
                        differences.push(ArgumentDifference {
                            argument: "(unparsed)".into(),
                            declared: "-".into(),
                            existing: text,
                        });
                        break;
                    };
                    let argument = difference.argument.clone();
                    differences.push(difference);
                    match (argument.as_str(), existing) {
                        ("durable", Existing::Flag(b)) => durable = b,
                        (_, Existing::None) => {
                            table.remove(&argument);
                        }
                        (_, Existing::Value(v)) => {
                            table.insert(argument, v);
                        }
                        _ => break,
                    }
                }
            }
        }
        if differences.is_empty() {
            Ok(if exists {
                StepState::Unchanged
            } else {
                StepState::Created
            })
        } else {
            Err(AmqpError::ArgumentsDiffer {
                kind: "queue",
                name: name.to_owned(),
                differences,
            })
        }
    }
}
