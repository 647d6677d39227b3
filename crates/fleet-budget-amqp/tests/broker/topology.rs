//! Migrations against the real broker: dry-run plan, idempotent apply, the error for a queue
//! declared with other arguments, and the upgrade to the powers-of-two retry tiers.

use std::collections::BTreeSet;
use std::time::Duration;

use fleet_budget_amqp::{
    AmqpError, AmqpSettings, Migrations, Object, StepState, Topology, delete_topology, migrate,
    queue_depth,
};
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use crate::common::Env;

#[tokio::test]
async fn migrations_plan_apply_and_reapply_idempotently() {
    let mut env = Env::new("migrate", "", "", "").await;
    // A second prefix that nothing has declared yet.
    let mut settings = env.config.amqp.clone();
    settings.prefix = format!("{}.fresh", settings.prefix);
    let fresh = Topology::new(&settings);
    env.broker.also_delete(fresh.clone());
    let migrations = Migrations::embedded().unwrap();

    let plan = migrate(&env.url, &settings, &migrations, true)
        .await
        .unwrap();
    assert!(plan.dry_run);
    assert!(
        plan.steps
            .iter()
            .all(|(_, s)| matches!(s, StepState::WouldCreate | StepState::WouldBind)),
        "{plan}"
    );
    assert!(plan.to_string().contains("would create"), "{plan}");
    // The dry run created nothing.
    let conn = env.connection().await;
    let ch = conn.create_channel().await.unwrap();
    assert!(queue_depth(&ch, &fresh.work_queue).await.is_err());

    let applied = migrate(&env.url, &settings, &migrations, false)
        .await
        .unwrap();
    assert_eq!(applied.created(), plan.created(), "{applied}");
    let versions: Vec<u32> = applied.steps.iter().map(|(op, _)| op.version).collect();
    assert!(
        versions.windows(2).all(|w| w[0] <= w[1]),
        "applied in version order"
    );

    let again = migrate(&env.url, &settings, &migrations, false)
        .await
        .unwrap();
    assert_eq!(again.created(), 0, "{again}");
    assert!(
        again
            .steps
            .iter()
            .all(|(_, s)| matches!(s, StepState::Unchanged | StepState::Bound)),
        "{again}"
    );
    let replan = migrate(&env.url, &settings, &migrations, true)
        .await
        .unwrap();
    assert!(
        replan
            .steps
            .iter()
            .all(|(_, s)| matches!(s, StepState::Unchanged | StepState::WouldBind)),
        "{replan}"
    );
    let _ = conn.close(200, ShortString::from("bye")).await;
}

#[tokio::test]
async fn a_queue_declared_with_other_arguments_is_named_with_every_difference() {
    let mut env = Env::new("conflict", "", "", "").await;
    let mut settings = env.config.amqp.clone();
    settings.prefix = format!("{}.other", settings.prefix);
    let other = Topology::new(&settings);
    env.broker.also_delete(other.clone());
    // Someone declared the work queue by hand: quorum, a delivery limit of 5, no dead-letter exchange.
    let conn = env.connection().await;
    let ch = conn.create_channel().await.unwrap();
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    args.insert(
        ShortString::from("x-delivery-limit"),
        AMQPValue::LongLongInt(5),
    );
    args.insert(
        ShortString::from("x-max-length"),
        AMQPValue::LongLongInt(100),
    );
    ch.queue_declare(
        ShortString::from(other.work_queue.as_str()),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        args,
    )
    .await
    .unwrap();

    let err = migrate(&env.url, &settings, &Migrations::embedded().unwrap(), false)
        .await
        .unwrap_err();
    let text = err.to_string();
    eprintln!("{text}");
    match &err {
        AmqpError::ArgumentsDiffer {
            kind,
            name,
            differences,
        } => {
            assert_eq!(
                (*kind, name.as_str()),
                ("queue", other.work_queue.as_str()),
                "{text}"
            );
            let names: Vec<&str> = differences.iter().map(|d| d.argument.as_str()).collect();
            assert!(names.contains(&"x-delivery-limit"), "{text}");
            assert!(names.contains(&"x-dead-letter-exchange"), "{text}");
            assert!(names.contains(&"x-max-length"), "{text}");
            assert_eq!(differences.len(), 3, "{text}");
            let limit = differences
                .iter()
                .find(|d| d.argument == "x-delivery-limit")
                .unwrap();
            assert!(
                limit.declared.starts_with("50") && limit.existing.starts_with('5'),
                "{text}"
            );
        }
        other => panic!("expected ArgumentsDiffer, got {other:?}"),
    }
    assert!(
        !text.contains("PRECONDITION_FAILED"),
        "a bare broker error leaked: {text}"
    );
    // The dry run reports the same conflict without changing anything.
    let err = migrate(&env.url, &settings, &Migrations::embedded().unwrap(), true)
        .await
        .unwrap_err();
    assert!(matches!(err, AmqpError::ArgumentsDiffer { .. }), "{err}");
    let _ = conn.close(200, ShortString::from("bye")).await;
}

