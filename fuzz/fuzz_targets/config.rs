//! The configuration parser: any text, as the budget's sections and as a worker's whole file
//! (`[amqp]` included). Must return a value or a `ConfigError`, never panic or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = fleet_budget::Config::from_toml(text, "fuzz.toml") {
        let _ = e.to_string();
    }
    match fleet_budget_amqp::WorkerConfig::from_toml(text, "fuzz.toml") {
        Ok(config) => {
            let _ = config.budget.redis_display();
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
