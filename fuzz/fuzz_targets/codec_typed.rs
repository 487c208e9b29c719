//! Arbitrary bytes decoded into a representative message type under tight limits; whatever
//! decodes must re-encode to exactly the input bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_fuzz::check_typed(data));
