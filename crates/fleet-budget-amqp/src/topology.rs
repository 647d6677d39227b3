//! The broker topology: names derived from `[amqp]` settings, and the versioned migrations in
//! `migrations/` that declare them.
//!
//! Migrations are declarative TOML files, one per version, applied in order by [`migrate`].
//! Declaring is idempotent, so applying twice changes nothing. Before declaring, each object is
//! probed: an absent one is created (or, in a dry run, reported as "would create"); an existing
//! one is re-declared with the migration's arguments, which the broker refuses with
//! `PRECONDITION_FAILED` when they differ. That refusal closes the channel and names only the
//! first difference, so [`migrate`] reopens the channel and probes again with that argument set
//! to the existing value, until it has every difference; the error names the object and all of
//! them ([`AmqpError::ArgumentsDiffer`]). Nothing is ever deleted.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use crate::config::AmqpSettings;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Connection, ExchangeKind};
use serde::Deserialize;

use crate::connection::connect;
use crate::error::{AmqpError, ArgumentDifference, protocol_message};

/// The migrations shipped with the crate (the files of `migrations/`, in version order).
const EMBEDDED: [(&str, &str); 2] = [
    (
        "0001_base_topology.toml",
        include_str!("../../../migrations/0001_base_topology.toml"),
    ),
    (
        "0002_retry_tiers.toml",
        include_str!("../../../migrations/0002_retry_tiers.toml"),
    ),
];

/// A retry delay tier: an exchange and a queue whose TTL is the delay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryTier {
    /// The delay.
    pub delay: Duration,
    /// The exchange retries are published to (`<prefix>.retry.<ms>ms`).
    pub exchange: String,
    /// The queue that holds them for `delay` (same name).
    pub queue: String,
}

/// The names of everything the migrations declare, for a given `[amqp]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Jobs are published here (topic; routing key = task).
    pub work_exchange: String,
    /// The quorum work queue workers consume.
    pub work_queue: String,
    /// Dead-letters are published here (fanout).
    pub dead_exchange: String,
    /// The dead-letter queue the replayer reads.
    pub dead_queue: String,
    /// Parked messages are published here (fanout).
    pub parked_exchange: String,
    /// The parked queue.
    pub parked_queue: String,
    /// Retry tiers, shortest first.
    pub retry_tiers: Vec<RetryTier>,
}

impl Topology {
    /// The names for `settings` (prefix and retry tiers).
    #[must_use]
    pub fn new(settings: &AmqpSettings) -> Self {
        let p = &settings.prefix;
        let mut tiers: Vec<Duration> = settings.retry_tiers.clone();
        tiers.sort();
        tiers.dedup_by_key(|d| d.as_millis());
        Self {
            work_exchange: format!("{p}.work"),
            work_queue: format!("{p}.work"),
            dead_exchange: format!("{p}.dead"),
            dead_queue: format!("{p}.dead"),
            parked_exchange: format!("{p}.parked"),
            parked_queue: format!("{p}.parked"),
            retry_tiers: tiers
                .into_iter()
                .map(|delay| {
                    let name = format!("{p}.retry.{}ms", delay.as_millis());
                    RetryTier {
                        delay,
                        exchange: name.clone(),
                        queue: name,
                    }
                })
                .collect(),
        }
    }

    /// The tier a retry with backoff `delay` waits in: the shortest tier at or above `delay`,
    /// so a retry never comes back before its backoff (the jittered delay picks the tier); the
    /// longest tier when `delay` exceeds them all (the worker then sends it to wait again when
    /// it comes back early, see [`crate::headers::NOT_BEFORE_MS`]). `None` only without tiers.
    #[must_use]
    pub fn tier_for(&self, delay: Duration) -> Option<&RetryTier> {
        self.retry_tiers
            .iter()
            .find(|t| t.delay >= delay)
            .or_else(|| self.retry_tiers.last())
    }

    /// Every queue, for deleting a test's topology.
    #[must_use]
    pub fn queues(&self) -> Vec<String> {
        let mut q = vec![
            self.work_queue.clone(),
            self.dead_queue.clone(),
            self.parked_queue.clone(),
        ];
        q.extend(self.retry_tiers.iter().map(|t| t.queue.clone()));
        q
    }

