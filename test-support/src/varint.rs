//! LEB128 varints as postcard writes them: seven bits a byte, least significant group first,
//! the top bit set on every byte but the last.

/// `value` as postcard's varint: the fewest bytes that hold it (1 to 10).
///
/// ```
/// use airlock_test_support::varint::encode;
///
/// assert_eq!(encode(0), [0x00]);
/// assert_eq!(encode(127), [0x7f]);
/// assert_eq!(encode(128), [0x80, 0x01]);
/// assert_eq!(encode(u64::MAX).len(), 10);
/// ```
pub fn encode(mut value: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(10);
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
    out
}

/// Reads a varint from the front of `bytes` the way a trusting hand-rolled parser does, and
/// returns its value and the bytes after it; `None` only when the input ends inside it.
///
/// Nothing is checked: an overlong encoding (`80 00` for 0) is read as its value, and groups
/// past bit 63 are dropped, so many byte strings read as the same `u64`. The suites use it to
/// show what hostile bytes do to a decoder that trusts them, and to read what a peer claimed;
/// airlock's own decoder refuses both forms.
///
/// ```
/// use airlock_test_support::varint::read_unchecked;
///
/// assert_eq!(read_unchecked(&[0x80, 0x01, 0xaa]), Some((128, &[0xaa][..])));
/// assert_eq!(read_unchecked(&[0x80, 0x00]), Some((0, &[][..]))); // overlong, accepted
/// assert_eq!(read_unchecked(&[0x80]), None);
/// ```
pub fn read_unchecked(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate() {
        let group = u64::from(byte & 0x7f);
        // A shift of 64 or more drops the group, as a parser that never checks the width does.
        let shift = u32::try_from(7 * i).unwrap_or(u32::MAX);
        value |= group.checked_shl(shift).unwrap_or(0);
        if byte & 0x80 == 0 {
            return Some((value, &bytes[i + 1..]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_encoded_reads_back_with_nothing_left() {
        for value in [0, 1, 127, 128, 300, 1 << 32, 1 << 63, u64::MAX] {
            let bytes = encode(value);
            assert_eq!(read_unchecked(&bytes), Some((value, &[][..])), "{value}");
        }
    }

    #[test]
    fn eleven_bytes_read_as_a_u64_whose_encoding_is_other_bytes() {
        let mut eleven = vec![0xff; 10];
        eleven.push(0x01);
        let (value, rest) = read_unchecked(&eleven).unwrap();
        assert!(rest.is_empty());
        assert_eq!(value, u64::MAX);
        assert_ne!(encode(value), eleven);
    }
}
