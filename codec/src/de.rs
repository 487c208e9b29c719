//! Typed decoding: the postcard wire format, read strictly and within [`Limits`].
//!
//! What a byte string may become is fixed by the caller's Rust type: this deserializer never
//! looks a type up from the input and refuses `deserialize_any`. Each nesting level is entered
//! through [`Reader::enter`], each element through [`Reader::reserve_items`], each string
//! through [`Reader::length_prefixed`], so every budget is checked before its cost is paid.

use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};

use crate::reader::Reader;
use crate::{DecodeError, Limits};

/// Decodes one `T` from the whole of `input`, in the postcard wire format, within `limits`.
///
/// Refuses: input over `max_bytes`; nesting over `max_depth`; more than `max_items` elements;
/// strings over `max_len`; any length prefix beyond the remaining input; invalid UTF-8;
/// bool/option/enum tags out of range; overlong or overflowing varints; trailing bytes. Borrowed
/// `&str` and `&[u8]` fields point into `input` without copying.
///
/// ```
/// use airlock_codec::{from_slice, to_vec, Limits, DecodeError};
/// let bytes = to_vec(&(7u32, "seven")).unwrap();
/// let back: (u32, &str) = from_slice(&bytes, &Limits::default()).unwrap();
/// assert_eq!(back, (7, "seven"));
///
/// let mut trailing = bytes.clone();
/// trailing.push(0);
/// let err = from_slice::<(u32, &str)>(&trailing, &Limits::default()).unwrap_err();
/// assert_eq!(err, DecodeError::TrailingBytes { count: 1 });
/// ```
pub fn from_slice<'de, T: de::Deserialize<'de>>(
    input: &'de [u8],
    limits: &Limits,
) -> Result<T, DecodeError> {
    from_slice_counted(input, limits).map(|(value, _items)| value)
}

/// [`from_slice`], also giving the number of items (sequence elements and map entries) the
/// decode charged against [`Limits::max_items`].
///
/// With the input's length, the count bounds what the value holds in memory, for a caller that
/// keeps many decoded values and must budget them together: a thousand empty strings are a few
/// bytes of input but a thousand `String`s in memory.
///
/// ```
/// use airlock_codec::{from_slice_counted, to_vec, Limits};
/// let bytes = to_vec(&vec![String::new(); 1000]).unwrap();
/// assert!(bytes.len() < 1010);
/// let (back, items) = from_slice_counted::<Vec<String>>(&bytes, &Limits::default()).unwrap();
/// assert_eq!((back.len(), items), (1000, 1000));
/// ```
pub fn from_slice_counted<'de, T: de::Deserialize<'de>>(
    input: &'de [u8],
    limits: &Limits,
) -> Result<(T, usize), DecodeError> {
    let mut de = Deserializer {
        reader: Reader::new(input, limits)?,
    };
    let value = T::deserialize(&mut de)?;
    de.reader.finish()?;
    Ok((value, de.reader.items_spent()))
}

/// The serde deserializer behind [`from_slice`].
struct Deserializer<'de> {
    reader: Reader<'de>,
}

