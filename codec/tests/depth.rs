//! Deep nesting is refused at `max_depth` without recursing further, even on a thread whose
//! stack is 64 KiB. The attack is first shown to be live: the same bytes overflow the stack of a
//! plain postcard decode, which kills its process (so that part runs in a child process).

use airlock_codec::{from_slice, DecodeError, Limits, Value, DEFAULT_MAX_DEPTH};
use airlock_test_support::ChildMode;
use serde::Deserialize;

const SMALL_STACK: usize = 64 * 1024;
const HOSTILE_LEVELS: usize = 200_000;

/// A recursive type: each level is a newtype around an option.
#[derive(Deserialize, Debug)]
#[allow(dead_code)]
struct Nest(Option<Box<Nest>>);

/// `Some(Some(...(None)))`, `levels` deep, in the typed wire format.
fn typed_nest(levels: usize) -> Vec<u8> {
    let mut bytes = vec![1u8; levels];
    bytes.push(0);
    bytes
}

/// `[[[...null...]]]`, `levels` deep, in the `Value` encoding.
fn value_nest(levels: usize) -> Vec<u8> {
    let mut bytes = [0x08, 0x01].repeat(levels);
    bytes.push(0x00);
    bytes
}

fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(SMALL_STACK)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

/// Decodes the hostile bytes with plain postcard on a small stack, which overflows it and
/// aborts the process: the child's part of the test below.
fn plain_postcard_on_small_stack() {
    on_small_stack(|| {
        let bytes = typed_nest(HOSTILE_LEVELS);
        let _ = postcard::from_bytes::<Nest>(&bytes);
    });
    println!("plain postcard survived");
}

#[test]
fn nesting_over_max_depth_is_refused_on_small_stack() {
    // 1. The attack is live: plain postcard recurses once per level and overflows the stack,
    // which aborts its process, so that part runs in a child: this test, re-run alone.
    let child = ChildMode::of(
        module_path!(),
        "nesting_over_max_depth_is_refused_on_small_stack",
    );
    if child.in_child() {
        plain_postcard_on_small_stack();
        return;
    }
    let output = child.command().output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(child.ran(&output.stdout), "the child never ran: {output:?}");
    assert!(
        !output.status.success(),
        "plain postcard survived: {output:?}"
    );
    assert!(
        stderr.contains("overflowed its stack"),
        "unexpected failure: {stderr}"
    );

    // 2. airlock refuses the identical bytes at the default depth, on the same small stack.
    let refused =
        on_small_stack(|| from_slice::<Nest>(&typed_nest(HOSTILE_LEVELS), &Limits::default()));
    assert_eq!(
        refused.unwrap_err(),
        DecodeError::DepthLimit {
            max: DEFAULT_MAX_DEPTH
        }
    );

    // 3. Nesting up to the budget decodes on the same stack: `n` `Some`s nest 2n + 1 levels.
    let within = on_small_stack(|| {
        from_slice::<Nest>(&typed_nest((DEFAULT_MAX_DEPTH - 1) / 2), &Limits::default()).is_ok()
    });
    assert!(within);
}

#[test]
fn value_nesting_over_max_depth_is_refused_on_small_stack() {
    let limits = Limits::default();
    let refused = on_small_stack(move || Value::from_slice(&value_nest(HOSTILE_LEVELS), &limits));
    assert_eq!(
        refused,
        Err(DecodeError::DepthLimit {
            max: DEFAULT_MAX_DEPTH
        })
    );
    // Exactly at the limit is fine; one more level is not.
    let at_limit =
        on_small_stack(move || Value::from_slice(&value_nest(DEFAULT_MAX_DEPTH), &limits).is_ok());
    assert!(at_limit);
    let over =
        on_small_stack(move || Value::from_slice(&value_nest(DEFAULT_MAX_DEPTH + 1), &limits));
    assert_eq!(
        over,
        Err(DecodeError::DepthLimit {
            max: DEFAULT_MAX_DEPTH
        })
    );
}

#[test]
fn depth_limit_is_exact_for_typed_values() {
    let limits = Limits::default().max_depth(10);
    // `n` `Some`s nest 2n + 1 levels (each `Nest` newtype, each `Some`, and the innermost
    // `Nest` around `None`): four fit in ten levels, five do not.
    assert!(from_slice::<Nest>(&typed_nest(4), &limits).is_ok());
    assert_eq!(
        from_slice::<Nest>(&typed_nest(5), &limits).unwrap_err(),
        DecodeError::DepthLimit { max: 10 }
    );
    // Sequences nest too.
    let deep_vec = [1u8, 1, 1, 0].to_vec(); // Vec<Vec<Vec<Vec<u8>>>> = [[[[]]]]
    assert!(
        from_slice::<Vec<Vec<Vec<Vec<u8>>>>>(&deep_vec, &Limits::default().max_depth(4)).is_ok()
    );
    assert_eq!(
        from_slice::<Vec<Vec<Vec<Vec<u8>>>>>(&deep_vec, &Limits::default().max_depth(3))
            .unwrap_err(),
        DecodeError::DepthLimit { max: 3 }
    );
}
