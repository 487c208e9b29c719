//! The codec's errors: one variant per cause, each budget variant naming the limit it hit.

use alloc::string::String;
use core::fmt;

/// The longest message kept from a target type's own `Deserialize`/`Serialize` error.
///
/// Such messages can quote input; keeping them short bounds what a hostile peer can make the
/// host store or log through them.
pub const MAX_CUSTOM_MESSAGE: usize = 256;

/// Why input was refused. Decoding stops at the first fault; nothing partial is returned.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input is longer than [`Limits::max_bytes`](crate::Limits::max_bytes); it was not read.
    InputTooLong {
        /// Length of the input, in bytes.
        len: usize,
        /// The budget.
        max: usize,
    },
    /// The input ended before the value did, or a length prefix promised more bytes than remain.
    UnexpectedEnd {
        /// Bytes the decoder needed at that point.
        needed: u64,
        /// Bytes that remained.
        remaining: usize,
    },
    /// The value ended before the input did.
    TrailingBytes {
        /// How many bytes were left over.
        count: usize,
    },
    /// Nesting went deeper than [`Limits::max_depth`](crate::Limits::max_depth).
    DepthLimit {
        /// The budget, in levels.
        max: usize,
    },
    /// More elements and map entries than [`Limits::max_items`](crate::Limits::max_items).
    ItemLimit {
        /// The budget, in items over the whole value.
        max: usize,
    },
    /// A string or byte string longer than [`Limits::max_len`](crate::Limits::max_len).
    LengthLimit {
        /// The length the input declared.
        len: u64,
        /// The budget, in bytes.
        max: usize,
    },
    /// A varint used more bytes than its value needs (a trailing zero group).
    OverlongVarint,
    /// A varint encodes a value wider than the integer it is read into.
    VarintOverflow,
    /// A string is not valid UTF-8.
    InvalidUtf8,
    /// A `char` is not exactly one Unicode scalar value.
    InvalidChar,
    /// A `bool` byte other than 0 or 1.
    BadBool(u8),
    /// An `Option` tag other than 0 (`None`) or 1 (`Some`).
    BadOptionTag(u8),
    /// An enum variant index beyond the variants the target type declares.
    BadEnumTag {
        /// The index read.
        tag: u32,
        /// How many variants the target type has.
        variants: usize,
    },
    /// A [`Value`](crate::Value) tag byte outside the closed set.
    BadValueTag(u8),
    /// A [`Value`](crate::Value) map key tag that is not a string or an integer.
    BadKeyTag(u8),
    /// A [`Value`](crate::Value) map names the same key twice.
    DuplicateMapKey,
    /// An integer does not fit the target type (dynamic conversions only).
    IntegerOutOfRange,
    /// The target type asked for self-description (`deserialize_any`), which the typed wire
    /// format does not carry. Decode into a concrete type, or use [`Value`](crate::Value).
    SelfDescribingUnsupported,
    /// The target type's own `Deserialize` refused the value (unknown variant name, a failed
    /// validation...). The message is cut at [`MAX_CUSTOM_MESSAGE`] bytes.
    Custom(String),
}

/// Why a value could not be encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// The output slice is too small for the encoding.
    BufferFull,
    /// A sequence or map did not state its length up front, which the wire format requires.
    LengthUnknown,
    /// A map key is not a string or an integer (dynamic [`Value`](crate::Value) maps only).
    UnsupportedMapKey,
    /// An integer does not fit the dynamic model's 64 bits.
    IntegerOutOfRange,
    /// The value's own `Serialize` failed. The message is cut at [`MAX_CUSTOM_MESSAGE`] bytes
    /// (empty when the wire encoder reports none).
    Custom(String),
}

