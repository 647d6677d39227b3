//! Which services the drill runs on: Redis and RabbitMQ when they answer, else the in-process
//! budget store and the in-memory queue, with a note that says which URL failed and how to
//! start the services.

use std::time::Duration;

use fleet_budget::redact::{redact_text, redact_url};
use fleet_budget::store::RedisStore;
use fleet_budget_amqp::WorkerConfig;
use serde::Serialize;

use super::WINDOW;
use crate::redis_conn;

/// Where the drill keeps budgets and jobs.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Mode {
    /// `redis` or `in_process`.
    budget_store: &'static str,
    /// The Redis URL (password redacted) when used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) redis: Option<String>,
    /// `rabbitmq` or `in_memory`.
    queue: &'static str,
    /// The RabbitMQ URL (password redacted) when used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) rabbitmq: Option<String>,
    /// Why a service was not used, if one was not.
    pub(super) notes: Vec<String>,
}

impl Mode {
    /// The budget store, for people.
    pub(super) fn store_line(&self) -> String {
        match &self.redis {
            Some(url) => format!("Redis at {url} (window {}s)", WINDOW.as_secs()),
            None => "IN-PROCESS (fleet-budget's local store; no Redis)".to_owned(),
        }
    }

    /// The queue, for people.
    pub(super) fn queue_line(&self) -> String {
        match &self.rabbitmq {
            Some(url) => format!("RabbitMQ at {url}"),
            None => "IN-MEMORY (a queue in this process; no RabbitMQ)".to_owned(),
        }
    }
}

/// Checks which services answer (none when `in_process`).
pub(super) async fn choose(config: &WorkerConfig, in_process: bool) -> Mode {
    let redis_shown = config.budget.redis_display();
    let mut mode = Mode {
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
        redis_conn::target(&config.budget),
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
        fleet_budget_amqp::connect(&config.amqp.url, "budgetctl demo probe"),
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
