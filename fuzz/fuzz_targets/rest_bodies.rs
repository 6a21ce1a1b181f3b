#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| streamgate::fuzz::rest_bodies(data));
