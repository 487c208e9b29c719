//! Arbitrary bytes decoded as a dynamic `Value` under tight limits; whatever decodes must
//! re-encode to bytes that decode again to the same value.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_fuzz::check_value(data));
