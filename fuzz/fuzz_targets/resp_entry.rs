#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| streamgate_resp::fuzz::entry_round_trip(data));