impl DecodeError {
    /// The budget this error hit, as the name of the [`Limits`](crate::Limits) setter that
    /// changes it and the budget's value; `None` when the input was malformed rather than
    /// over a budget.
    ///
    /// ```
    /// use airlock_codec::{from_slice, to_vec, Limits};
    /// let bytes = to_vec(&vec![1u32, 2, 3]).unwrap();
    /// let err = from_slice::<Vec<u32>>(&bytes, &Limits::default().max_items(2)).unwrap_err();
    /// assert_eq!(err.budget(), Some(("max_items", 2)));
    /// ```
    pub fn budget(&self) -> Option<(&'static str, usize)> {
        match *self {
            Self::InputTooLong { max, .. } => Some(("max_bytes", max)),
            Self::DepthLimit { max } => Some(("max_depth", max)),
            Self::ItemLimit { max } => Some(("max_items", max)),
            Self::LengthLimit { max, .. } => Some(("max_len", max)),
            Self::UnexpectedEnd { .. }
            | Self::TrailingBytes { .. }
            | Self::OverlongVarint
            | Self::VarintOverflow
            | Self::InvalidUtf8
            | Self::InvalidChar
            | Self::BadBool(_)
            | Self::BadOptionTag(_)
            | Self::BadEnumTag { .. }
            | Self::BadValueTag(_)
            | Self::BadKeyTag(_)
            | Self::DuplicateMapKey
            | Self::IntegerOutOfRange
            | Self::SelfDescribingUnsupported
            | Self::Custom(_) => None,
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InputTooLong { len, max } => write!(
                f,
                "input of {len} bytes is over the byte budget of {max} (Limits::max_bytes)"
            ),
            Self::UnexpectedEnd { needed, remaining } => {
                write!(f, "input ended: needed {needed} bytes, {remaining} remain")
            }
            Self::TrailingBytes { count } => write!(f, "{count} trailing bytes after the value"),
            Self::DepthLimit { max } => write!(
                f,
                "nesting is deeper than the depth budget of {max} levels (Limits::max_depth)"
            ),
            Self::ItemLimit { max } => write!(
                f,
                "more than {max} elements and map entries in one value, the item budget \
                 (Limits::max_items)"
            ),
            Self::LengthLimit { len, max } => write!(
                f,
                "a string, byte string or byte sequence of {len} bytes is over the length \
                 budget of {max} (Limits::max_len)"
            ),
            Self::OverlongVarint => f.write_str("overlong varint"),
            Self::VarintOverflow => f.write_str("varint overflows its integer type"),
            Self::InvalidUtf8 => f.write_str("string is not valid UTF-8"),
            Self::InvalidChar => f.write_str("char is not exactly one scalar value"),
            Self::BadBool(b) => write!(f, "bool byte {b:#04x} is neither 0 nor 1"),
            Self::BadOptionTag(b) => write!(f, "option tag {b:#04x} is neither 0 nor 1"),
            Self::BadEnumTag { tag, variants } => {
                write!(
                    f,
                    "enum tag {tag} out of range (type has {variants} variants)"
                )
            }
            Self::BadValueTag(b) => write!(f, "unknown value tag {b:#04x}"),
            Self::BadKeyTag(b) => write!(f, "map key tag {b:#04x} is not a string or integer"),
            Self::DuplicateMapKey => f.write_str("duplicate map key"),
            Self::IntegerOutOfRange => f.write_str("integer out of range for the target type"),
            Self::SelfDescribingUnsupported => {
                f.write_str("target type needs a self-describing format (deserialize_any)")
            }
            Self::Custom(msg) => write!(f, "target type refused the value: {msg}"),
        }
    }
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BufferFull => f.write_str("output buffer too small"),
            Self::LengthUnknown => f.write_str("sequence or map length must be known up front"),
            Self::UnsupportedMapKey => f.write_str("map key is not a string or an integer"),
            Self::IntegerOutOfRange => f.write_str("integer does not fit in 64 bits"),
            Self::Custom(msg) => write!(f, "value failed to serialize: {msg}"),
        }
    }
}

