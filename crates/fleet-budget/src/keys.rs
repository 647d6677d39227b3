//! The Redis key layout, version 1. Documented for other languages in `lua/README.md`.
//!
//! One hash per dependency: `<prefix>:v1:{<dependency>}`. The braces make the dependency the
//! Redis Cluster hash tag, so every key of a dependency lives in one slot and ACL key patterns
//! such as `~fb:v1:*` cover them all.

use crate::dependency::Dependency;

/// The key-schema version this build reads and writes.
pub const KEY_SCHEMA_VERSION: u32 = 1;

/// The budget hash of `dependency` under `prefix`.
#[must_use]
pub fn budget_key(prefix: &str, dependency: &Dependency) -> String {
    format!("{prefix}:v{KEY_SCHEMA_VERSION}:{{{dependency}}}")
}

/// The audit stream under `prefix`: every override, replay, purge and migration.
#[must_use]
pub fn audit_key(prefix: &str) -> String {
    format!("{prefix}:v{KEY_SCHEMA_VERSION}:audit")
}

/// The glob matching every budget key under `prefix`, for `SCAN`. The prefix is matched as
/// written: its glob characters (`*`, `?`, `[`, `]`, `\`), which a prefix may hold, are escaped,
/// so that `t[7]` finds the keys of `t[7]` and not those of `t7`.
#[must_use]
pub fn budget_key_pattern(prefix: &str) -> String {
    let mut escaped = String::with_capacity(prefix.len() + 4);
    for ch in prefix.chars() {
        if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(ch);
    }
    format!("{escaped}:v{KEY_SCHEMA_VERSION}:{{*}}")
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
}
