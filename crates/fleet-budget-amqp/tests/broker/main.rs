//! This crate against the real RabbitMQ (the shared broker, names of each test's own through
//! [`fleet_budget_amqp::testing::TestBroker`]) and a private Redis per test: migrations, the
//! worker, the replayer. One test binary, one module per part.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;
mod connection_watch;
mod dead_letters;
mod inspect;
mod metrics;
mod node_list;
mod replay;
mod replay_close;
mod replay_frame;
mod replay_loop;
mod replay_refused;
mod tls;
mod topology;
mod worker;
