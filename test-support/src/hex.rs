//! Bytes as lowercase hex digits, two a byte, and back: how the suites write frames and ids
//! into logs and marks, and read them again.

/// `bytes` as lowercase hex, two digits a byte.
///
/// ```
/// assert_eq!(airlock_test_support::hex::encode(&[0x00, 0xab, 0x7f]), "00ab7f");
/// ```
pub fn encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

/// The bytes that `text` spells two hex digits each (either case), or `None` when `text` has
/// an odd length or anything but hex digits.
///
/// ```
/// use airlock_test_support::hex::decode;
///
/// assert_eq!(decode("00AB7f"), Some(vec![0x00, 0xab, 0x7f]));
/// assert_eq!(decode("abc"), None);
/// assert_eq!(decode("zz"), None);
/// ```
pub fn decode(text: &str) -> Option<Vec<u8>> {
    let digits = text.as_bytes();
    if digits.len() % 2 != 0 {
        return None;
    }
    digits
        .chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

fn digit(ascii: u8) -> Option<u8> {
    char::from(ascii)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_survives_the_round_trip() {
        let all: Vec<u8> = (0..=u8::MAX).collect();
        let text = encode(&all);
        assert_eq!(text.len(), 512);
        assert_eq!(decode(&text), Some(all));
    }

    #[test]
    fn signs_and_spaces_are_not_digits() {
        // `u8::from_str_radix` would take "+f" as 15.
        assert_eq!(decode("+f"), None);
        assert_eq!(decode(" f"), None);
        assert_eq!(decode(""), Some(vec![]));
    }
}
