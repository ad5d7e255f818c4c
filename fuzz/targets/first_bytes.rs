#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| linnet::fuzzing::first_bytes(data));