impl<'de> Deserializer<'de> {
    /// Runs `f` one nesting level deeper.
    #[inline]
    fn nested<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, DecodeError>,
    ) -> Result<T, DecodeError> {
        self.reader.enter()?;
        let out = f(self);
        self.reader.leave();
        out
    }

    /// Visits a sequence whose element count came from the input. Each element is charged as
    /// it is decoded ([`Element`]): a lone `u8` or `i8` to the bytes it is read from, anything
    /// else to the item budget. A count that both budgets together could never pay for is
    /// refused before the first element.
    fn counted_elements<V: Visitor<'de>>(
        &mut self,
        count: u64,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        let count = self.reader.plausible_count(count)?;
        self.reader.enter()?;
        let hint = self.reader.cautious_hint(count);
        let mut access = CountedElements {
            de: self,
            count,
            left: count,
            bytes: 0,
            hint,
            contiguous: core::cell::Cell::new(false),
        };
        let value = visitor.visit_seq(&mut access);
        let left = access.left;
        self.reader.leave();
        // As in `elements`: a visitor that stops early is refused plainly.
        if left != 0 && value.is_ok() {
            return Err(too_few_elements(count));
        }
        value
    }

    /// Visits `count` elements one level deeper. Used directly for tuples, structs and variants,
    /// whose arity comes from the Rust type rather than the input.
    #[inline]
    fn fixed_elements<V: Visitor<'de>>(
        &mut self,
        count: usize,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.reader.enter()?;
        let out = self.elements(count, 0, visitor);
        self.reader.leave();
        out
    }

    /// Visits exactly `count` elements, offering `hint` as the capacity to pre-allocate.
    #[inline]
    fn elements<V: Visitor<'de>>(
        &mut self,
        count: usize,
        hint: usize,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        let mut access = Elements {
            de: self,
            left: count,
            hint,
        };
        let value = visitor.visit_seq(&mut access);
        // A visitor that stops early would leave elements unread; refuse that plainly
        // rather than as confusing trailing bytes. (The visitor's result is passed on as it
        // is, not unwrapped and rewrapped: a struct is then moved once, not twice.)
        if access.left != 0 && value.is_ok() {
            return Err(too_few_elements(count));
        }
        value
    }

    fn zigzag(raw: u64) -> i64 {
        ((raw >> 1) as i64) ^ -((raw & 1) as i64)
    }
}

#[cold]
fn too_few_elements(count: usize) -> DecodeError {
    de::Error::invalid_length(count, &"fewer elements")
}

/// Converts a varint already bounded to the target's width.
fn narrow<T: TryFrom<u64>>(raw: u64) -> Result<T, DecodeError> {
    T::try_from(raw).map_err(|_| DecodeError::VarintOverflow)
}

