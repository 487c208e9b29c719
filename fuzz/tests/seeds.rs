//! The committed seed corpus is what `airlock_fuzz::seeds` and `airlock_fuzz::frame_stream`
//! generate, and each seed decodes, is refused, or (for `frame_stream`) ends its session as its
//! name says. `AIRLOCK_WRITE_SEEDS=1` rewrites the files instead of checking.

use std::path::{Path, PathBuf};

use airlock_codec::{from_slice, DecodeError, Value};
use airlock_fuzz::seeds::{self, Seed};
use airlock_fuzz::{check_typed, check_value, frame_decoder, frame_stream, limits, Message};

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

fn sync(target: &str, seeds: &[Seed]) {
    let files: Vec<(&str, &[u8])> = seeds.iter().map(|s| (s.name, &s.bytes[..])).collect();
    sync_files(target, &files);
}

fn sync_files(target: &str, seeds: &[(&str, &[u8])]) {
    let dir = corpus(target);
    let write = std::env::var_os("AIRLOCK_WRITE_SEEDS").is_some();
    if write {
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("seed-")
            {
                std::fs::remove_file(path).unwrap();
            }
        }
    }
    for &(name, bytes) in seeds {
        let path = dir.join(format!("seed-{name}"));
        if write {
            std::fs::write(&path, bytes).unwrap();
        } else {
            let committed = std::fs::read(&path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e}; regenerate with AIRLOCK_WRITE_SEEDS=1",
                    path.display()
                )
            });
            assert_eq!(
                committed,
                bytes,
                "{} is stale; regenerate with AIRLOCK_WRITE_SEEDS=1",
                path.display()
            );
        }
    }
}

fn check(seed: &Seed, outcome: Result<(), DecodeError>) {
    match (seed.refused_with, outcome) {
        (None, Ok(())) => {}
        (None, Err(e)) => panic!("valid seed {} refused: {e:?}", seed.name),
        (Some(_), Ok(())) => panic!("hostile seed {} decoded", seed.name),
        (Some(expected), Err(e)) => assert!(
            expected(&e),
            "hostile seed {} refused with {e:?}",
            seed.name
        ),
    }
}

#[test]
fn typed_seeds_decode_as_named_and_are_committed() {
    let seeds = seeds::typed();
    for seed in &seeds {
        check(
            seed,
            from_slice::<Message>(&seed.bytes, &limits()).map(drop),
        );
        check_typed(&seed.bytes);
    }
    sync("codec_typed", &seeds);
}

#[test]
fn value_seeds_decode_as_named_and_are_committed() {
    let seeds = seeds::value();
    for seed in &seeds {
        check(seed, Value::from_slice(&seed.bytes, &limits()).map(drop));
        check_value(&seed.bytes);
    }
    sync("codec_value", &seeds);
}

#[test]
fn frame_stream_seeds_do_as_named_and_are_committed() {
    let seeds = frame_stream::seeds();
    for (name, bytes, expected) in &seeds {
        let report = frame_stream::check_frame_stream(bytes);
        assert!(
            expected(&report),
            "seed {name} did not do as named: {report:?}"
        );
    }
    let files: Vec<(&str, &[u8])> = seeds.iter().map(|(n, b, _)| (*n, &b[..])).collect();
    sync_files("frame_stream", &files);
}

#[test]
fn frame_decoder_seeds_do_as_named_and_are_committed() {
    let seeds = frame_decoder::seeds();
    for (name, bytes, (frames, end)) in &seeds {
        let (got_frames, got_end) = frame_decoder::check_frame_decoder(bytes);
        assert_eq!(
            (got_frames.len(), &got_end),
            (*frames, end),
            "seed {name} did not do as named"
        );
    }
    let files: Vec<(&str, &[u8])> = seeds.iter().map(|(n, b, _)| (*n, &b[..])).collect();
    sync_files("frame_decoder", &files);
}
