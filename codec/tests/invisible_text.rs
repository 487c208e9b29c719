//! Text that could hide content in a log or an error message: every invisible format character
//! counts as unsafe, and a decode error that quotes its input hides nothing.

use airlock_codec::{from_slice, is_unsafe_in_text, Limits, MAX_CUSTOM_MESSAGE};
use serde::de::{Deserialize, Deserializer, Error as _};

/// `is_unsafe_in_text` is the one predicate behind the error-message rule (protocol), the
/// escaping of decode errors (codec) and the stderr relay (host). It lists some ranges by hand
/// and misses other Unicode format characters (category Cf) and blank fillers, among them the
/// invisible "tag" characters U+E0000–E007F used to hide ASCII text in plain sight.
#[test]
fn every_invisible_format_character_is_unsafe_in_text() {
    let missed: Vec<String> = [
        '\u{00AD}',
        '\u{180E}',
        '\u{206A}',
        '\u{206F}',
        '\u{FFF9}',
        '\u{FFFB}',
        '\u{E0001}',
        '\u{E0041}',
        '\u{E007F}',
        '\u{3164}',
    ]
    .into_iter()
    .filter(|c| !is_unsafe_in_text(*c))
    .map(|c| format!("U+{:04X}", c as u32))
    .collect();
    assert!(missed.is_empty(), "not treated as unsafe: {missed:?}");
}

/// A request/response type that quotes the input in its error, as validating types do.
#[derive(Debug)]
struct Quoting;
impl<'de> Deserialize<'de> for Quoting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Err(D::Error::custom(format!("bad name {s:?}… or {s}")))
    }
}

/// Decode errors quote hostile input (`bounded_message`): the quoted text must come out with
/// nothing that hides text, whatever the type's own `Display` does.
#[test]
fn a_decode_error_quoting_input_hides_nothing() {
    let hidden: String = "rm -rf /"
        .chars()
        .map(|c| char::from_u32(0xE0000 + c as u32).unwrap())
        .collect();
    let input = airlock_codec::to_vec(&format!("ok{hidden}")).unwrap();
    let err = from_slice::<Quoting>(&input, &Limits::default()).unwrap_err();
    let text = err.to_string();
    assert!(text.len() <= MAX_CUSTOM_MESSAGE + 64, "{}", text.len());
    let hiding: Vec<String> = text
        .chars()
        .filter(|c| ('\u{E0000}'..='\u{E007F}').contains(c))
        .map(|c| format!("U+{:04X}", c as u32))
        .collect();
    assert!(
        hiding.is_empty(),
        "the decode error carries invisible text: {hiding:?}"
    );
}
