//! The Redis key layout, version 1. Documented for other languages in `lua/README.md`.
//!
//! One hash per dependency: `<prefix>:v1:{<dependency>}`. The braces make the dependency the
//! Redis Cluster hash tag, so every key of a dependency lives in one slot and ACL key patterns
//! such as `~fb:v1:*` cover them all.
//!
//! The worker registry (`lua/heartbeat.lua`) is two keys beside them, `<prefix>:v1:workers:{workers}`
//! and `<prefix>:v1:workers:{workers}:seen`: after `v1:` comes `w`, never `{`, so neither can be a
//! budget key nor match [`budget_key_pattern`], and the tag `workers` puts both in one slot.

use crate::dependency::Dependency;

/// The key-schema version this build reads and writes.
pub const KEY_SCHEMA_VERSION: u32 = 1;

/// The budget hash of `dependency` under `prefix`.
#[must_use]
pub fn budget_key(prefix: &str, dependency: &Dependency) -> String {
    format!("{prefix}:v{KEY_SCHEMA_VERSION}:{{{dependency}}}")
}

/// The enforcement switch of `dependency` under `prefix` (`control::enforcement`): an operator's
/// `budgetctl budget shadow|enforce`, expiring with the key. After `v1:` comes `e`, never `{`, so
/// it is never a budget key; the dependency is its hash tag (the budget's slot).
#[must_use]
pub fn enforcement_key(prefix: &str, dependency: &Dependency) -> String {
    format!("{prefix}:v{KEY_SCHEMA_VERSION}:enforcement:{{{dependency}}}")
}

/// The audit stream under `prefix`: every override, replay, purge and migration.
#[must_use]
pub fn audit_key(prefix: &str) -> String {
    format!("{prefix}:v{KEY_SCHEMA_VERSION}:audit")
}

/// The worker registry's hash under `prefix`: worker id → its report (JSON, see
/// `crate::budget::heartbeat`).
#[must_use]
pub fn workers_key(prefix: &str) -> String {
    format!("{prefix}:v{KEY_SCHEMA_VERSION}:workers:{{workers}}")
}

/// The worker registry's sorted set under `prefix`: worker id → when it last reported (server
/// ms), so that readers list the freshest first and a beat prunes the oldest.
#[must_use]
pub fn workers_seen_key(prefix: &str) -> String {
    format!("{}:seen", workers_key(prefix))
}

/// The journal of running replays and purges under `prefix` (`control::runs`): run id → its
/// last progress. After `v1:` comes `r`, never `{`.
#[must_use]
pub fn runs_key(prefix: &str) -> String {
    format!("{prefix}:v{KEY_SCHEMA_VERSION}:runs:{{runs}}")
}

/// The dead-letter index of the queue `queue` under `prefix` (`lua/dead_letters.lua`): row →
/// messages. After `v1:` comes `d`, never `{`, so it is never a budget key; the queue's name is
/// its hash tag.
#[must_use]
pub fn dead_letters_key(prefix: &str, queue: &str) -> String {
    format!("{prefix}:v{KEY_SCHEMA_VERSION}:dead-letters:{{{queue}}}")
}

/// The last batch that writer `writer` applied to the dead-letter index of `queue` under
/// `prefix` ([`crate::control::DeadLetterIndex::change_once`]): a hash whose field `last` is the
/// batch's sequence number, so that a batch sent again after a timeout is not counted twice;
/// it expires 10 minutes after its last write. After `v1:` comes `d`, never `{`, so it is never a
/// budget key; the queue's name is its hash tag (the index's slot).
#[must_use]
pub fn dead_letters_writer_key(prefix: &str, queue: &str, writer: &str) -> String {
    format!("{prefix}:v{KEY_SCHEMA_VERSION}:dead-letters-writer:{{{queue}}}:{writer}")
}

/// The moves of the replays of the queue `queue` under `prefix`
/// ([`crate::control::ReplayMoves`]): dead letter → the run that is moving it. After `v1:` comes
/// `r`, never `{`, so it is never a budget key; the queue's name is its hash tag.
#[must_use]
pub fn replay_moves_key(prefix: &str, queue: &str) -> String {
    format!("{prefix}:v{KEY_SCHEMA_VERSION}:replay-moves:{{{queue}}}")
}

/// The glob matching every budget key under `prefix`, for `SCAN`. The prefix is matched as
/// written: its glob characters (`*`, `?`, `[`, `]`, `\`), which a prefix may hold, are escaped,
/// so that `t[7]` finds the keys of `t[7]` and not those of `t7`.
#[must_use]
pub fn budget_key_pattern(prefix: &str) -> String {
    format!("{}:v{KEY_SCHEMA_VERSION}:{{*}}", glob_escaped(prefix))
}

/// `text` with its glob characters (`*`, `?`, `[`, `]`, `\`) escaped, to match as written.
fn glob_escaped(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len() + 4);
    for ch in text.chars() {
        if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(ch);
    }
    escaped
}

