#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| streamgate::fuzz::s2s_frames(data));
