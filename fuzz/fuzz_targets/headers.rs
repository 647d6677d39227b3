//! The job (retry) and dead-letter header parsers, fed a header table decoded from AMQP wire bytes as
//! the broker would deliver it; the copies written for replay and parking are re-parsed.
#![no_main]

use amq_protocol_types::parsing::parse_field_table;
use fleet_budget_amqp::headers::{park_headers, replay_headers};
use fleet_budget_amqp::{DeadLetterRecord, JobHeaders};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok((_, table)) = parse_field_table(data) else {
        return;
    };
    let _ = JobHeaders::parse(&table);
    if let Ok(record) = DeadLetterRecord::parse(&table) {
        // A record that parsed writes headers that parse back.
        let mut written = table.clone();
        record.write(&mut written);
        assert!(DeadLetterRecord::parse(&written).is_ok());
    }
    let replayed = replay_headers(&table, 1);
    let _ = JobHeaders::parse(&replayed);
    let parked = park_headers(&table, "fuzz");
    let _ = DeadLetterRecord::parse(&parked);
});
