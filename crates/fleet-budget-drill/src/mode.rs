//! Which services the drill runs on: Redis and RabbitMQ when they answer, else the in-process
//! budget store and the in-memory queue, with a note that says which URL failed and how to
//! start the services.

use std::time::Duration;

use fleet_budget::redact::{redact_text, redact_url};
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget_amqp::WorkerConfig;
use serde::Serialize;

use crate::DrillError;

/// Where the drill keeps budgets and jobs.
#[derive(Debug, Clone, Serialize)]
pub struct Mode {
    /// `redis` or `in_process`.
    pub budget_store: &'static str,
    /// The Redis URL (password redacted) when used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis: Option<String>,
    /// `rabbitmq` or `in_memory`.
    pub queue: &'static str,
    /// The RabbitMQ URL (password redacted) when used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rabbitmq: Option<String>,
    /// Why a service was not used, if one was not.
    pub notes: Vec<String>,
}

impl Mode {
    /// Checks which of `config`'s services answer (none when `in_process`).
    pub async fn choose(config: &WorkerConfig, in_process: bool) -> Self {
        let redis_shown = config.budget.redis_display();
        let mut mode = Self {
            budget_store: "in_process",
            redis: None,
            queue: "in_memory",
            rabbitmq: None,
            notes: Vec::new(),
        };
        if in_process {
            mode.notes
                .push("--in-process: Redis and RabbitMQ were not tried".to_owned());
            return mode;
        }
        let timeout = Duration::from_millis(500);
        match RedisStore::new_with_tls(
            RedisTarget::from_settings(&config.budget.redis),
            &config.budget.redis.key_prefix,
            timeout,
            &config.budget.redis.tls,
        ) {
            Ok(store) => match store.ping().await {
                Ok(_) => {
                    mode.budget_store = "redis";
                    mode.redis = Some(redis_shown);
                }
                Err(e) => mode.notes.push(format!(
                    "Redis at {redis_shown} does not answer ({}); start Redis and RabbitMQ with `docker compose up -d`. Running the drill with the in-process budget store instead",
                    redact_text(&e.to_string())
                )),
            },
            Err(e) => mode.notes.push(format!("Redis URL {redis_shown} cannot be used ({e}); using the in-process budget store")),
        }
        let amqp_shown = redact_url(&config.amqp.url);
        let probe = tokio::time::timeout(
            Duration::from_secs(5),
            fleet_budget_amqp::connect(config.amqp.connection(), "budgetctl demo probe"),
        )
        .await;
        match probe {
            Ok(Ok(conn)) => {
                let _ = conn.close(200, "probe".into()).await;
                mode.queue = "rabbitmq";
                mode.rabbitmq = Some(amqp_shown);
            }
            Ok(Err(e)) => mode.notes.push(format!(
                "RabbitMQ at {amqp_shown} does not answer ({}); start Redis and RabbitMQ with `docker compose up -d`. Running the drill with an in-memory queue instead",
                redact_text(&e.to_string())
            )),
            Err(_) => mode.notes.push(format!(
                "RabbitMQ at {amqp_shown} does not answer within 5s; start Redis and RabbitMQ with `docker compose up -d`. Running the drill with an in-memory queue instead"
            )),
        }
        mode
    }

    /// The scenarios need what they show: leases and breaker state in Redis, jobs on RabbitMQ.
    ///
    /// # Errors
    /// [`DrillError::ServicesMissing`], with the notes that say why.
    pub fn require_services(&self) -> Result<(), DrillError> {
        if self.redis.is_some() && self.rabbitmq.is_some() {
            return Ok(());
        }
        Err(DrillError::ServicesMissing {
            notes: self.notes.join("; "),
        })
    }
}