impl<'de> de::Deserializer<'de> for &mut Deserializer<'de> {
    type Error = DecodeError;

    fn is_human_readable(&self) -> bool {
        false
    }

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, DecodeError> {
        Err(DecodeError::SelfDescribingUnsupported)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, DecodeError> {
        Err(DecodeError::SelfDescribingUnsupported)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.reader.byte()? {
            0 => visitor.visit_bool(false),
            1 => visitor.visit_bool(true),
            other => Err(DecodeError::BadBool(other)),
        }
    }

    fn deserialize_i8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_i8(self.reader.byte()? as i8)
    }

    fn deserialize_i16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        let raw = self.reader.varint::<16>()?;
        // A 16-bit varint zigzag-decodes into i16's range exactly.
        visitor.visit_i16(Deserializer::zigzag(raw) as i16)
    }

    fn deserialize_i32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        let raw = self.reader.varint::<32>()?;
        visitor.visit_i32(Deserializer::zigzag(raw) as i32)
    }

    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        let raw = self.reader.varint::<64>()?;
        visitor.visit_i64(Deserializer::zigzag(raw))
    }

    fn deserialize_i128<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        let raw = self.reader.varint_u128()?;
        visitor.visit_i128(((raw >> 1) as i128) ^ -((raw & 1) as i128))
    }

    fn deserialize_u8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_u8(self.reader.byte()?)
    }

    fn deserialize_u16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_u16(narrow(self.reader.varint::<16>()?)?)
    }

    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_u32(narrow(self.reader.varint::<32>()?)?)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_u64(self.reader.varint::<64>()?)
    }

    fn deserialize_u128<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_u128(self.reader.varint_u128()?)
    }

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_f32(f32::from_le_bytes(self.reader.array()?))
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_f64(f64::from_le_bytes(self.reader.array()?))
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        let s = self.reader.str()?;
        let mut chars = s.chars();
        match (chars.next(), chars.next()) {
            (Some(c), None) => visitor.visit_char(c),
            _ => Err(DecodeError::InvalidChar),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_borrowed_str(self.reader.str()?)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_borrowed_bytes(self.reader.length_prefixed()?)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_bytes(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.reader.byte()? {
            0 => visitor.visit_none(),
            1 => self.nested(|de| visitor.visit_some(de)),
            other => Err(DecodeError::BadOptionTag(other)),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.nested(|de| visitor.visit_newtype_struct(de))
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        let count = self.reader.varint_u64()?;
        self.counted_elements(count, visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.fixed_elements(len, visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.fixed_elements(len, visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        let count = self.reader.varint_u64()?;
        let count = self.reader.reserve_items(count)?;
        self.nested(|de| {
            let mut access = Entries { de, left: count };
            let value = visitor.visit_map(&mut access)?;
            match access.left {
                0 => Ok(value),
                _ => Err(de::Error::invalid_length(count, &"fewer entries")),
            }
        })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.fixed_elements(fields.len(), visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        let raw = self.reader.varint::<32>()?;
        let tag = narrow::<u32>(raw)?;
        if raw >= variants.len() as u64 {
            return Err(DecodeError::BadEnumTag {
                tag,
                variants: variants.len(),
            });
        }
        self.nested(|de| visitor.visit_enum(VariantAccess { de, tag }))
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        // Only reached for enum variant identifiers, which `deserialize_enum` hands over as an
        // index it already checked (see `VariantAccess::variant_seed`).
        visitor.visit_u32(narrow(self.reader.varint::<32>()?)?)
    }
}

/// Elements of a sequence, tuple or struct: exactly `left` more of them.
struct Elements<'a, 'de> {
    de: &'a mut Deserializer<'de>,
    left: usize,
    /// Capacity already granted from the reader's pre-allocation budget.
    hint: usize,
}

impl<'de> de::SeqAccess<'de> for Elements<'_, 'de> {
    type Error = DecodeError;

    #[inline]
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DecodeError> {
        match self.left.checked_sub(1) {
            None => Ok(None),
            Some(left) => {
                self.left = left;
                seed.deserialize(&mut *self.de).map(Some)
            }
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.hint.min(self.left))
    }
}

/// Elements of a sequence whose count came from the input: exactly `left` more of them, each
/// decoded through an [`Element`] that charges it.
struct CountedElements<'a, 'de> {
    de: &'a mut Deserializer<'de>,
    /// The count the input declared.
    count: usize,
    left: usize,
    /// Elements so far that were a lone byte, counted against `max_len`.
    bytes: usize,
    /// Capacity already granted from the reader's pre-allocation budget.
    hint: usize,
    /// The container asked for the size hint, as those that keep their elements in one buffer
    /// (`Vec`, `VecDeque`, `BinaryHeap`) do before the first element; a `LinkedList`, which
    /// allocates a node per element, does not. This holds for `Deserialize::deserialize`, the
    /// only entry this crate uses; serde's `deserialize_in_place` of a `LinkedList` asks too,
    /// so an in-place decode must not rely on it.
    contiguous: core::cell::Cell<bool>,
}

impl<'de> de::SeqAccess<'de> for CountedElements<'_, 'de> {
    type Error = DecodeError;

    #[inline]
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DecodeError> {
        match self.left.checked_sub(1) {
            None => Ok(None),
            Some(left) => {
                self.left = left;
                // Only a one-byte value in a container that keeps its elements in one buffer
                // can be a lone byte: a `Box<u8>`, any larger type read from a `u8`, or a
                // `LinkedList<u8>`'s node occupies more than the byte it came from.
                let lone_byte = core::mem::size_of::<T::Value>() == 1 && self.contiguous.get();
                seed.deserialize(Element {
                    seq: self,
                    lone_byte,
                })
                .map(Some)
            }
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.contiguous.set(true);
        Some(self.hint.min(self.left))
    }
}

/// The deserializer one element of a counted sequence is decoded with: it sees the element's
/// outermost request, so it knows what the element is and charges it once.
///
/// **A byte is budgeted as a byte.** An element that is read as one `u8` or `i8`, is itself
/// one byte in memory and goes into a container that keeps its elements in one buffer (a
/// `Vec<u8>`'s elements) comes from exactly one input byte and occupies one byte (a growing
/// buffer at most two), so the input-length budget already bounds both its count and its memory;
/// it is counted against `max_len`, like the byte string it is, and not against `max_items`.
/// Every other element is charged one item before it is decoded: a zero-sized element costs no
/// input at all, and a larger one (a `Box<u8>`, a struct, a string) may occupy more memory
/// than the bytes it came from, which is what the item budget bounds.
struct Element<'a, 'b, 'de> {
    seq: &'a mut CountedElements<'b, 'de>,
    /// The element's type is one byte in memory, so a `u8` read is budgeted as a byte.
    lone_byte: bool,
}

impl<'de> Element<'_, '_, 'de> {
    /// Counts one byte-sized element read as a byte against `max_len`; any other element read
    /// as a byte is charged an item.
    #[inline]
    fn byte(&mut self) -> Result<(), DecodeError> {
        if !self.lone_byte {
            return self.seq.de.reader.charge_item();
        }
        let seq = &mut *self.seq;
        seq.bytes += 1;
        let max = seq.de.reader.len_budget();
        if seq.bytes > max {
            return Err(DecodeError::LengthLimit {
                len: seq.count as u64,
                max,
            });
        }
        Ok(())
    }
}

/// Forwards each listed request to the sequence's deserializer after charging one item.
macro_rules! charged {
    ($($method:ident($($arg:ident: $ty:ty),*);)*) => {$(
        #[inline]
        fn $method<V: Visitor<'de>>(
            self,
            $($arg: $ty,)*
            visitor: V,
        ) -> Result<V::Value, DecodeError> {
            self.seq.de.reader.charge_item()?;
            (&mut *self.seq.de).$method($($arg,)* visitor)
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Element<'_, '_, 'de> {
    type Error = DecodeError;

    fn is_human_readable(&self) -> bool {
        false
    }

    #[inline]
    fn deserialize_u8<V: Visitor<'de>>(mut self, visitor: V) -> Result<V::Value, DecodeError> {
        self.byte()?;
        (&mut *self.seq.de).deserialize_u8(visitor)
    }

    #[inline]
    fn deserialize_i8<V: Visitor<'de>>(mut self, visitor: V) -> Result<V::Value, DecodeError> {
        self.byte()?;
        (&mut *self.seq.de).deserialize_i8(visitor)
    }

    charged! {
        deserialize_any();
        deserialize_ignored_any();
        deserialize_bool();
        deserialize_i16();
        deserialize_i32();
        deserialize_i64();
        deserialize_i128();
        deserialize_u16();
        deserialize_u32();
        deserialize_u64();
        deserialize_u128();
        deserialize_f32();
        deserialize_f64();
        deserialize_char();
        deserialize_str();
        deserialize_string();
        deserialize_bytes();
        deserialize_byte_buf();
        deserialize_option();
        deserialize_unit();
        deserialize_unit_struct(name: &'static str);
        deserialize_newtype_struct(name: &'static str);
        deserialize_seq();
        deserialize_tuple(len: usize);
        deserialize_tuple_struct(name: &'static str, len: usize);
        deserialize_map();
        deserialize_struct(name: &'static str, fields: &'static [&'static str]);
        deserialize_enum(name: &'static str, variants: &'static [&'static str]);
        deserialize_identifier();
    }
}

/// Entries of a map: exactly `left` more key/value pairs.
struct Entries<'a, 'de> {
    de: &'a mut Deserializer<'de>,
    left: usize,
}

impl<'de> de::MapAccess<'de> for Entries<'_, 'de> {
    type Error = DecodeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DecodeError> {
        match self.left.checked_sub(1) {
            None => Ok(None),
            Some(left) => {
                self.left = left;
                seed.deserialize(&mut *self.de).map(Some)
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, DecodeError> {
        seed.deserialize(&mut *self.de)
    }

    /// None: a map grows as its entries really arrive. A hash map turns any hint into a
    /// power-of-two bucket table (over four times the entries' size for a hint of one), which
    /// the slot budget cannot see; maps take no pre-allocation at all.
    fn size_hint(&self) -> Option<usize> {
        None
    }
}

/// One enum value whose variant index was already read and checked.
struct VariantAccess<'a, 'de> {
    de: &'a mut Deserializer<'de>,
    tag: u32,
}

impl<'de, 'a> de::EnumAccess<'de> for VariantAccess<'a, 'de> {
    type Error = DecodeError;
    type Variant = &'a mut Deserializer<'de>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Self::Variant), DecodeError> {
        let tag: de::value::U32Deserializer<DecodeError> = self.tag.into_deserializer();
        let variant = seed.deserialize(tag)?;
        Ok((variant, self.de))
    }
}

impl<'de> de::VariantAccess<'de> for &mut Deserializer<'de> {
    type Error = DecodeError;

    fn unit_variant(self) -> Result<(), DecodeError> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<T::Value, DecodeError> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.fixed_elements(len, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.fixed_elements(fields.len(), visitor)
    }
}