impl core::error::Error for DecodeError {}
impl core::error::Error for EncodeError {}

/// True for characters that can forge or hide text where a message is shown: control
/// characters (Cc), line and paragraph separators (Zl, Zp), format characters (Cf: bidi
/// controls, zero-width characters, tags, interlinear annotations...), and every other
/// Unicode default-ignorable code point (variation selectors, fillers, invisible operators).
///
/// The ranges are Unicode 16's `General_Category=Cf|Cc|Zl|Zp` and
/// `Default_Ignorable_Code_Point`, written out because `core` has no category tables. Such
/// characters are refused in error messages from a worker and escaped or replaced wherever a
/// host shows text that came from one.
pub fn is_unsafe_in_text(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{00AD}'                    // soft hyphen
            | '\u{034F}'                  // combining grapheme joiner
            | '\u{0600}'..='\u{0605}'     // Arabic number signs (Cf)
            | '\u{061C}'                  // Arabic letter mark
            | '\u{06DD}' | '\u{070F}'     // Arabic/Syriac end-of-ayah marks (Cf)
            | '\u{0890}'..='\u{0891}' | '\u{08E2}'
            | '\u{115F}'..='\u{1160}'     // Hangul fillers
            | '\u{17B4}'..='\u{17B5}'     // Khmer inherent vowels
            | '\u{180B}'..='\u{180F}'     // Mongolian variation selectors and vowel separator
            | '\u{200B}'..='\u{200F}'     // zero-width space/joiners, LRM, RLM
            | '\u{2028}'..='\u{202E}'     // line/paragraph separators, bidi embeddings
            | '\u{2060}'..='\u{206F}'     // word joiner, invisible operators, bidi isolates
            | '\u{3164}'                  // Hangul filler
            | '\u{FE00}'..='\u{FE0F}'     // variation selectors
            | '\u{FEFF}'                  // zero-width no-break space (BOM)
            | '\u{FFA0}'                  // halfwidth Hangul filler
            | '\u{FFF0}'..='\u{FFFB}'     // unassigned specials, interlinear annotations
            | '\u{110BD}' | '\u{110CD}'   // Kaithi number signs (Cf)
            | '\u{13430}'..='\u{1345F}'   // Egyptian hieroglyph format controls
            | '\u{1BCA0}'..='\u{1BCA3}'   // shorthand format controls
            | '\u{1D173}'..='\u{1D17A}'   // musical symbol format controls
            | '\u{E0000}'..='\u{E0FFF}') // tags and variation selectors supplement
}

/// Keeps at most [`MAX_CUSTOM_MESSAGE`] bytes of `msg`, cut on a character boundary, with every
/// [unsafe character](is_unsafe_in_text) escaped (`\n`, `\u{202e}`): such messages can quote
/// hostile input, which must not reach a log or terminal as live text.
pub(crate) fn bounded_message(msg: &dyn fmt::Display) -> String {
    use core::fmt::Write;
    struct Bounded(String);
    impl Bounded {
        fn push(&mut self, piece: &str) -> fmt::Result {
            if self.0.len() + piece.len() > MAX_CUSTOM_MESSAGE {
                return Err(fmt::Error); // full: stop the formatter, the rest is dropped
            }
            self.0.push_str(piece);
            Ok(())
        }
    }
    impl Write for Bounded {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            let mut utf8 = [0u8; 4];
            for c in s.chars() {
                if is_unsafe_in_text(c) {
                    for e in c.escape_default() {
                        self.push(e.encode_utf8(&mut utf8))?;
                    }
                } else {
                    self.push(c.encode_utf8(&mut utf8))?;
                }
            }
            Ok(())
        }
    }
    let mut out = Bounded(String::new());
    let _ = write!(out, "{msg}");
    out.0
}

impl serde::de::Error for DecodeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self::Custom(bounded_message(&msg))
    }
}

impl serde::ser::Error for EncodeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self::Custom(bounded_message(&msg))
    }
}