/// A list of a BullMQ queue's kept jobs under `prefix` ([`crate::control::bullmq`]), written by
/// the Node.js client and `budgetctl replay --bullmq-queue`:
/// `<prefix>:v1:bullmq-<list>:{<queue>}` (`list` is `kept`, `kept-dropped`, `replay` or
/// `parked`). After `v1:` comes `b`, never `{`, so it is never a budget key.
#[must_use]
pub fn bullmq_key(prefix: &str, list: &str, queue: &str) -> String {
    format!("{prefix}:v{KEY_SCHEMA_VERSION}:bullmq-{list}:{{{queue}}}")
}

/// The glob matching every list of kept BullMQ jobs under `prefix`, for `SCAN`.
#[must_use]
pub fn bullmq_key_pattern(prefix: &str) -> String {
    format!(
        "{}:v{KEY_SCHEMA_VERSION}:bullmq-*:{{*}}",
        glob_escaped(prefix)
    )
}

/// The list and the queue of a kept BullMQ jobs' key under `prefix`, if it is one.
#[must_use]
pub fn bullmq_list_of_key<'a>(prefix: &str, key: &'a str) -> Option<(&'a str, &'a str)> {
    let rest = key
        .strip_prefix(prefix)?
        .strip_prefix(&format!(":v{KEY_SCHEMA_VERSION}:bullmq-"))?;
    let (list, queue) = rest.split_once(":{")?;
    Some((list, queue.strip_suffix('}')?))
}

/// The dependency of a budget key under `prefix`, if it is one.
#[must_use]
pub fn dependency_of_key(prefix: &str, key: &str) -> Option<Dependency> {
    let rest = key
        .strip_prefix(prefix)?
        .strip_prefix(&format!(":v{KEY_SCHEMA_VERSION}:{{"))?;
    Dependency::new(rest.strip_suffix('}')?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_round_trip() {
        let d = Dependency::new("search").unwrap();
        let key = budget_key("fb", &d);
        assert_eq!(key, "fb:v1:{search}");
        assert_eq!(dependency_of_key("fb", &key), Some(d));
        assert_eq!(dependency_of_key("fb", "fb:v1:search"), None);
        assert_eq!(dependency_of_key("other", &key), None);
        assert_eq!(dependency_of_key("fb", &audit_key("fb")), None);
    }

    #[test]
    fn the_scan_pattern_matches_the_prefix_as_written() {
        assert_eq!(budget_key_pattern("fb"), "fb:v1:{*}");
        assert_eq!(budget_key_pattern(r"t[7]*?\"), r"t\[7\]\*\?\\:v1:{*}");
    }

    /// The registry's keys are never a dependency's, are not found by the budget `SCAN`, and
    /// share one Redis Cluster slot (a script takes both).
    #[test]
    fn the_worker_registry_keys_are_no_budget_keys_and_share_a_slot() {
        let (hash, seen) = (workers_key("fb"), workers_seen_key("fb"));
        assert_eq!(hash, "fb:v1:workers:{workers}");
        assert_eq!(seen, "fb:v1:workers:{workers}:seen");
        for key in [&hash, &seen] {
            assert_eq!(dependency_of_key("fb", key), None, "{key}");
            assert!(!glob_matches(&budget_key_pattern("fb"), key), "{key}");
        }
        assert!(glob_matches(&budget_key_pattern("fb"), "fb:v1:{workers}"));
        assert_eq!(hash_tag(&hash), "workers");
        assert_eq!(hash_tag(&seen), "workers");
        // No dependency can be named so that its key is a registry key: a name holds no brace.
        assert!(Dependency::new("workers}:seen").is_err());
    }

    /// Redis's hash tag: the text between the first `{` and the next `}`, when not empty.
    fn hash_tag(key: &str) -> &str {
        key.find('{')
            .and_then(|open| {
                let rest = &key[open + 1..];
                rest.find('}')
                    .filter(|&n| n > 0)
                    .map(|close| &rest[..close])
            })
            .unwrap_or(key)
    }

    /// Redis's `SCAN MATCH` glob for the patterns [`budget_key_pattern`] makes: `*`, and `\`
    /// escapes (no `?` or classes in an unescaped prefix here).
    fn glob_matches(pattern: &str, text: &str) -> bool {
        fn go(p: &[char], t: &[char]) -> bool {
            match p.split_first() {
                None => t.is_empty(),
                Some(('*', rest)) => (0..=t.len()).any(|i| go(rest, &t[i..])),
                Some(('\\', rest)) => match (rest.split_first(), t.split_first()) {
                    (Some((c, rest)), Some((d, t))) => c == d && go(rest, t),
                    _ => false,
                },
                Some((c, rest)) => t.split_first().is_some_and(|(d, t)| c == d && go(rest, t)),
            }
        }
        let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
        go(&p, &t)
    }
}
