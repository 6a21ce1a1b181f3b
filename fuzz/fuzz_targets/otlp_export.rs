#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| streamgate_otlp::fuzz::export(data));
