//! The migration files as [`super::Migrations`] reads and renders them, and their refusals.

use std::collections::BTreeSet;
use std::time::Duration;

use super::*;
use crate::topology::names::{DEAD, PARKED, RETRY_TIER, Topology, WORK};

/// `EMBEDDED` is every file of the crate's copy, and in the repository that copy is the source,
/// the top-level `migrations/`, behind the "generated" comment `scripts/gen-migrations` writes:
/// a stale copy fails `cargo test` alone, naming the file.
#[test]
fn embedded_migrations_are_the_files_of_the_directory() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert_eq!(
        Migrations::from_dir(&crate_dir.join("migrations")).unwrap(),
        Migrations::embedded().unwrap(),
        "add new files to EMBEDDED"
    );
    let root = crate_dir.join("../..");
    if !root.join("scripts/gen-migrations").is_file() {
        // Built from its package: the copy is all there is.
        return;
    }
    let mut sources: Vec<(String, String)> = std::fs::read_dir(root.join("migrations"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "toml"))
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            (name, text)
        })
        .collect();
    sources.sort();
    let embedded: Vec<&str> = EMBEDDED.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        sources
            .iter()
            .map(|(name, _)| name.as_str())
            .collect::<Vec<_>>(),
        embedded,
        "migrations/ and EMBEDDED hold different files: run scripts/gen-migrations, then list \
         every file in EMBEDDED"
    );
    for ((name, source), (_, copy)) in sources.iter().zip(EMBEDDED) {
        let generated = format!(
            "# GENERATED from migrations/{name} at the repository's root:\n\
             # edit that, then run scripts/gen-migrations\n{source}"
        );
        assert!(
            copy == generated,
            "crates/fleet-budget-amqp/migrations/{name} is stale: run scripts/gen-migrations \
             (edit migrations/, never a copy)"
        );
    }
}

/// The exchange and queue names the migrations declare, rendered for `settings`.
fn declared(settings: &AmqpSettings) -> (BTreeSet<String>, BTreeSet<String>) {
    let ops = Migrations::embedded()
        .unwrap()
        .operations(settings)
        .unwrap();
    let mut exchanges = BTreeSet::new();
    let mut queues = BTreeSet::new();
    for op in ops {
        match op.object {
            Object::Exchange { name, .. } => exchanges.insert(name),
            Object::Queue { name, .. } => queues.insert(name),
            Object::Binding { .. } | Object::QueueArguments { .. } => false,
        };
    }
    (exchanges, queues)
}

#[test]
fn the_migrations_declare_exactly_the_names_of_the_topology() {
    let few = AmqpSettings {
        prefix: "other.prefix".into(),
        retry_tiers: vec![Duration::from_millis(250), Duration::from_secs(2)],
        ..AmqpSettings::default()
    };
    for settings in [AmqpSettings::default(), few] {
        let t = Topology::new(&settings);
        let (exchanges, queues) = declared(&settings);
        assert_eq!(
            exchanges,
            t.exchanges().into_iter().collect(),
            "migrations/*.toml and topology/names.rs name the exchanges differently"
        );
        assert_eq!(
            queues,
            t.queues().into_iter().collect(),
            "migrations/*.toml and topology/names.rs name the queues differently"
        );
    }
}

#[test]
fn the_migration_files_write_the_name_templates_of_names_rs() {
    let templates: BTreeSet<&str> = [WORK, DEAD, PARKED, RETRY_TIER].into();
    for m in Migrations::embedded().unwrap().files() {
        let names = m
            .spec
            .exchange
            .iter()
            .map(|e| e.name.as_str())
            .chain(m.spec.queue.iter().map(|q| q.name.as_str()))
            .chain(m.spec.binding.iter().map(|b| b.queue.as_str()))
            .chain(m.spec.binding.iter().map(|b| b.exchange.as_str()));
        for name in names {
            assert!(templates.contains(name), "{}: {name}", m.file);
        }
    }
}

#[test]
fn the_work_queue_is_a_quorum_queue_that_dead_letters_to_the_dead_exchange() {
    let settings = AmqpSettings::default();
    let ops = Migrations::embedded()
        .unwrap()
        .operations(&settings)
        .unwrap();
    let t = Topology::new(&settings);
    let versions: Vec<u32> = ops.iter().map(|o| o.version).collect();
    assert!(
        versions.windows(2).all(|w| w[0] <= w[1]),
        "applied in version order"
    );
    let work = ops
        .iter()
        .find_map(|o| match &o.object {
            Object::Queue { name, arguments } if *name == t.work_queue => Some(arguments.clone()),
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
fn added_arguments_name_an_earlier_queue_and_have_a_policy_equivalent() {
    let ops = Migrations::embedded()
        .unwrap()
        .operations(&AmqpSettings::default())
        .unwrap();
    let upgrade = ops
        .iter()
        .find(|op| matches!(op.object, Object::QueueArguments { .. }))
        .unwrap();
    assert_eq!(upgrade.version, 3);
    assert_eq!(
        upgrade.object.policy_command().unwrap(),
        "rabbitmqctl set_policy --apply-to queues fleet.work.upgrade '^fleet\\.work$' \
         '{\"dead-letter-strategy\":\"at-least-once\",\"overflow\":\"reject-publish\"}'"
    );
    let orphan = "version = 9\n[[queue_arguments]]\nname = \"{prefix}.nowhere\"\n\
                  [queue_arguments.arguments]\nx-overflow = \"reject-publish\"\n";
    let e = Migrations::from_files(vec![("0009_x.toml".into(), orphan.into())])
        .unwrap()
        .operations(&AmqpSettings::default())
        .unwrap_err();
    assert!(e.to_string().contains("no earlier migration"), "{e}");
}
