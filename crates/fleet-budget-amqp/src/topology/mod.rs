//! The broker topology: what is declared, under which names, and how it gets there.
//!
//! * [`names`]: the name of every exchange and queue ([`Topology`]), from one template each;
//!   the migration files write the same templates, and a test holds the two together;
//! * [`plan`]: the versioned migration files ([`Migrations`]; their source is the repository's
//!   top-level `migrations/`, compiled in from the crate's generated copy), rendered into the
//!   concrete [`Operation`]s for an `[amqp]` section, without touching the broker;
//! * [`apply`]: [`migrate`] runs those operations against the broker (idempotently, with a dry
//!   run, naming every differing argument of an existing queue), and [`delete_topology`]
//!   removes a topology again (tests, demos);
//! * [`inspect`]: passive declares (does it exist, how deep is a queue: [`queue_depth`],
//!   [`QueueDepths`]) and the broker's refusal text when a declaration differs.
//!
//! A worker or replayer needs only [`Topology`]; `budgetctl migrate` needs [`migrate`].

pub mod apply;
pub mod inspect;
pub mod names;
pub mod plan;

pub use apply::{MigrationReport, StepState, delete_topology, delete_topology_within, migrate};
pub use inspect::{QueueDepths, queue_depth, queue_depth_within, queue_depths};
pub use names::{RetryTier, Topology};
pub use plan::{ArgumentValue, Migration, Migrations, Object, Operation};
