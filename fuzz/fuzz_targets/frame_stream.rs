//! A host session past its handshake, with calls in flight, fed arbitrary worker bytes in
//! arbitrary chunks: it must never panic, must complete every call exactly once, and must emit
//! `Closed` once, last.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    airlock_fuzz::frame_stream::check_frame_stream(data);
});
