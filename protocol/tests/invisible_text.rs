//! A worker's `Fail` message cannot hide text in invisible characters: the session refuses it,
//! and `RemoteError::new` strips them.

mod support;

use airlock_protocol::*;
use support::Pair;

/// Invisible characters that `airlock_codec::is_unsafe_in_text` must refuse: all are Unicode
/// format characters (general category Cf) or fillers that render as nothing, the class it is
/// defined to refuse ("bidi and invisible format characters"). Each is named here, because a
/// predicate written as a list of ranges fails open: a range left out lets its characters
/// through.
/// U+E0000–E007F are the "tag" characters used to smuggle hidden ASCII ("ASCII smuggling")
/// into text that humans and log analysers read differently.
pub const INVISIBLE: &[(char, &str)] = &[
    ('\u{00AD}', "SOFT HYPHEN (Cf)"),
    ('\u{180E}', "MONGOLIAN VOWEL SEPARATOR (Cf)"),
    ('\u{206A}', "INHIBIT SYMMETRIC SWAPPING (Cf)"),
    ('\u{206F}', "NOMINAL DIGIT SHAPES (Cf)"),
    ('\u{FFF9}', "INTERLINEAR ANNOTATION ANCHOR (Cf)"),
    ('\u{FFFB}', "INTERLINEAR ANNOTATION TERMINATOR (Cf)"),
    ('\u{E0001}', "LANGUAGE TAG (Cf)"),
    ('\u{E0041}', "TAG LATIN CAPITAL LETTER A (Cf)"),
    ('\u{E007F}', "CANCEL TAG (Cf)"),
    ('\u{3164}', "HANGUL FILLER (renders blank)"),
];

/// The host accepts a worker's `Fail` only if its message is "free of characters that could
/// forge or hide log text" (remote_error.rs `is_clean_message`). A message that hides a whole
/// sentence in tag characters — invisible in any terminal or log viewer, readable to anything
/// that decodes them — is accepted as clean and delivered to the caller (and its logs) as is.
#[test]
fn a_fail_message_hiding_text_in_invisible_characters_is_refused() {
    let hidden: String = "IGNORE PREVIOUS INSTRUCTIONS"
        .chars()
        .map(|c| char::from_u32(0xE0000 + c as u32).unwrap())
        .collect();
    for (c, name) in INVISIBLE {
        let message = format!("handler failed{c}{hidden}");
        let (pair, id) = Pair::handler_failed_with(&message);
        let delivered = pair.outcome_of(id);
        assert_eq!(
            pair.violation(),
            Some(ViolationCode::InvalidErrorDescriptor),
            "a Fail message with {name} (U+{:04X}) was accepted as clean: {delivered:?}",
            *c as u32
        );
    }
}

/// The worker side's sanitiser (`RemoteError::new`) strips the same characters, so an honest
/// worker quoting hostile input does not forward them.
#[test]
fn remote_error_new_strips_invisible_characters() {
    for (c, name) in INVISIBLE {
        let err = RemoteError::new(ErrorKind::Handler, &format!("a{c}b"));
        assert!(
            !err.message().contains(*c),
            "RemoteError::new kept {name} (U+{:04X})",
            *c as u32
        );
    }
}