    /// Every exchange, for deleting a test's topology.
    #[must_use]
    pub fn exchanges(&self) -> Vec<String> {
        let mut e = vec![
            self.work_exchange.clone(),
            self.dead_exchange.clone(),
            self.parked_exchange.clone(),
        ];
        e.extend(self.retry_tiers.iter().map(|t| t.exchange.clone()));
        e
    }
}

/// Ready messages in each queue of a topology (`budgetctl dlq stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueDepths {
    /// The work queue.
    pub work: u32,
    /// The dead-letter queue.
    pub dead: u32,
    /// The parked queue.
    pub parked: u32,
    /// Each retry tier queue, shortest first.
    pub retry: Vec<(String, u32)>,
}

/// Reads the depth (ready messages) of every queue of `topology`.
///
/// # Errors
/// The broker cannot be reached or a queue does not exist (run [`migrate`]).
pub async fn queue_depths(url: &str, topology: &Topology) -> Result<QueueDepths, AmqpError> {
    let conn = connect(url, "fleet-budget queue depths").await?;
    let result = async {
        let ch = conn
            .create_channel()
            .await
            .map_err(|e| AmqpError::broker("open a channel", e))?;
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let depth = async |name: &str| -> Result<u32, AmqpError> {
            ch.queue_declare(sstr(name)?, passive, FieldTable::default())
                .await
                .map(|q| q.message_count())
                .map_err(|e| AmqpError::broker(format!("inspect queue {name}"), e))
        };
        let mut d = QueueDepths {
            work: depth(&topology.work_queue).await?,
            dead: depth(&topology.dead_queue).await?,
            parked: depth(&topology.parked_queue).await?,
            retry: Vec::new(),
        };
        for t in &topology.retry_tiers {
            d.retry.push((t.queue.clone(), depth(&t.queue).await?));
        }
        Ok(d)
    }
    .await;
    let _ = conn.close(200, ShortString::from("bye")).await;
    result
}

