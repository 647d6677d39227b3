//! Migration planning: the versioned migration files parsed and rendered into the concrete
//! [`Operation`]s for an `[amqp]` section, without touching the broker.
//!
//! The files' source is the repository's top-level `migrations/`; the crate compiles in its
//! generated copy, `crates/fleet-budget-amqp/migrations/` (written by `scripts/gen-migrations`,
//! since `cargo package` takes only files inside the crate's folder).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use lapin::ExchangeKind;
use lapin::types::{AMQPValue, LongString};
use serde::Deserialize;

use super::names::{Vars, render, tier_delays, vars};
use crate::config::AmqpSettings;
use crate::error::AmqpError;

/// The migrations shipped with the crate (the crate's copy of the repository's `migrations/`, in
/// version order).
const EMBEDDED: [(&str, &str); 3] = [
    (
        "0001_base_topology.toml",
        include_str!("../../migrations/0001_base_topology.toml"),
    ),
    (
        "0002_retry_tiers.toml",
        include_str!("../../migrations/0002_retry_tiers.toml"),
    ),
    (
        "0003_work_dead_letter_at_least_once.toml",
        include_str!("../../migrations/0003_work_dead_letter_at_least_once.toml"),
    ),
];

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
    #[serde(default)]
    queue_arguments: Vec<QueueArgumentsSpec>,
}

/// Arguments added to a queue an earlier migration declares (see [`Object::QueueArguments`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueArgumentsSpec {
    name: String,
    arguments: BTreeMap<String, toml::Value>,
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
    /// The migrations compiled into the crate (the repository's `migrations/`, through the crate's
    /// generated copy).
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
        let plain = vars(settings, None);
        let once = vec![plain.clone()];
        let each_tier: Vec<Vars> = tier_delays(settings)
            .into_iter()
            .map(|delay| vars(settings, Some(delay)))
            .collect();
        let varieties = |each_retry_tier: bool| if each_retry_tier { &each_tier } else { &once };
        let mut ops = Vec::new();
        for m in &self.files {
            let fail = |message: String| AmqpError::Migration {
                file: m.file.clone(),
                message,
            };
            let mut push = |object| {
                ops.push(Operation {
                    version: m.version,
                    object,
                });
            };
            for e in &m.spec.exchange {
                for v in varieties(e.each_retry_tier) {
                    let name = render(&e.name, v);
                    check_name("exchange", &name)?;
                    push(Object::Exchange {
                        name,
                        kind: e.kind.clone(),
                    });
                }
            }
            for q in &m.spec.queue {
                for v in varieties(q.each_retry_tier) {
                    let name = render(&q.name, v);
                    check_name("queue", &name)?;
                    let mut arguments = BTreeMap::new();
                    for (k, value) in &q.arguments {
                        let value = argument(value, v)
                            .map_err(|e| fail(format!("queue {name}: argument {k}: {e}")))?;
                        arguments.insert(k.clone(), value);
                    }
                    push(Object::Queue { name, arguments });
                }
            }
            for b in &m.spec.binding {
                for v in varieties(b.each_retry_tier) {
                    let routing_key = render(&b.routing_key, v);
                    check_name("routing key", &routing_key)?;
                    push(Object::Binding {
                        exchange: render(&b.exchange, v),
                        queue: render(&b.queue, v),
                        routing_key,
                    });
                }
            }
            for q in &m.spec.queue_arguments {
                let name = render(&q.name, &plain);
                let mut arguments = BTreeMap::new();
                for (k, value) in &q.arguments {
                    let value = argument(value, &plain)
                        .map_err(|e| fail(format!("queue {name}: argument {k}: {e}")))?;
                    arguments.insert(k.clone(), value);
                }
                let declared = ops.iter().any(
                    |op: &Operation| matches!(&op.object, Object::Queue { name: n, .. } if *n == name),
                );
                if !declared {
                    return Err(fail(format!(
                        "queue_arguments for {name}: no earlier migration declares that queue"
                    )));
                }
                ops.push(Operation {
                    version: m.version,
                    object: Object::QueueArguments { name, arguments },
                });
            }
        }
        Ok(ops)
    }
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
    /// The value as the broker receives it.
    pub(crate) fn amqp(&self) -> AMQPValue {
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
            let text = render(s, vars);
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

/// The exchange type named `kind` in a migration file.
pub(crate) fn exchange_kind(kind: &str) -> Result<ExchangeKind, String> {
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
    /// Arguments added to a queue an earlier migration declares. RabbitMQ cannot change a
    /// queue's arguments once it exists: a queue created by the same run is created with them;
    /// an existing one without them is reported [`super::StepState::NeedsPolicy`], with the
    /// equivalent policy to set ([`Object::policy_command`]).
    QueueArguments {
        /// The queue.
        name: String,
        /// The added arguments.
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
            Self::QueueArguments { name, arguments } => {
                write!(f, "queue {name:?} arguments")?;
                for (i, (k, v)) in arguments.iter().enumerate() {
                    write!(f, "{} {k}={v}", if i == 0 { "" } else { "," })?;
                }
                Ok(())
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

impl Object {
    /// For [`Object::QueueArguments`], the `rabbitmqctl` command that sets the same settings as
    /// a policy on the existing queue (policy keys are the argument names without `x-`).
    #[must_use]
    pub fn policy_command(&self) -> Option<String> {
        let Self::QueueArguments { name, arguments } = self else {
            return None;
        };
        let definition: serde_json::Map<String, serde_json::Value> = arguments
            .iter()
            .map(|(k, v)| {
                let value = match v {
                    ArgumentValue::Text(t) => serde_json::Value::from(t.as_str()),
                    ArgumentValue::Int(i) => serde_json::Value::from(*i),
                    ArgumentValue::Bool(b) => serde_json::Value::from(*b),
                };
                (k.trim_start_matches("x-").to_owned(), value)
            })
            .collect();
        let pattern: String = name
            .chars()
            .flat_map(|c| {
                let escape = !c.is_ascii_alphanumeric() && c != '_' && c != '-';
                escape.then_some('\\').into_iter().chain([c])
            })
            .collect();
        Some(format!(
            "rabbitmqctl set_policy --apply-to queues {name}.upgrade '^{pattern}$' '{}'",
            serde_json::Value::Object(definition)
        ))
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

#[cfg(test)]
mod tests;
