//! What this process remembers of each budget hash it called (`lua/README.md`, "Lost budgets"):
//! the hash's birth, the overrides in force and the counters as its last reply showed them. The
//! budget scripts take it as two optional arguments and, when the hash is gone (evicted under a
//! `maxmemory-policy`, `FLUSHALL`, a restart without persistence) or is another one (another
//! birth), restore what still counts before deciding, and say so (`lost`).
//!
//! One entry per budget key this store called: bounded by the dependencies of the
//! configuration, and by [`MAX_REMEMBERED`] whatever happens.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use redis::Value;

use super::reply::{int_at, text_at};
use crate::allowance::{BudgetSnapshot, WindowCounters};
use crate::error::StoreError;

/// The most budget keys remembered; keys past it are called without memory (as before 0.2.0).
pub(super) const MAX_REMEMBERED: usize = 100_000;

/// How many fields the scripts append for a caller that sent its memory.
pub(super) const MEMORY_FIELDS: usize = 6;

/// What a reply said of the hash, beyond the budget: the fields a caller with memory gets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct HashState {
    /// The hash's birth (server ms it was created).
    pub(super) birth: u64,
    /// When the freeze in force ends (server ms; 0: none).
    pub(super) freeze_until: u64,
    /// When the set override ends (server ms; 0: none).
    pub(super) set_until: u64,
    /// The set override's ratio and floor, as text ("" when absent).
    pub(super) set_ratio: String,
    /// The set override's floor, as text ("" when absent).
    pub(super) set_min: String,
    /// The call found the hash this process remembered gone, and restored what still counted.
    pub(super) lost: bool,
}

/// One budget as this process last saw it.
#[derive(Debug, Clone, Default)]
struct Seen {
    state: HashState,
    window_ms: u64,
    window_index: u64,
    current: WindowCounters,
    previous: WindowCounters,
}

/// Per budget key, what this process last saw.
#[derive(Debug, Default)]
pub(super) struct Memory {
    seen: Mutex<HashMap<String, Seen>>,
}

fn counters(c: &WindowCounters) -> [u64; 4] {
    [c.successes, c.first_attempts, c.retries, c.denied]
}

impl Memory {
    /// The two arguments the scripts take after their own: the birth last seen (`""`: none)
    /// and `fu,su,sr,sm,w,i,cs,ca,cr,cd,ps,pa,pr,pd`.
    pub(super) fn args(&self, key: &str) -> [String; 2] {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(s) = seen.get(key) else {
            return [String::new(), String::new()];
        };
        let [cs, ca, cr, cd] = counters(&s.current);
        let [ps, pa, pr, pd] = counters(&s.previous);
        [
            s.state.birth.to_string(),
            format!(
                "{},{},{},{},{},{},{cs},{ca},{cr},{cd},{ps},{pa},{pr},{pd}",
                s.state.freeze_until,
                s.state.set_until,
                s.state.set_ratio,
                s.state.set_min,
                s.window_ms,
                s.window_index,
            ),
        ]
    }

    /// Remembers `key` as the reply showed it.
    pub(super) fn learn(&self, key: &str, state: &HashState, snapshot: &BudgetSnapshot) {
        let entry = Seen {
            state: HashState {
                lost: false,
                ..state.clone()
            },
            window_ms: snapshot.window_ms,
            window_index: snapshot.window_index,
            current: snapshot.current,
            previous: snapshot.previous,
        };
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.len() < MAX_REMEMBERED || seen.contains_key(key) {
            seen.insert(key.to_owned(), entry);
        }
    }

    /// Forgets everything (a test that empties Redis on purpose and wants no restore).
    pub(super) fn clear(&self) {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// Splits a reply to a caller that sent its memory: the reply as it was, and the six fields
/// after it (`lua/README.md`, "Lost budgets").
pub(super) fn split(
    script: &'static str,
    reply: &[Value],
) -> Result<(usize, HashState), StoreError> {
    let bad = |detail: String| StoreError::BadReply { script, detail };
    let at = reply
        .len()
        .checked_sub(MEMORY_FIELDS)
        .filter(|at| *at >= 17)
        .ok_or_else(|| bad(format!("{} fields, without the memory fields", reply.len())))?;
    let count = |index: usize| -> Result<u64, StoreError> {
        let v = int_at(reply, index).map_err(bad)?;
        u64::try_from(v).map_err(|_| bad(format!("field {} is negative: {v}", index + 1)))
    };
    let text = |index: usize| -> Result<String, StoreError> {
        let t = text_at(reply, index).map_err(bad)?;
        // Sent back as one of the memory's comma-separated fields: at most 32 printable
        // characters, no comma (the scripts check the number itself).
        if t.len() > 32 || !t.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
            return Err(bad(format!("field {} is not a number: {t:?}", index + 1)));
        }
        Ok(t)
    };
    let lost = count(at + 5)?;
    Ok((
        at,
        HashState {
            birth: count(at)?,
            freeze_until: count(at + 1)?,
            set_until: count(at + 2)?,
            set_ratio: text(at + 3)?,
            set_min: text(at + 4)?,
            lost: lost == 1,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(tail: Vec<Value>) -> Vec<Value> {
        let mut r: Vec<Value> = (0..17).map(|_| Value::Int(0)).collect();
        r.extend(tail);
        r
    }

    #[test]
    fn the_six_fields_are_read_and_nothing_else_is_taken_for_them() {
        let good = reply(vec![
            Value::Int(7),
            Value::Int(100),
            Value::Int(0),
            Value::BulkString(b"0.5".to_vec()),
            Value::BulkString(Vec::new()),
            Value::Int(1),
        ]);
        let (at, state) = split("spend", &good).unwrap();
        assert_eq!(at, 17);
        assert_eq!(
            state,
            HashState {
                birth: 7,
                freeze_until: 100,
                set_until: 0,
                set_ratio: "0.5".to_owned(),
                set_min: String::new(),
                lost: true,
            }
        );
        assert!(
            split("spend", &reply(Vec::new())).is_err(),
            "no memory fields"
        );
        for (index, bad) in [
            (17, Value::Int(-1)),
            (20, Value::BulkString(b"1,2".to_vec())),
            (21, Value::BulkString(vec![b'1'; 33])),
            (22, Value::BulkString(b"1".to_vec())),
        ] {
            let mut r = good.clone();
            r[index] = bad;
            assert!(split("spend", &r).is_err(), "{r:?}");
        }
    }

    #[test]
    fn memory_is_sent_as_the_scripts_read_it_and_bounded() {
        let memory = Memory::default();
        assert_eq!(memory.args("k"), [String::new(), String::new()]);
        let snapshot = BudgetSnapshot {
            window_ms: 60_000,
            window_index: 9,
            current: WindowCounters {
                successes: 1,
                first_attempts: 2,
                retries: 3,
                denied: 4,
            },
            previous: WindowCounters {
                successes: 5,
                first_attempts: 6,
                retries: 7,
                denied: 8,
            },
            ..BudgetSnapshot::default()
        };
        let state = HashState {
            birth: 42,
            freeze_until: 99,
            set_until: 0,
            set_ratio: String::new(),
            set_min: "3".to_owned(),
            lost: true,
        };
        memory.learn("k", &state, &snapshot);
        assert_eq!(
            memory.args("k"),
            [
                "42".to_owned(),
                "99,0,,3,60000,9,1,2,3,4,5,6,7,8".to_owned()
            ]
        );
        memory.clear();
        assert_eq!(memory.args("k")[0], "");
    }
}
