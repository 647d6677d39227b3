//! The Lua reply parser, fed what Redis could send: RESP bytes decoded by the redis crate, read
//! as the integer array the scripts return.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis::FromRedisValue;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = redis::parse_redis_value(data) else {
        return;
    };
    let Ok(reply) = Vec::<i64>::from_redis_value(value) else {
        return;
    };
    for script in ["spend", "deposit", "status"] {
        if let Ok((_, snapshot)) = fleet_budget::store::parse_reply(script, &reply) {
            let _ = snapshot.estimates();
        }
    }
});
