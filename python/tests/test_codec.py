"""The Python SDK's codec against PROTOCOL.md: its golden vectors and tables byte for byte, and
the hostile inputs every decoder must refuse before it pays for them."""

import math
import struct
import unittest

from spec import golden_table, hex_blocks, parse_hex

import airlock_worker as aw
from airlock_worker import U64, DecodeError, EncodeError, Limits, decode_value, encode_value


def refused(test, reason, data, limits=Limits()):
    with test.assertRaises(DecodeError) as caught:
        decode_value(data, limits)
    test.assertEqual(caught.exception.reason, reason, f"{data[:32].hex(' ')}: {caught.exception}")


class SpecTables(unittest.TestCase):
    """The numbers the spec fixes are the SDK's numbers."""

    def test_constants_table_matches_the_module(self):
        rows = golden_table("constants")
        self.assertTrue(rows)
        for name, value, _meaning in rows:
            self.assertEqual(getattr(aw, name), int(value), name)

    def test_error_kind_table_is_the_sdks_error_kinds(self):
        rows = golden_table("error-kinds")
        expected = [(k.value, k.name) for k in aw.ErrorKind]
        self.assertEqual([(int(v), k) for v, k, _ in rows], expected)

    def test_refuse_reason_table_is_the_sdks_refuse_reasons(self):
        rows = golden_table("refuse-reasons")
        expected = [(r.value, r.name) for r in aw.RefuseReason]
        self.assertEqual([(int(v), r) for v, r, _ in rows], expected)

    def test_violation_table_is_the_sdks_violation_codes(self):
        rows = golden_table("violations")
        expected = [(c.value, c.name) for c in aw.ViolationCode]
        self.assertEqual([(int(n), c) for n, c, _ in rows], expected)


# The values of the spec's `golden:value` table, by the name the table gives them.
VALUE_CASES = {
    "Null": None,
    "Bool(false)": False,
    "Bool(true)": True,
    "I64(0)": 0,
    "I64(-1)": -1,
    "I64(1)": 1,
    "I64(i64::MIN)": -(1 << 63),
    "U64(300)": U64(300),
    "F64(1.0)": 1.0,
    'Str("hi")': "hi",
    "Bytes([de, ad])": b"\xde\xad",
    "List([])": [],
    "List([Null, U64(1)])": [None, U64(1)],
    "Map({})": {},
    'Map({I64(-1): Null, U64(2): Null, Str("a"): Bool(true)})': {"a": True, U64(2): None, -1: None},
}


