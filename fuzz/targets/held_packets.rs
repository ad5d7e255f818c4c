#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| linnet::fuzzing::held_packets(data));