/// One migration file.
#[derive(Debug, Clone, PartialEq)]
pub struct Migration {
    /// Its version (strictly increasing across files).
    pub version: u32,
    /// The file name.
    pub file: String,
    /// What it declares.
    pub description: String,
    spec: MigrationSpec,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct MigrationSpec {
    version: u32,
    #[serde(default)]
    description: String,
    #[serde(default)]
    exchange: Vec<ExchangeSpec>,
    #[serde(default)]
    queue: Vec<QueueSpec>,
    #[serde(default)]
    binding: Vec<BindingSpec>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExchangeSpec {
    name: String,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    each_retry_tier: bool,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueSpec {
    name: String,
    #[serde(default)]
    arguments: BTreeMap<String, toml::Value>,
    #[serde(default)]
    each_retry_tier: bool,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct BindingSpec {
    exchange: String,
    queue: String,
    #[serde(default)]
    routing_key: String,
    #[serde(default)]
    each_retry_tier: bool,
}

/// The ordered set of migrations.
#[derive(Debug, Clone, PartialEq)]
pub struct Migrations {
    files: Vec<Migration>,
}

impl Migrations {
    /// The migrations compiled into the crate (the repository's `migrations/`).
    ///
    /// # Errors
    /// Only if a shipped file is broken (a unit test makes sure it is not).
    pub fn embedded() -> Result<Self, AmqpError> {
        Self::from_files(
            EMBEDDED
                .iter()
                .map(|(f, t)| ((*f).to_owned(), (*t).to_owned()))
                .collect(),
        )
    }

    /// The `*.toml` files of `dir`, ordered by version.
    ///
    /// # Errors
    /// The directory cannot be read, or a file is invalid.
    pub fn from_dir(dir: &Path) -> Result<Self, AmqpError> {
        let err = |message: String| AmqpError::Migration {
            file: dir.display().to_string(),
            message,
        };
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| err(e.to_string()))? {
            let path = entry.map_err(|e| err(e.to_string()))?.path();
            if path.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| err(format!("{}: {e}", path.display())))?;
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                files.push((name, text));
            }
        }
        Self::from_files(files)
    }

    /// Parses `(file name, text)` pairs.
    ///
    /// # Errors
    /// Invalid TOML, unknown keys, an unknown exchange type, or duplicate versions.
    pub fn from_files(files: Vec<(String, String)>) -> Result<Self, AmqpError> {
        let mut out = Vec::new();
        for (file, text) in files {
            let spec: MigrationSpec = toml::from_str(&text).map_err(|e| AmqpError::Migration {
                file: file.clone(),
                message: e.to_string(),
            })?;
            for e in &spec.exchange {
                exchange_kind(&e.kind).map_err(|message| AmqpError::Migration {
                    file: file.clone(),
                    message,
                })?;
            }
            out.push(Migration {
                version: spec.version,
                file,
                description: spec.description.clone(),
                spec,
            });
        }
        out.sort_by_key(|m| m.version);
        for pair in out.windows(2) {
            if let [a, b] = pair
                && a.version == b.version
            {
                return Err(AmqpError::Migration {
                    file: b.file.clone(),
                    message: format!("version {} is also used by {}", b.version, a.file),
                });
            }
        }
        Ok(Self { files: out })
    }

    /// The migrations, in version order.
    #[must_use]
    pub fn files(&self) -> &[Migration] {
        &self.files
    }

    /// The concrete operations for `settings`, in order, without touching the broker.
    ///
    /// # Errors
    /// A name longer than AMQP allows, or an argument the broker cannot take.
    pub fn operations(&self, settings: &AmqpSettings) -> Result<Vec<Operation>, AmqpError> {
        let topology = Topology::new(settings);
        let mut ops = Vec::new();
        for m in &self.files {
            let fail = |message: String| AmqpError::Migration {
                file: m.file.clone(),
                message,
            };
            let mut vars_list = vec![vars(settings, None)];
            let tier_vars: Vec<_> = topology
                .retry_tiers
                .iter()
                .map(|t| vars(settings, Some(t.delay)))
                .collect();
            for e in &m.spec.exchange {
                for v in if e.each_retry_tier {
                    &tier_vars
                } else {
                    &vars_list
                } {
                    let name = substitute(&e.name, v);
                    check_name("exchange", &name)?;
                    ops.push(Operation {
                        version: m.version,
                        object: Object::Exchange {
                            name,
                            kind: e.kind.clone(),
                        },
                    });
                }
            }
            for q in &m.spec.queue {
                for v in if q.each_retry_tier {
                    &tier_vars
                } else {
                    &vars_list
                } {
                    let name = substitute(&q.name, v);
                    check_name("queue", &name)?;
                    let mut arguments = BTreeMap::new();
                    for (k, value) in &q.arguments {
                        arguments.insert(
                            k.clone(),
                            argument(value, v)
                                .map_err(|e| fail(format!("queue {name}: argument {k}: {e}")))?,
                        );
                    }
                    ops.push(Operation {
                        version: m.version,
                        object: Object::Queue { name, arguments },
                    });
                }
            }
            for b in &m.spec.binding {
                for v in if b.each_retry_tier {
                    &tier_vars
                } else {
                    &vars_list
                } {
                    let exchange = substitute(&b.exchange, v);
                    let queue = substitute(&b.queue, v);
                    let routing_key = substitute(&b.routing_key, v);
                    check_name("routing key", &routing_key)?;
                    ops.push(Operation {
                        version: m.version,
                        object: Object::Binding {
                            exchange,
                            queue,
                            routing_key,
                        },
                    });
                }
            }
            vars_list.clear();
        }
        Ok(ops)
    }
}

type Vars = Vec<(&'static str, String)>;

fn vars(settings: &AmqpSettings, tier: Option<Duration>) -> Vars {
    let mut v = vec![
        ("prefix", settings.prefix.clone()),
        ("delivery_limit", settings.delivery_limit.to_string()),
    ];
    if let Some(t) = tier {
        v.push(("tier_ms", t.as_millis().to_string()));
    }
    v
}

fn substitute(text: &str, vars: &Vars) -> String {
    let mut out = text.to_owned();
    for (k, v) in vars {
        out = out.replace(&format!("{{{k}}}"), v);
    }
    out
}

fn check_name(what: &'static str, name: &str) -> Result<(), AmqpError> {
    if name.len() > 255 {
        return Err(AmqpError::InvalidName {
            what,
            name: name.to_owned(),
            reason: "longer than 255 bytes".to_owned(),
        });
    }
    Ok(())
}

/// A queue argument value as declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgumentValue {
    /// Text.
    Text(String),
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
}

impl fmt::Display for ArgumentValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Text(s) => write!(f, "{s:?}"),
            Self::Int(i) => write!(f, "{i}"),
            Self::Bool(b) => write!(f, "{b}"),
        }
    }
}

