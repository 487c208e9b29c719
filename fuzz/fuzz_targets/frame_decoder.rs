//! The frame decoder fed frames of every size class, every way a transport may, held to a
//! plain parser (`airlock_fuzz::frame_decoder`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // The check panics on any difference; what it returns is for the seed test.
    let _frames_and_end = airlock_fuzz::frame_decoder::check_frame_decoder(data);
});
