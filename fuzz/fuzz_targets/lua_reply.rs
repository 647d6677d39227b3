//! The Lua reply parser, fed what Redis could send: RESP bytes decoded by the redis crate, read
//! as the array the scripts return.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = redis::parse_redis_value(data) else {
        return;
    };
    let redis::Value::Array(reply) = value else {
        return;
    };
    // The caller's policy fills in the policy in force when a reply leaves it out (no conflict).
    let caller = fleet_budget::BudgetPolicy::default();
    for script in ["spend", "deposit", "status"] {
        let _ = fleet_budget::store::parse_reply(script, &reply, &caller);
    }
});