impl ArgumentValue {
    fn amqp(&self) -> AMQPValue {
        match self {
            Self::Text(s) => AMQPValue::LongString(LongString::from(s.as_str())),
            Self::Int(i) => AMQPValue::LongLongInt(*i),
            Self::Bool(b) => AMQPValue::Boolean(*b),
        }
    }
}

fn argument(value: &toml::Value, vars: &Vars) -> Result<ArgumentValue, String> {
    match value {
        toml::Value::String(s) => {
            // A string that is exactly one numeric placeholder is an integer.
            let is_placeholder =
                s.starts_with('{') && s.ends_with('}') && s.matches('{').count() == 1;
            let text = substitute(s, vars);
            if is_placeholder {
                if text == *s {
                    return Err(format!("unknown placeholder {s}"));
                }
                if let Ok(i) = text.parse::<i64>() {
                    return Ok(ArgumentValue::Int(i));
                }
            }
            Ok(ArgumentValue::Text(text))
        }
        toml::Value::Integer(i) => Ok(ArgumentValue::Int(*i)),
        toml::Value::Boolean(b) => Ok(ArgumentValue::Bool(*b)),
        other => Err(format!(
            "unsupported value {other} (use a string, an integer or a boolean)"
        )),
    }
}

fn exchange_kind(kind: &str) -> Result<ExchangeKind, String> {
    match kind {
        "direct" => Ok(ExchangeKind::Direct),
        "fanout" => Ok(ExchangeKind::Fanout),
        "topic" => Ok(ExchangeKind::Topic),
        "headers" => Ok(ExchangeKind::Headers),
        other => Err(format!(
            "unknown exchange type {other:?} (direct, fanout, topic, headers)"
        )),
    }
}

/// One thing a migration declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Object {
    /// A durable exchange.
    Exchange {
        /// Name.
        name: String,
        /// Type (`topic`, `fanout`, ...).
        kind: String,
    },
    /// A durable queue.
    Queue {
        /// Name.
        name: String,
        /// Arguments (`x-queue-type`, `x-delivery-limit`, ...).
        arguments: BTreeMap<String, ArgumentValue>,
    },
    /// A binding.
    Binding {
        /// Exchange.
        exchange: String,
        /// Queue.
        queue: String,
        /// Binding key.
        routing_key: String,
    },
}

impl fmt::Display for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exchange { name, kind } => write!(f, "exchange {name:?} ({kind}, durable)"),
            Self::Queue { name, arguments } => {
                write!(f, "queue {name:?} (durable")?;
                for (k, v) in arguments {
                    write!(f, ", {k}={v}")?;
                }
                f.write_str(")")
            }
            Self::Binding {
                exchange,
                queue,
                routing_key,
            } => {
                write!(f, "binding {exchange:?} -> {queue:?} (key {routing_key:?})")
            }
        }
    }
}

/// A declaration of one migration version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    /// The migration version that declares it.
    pub version: u32,
    /// What.
    pub object: Object,
}

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
    /// How many objects were (or would be) created.
    #[must_use]
    pub fn created(&self) -> usize {
        self.steps
            .iter()
            .filter(|(_, s)| matches!(s, StepState::Created | StepState::WouldCreate))
            .count()
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
        }
        Ok(())
    }
}