#[tokio::test]
async fn a_deleted_topology_is_gone_and_deleting_it_again_is_fine() {
    let env = Env::new("delete", "", "", "").await;
    let conn = env.connection().await;
    let ch = conn.create_channel().await.unwrap();
    for q in env.topology.queues() {
        assert_eq!(queue_depth(&ch, &q).await.unwrap(), 0, "{q} declared");
    }
    delete_topology(&conn, &env.topology).await.unwrap();
    for q in env.topology.queues() {
        let ch = conn.create_channel().await.unwrap();
        assert!(queue_depth(&ch, &q).await.is_err(), "{q} still exists");
    }
    // The migration plan sees every exchange gone too.
    let plan = migrate(
        &env.url,
        &env.settings,
        &Migrations::embedded().unwrap(),
        true,
    )
    .await
    .unwrap();
    assert!(
        plan.steps
            .iter()
            .all(|(_, s)| matches!(s, StepState::WouldCreate | StepState::WouldBind)),
        "{plan}"
    );
    delete_topology(&conn, &env.topology).await.unwrap();
    let _ = conn.close(200, ShortString::from("bye")).await;
}

/// An existing deployment with the old tiers (1, 5, 30, 120, 600 s) upgrades with `migrate`:
/// the powers-of-two tiers of the new default are created, nothing else changes, and the old
/// tier queues stay (they drain back to the work queue; `migrate` never deletes).
#[tokio::test]
async fn migrate_upgrades_a_deployment_with_the_old_tiers_to_the_powers_of_two() {
    let mut env = Env::new("upgrade", "", "", "").await;
    let mut old = env.config.amqp.clone();
    old.prefix = format!("{}.old", old.prefix);
    old.retry_tiers = [1, 5, 30, 120, 600].map(Duration::from_secs).to_vec();
    let new = AmqpSettings {
        retry_tiers: AmqpSettings::default().retry_tiers,
        ..old.clone()
    };
    env.broker.also_delete(Topology::new(&old));
    env.broker.also_delete(Topology::new(&new));
    let migrations = Migrations::embedded().unwrap();
    migrate(&env.url, &old, &migrations, false).await.unwrap();

    let upgrade = migrate(&env.url, &new, &migrations, false).await.unwrap();
    let created: BTreeSet<String> = upgrade
        .steps
        .iter()
        .filter(|(_, s)| *s == StepState::Created)
        .filter_map(|(op, _)| match &op.object {
            Object::Exchange { name, .. } | Object::Queue { name, .. } => Some(name.clone()),
            Object::Binding { .. } | Object::QueueArguments { .. } => None,
        })
        .collect();
    let expected: BTreeSet<String> = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
        .iter()
        .map(|s| format!("{}.retry.{}ms", old.prefix, s * 1000))
        .collect();
    assert_eq!(created, expected, "{upgrade}");
    assert_eq!(
        upgrade.created(),
        2 * expected.len(),
        "an exchange and a queue per tier"
    );
    let conn = env.connection().await;
    let ch = conn.create_channel().await.unwrap();
    for t in &Topology::new(&old).retry_tiers {
        assert!(queue_depth(&ch, &t.queue).await.is_ok(), "{} kept", t.queue);
    }
    let _ = conn.close(200, ShortString::from("bye")).await;
}