def same_tag(a, b):
    """Equal, and equal in the distinctions Python's == ignores (bool vs int, U64 vs int)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same_tag(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(
            same_tag(k, next(j for j in b if j == k)) and same_tag(a[k], b[k]) for k in a
        )
    return a == b


class ValueGoldenVectors(unittest.TestCase):
    def test_value_table_in_the_spec_is_what_the_sdk_encodes_and_decodes(self):
        rows = golden_table("value")
        self.assertEqual({row[0] for row in rows}, set(VALUE_CASES))
        for name, hex_bytes in rows:
            value = VALUE_CASES[name]
            data = parse_hex(hex_bytes)
            self.assertEqual(encode_value(value), data, name)
            self.assertTrue(same_tag(decode_value(data), value), name)

    def test_value_reject_table_in_the_spec_is_refused_as_stated(self):
        for hex_bytes, reason in golden_table("value-reject"):
            refused(self, reason, parse_hex(hex_bytes))

    def test_varint_reject_table_in_the_spec_is_refused_as_stated(self):
        widths = {"u16": 16, "u32": 32, "u64": 64, "u128": 128}
        for type_name, hex_bytes, reason in golden_table("varint-reject"):
            reader = aw._Reader(parse_hex(hex_bytes), Limits())
            with self.assertRaises(DecodeError) as caught:
                reader.varint(widths[type_name])
            self.assertEqual(caught.exception.reason, reason, f"{type_name} {hex_bytes}")

    def test_integer_rows_of_the_typed_table_are_the_sdks_varints(self):
        pattern = r"(-?\d+)([ui])(16|32|64|128)"
        limits = {"u16::MAX": (0xFFFF, "u", 16), "u32::MAX": (_max(32), "u", 32),
                  "u64::MAX": (_max(64), "u", 64), "u128::MAX": (_max(128), "u", 128),
                  "i64::MIN": (-(1 << 63), "i", 64), "i16::MIN": (-(1 << 15), "i", 16),
                  "i16::MAX": ((1 << 15) - 1, "i", 16)}  # fmt: skip
        import re

        checked = 0
        for name, hex_bytes in golden_table("typed"):
            match = re.fullmatch(pattern, name)
            if match:
                number, sign, bits = int(match[1]), match[2], int(match[3])
            elif name in limits:
                number, sign, bits = limits[name]
            else:
                continue
            raw = number if sign == "u" else (number << 1) ^ (number >> (bits - 1))
            out = bytearray()
            aw._put_varint(out, raw)
            data = parse_hex(hex_bytes)
            self.assertEqual(bytes(out), data, name)
            decoded = aw._Reader(data, Limits()).varint(bits)
            self.assertEqual(decoded if sign == "u" else aw._unzigzag(decoded), number, name)
            checked += 1
        self.assertGreaterEqual(checked, 15)


def _max(bits):
    return (1 << bits) - 1


class FrameGoldenVectors(unittest.TestCase):
    def test_every_frame_vector_in_the_spec_decodes_and_encodes_back_to_its_bytes(self):
        kinds = set()
        for name, _words, data in hex_blocks("frame"):
            (length,) = struct.unpack_from("<I", data)
            self.assertEqual(length, len(data) - 4, name)
            frame = aw.decode_frame(data[4:])
            self.assertEqual(aw.encode_frame(frame), data, name)
            kinds.add(type(frame))
        self.assertEqual(kinds, set(aw._KINDS))

    def test_real_body_vectors_carry_the_values_own_encoding(self):
        frames = {name: aw.decode_frame(data[4:]) for name, _, data in hex_blocks("frame")}
        self.assertEqual(frames["call-value"].body, encode_value("hi"))
        self.assertEqual(decode_value(frames["call-value"].body), "hi")
        # A typed ByteBuf: its own length inside the field's.
        self.assertEqual(frames["call-echo"].body, b"\x02hi")
        self.assertEqual(frames["return-echo"].body, b"\x02hi")

    def test_every_reject_vector_in_the_spec_is_refused_with_its_reason(self):
        for name, words, data in hex_blocks("reject"):
            with self.assertRaises(DecodeError, msg=name) as caught:
                aw.decode_frame(data[4:])
            self.assertEqual([caught.exception.reason], words, name)


class HostileValues(unittest.TestCase):
    """Inputs a hostile peer could send: each refused, at the point the spec says, before the
    decoder pays for what the input claims."""

    def test_overlong_varints_are_refused_everywhere_a_varint_is_read(self):
        refused(self, "OverlongVarint", bytes.fromhex("04 80 00"))  # U64
        refused(self, "OverlongVarint", bytes.fromhex("03 81 80 00"))  # I64
        refused(self, "OverlongVarint", bytes.fromhex("06 80 00"))  # a string's length
        refused(self, "OverlongVarint", bytes.fromhex("08 80 00"))  # a list's count
        refused(self, "OverlongVarint", bytes.fromhex("09 01 04 80 00 00"))  # a key

    def test_varints_wider_than_64_bits_are_refused(self):
        refused(self, "VarintOverflow", bytes.fromhex("04 ff ff ff ff ff ff ff ff ff 02"))
        refused(self, "VarintOverflow", bytes.fromhex("04 ff ff ff ff ff ff ff ff ff 81 00"))
        largest = bytes.fromhex("04 ff ff ff ff ff ff ff ff ff 01")
        self.assertEqual(decode_value(largest), U64(2**64 - 1))

    def test_a_length_past_the_end_is_refused_without_reading_past_it(self):
        refused(self, "UnexpectedEnd", bytes.fromhex("06 05 61 62"))
        refused(self, "UnexpectedEnd", bytes.fromhex("07 03 01 02"))
        refused(self, "UnexpectedEnd", bytes.fromhex("05 00 00 00"))  # F64 needs 8 bytes
        refused(self, "UnexpectedEnd", b"")
        refused(self, "UnexpectedEnd", bytes.fromhex("08 02 00"))  # two elements promised
        refused(self, "UnexpectedEnd", bytes.fromhex("04 80"))  # inside a varint

    def test_a_huge_length_is_refused_by_max_len_before_anything_is_allocated(self):
        refused(self, "LengthLimit", bytes.fromhex("07 ff ff ff ff 0f"))
        refused(self, "LengthLimit", bytes.fromhex("06 05 61 62 63 64 65"), Limits(max_len=4))
        # Within max_len, the bytes that remain still bound it.
        refused(self, "UnexpectedEnd", bytes.fromhex("07 ff ff ff ff 0f"), Limits(max_len=2**40))

    def test_a_huge_count_is_refused_at_its_prefix(self):
        refused(self, "ItemLimit", bytes.fromhex("08 ff ff ff ff ff ff ff ff ff 01"))
        refused(self, "ItemLimit", bytes.fromhex("08 81 80 40"))  # 2**20 + 1 elements
        refused(self, "ItemLimit", bytes.fromhex("08 03 00 00 00"), Limits(max_items=2))
        two = bytes.fromhex("08 02 00 00")
        self.assertEqual(decode_value(two, Limits(max_items=2)), [None, None])

    def test_items_are_counted_over_the_whole_value(self):
        nested = bytes.fromhex("08 02 08 02 00 00 08 02 00 00")  # [[_, _], [_, _]]: 6 items
        self.assertEqual(decode_value(nested, Limits(max_items=6)), [[None, None], [None, None]])
        refused(self, "ItemLimit", nested, Limits(max_items=5))

    def test_a_map_costs_six_items_per_entry_and_twenty_three_more(self):
        one_entry = bytes.fromhex("09 01 06 01 61 00")
        self.assertEqual(decode_value(one_entry, Limits(max_items=29)), {"a": None})
        refused(self, "ItemLimit", one_entry, Limits(max_items=28))
        self.assertEqual(decode_value(bytes.fromhex("09 00"), Limits(max_items=0)), {})
        # Under the default budget the largest map has (1048576 - 23) // 6 entries; a count one
        # above that is refused at its prefix, while the largest is refused only for want of
        # the entries it promised.
        largest = (aw.DEFAULT_MAX_ITEMS - aw.MAP_ROOT_ITEMS) // 6
        self.assertEqual(largest, 174_758)
        refused(self, "UnexpectedEnd", b"\x09" + _varint(largest))
        refused(self, "ItemLimit", b"\x09" + _varint(largest + 1))

    def test_nesting_past_max_depth_is_refused_without_recursion(self):
        def nested(depth):
            return b"\x08\x01" * depth + b"\x00"

        self.assertEqual(decode_value(nested(64)), _nest(64))
        refused(self, "DepthLimit", nested(65))
        refused(self, "DepthLimit", b"\x09\x01\x06\x01k" * 65 + b"\x00")
        # Far deeper than Python's own recursion limit: refused by the budget, not a crash.
        refused(self, "DepthLimit", nested(100_000))
        self.assertEqual(_depth(decode_value(nested(5000), Limits(max_depth=5000))), 5000)

    def test_map_keys_are_only_integers_and_strings(self):
        for tag in ("00", "01", "02", "05", "07", "08", "09", "0a"):
            refused(self, "BadKeyTag", bytes.fromhex(f"09 01 {tag} 00"))

    def test_duplicate_keys_are_refused(self):
        refused(self, "DuplicateMapKey", bytes.fromhex("09 02 03 02 00 03 02 01"))
        refused(self, "DuplicateMapKey", bytes.fromhex("09 02 04 02 00 04 02 01"))

    def test_keys_distinct_on_the_wire_but_equal_in_python_are_refused_not_merged(self):
        # I64(1) and U64(1) are two keys of one valid map; a dict cannot hold both.
        refused(self, "UnrepresentableMap", bytes.fromhex("09 02 03 02 00 04 01 01"))

    def test_text_must_be_utf8_in_values_and_keys(self):
        refused(self, "InvalidUtf8", bytes.fromhex("06 01 ff"))
        refused(self, "InvalidUtf8", bytes.fromhex("06 03 ed a0 80"))  # an encoded surrogate
        refused(self, "InvalidUtf8", bytes.fromhex("06 02 c0 80"))  # overlong NUL
        refused(self, "InvalidUtf8", bytes.fromhex("09 01 06 01 ff 00"))

    def test_unknown_tags_and_trailing_bytes_are_refused(self):
        for tag in range(0x0A, 0x100):
            refused(self, "BadValueTag", bytes([tag]))
        refused(self, "TrailingBytes", bytes.fromhex("02 00"))
        refused(self, "TrailingBytes", bytes.fromhex("08 00 08 00"))

    def test_input_over_max_bytes_is_refused_unread(self):
        refused(self, "InputTooLong", bytes.fromhex("06 03 61 62 63"), Limits(max_bytes=4))


def _varint(value):
    out = bytearray()
    aw._put_varint(out, value)
    return bytes(out)


def _depth(value):
    """How many lists deep ``value`` is, without recursing."""
    depth = 0
    while isinstance(value, list):
        depth += 1
        value = value[0]
    return depth


def _nest(depth):
    value = None
    for _ in range(depth):
        value = [value]
    return value


class Encoding(unittest.TestCase):
    def test_integers_take_the_tag_their_range_needs(self):
        self.assertEqual(encode_value(-1), bytes.fromhex("03 01"))
        self.assertEqual(encode_value(2**63 - 1)[0], 0x03)
        self.assertEqual(encode_value(2**63), bytes.fromhex("04 80 80 80 80 80 80 80 80 80 01"))
        self.assertEqual(encode_value(U64(5)), bytes.fromhex("04 05"))
        for out_of_range in (2**64, -(2**63) - 1):
            with self.assertRaises(EncodeError):
                encode_value(out_of_range)
        with self.assertRaises(ValueError):
            U64(-1)

    def test_every_value_survives_a_round_trip_with_its_tag(self):
        value = {
            "list": [None, True, False, -5, U64(5), 2.5, "é", b"\x00\xff", [], {}],
            U64(7): {-3: "neg", 4: "pos"},
            -1: (1, 2),
        }
        decoded = decode_value(encode_value(value))
        expected = dict(value)
        expected[-1] = [1, 2]  # a tuple is sent as a list
        self.assertTrue(same_tag(decoded, expected), decoded)

    def test_floats_keep_their_bits(self):
        for bits in (0x7FF8_0000_0000_0001, 0xFFF0_0000_0000_0000, 0x8000_0000_0000_0000):
            value = struct.unpack("<d", struct.pack("<Q", bits))[0]
            back = decode_value(encode_value(value))
            self.assertEqual(struct.pack("<d", back), struct.pack("<Q", bits))
        self.assertTrue(math.isnan(decode_value(encode_value(math.nan))))

    def test_map_entries_are_written_in_the_rust_encoders_order(self):
        data = encode_value({"b": 0, "a": 0, U64(1): 0, 3: 0, -2: 0})
        self.assertEqual(
            data,
            bytes.fromhex(
                "09 05 03 03 03 00 03 06 03 00 04 01 03 00 06 01 61 03 00 06 01 62 03 00"
            ),
        )

    def test_values_outside_the_model_are_refused(self):
        for value in ({1, 2}, object(), {True: 1}, {1.5: 1}, {(1,): 1}, "\ud800", {"\udc00": 1}):
            with self.assertRaises(EncodeError, msg=repr(value)):
                encode_value(value)

    def test_a_cycle_or_too_deep_a_value_is_refused_not_a_recursion_error(self):
        cycle = []
        cycle.append(cycle)
        with self.assertRaises(EncodeError):
            encode_value(cycle)
        self.assertEqual(encode_value(_nest(64)), b"\x08\x01" * 64 + b"\x00")
        with self.assertRaises(EncodeError):
            encode_value(_nest(65))


class Messages(unittest.TestCase):
    def test_characters_that_could_forge_log_text_become_spaces(self):
        self.assertEqual(aw.clean_message("a\nb\rc\td\x00e\x7f\x85f"), "a b c d e  f")
        self.assertEqual(aw.clean_message("x\u202ey\u2028z\u200b\ufeff\U000e0041"), "x y z   ")
        self.assertEqual(aw.clean_message("plain é ☃"), "plain é ☃")

    def test_every_listed_range_is_unsafe_and_its_neighbours_are_not(self):
        for low, high in aw._UNSAFE_RANGES:
            self.assertTrue(aw.is_unsafe_in_text(chr(low)) and aw.is_unsafe_in_text(chr(high)))
        self.assertFalse(aw.is_unsafe_in_text("\u00ac"))
        self.assertFalse(aw.is_unsafe_in_text("\u00ae"))

    def test_a_long_message_is_cut_on_a_character_boundary(self):
        for text in ("é" * 5000, "€" * 5000, "a" * 5000, "😀" * 5000):
            cut = aw.clean_message(text)
            self.assertLessEqual(len(cut.encode()), aw.MAX_ERROR_MESSAGE)
            self.assertGreater(len(cut.encode()), aw.MAX_ERROR_MESSAGE - 4)
            self.assertTrue(text.startswith(cut))


class Framing(unittest.TestCase):
    def test_a_prefix_over_the_cap_is_refused_before_its_payload_arrives(self):
        reader = aw._FrameReader(8192)
        reader.feed(struct.pack("<I", 8193))
        with self.assertRaises(aw.HostViolation) as caught:
            reader.next_frame()
        self.assertEqual(caught.exception.code, aw.ViolationCode.FrameTooLarge)

    def test_a_zero_length_frame_is_refused(self):
        reader = aw._FrameReader(8192)
        reader.feed(b"\x00\x00\x00\x00")
        with self.assertRaises(aw.HostViolation) as caught:
            reader.next_frame()
        self.assertEqual(caught.exception.code, aw.ViolationCode.EmptyFrame)

    def test_frames_split_anywhere_or_joined_are_read_whole(self):
        frames = [data for _, _, data in hex_blocks("frame")]
        stream = b"".join(frames)
        for chunk in (1, 3, 7, len(stream)):
            reader = aw._FrameReader(aw.DEFAULT_MAX_FRAME)
            got = []
            for at in range(0, len(stream), chunk):
                reader.feed(stream[at : at + chunk])
                while (payload := reader.next_frame()) is not None:
                    got.append(payload)
            reader.finish()
            self.assertEqual(got, [f[4:] for f in frames], f"chunks of {chunk}")

    def test_a_stream_ending_inside_a_frame_is_truncated(self):
        for cut in (b"\x05\x00", b"\x05\x00\x00\x00\x01"):
            reader = aw._FrameReader(8192)
            reader.feed(cut)
            self.assertIsNone(reader.next_frame())
            with self.assertRaises(aw.HostViolation) as caught:
                reader.finish()
            self.assertEqual(caught.exception.code, aw.ViolationCode.TruncatedFrame)


if __name__ == "__main__":
    unittest.main()