/// Applies `migrations` for `settings` to the broker at `url`, in version order, idempotently;
/// with `dry_run`, only probes and returns the plan.
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
    let conn = connect(url, "fleet-budget migrate").await?;
    let result = run_ops(&conn, ops, dry_run).await;
    let _ = conn.close(200, ShortString::from("migrated")).await;
    result
}

async fn run_ops(
    conn: &Connection,
    ops: Vec<Operation>,
    dry_run: bool,
) -> Result<MigrationReport, AmqpError> {
    let mut probe = Probe {
        conn,
        channel: None,
    };
    let mut steps = Vec::new();
    for op in ops {
        let state = match &op.object {
            Object::Exchange { name, kind } => probe.exchange(name, kind, dry_run).await?,
            Object::Queue { name, arguments } => probe.queue(name, arguments, dry_run).await?,
            Object::Binding {
                exchange,
                queue,
                routing_key,
            } => {
                if dry_run {
                    StepState::WouldBind
                } else {
                    let ch = probe.channel().await?;
                    ch.queue_bind(
                        sstr(queue)?,
                        sstr(exchange)?,
                        sstr(routing_key)?,
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .map_err(|e| AmqpError::broker(format!("bind {queue} to {exchange}"), e))?;
                    StepState::Bound
                }
            }
        };
        steps.push((op, state));
    }
    if let Some(ch) = probe.channel.take() {
        let _ = ch.close(200, ShortString::from("done")).await;
    }
    Ok(MigrationReport { dry_run, steps })
}

fn sstr(s: &str) -> Result<ShortString, AmqpError> {
    ShortString::try_new(s).map_err(|e| AmqpError::InvalidName {
        what: "name",
        name: s.to_owned(),
        reason: e.to_string(),
    })
}

const NOT_FOUND: u16 = 404;
const PRECONDITION_FAILED: u16 = 406;

/// A channel that is reopened after the broker closes it (a failed passive declare or a
/// `PRECONDITION_FAILED` closes it).
struct Probe<'a> {
    conn: &'a Connection,
    channel: Option<Channel>,
}

