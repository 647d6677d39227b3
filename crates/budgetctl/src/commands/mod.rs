//! One module per command, named after it: its arguments, what it calls in the libraries, and
//! how it prints.

pub(crate) mod audit;
pub(crate) mod bench;
pub(crate) mod budget;
pub(crate) mod bullmq_replay;
pub(crate) mod config;
pub(crate) mod console;
pub(crate) mod demo;
pub(crate) mod dlq;
pub(crate) mod doctor;
pub(crate) mod exporter;
pub(crate) mod incident;
pub(crate) mod migrate;
pub(crate) mod parked;
pub(crate) mod plan;
pub(crate) mod replay;
pub(crate) mod simulate;
pub(crate) mod status;
pub(crate) mod tune;