impl Probe<'_> {
    async fn channel(&mut self) -> Result<Channel, AmqpError> {
        if let Some(ch) = &self.channel
            && ch.status().connected()
        {
            return Ok(ch.clone());
        }
        let ch = self
            .conn
            .create_channel()
            .await
            .map_err(|e| AmqpError::broker("open a channel", e))?;
        self.channel = Some(ch.clone());
        Ok(ch)
    }

    async fn exists_exchange(&mut self, name: &str) -> Result<bool, AmqpError> {
        if name.is_empty() || name.starts_with("amq.") {
            return Ok(true);
        }
        let ch = self.channel().await?;
        let opts = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        match ch
            .exchange_declare(
                sstr(name)?,
                ExchangeKind::Direct,
                opts,
                FieldTable::default(),
            )
            .await
        {
            Ok(()) => Ok(true),
            Err(e) if protocol_message(&e).is_some_and(|(code, _)| code == NOT_FOUND) => Ok(false),
            Err(e) => Err(AmqpError::broker(format!("check exchange {name}"), e)),
        }
    }

    async fn exists_queue(&mut self, name: &str) -> Result<bool, AmqpError> {
        let ch = self.channel().await?;
        match ch
            .queue_declare(
                sstr(name)?,
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if protocol_message(&e).is_some_and(|(code, _)| code == NOT_FOUND) => Ok(false),
            Err(e) => Err(AmqpError::broker(format!("check queue {name}"), e)),
        }
    }

    async fn exchange(
        &mut self,
        name: &str,
        kind: &str,
        dry_run: bool,
    ) -> Result<StepState, AmqpError> {
        let exists = self.exists_exchange(name).await?;
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
        match ch
            .exchange_declare(sstr(name)?, kind_value, opts, FieldTable::default())
            .await
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

    async fn queue(
        &mut self,
        name: &str,
        arguments: &BTreeMap<String, ArgumentValue>,
        dry_run: bool,
    ) -> Result<StepState, AmqpError> {
        let exists = self.exists_queue(name).await?;
        if !exists && dry_run {
            return Ok(StepState::WouldCreate);
        }
        let mut table: BTreeMap<String, AMQPValue> = arguments
            .iter()
            .map(|(k, v)| (k.clone(), v.amqp()))
            .collect();
        let mut durable = true;
        let mut differences = Vec::new();
        // Each refusal names one difference; set it to the existing value and ask again. The
        // queue exists, so these declarations create nothing, and the last one matches it.
        for _ in 0..32 {
            let ch = self.channel().await?;
            let mut args = FieldTable::default();
            for (k, v) in &table {
                args.insert(sstr(k)?, v.clone());
            }
            let opts = QueueDeclareOptions {
                durable,
                ..QueueDeclareOptions::default()
            };
            match ch.queue_declare(sstr(name)?, opts, args).await {
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

/// What the broker said the existing object has.
#[derive(Debug, Clone, PartialEq)]
enum Existing {
    None,
    Flag(bool),
    Value(AMQPValue),
    Unknown,
}

/// Parses `PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' in vhost
/// '/': received the value '50' of type 'long' but current is none`.
fn parse_inequivalent(text: &str) -> Option<(ArgumentDifference, Existing)> {
    let rest = text.split("inequivalent arg '").nth(1)?;
    let (argument, rest) = rest.split_once('\'')?;
    let rest = rest.split_once(": received ")?.1;
    let (received, current) = rest.split_once(" but current is ")?;
    let existing = parse_side(current);
    let difference = ArgumentDifference {
        argument: argument.to_owned(),
        declared: describe(received),
        existing: describe(current),
    };
    Some((difference, existing))
}

fn describe(side: &str) -> String {
    match side_parts(side) {
        Some((value, ty)) => format!("{value} ({ty})"),
        None => side.trim().trim_matches('\'').to_owned(),
    }
}

fn side_parts(side: &str) -> Option<(&str, &str)> {
    let rest = side.trim().strip_prefix("the value '")?;
    let (value, rest) = rest.rsplit_once("' of type '")?;
    Some((value, rest.trim_end_matches('\'')))
}

fn parse_side(side: &str) -> Existing {
    let s = side.trim();
    if s == "none" {
        return Existing::None;
    }
    match s.trim_matches('\'') {
        "true" if !s.starts_with("the value") => return Existing::Flag(true),
        "false" if !s.starts_with("the value") => return Existing::Flag(false),
        _ => {}
    }
    let Some((value, ty)) = side_parts(s) else {
        // Numbers are printed bare: `received '50' but current is '5'`. The broker compares
        // integers by value across widths, so a long stands for any of them.
        return s.trim_matches('\'').parse().map_or(Existing::Unknown, |i| {
            Existing::Value(AMQPValue::LongLongInt(i))
        });
    };
    let v = match ty {
        "longstr" => AMQPValue::LongString(LongString::from(value)),
        "long" => value
            .parse()
            .map_or(AMQPValue::Void, AMQPValue::LongLongInt),
        "signedint" => value.parse().map_or(AMQPValue::Void, AMQPValue::LongInt),
        "short" => value.parse().map_or(AMQPValue::Void, AMQPValue::ShortInt),
        "byte" => value
            .parse()
            .map_or(AMQPValue::Void, AMQPValue::ShortShortInt),
        "bool" => AMQPValue::Boolean(value == "true"),
        _ => return Existing::Unknown,
    };
    if v == AMQPValue::Void {
        Existing::Unknown
    } else {
        Existing::Value(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_migrations_are_the_files_of_the_directory() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
        assert_eq!(
            Migrations::from_dir(&dir).unwrap(),
            Migrations::embedded().unwrap(),
            "add new files to EMBEDDED"
        );
    }

    #[test]
    fn migrations_declare_every_name_of_the_topology() {
        let settings = AmqpSettings::default();
        let ops = Migrations::embedded()
            .unwrap()
            .operations(&settings)
            .unwrap();
        let t = Topology::new(&settings);
        let exchanges: Vec<&str> = ops
            .iter()
            .filter_map(|o| match &o.object {
                Object::Exchange { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        let queues: Vec<&str> = ops
            .iter()
            .filter_map(|o| match &o.object {
                Object::Queue { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        for e in t.exchanges() {
            assert!(exchanges.contains(&e.as_str()), "{e}");
        }
        for q in t.queues() {
            assert!(queues.contains(&q.as_str()), "{q}");
        }
        let versions: Vec<u32> = ops.iter().map(|o| o.version).collect();
        assert!(
            versions.windows(2).all(|w| w[0] <= w[1]),
            "applied in version order"
        );
        let work = ops
            .iter()
            .find_map(|o| match &o.object {
                Object::Queue { name, arguments } if *name == t.work_queue => {
                    Some(arguments.clone())
                }
                _ => None,
            })
            .unwrap();
        assert_eq!(work.get("x-delivery-limit"), Some(&ArgumentValue::Int(50)));
        assert_eq!(
            work.get("x-queue-type"),
            Some(&ArgumentValue::Text("quorum".into()))
        );
        assert_eq!(
            work.get("x-dead-letter-exchange"),
            Some(&ArgumentValue::Text(t.dead_exchange))
        );
    }

    #[test]
    fn tiers_are_never_shorter_than_the_delay() {
        let t = Topology::new(&AmqpSettings::default());
        assert_eq!(
            t.tier_for(Duration::from_millis(10)).unwrap().delay,
            Duration::from_secs(1)
        );
        assert_eq!(
            t.tier_for(Duration::from_millis(1001)).unwrap().delay,
            Duration::from_secs(5)
        );
        assert_eq!(
            t.tier_for(Duration::from_secs(5)).unwrap().delay,
            Duration::from_secs(5)
        );
        assert_eq!(
            t.tier_for(Duration::from_secs(9999)).unwrap().delay,
            Duration::from_secs(600)
        );
        assert_eq!(t.retry_tiers[0].queue, "fleet.retry.1000ms");
    }

    #[test]
    fn broken_migration_files_are_errors() {
        for text in [
            "version = 1\n[[exchange]]\nname = \"a\"\ntype = \"bogus\"\n",
            "nonsense",
            "version = 1\n[[queue]]\nname = \"q\"\nfoo = 1\n",
        ] {
            assert!(
                Migrations::from_files(vec![("f.toml".into(), text.into())]).is_err(),
                "{text}"
            );
        }
        let dup = vec![
            ("a.toml".into(), "version = 1\n".into()),
            ("b.toml".into(), "version = 1\n".into()),
        ];
        assert!(
            Migrations::from_files(dup)
                .unwrap_err()
                .to_string()
                .contains("also used by a.toml")
        );
        let bad_placeholder =
            "version = 1\n[[queue]]\nname = \"q\"\n[queue.arguments]\nx-max-length = \"{nope}\"\n";
        let m = Migrations::from_files(vec![("f.toml".into(), bad_placeholder.into())]).unwrap();
        assert!(
            m.operations(&AmqpSettings::default())
                .unwrap_err()
                .to_string()
                .contains("unknown placeholder")
        );
    }

    #[test]
    fn broker_refusals_are_parsed() {
        let (d, e) = parse_inequivalent("PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' in vhost '/': received the value '50' of type 'long' but current is the value '5' of type 'long'").unwrap();
        assert_eq!(d.argument, "x-delivery-limit");
        assert_eq!(d.declared, "50 (long)");
        assert_eq!(d.existing, "5 (long)");
        assert_eq!(e, Existing::Value(AMQPValue::LongLongInt(5)));
        let (d, e) = parse_inequivalent("PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received the value 'quorum' of type 'longstr' but current is none").unwrap();
        assert_eq!((d.existing.as_str(), e), ("none", Existing::None));
        let (d, e) = parse_inequivalent("PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': received 'true' but current is 'false'").unwrap();
        assert_eq!((d.argument.as_str(), e), ("durable", Existing::Flag(false)));
        assert!(parse_inequivalent("PRECONDITION_FAILED - something else").is_none());
        let (d, e) = parse_inequivalent("PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' in vhost '/': received '50' but current is '5'").unwrap();
        assert_eq!((d.declared.as_str(), d.existing.as_str()), ("50", "5"));
        assert_eq!(e, Existing::Value(AMQPValue::LongLongInt(5)));
    }
}
