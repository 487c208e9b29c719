"""Serve plain Python functions to an airlock host.

This module is an airlock worker written from ``PROTOCOL.md`` alone, with the standard library
only. It speaks protocol version 1 over the channel the host set up (a pipe, an inherited
socket or a named socket, PROTOCOL.md section 1.1), decodes every request with the dynamic
``Value`` encoding (section 4) within budgets, and answers each call with exactly one ``Return``
or ``Fail``. A handler's exception is sent as data: a closed kind, a cleaned message of at most
4096 bytes, an optional numeric code.

    import sys
    import airlock_worker

    worker = airlock_worker.Worker("greeter", "1.0.0")

    @worker.method("greet")
    def greet(name):
        return "hello, " + name

    if __name__ == "__main__":
        sys.exit(worker.run())

Values map to Python as: ``Null`` <-> ``None``, ``Bool`` <-> ``bool``, ``I64`` <-> ``int``,
``U64`` <-> :class:`U64` (an ``int``; a plain ``int`` from 2**63 up is sent as ``U64`` too),
``F64`` <-> ``float``, ``Str`` <-> ``str``, ``Bytes`` <-> ``bytes`` (``bytearray`` and
``memoryview`` are sent as ``Bytes``), ``List`` <-> ``list`` (a ``tuple`` is sent as a list),
``Map`` <-> ``dict`` with ``int``, :class:`U64` or ``str`` keys. Nothing else is sent and
nothing else is ever built from the wire: decoding names no class and calls no constructor but
these.

What this worker does not do: it installs no seccomp filter of its own (the host's confinement
still applies; a host must not ``require_worker_filter()`` for it), and it cannot stop a running
handler: a cancelled call is answered at once, and its handler runs on until it returns (it may
watch ``call.cancelled`` to stop early).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import os
import queue
import re
import selectors
import socket
import struct
import sys
import threading
import traceback
from typing import Any, Callable, Dict, Optional, Tuple, Union

__all__ = [
    "Worker",
    "Call",
    "HandlerError",
    "Limits",
    "U64",
    "DecodeError",
    "EncodeError",
    "HostViolation",
    "Refused",
    "Channel",
    "ChannelError",
    "channel_from_env",
    "ErrorKind",
    "RefuseReason",
    "ViolationCode",
    "decode_value",
    "encode_value",
    "decode_frame",
    "encode_frame",
    "Hello",
    "Welcome",
    "Refuse",
    "CallFrame",
    "Cancel",
    "Progress",
    "Return",
    "Fail",
    "Shutdown",
    "clean_message",
    "is_unsafe_in_text",
    "is_valid_name",
]

# ---------------------------------------------------------------------------------------------
# The protocol's numbers (PROTOCOL.md section 10, "Constants").

PROTOCOL_VERSION = 1
LENGTH_PREFIX = 4
DEFAULT_MAX_FRAME = 16_781_312
MIN_MAX_FRAME = 8192
HANDSHAKE_MAX_FRAME = 131_072
DEFAULT_MAX_IN_FLIGHT = 1024
MAX_IN_FLIGHT = 65_536
DEFAULT_MAX_PROGRESS_PER_CALL = 1024
MAX_METHOD_NAME = 64
MAX_HELLO_METHODS = 1024
TOKEN_LEN = 32
MAX_ERROR_MESSAGE = 4096
FINISHED_ID_MEMORY = 4096
DEFAULT_HANDSHAKE_TIMEOUT = 10
DEFAULT_SEND_TIMEOUT = 5
# Seconds the host lets a worker finish a call past its deadline (answering the Cancel) before
# it kills the worker; this SDK answers a Cancel at once (PROTOCOL.md §8, §9).
DEFAULT_CANCEL_GRACE = 1

# The decoding budgets' defaults (section 3.5).
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_DEPTH = 64
DEFAULT_MAX_ITEMS = 1_048_576
DEFAULT_MAX_LEN = 16 * 1024 * 1024

# What a non-empty Value map costs beyond its entries (section 4): 6n + 23 items for n entries.
MAP_ROOT_ITEMS = 23
MAP_ENTRY_EXTRA_ITEMS = 5

# Handlers running at once, each on a thread of its own, unless the Worker is told otherwise.
DEFAULT_MAX_CONCURRENCY = 16

# Bytes asked of the channel per read.
_READ_CHUNK = 64 * 1024

_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1
_U64_MAX = (1 << 64) - 1
_U32_MAX = (1 << 32) - 1


class ErrorKind(enum.IntEnum):
    """``Fail.kind`` (section 5.1): what went wrong, as a closed set of wire values."""

    Handler = 0
    Panic = 1
    UnknownMethod = 2
    BadRequest = 3
    Cancelled = 4
    Limit = 5
    Internal = 6


class RefuseReason(enum.IntEnum):
    """``Refuse.reason`` (section 5.1): why the host refused the ``Hello``."""

    VersionMismatch = 0
    BadToken = 1
    InvalidHello = 2


class ViolationCode(enum.IntEnum):
    """The violations of section 10, by their stable numbers."""

    FrameTooLarge = 1
    EmptyFrame = 2
    MalformedFrame = 3
    TruncatedFrame = 4
    FrameBeforeHandshake = 5
    DuplicateHandshake = 6
    ForbiddenKind = 7
    UnknownCallId = 8
    FinishedCallId = 9
    MethodMismatch = 10
    InvalidName = 11
    ProgressOverQuota = 12
    InvalidErrorDescriptor = 13
    InvalidHello = 14
    DuplicateCallId = 15
    TooManyCalls = 16
    InvalidWelcome = 17


# ---------------------------------------------------------------------------------------------
# Errors.


class DecodeError(ValueError):
    """Bytes that are not a valid encoding, or that exceed a budget.

    ``reason`` is the name PROTOCOL.md gives the refusal (``OverlongVarint``, ``ItemLimit``,
    ``DuplicateMapKey``, ...); the message says where.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class EncodeError(ValueError):
    """A Python value with no ``Value`` encoding (an unsupported type, an integer outside
    64 bits, a map key that is not an ``int`` or a ``str``, nesting past ``max_depth``)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class HandlerError(Exception):
    """Raise this from a handler to answer with ``Fail`` kind ``Handler``: the call failed, as
    the handler meant to report. ``code`` is an optional number (0 to 2**32 - 1) with a meaning
    of the application's. Any other exception is sent as kind ``Panic``."""

    def __init__(self, message: str, code: Optional[int] = None) -> None:
        if code is not None and (
            not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= _U32_MAX
        ):
            raise ValueError(f"a Fail code is an integer from 0 to {_U32_MAX}, not {code!r}")
        super().__init__(message)
        self.message = str(message)
        self.code = code


class HostViolation(Exception):
    """The host broke a rule of the protocol. The worker sent nothing more and stopped."""

    def __init__(self, code: ViolationCode, expected: str, received: str) -> None:
        super().__init__(
            f"host violation #{int(code)} {code.name}: expected {expected}, received {received}"
        )
        self.code = code
        self.expected = expected
        self.received = received


class Refused(Exception):
    """The host answered the ``Hello`` with ``Refuse``."""

    def __init__(self, reason: Union[RefuseReason, int], host_protocol: int) -> None:
        name = reason.name if isinstance(reason, RefuseReason) else str(reason)
        super().__init__(
            f"the host refused the handshake: {name} (host protocol {host_protocol})"
        )
        self.reason = reason
        self.host_protocol = host_protocol


class ChannelError(Exception):
    """The environment names no usable channel (a bad descriptor number, a missing socket)."""


# ---------------------------------------------------------------------------------------------
# Budgets (section 3.5).


@dataclasses.dataclass(frozen=True)
class Limits:
    """The four decoding budgets, each checked before its cost is paid.

    ``max_bytes``: length of the whole input. ``max_depth``: nesting of lists and maps.
    ``max_items``: list elements plus map entries over the whole value (a map of n >= 1 entries
    costs 6n + 23). ``max_len``: length of one string or byte string.
    """

    max_bytes: int = DEFAULT_MAX_BYTES
    max_depth: int = DEFAULT_MAX_DEPTH
    max_items: int = DEFAULT_MAX_ITEMS
    max_len: int = DEFAULT_MAX_LEN

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Limits.{field.name} must be a non-negative int, not {value!r}")


# ---------------------------------------------------------------------------------------------
# Reading bytes within budgets (sections 3.1 to 3.5).


class _Reader:
    """A cursor over one input that carries the budgets. No length read from the input is
    trusted beyond the bytes that remain, and every count is charged before it is used."""

    __slots__ = ("_data", "_pos", "_limits", "_depth_left", "_items_left")

    def __init__(self, data: bytes, limits: Limits) -> None:
        if len(data) > limits.max_bytes:
            raise DecodeError("InputTooLong", f"{len(data)} bytes, max_bytes is {limits.max_bytes}")
        self._data = data
        self._pos = 0
        self._limits = limits
        self._depth_left = limits.max_depth
        self._items_left = limits.max_items

    def remaining(self) -> int:
        return len(self._data) - self._pos

    def finish(self) -> None:
        left = self.remaining()
        if left:
            raise DecodeError("TrailingBytes", f"{left} bytes after the value")

    def byte(self) -> int:
        if self._pos >= len(self._data):
            raise DecodeError("UnexpectedEnd", "needed 1 byte, none remain")
        b = self._data[self._pos]
        self._pos += 1
        return b

    def take(self, n: int) -> bytes:
        if n > self.remaining():
            raise DecodeError("UnexpectedEnd", f"needed {n} bytes, {self.remaining()} remain")
        start = self._pos
        self._pos += n
        return bytes(self._data[start : self._pos])

    def varint(self, bits: int) -> int:
        """An unsigned LEB128 varint of at most ``bits`` bits, refused if overlong or wider."""
        value = 0
        shift = 0
        while True:
            b = self.byte()
            group = b & 0x7F
            if shift + 7 > bits and (b & 0x80 or group >> (bits - shift)):
                raise DecodeError("VarintOverflow", f"wider than {bits} bits")
            value |= group << shift
            if not b & 0x80:
                if b == 0 and shift > 0:
                    raise DecodeError("OverlongVarint", "a trailing zero group")
                return value
            shift += 7

    def length_prefixed(self) -> bytes:
        n = self.varint(64)
        if n > self._limits.max_len:
            raise DecodeError("LengthLimit", f"{n} bytes, max_len is {self._limits.max_len}")
        return self.take(n)

    def text(self) -> str:
        raw = self.length_prefixed()
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise DecodeError("InvalidUtf8", "a string that is not UTF-8") from None

    def charge_items(self, count: int) -> None:
        if count > self._items_left:
            raise DecodeError("ItemLimit", f"max_items is {self._limits.max_items}")
        self._items_left -= count

    def enter(self) -> None:
        if self._depth_left == 0:
            raise DecodeError("DepthLimit", f"max_depth is {self._limits.max_depth}")
        self._depth_left -= 1

    def leave(self) -> None:
        self._depth_left += 1


def _put_varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _varint_len(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def _unzigzag(raw: int) -> int:
    return (raw >> 1) ^ -(raw & 1)


# ---------------------------------------------------------------------------------------------
# The dynamic Value encoding (section 4).

_TAG_NULL = 0x00
_TAG_FALSE = 0x01
_TAG_TRUE = 0x02
_TAG_I64 = 0x03
_TAG_U64 = 0x04
_TAG_F64 = 0x05
_TAG_STR = 0x06
_TAG_BYTES = 0x07
_TAG_LIST = 0x08
_TAG_MAP = 0x09


class U64(int):
    """An integer the ``Value`` encoding tags ``U64`` (04) rather than ``I64`` (03).

    Decoding gives a ``U64`` for every ``U64`` on the wire, so a value passed back unchanged
    keeps its tag. Arithmetic on it gives plain ``int``s. A plain ``int`` is sent as ``I64`` when
    it fits in 64 signed bits, else as ``U64`` when it fits in 64 unsigned bits.
    """

    def __new__(cls, value: int = 0) -> "U64":
        number = int.__new__(cls, value)
        if not 0 <= number <= _U64_MAX:
            raise ValueError(f"U64 holds 0 to 2**64 - 1, not {int(number)}")
        return number

    def __repr__(self) -> str:
        return f"U64({int(self)})"


def _key_wire(key: Any) -> Tuple[int, Any]:
    """A map key's tag and payload, or EncodeError for a key the model has no room for."""
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise EncodeError(
            "UnsupportedMapKey", f"a map key is an int or a str, not {type(key).__name__}"
        )
    if isinstance(key, str):
        return _TAG_STR, _utf8(key)
    if isinstance(key, U64):
        return _TAG_U64, int(key)
    if _I64_MIN <= key <= _I64_MAX:
        return _TAG_I64, key
    if 0 <= key <= _U64_MAX:
        return _TAG_U64, key
    raise EncodeError("IntegerOutOfRange", f"{key} does not fit in 64 bits")


def _put_key(out: bytearray, tag: int, payload: Any) -> None:
    out.append(tag)
    if tag == _TAG_STR:
        _put_varint(out, len(payload))
        out += payload
    elif tag == _TAG_I64:
        _put_varint(out, _zigzag(payload))
    else:
        _put_varint(out, payload)


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise EncodeError("InvalidUtf8", "a str with a lone surrogate has no UTF-8 form") from None


def encode_value(value: Any, max_depth: int = DEFAULT_MAX_DEPTH) -> bytes:
    """The ``Value`` encoding of ``value`` (see the module docs for the mapping).

    Map entries are written in the Rust encoder's order: ``I64`` keys ascending, then ``U64``
    keys ascending, then ``str`` keys by their UTF-8 bytes. Lists and maps nested deeper than
    ``max_depth`` (a cycle, for one) raise :class:`EncodeError`, as does any other type.

    >>> encode_value({"n": U64(3)}).hex(" ")
    '09 01 06 01 6e 04 03'
    """
    out = bytearray()
    # A stack of iterators over the children still to write; a map's iterator writes each
    # key just before it yields that key's value.
    stack = [iter((value,))]
    while stack:
        try:
            item = next(stack[-1])
        except StopIteration:
            stack.pop()
            continue
        if item is None:
            out.append(_TAG_NULL)
        elif item is True:
            out.append(_TAG_TRUE)
        elif item is False:
            out.append(_TAG_FALSE)
        elif isinstance(item, int):
            if isinstance(item, U64):
                out.append(_TAG_U64)
                _put_varint(out, int(item))
            elif _I64_MIN <= item <= _I64_MAX:
                out.append(_TAG_I64)
                _put_varint(out, _zigzag(item))
            elif 0 <= item <= _U64_MAX:
                out.append(_TAG_U64)
                _put_varint(out, item)
            else:
                raise EncodeError("IntegerOutOfRange", f"{item} does not fit in 64 bits")
        elif isinstance(item, float):
            out.append(_TAG_F64)
            out += struct.pack("<d", item)
        elif isinstance(item, str):
            raw = _utf8(item)
            out.append(_TAG_STR)
            _put_varint(out, len(raw))
            out += raw
        elif isinstance(item, (bytes, bytearray, memoryview)):
            raw = bytes(item)
            out.append(_TAG_BYTES)
            _put_varint(out, len(raw))
            out += raw
        elif isinstance(item, (list, tuple)):
            if len(stack) > max_depth:
                raise EncodeError("DepthLimit", f"lists and maps nest deeper than {max_depth}")
            out.append(_TAG_LIST)
            _put_varint(out, len(item))
            stack.append(iter(item))
        elif isinstance(item, dict):
            if len(stack) > max_depth:
                raise EncodeError("DepthLimit", f"lists and maps nest deeper than {max_depth}")
            entries = []
            for key, child in item.items():
                entries.append((_key_wire(key), child))
            # I64 (03) before U64 (04) before Str (06); within a tag, by payload.
            entries.sort(key=lambda entry: entry[0])
            out.append(_TAG_MAP)
            _put_varint(out, len(entries))
            stack.append(_map_children(out, entries))
        else:
            raise EncodeError("UnsupportedType", f"{type(item).__name__} has no Value encoding")
    return bytes(out)


def _map_children(out: bytearray, entries: list):
    for (tag, payload), child in entries:
        _put_key(out, tag, payload)
        yield child


def _read_key(reader: _Reader) -> Union[int, str]:
    tag = reader.byte()
    if tag == _TAG_I64:
        return _unzigzag(reader.varint(64))
    if tag == _TAG_U64:
        return U64(reader.varint(64))
    if tag == _TAG_STR:
        return reader.text()
    raise DecodeError("BadKeyTag", f"key tag {tag:#04x}")


def decode_value(data: bytes, limits: Limits = Limits()) -> Any:
    """Decodes exactly one ``Value`` from the whole of ``data`` within ``limits``.

    Refuses (with :class:`DecodeError`) unknown tags, map keys other than ``I64``, ``U64`` and
    ``Str``, duplicate keys, truncation, invalid UTF-8, overlong or overflowing varints,
    trailing bytes and every budget overrun, each before its cost is paid. Iterative: any
    nesting depth uses the same small amount of stack. Also refused, as ``UnrepresentableMap``:
    a map holding both ``I64(n)`` and ``U64(n)`` for the same n, two keys the wire tells apart
    and a Python ``dict`` cannot.

    >>> decode_value(bytes.fromhex("08 02 00 04 01"))
    [None, U64(1)]
    """
    reader = _Reader(data, limits)
    # Open containers: [is_map, container, entries left, key awaiting its value].
    stack: list = []
    while True:
        top = stack[-1] if stack else None
        if top is not None and top[2] == 0:
            reader.leave()
            stack.pop()
            value = top[1]
        else:
            if top is not None and top[0]:
                top[3] = _read_key(reader)
            tag = reader.byte()
            if tag == _TAG_NULL:
                value = None
            elif tag == _TAG_FALSE:
                value = False
            elif tag == _TAG_TRUE:
                value = True
            elif tag == _TAG_I64:
                value = _unzigzag(reader.varint(64))
            elif tag == _TAG_U64:
                value = U64(reader.varint(64))
            elif tag == _TAG_F64:
                value = struct.unpack("<d", reader.take(8))[0]
            elif tag == _TAG_STR:
                value = reader.text()
            elif tag == _TAG_BYTES:
                value = reader.length_prefixed()
            elif tag in (_TAG_LIST, _TAG_MAP):
                count = reader.varint(64)
                reader.charge_items(count)
                if tag == _TAG_MAP and count:
                    reader.charge_items(MAP_ROOT_ITEMS + MAP_ENTRY_EXTRA_ITEMS * count)
                reader.enter()
                stack.append([tag == _TAG_MAP, {} if tag == _TAG_MAP else [], count, None])
                continue
            else:
                raise DecodeError("BadValueTag", f"tag {tag:#04x}")
        # Hand the finished value to its parent; parents it fills are finished in turn.
        while True:
            if not stack:
                reader.finish()
                return value
            parent = stack[-1]
            if parent[0]:
                key = parent[3]
                parent[3] = None
                if key in parent[1]:
                    existing = next(k for k in parent[1] if k == key)
                    if type(existing) is type(key):
                        raise DecodeError("DuplicateMapKey", f"key {key!r} twice")
                    raise DecodeError(
                        "UnrepresentableMap",
                        f"keys {existing!r} and {key!r} differ on the wire, not in a dict",
                    )
                parent[1][key] = value
            else:
                parent[1].append(value)
            parent[2] -= 1
            if parent[2]:
                break
            reader.leave()
            stack.pop()
            value = parent[1]


# ---------------------------------------------------------------------------------------------
# Frames (section 5): the typed encoding of one `Frame`.


@dataclasses.dataclass(frozen=True)
class Hello:
    """Kind 0, worker to host: the first frame on the worker's stream."""

    protocol: int
    worker_name: str
    worker_version: str
    methods: Tuple[str, ...]
    token: Optional[bytes]


@dataclasses.dataclass(frozen=True)
class Welcome:
    """Kind 1, host to worker: the handshake accepted, with the connection's limits."""

    max_frame: int
    max_in_flight: int
    max_progress_per_call: int


@dataclasses.dataclass(frozen=True)
class Refuse:
    """Kind 2, host to worker: the handshake refused (``reason`` is a :class:`RefuseReason`)."""

    reason: int
    host_protocol: int


@dataclasses.dataclass(frozen=True)
class CallFrame:
    """Kind 3, host to worker: run ``method`` on ``body`` (named so beside :class:`Call`, the
    handler's view of a running call)."""

    id: bytes
    method: str
    body: bytes


@dataclasses.dataclass(frozen=True)
class Cancel:
    """Kind 4, host to worker: the host gave up call ``id``; one terminal frame is still owed."""

    id: bytes


@dataclasses.dataclass(frozen=True)
class Progress:
    """Kind 5, worker to host: an update for a running call."""

    id: bytes
    method: str
    body: bytes


@dataclasses.dataclass(frozen=True)
class Return:
    """Kind 6, worker to host: a call's answer."""

    id: bytes
    method: str
    body: bytes


@dataclasses.dataclass(frozen=True)
class Fail:
    """Kind 7, worker to host: a call's failure (``kind`` is an :class:`ErrorKind`)."""

    id: bytes
    method: str
    kind: int
    message: str
    code: Optional[int]


@dataclasses.dataclass(frozen=True)
class Shutdown:
    """Kind 8, host to worker: take no new calls, answer those in flight, then close."""


_KINDS = (Hello, Welcome, Refuse, CallFrame, Cancel, Progress, Return, Fail, Shutdown)
_KIND_NAMES = (
    "Hello", "Welcome", "Refuse", "Call", "Cancel", "Progress", "Return", "Fail", "Shutdown"
)
_FRAME_ITEMS = MAX_HELLO_METHODS


def _kind_name(frame: Any) -> str:
    return _KIND_NAMES[_KINDS.index(type(frame))]


def decode_frame(payload: bytes) -> Any:
    """Decodes one frame payload (no length prefix) into one of the frame classes.

    Decoded as Rust decodes a frame: ``max_bytes`` and ``max_len`` are the payload's length,
    ``max_items`` is 1024 (``Hello.methods``), and nothing may follow the frame.
    """
    reader = _Reader(
        payload,
        Limits(max_bytes=len(payload), max_depth=4, max_items=_FRAME_ITEMS, max_len=len(payload)),
    )
    tag = reader.varint(32)
    if tag == 0:
        protocol = reader.varint(32)
        name = reader.text()
        version = reader.text()
        count = reader.varint(64)
        reader.charge_items(count)
        methods = tuple(reader.text() for _ in range(count))
        token = _read_option(reader, reader.length_prefixed)
        frame: Any = Hello(protocol, name, version, methods, token)
    elif tag == 1:
        frame = Welcome(reader.varint(32), reader.varint(32), reader.varint(32))
    elif tag == 2:
        reason = reader.varint(32)
        if reason > max(RefuseReason):
            raise DecodeError("BadEnumTag", f"RefuseReason {reason}")
        frame = Refuse(reason, reader.varint(32))
    elif tag in (3, 5, 6):
        call_id = reader.take(16)
        method = reader.text()
        body = reader.length_prefixed()
        frame = {3: CallFrame, 5: Progress, 6: Return}[tag](call_id, method, body)
    elif tag == 4:
        frame = Cancel(reader.take(16))
    elif tag == 7:
        call_id = reader.take(16)
        method = reader.text()
        kind = reader.byte()
        message = reader.text()
        code = _read_option(reader, lambda: reader.varint(32))
        frame = Fail(call_id, method, kind, message, code)
    elif tag == 8:
        frame = Shutdown()
    else:
        raise DecodeError("BadEnumTag", f"frame kind {tag}")
    reader.finish()
    return frame


def _read_option(reader: _Reader, read: Callable[[], Any]) -> Any:
    tag = reader.byte()
    if tag == 0:
        return None
    if tag == 1:
        return read()
    raise DecodeError("BadOptionTag", f"option tag {tag}")


def _put_text(out: bytearray, text: str) -> None:
    raw = text.encode("utf-8")
    _put_varint(out, len(raw))
    out += raw


def _put_bytes(out: bytearray, raw: bytes) -> None:
    _put_varint(out, len(raw))
    out += raw


def _body_head(tag: int, call_id: bytes, method: str, body_len: int) -> bytearray:
    """A body-carrying frame up to its body: prefix, tag, id, method, body length."""
    name = method.encode("ascii")
    payload_len = 1 + 16 + _varint_len(len(name)) + len(name) + _varint_len(body_len) + body_len
    out = bytearray(struct.pack("<I", payload_len))
    out.append(tag)
    out += call_id
    _put_varint(out, len(name))
    out += name
    _put_varint(out, body_len)
    return out


def _body_payload_len(method: str, body_len: int) -> int:
    return 1 + 16 + _varint_len(len(method)) + len(method) + _varint_len(body_len) + body_len


def encode_frame(frame: Any) -> bytes:
    """The frame as it goes on the wire: its length prefix, then its payload."""
    out = bytearray()
    if isinstance(frame, Hello):
        out.append(0)
        _put_varint(out, frame.protocol)
        _put_text(out, frame.worker_name)
        _put_text(out, frame.worker_version)
        _put_varint(out, len(frame.methods))
        for method in frame.methods:
            _put_text(out, method)
        if frame.token is None:
            out.append(0)
        else:
            out.append(1)
            _put_bytes(out, frame.token)
    elif isinstance(frame, Welcome):
        out.append(1)
        for number in (frame.max_frame, frame.max_in_flight, frame.max_progress_per_call):
            _put_varint(out, number)
    elif isinstance(frame, Refuse):
        out.append(2)
        _put_varint(out, int(frame.reason))
        _put_varint(out, frame.host_protocol)
    elif isinstance(frame, (CallFrame, Progress, Return)):
        tag = {CallFrame: 3, Progress: 5, Return: 6}[type(frame)]
        return bytes(_body_head(tag, frame.id, frame.method, len(frame.body)) + frame.body)
    elif isinstance(frame, Cancel):
        out.append(4)
        out += frame.id
    elif isinstance(frame, Fail):
        out.append(7)
        out += frame.id
        _put_text(out, frame.method)
        out.append(int(frame.kind))
        _put_text(out, frame.message)
        if frame.code is None:
            out.append(0)
        else:
            out.append(1)
            _put_varint(out, frame.code)
    elif isinstance(frame, Shutdown):
        out.append(8)
    else:
        raise TypeError(f"not a frame: {frame!r}")
    return struct.pack("<I", len(out)) + bytes(out)


class _FrameReader:
    """Splits a byte stream into frame payloads (section 2). A length prefix over ``max_frame``
    is refused as soon as its four bytes are in, before any room is made for its payload."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_frame(self) -> Optional[bytes]:
        if len(self._buffer) < LENGTH_PREFIX:
            return None
        (length,) = struct.unpack_from("<I", self._buffer)
        if length == 0:
            raise HostViolation(
                ViolationCode.EmptyFrame, "a frame of at least one byte", "length 0"
            )
        if length > self.max_frame:
            raise HostViolation(
                ViolationCode.FrameTooLarge,
                f"a frame of at most {self.max_frame} bytes",
                f"length {length}",
            )
        end = LENGTH_PREFIX + length
        if len(self._buffer) < end:
            return None
        payload = bytes(self._buffer[LENGTH_PREFIX:end])
        del self._buffer[:end]
        return payload

    def finish(self) -> None:
        if self._buffer:
            raise HostViolation(
                ViolationCode.TruncatedFrame,
                "the stream to end between frames",
                f"end of stream {len(self._buffer)} bytes into a frame",
            )


# ---------------------------------------------------------------------------------------------
# Names and text (section 5.1).

_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")


def is_valid_name(name: str) -> bool:
    """The naming rule of methods, worker names and versions: 1 to 64 bytes of
    ``[A-Za-z0-9._-]``."""
    return isinstance(name, str) and _NAME.match(name) is not None


# Unicode 16's Cf, Zl, Zp and Default_Ignorable_Code_Point beyond the controls (section 5.1).
_UNSAFE_RANGES = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x0600, 0x0605), (0x061C, 0x061C),
    (0x06DD, 0x06DD), (0x070F, 0x070F), (0x0890, 0x0891), (0x08E2, 0x08E2),
    (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x200B, 0x200F),
    (0x2028, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFFB), (0x110BD, 0x110BD),
    (0x110CD, 0x110CD), (0x13430, 0x1345F), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)  # fmt: skip


def is_unsafe_in_text(char: str) -> bool:
    """True for a character a ``Fail.message`` must not hold: a control character (Cc) or
    one that can hide or forge log text (section 5.1's list)."""
    point = ord(char)
    if point <= 0x1F or 0x7F <= point <= 0x9F:
        return True
    return any(low <= point <= high for low, high in _UNSAFE_RANGES)


def clean_message(text: str) -> str:
    """``text`` made fit for ``Fail.message``: each unsafe character (and each lone surrogate,
    which has no UTF-8 form) replaced by a space, then cut to at most 4096 UTF-8 bytes on a
    character boundary."""
    cleaned = "".join(
        " " if is_unsafe_in_text(c) or 0xD800 <= ord(c) <= 0xDFFF else c for c in text
    )
    raw = cleaned.encode("utf-8")
    if len(raw) <= MAX_ERROR_MESSAGE:
        return cleaned
    return raw[:MAX_ERROR_MESSAGE].decode("utf-8", "ignore")


def _describe(error: BaseException) -> str:
    """``Type: message`` for an exception, even one whose ``__str__`` itself raises."""
    try:
        text = str(error)
    except Exception:  # the exception's own __str__ failed; its type still says something
        text = "(its message could not be formatted)"
    name = type(error).__name__
    return f"{name}: {text}" if text else name


# ---------------------------------------------------------------------------------------------
# The channel (section 1.1).


class Channel:
    """A connection to the host: a descriptor to read frames from and one to write them to
    (the same one for a socket). Reads and writes block; writes are whole (see ``write_all``)."""

    def __init__(self, read_fd: int, write_fd: int, owner: Any = None) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        # A socket object that owns the descriptor, kept alive with the channel.
        self._owner = owner
        self._closed = False

    @classmethod
    def from_socket(cls, sock: socket.socket) -> "Channel":
        """A channel over a connected stream socket (``AF_UNIX``, ``SOCK_STREAM``)."""
        sock.setblocking(True)
        return cls(sock.fileno(), sock.fileno(), sock)

    def read(self, size: int = _READ_CHUNK) -> bytes:
        """Up to ``size`` bytes; ``b""`` at end of stream."""
        return os.read(self.read_fd, size)

    def write_all(self, data: bytes) -> None:
        """Writes every byte of ``data``, looping over short writes."""
        view = memoryview(data)
        while view:
            written = os.write(self.write_fd, view)
            view = view[written:]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if isinstance(self._owner, socket.socket):
            try:
                self._owner.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._owner.close()
            return
        for fd in {self.read_fd, self.write_fd}:
            try:
                os.close(fd)
            except OSError:
                pass


def _parse_token(text: str) -> Optional[bytes]:
    """``AIRLOCK_TOKEN``: exactly 64 lowercase hexadecimal digits, else no token at all."""
    if re.fullmatch(r"[0-9a-f]{64}", text) is None:
        return None
    return bytes.fromhex(text)


def channel_from_env(environ: Optional[Dict[str, str]] = None) -> Tuple[Channel, Optional[bytes]]:
    """Finds the channel the host set up, in the order of PROTOCOL.md section 1.1, and the
    token to quote in ``Hello`` (named socket only).

    Pipe: stdin and stdout are taken over as private descriptors, then fd 1 is pointed at
    stderr and fd 0 at ``/dev/null``, so a stray ``print`` goes to the host's log instead of
    corrupting the channel. Call it before any other code of the program writes to stdout.
    """
    env = os.environ if environ is None else environ
    name = env.get("AIRLOCK_SOCKET_NAME")
    if name is not None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(name)
        except OSError as err:
            sock.close()
            raise ChannelError(f"cannot connect to AIRLOCK_SOCKET_NAME {name!r}: {err}") from err
        return Channel.from_socket(sock), _parse_token(env.get("AIRLOCK_TOKEN", ""))
    fd_text = env.get("AIRLOCK_SOCKET_FD")
    if fd_text is not None:
        if re.fullmatch(r"[0-9]{1,9}", fd_text) is None or int(fd_text) < 3:
            raise ChannelError(
                f"AIRLOCK_SOCKET_FD={fd_text!r} is not a descriptor number from 3 up"
            )
        fd = int(fd_text)
        try:
            sock = socket.socket(fileno=fd)
        except OSError as err:
            raise ChannelError(f"AIRLOCK_SOCKET_FD={fd} is not a socket: {err}") from err
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            sock.detach()
            raise ChannelError(f"AIRLOCK_SOCKET_FD={fd} is not a Unix stream socket")
        os.set_inheritable(fd, False)
        return Channel.from_socket(sock), None
    # os.dup gives the lowest free descriptor (3 or above here), not inherited by children.
    channel_in = os.dup(0)
    channel_out = os.dup(1)
    sys.stdout.flush()
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return Channel(channel_in, channel_out), None


# ---------------------------------------------------------------------------------------------
# The worker.


class Call:
    """What a handler registered with ``takes_call=True`` receives beside its request."""

    def __init__(self, session: "_Session", call_id: bytes, method: str) -> None:
        self._session = session
        #: The call's id: 16 bytes the host drew at random; opaque.
        self.id = call_id
        #: The method's name.
        self.method = method
        #: Set when the host cancels the call. Its ``Fail`` (kind ``Cancelled``) is sent at
        #: once; whatever the handler returns afterwards is dropped.
        self.cancelled = threading.Event()

    def progress(self, value: Any) -> bool:
        """Sends ``value`` as a ``Progress`` update. False when it was not sent: the host's
        quota for this call is used up, the call already ended, or the update does not fit in
        a frame. Raises :class:`EncodeError` for a value with no ``Value`` encoding. (The Rust
        host counts updates but does not hand them to its caller yet.)"""
        body = encode_value(value, self._session.limits().max_depth)
        return self._session.send_progress(self.id, self.method, body)


@dataclasses.dataclass
class _Method:
    function: Callable[..., Any]
    takes_call: bool


class Worker:
    """A set of named handlers and the identity it introduces itself with.

    Each handler takes the decoded request (a ``Value``, see the module docs) and returns the
    response, or raises. ``max_concurrency`` handlers run at once, each on a thread of its own;
    more calls wait for a thread. ``limits`` are the budgets requests are decoded with; by
    default the codec's defaults with ``max_bytes`` and ``max_len`` raised to the host's
    ``max_frame``. ``max_frame`` caps the frames accepted before the host's ``Welcome`` states
    its own.
    """

    def __init__(
        self,
        name: str,
        version: str,
        *,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        limits: Optional[Limits] = None,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        for what, text in (("worker name", name), ("worker version", version)):
            if not is_valid_name(text):
                raise ValueError(f"a {what} is 1 to 64 characters of [A-Za-z0-9._-], not {text!r}")
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if max_frame < MIN_MAX_FRAME:
            raise ValueError(f"max_frame must be at least {MIN_MAX_FRAME}")
        self.name = name
        self.version = version
        self.max_concurrency = max_concurrency
        self.limits = limits
        self.max_frame = max_frame
        self._methods: Dict[str, _Method] = {}

    def method(self, name: str, *, takes_call: bool = False) -> Callable[[Callable], Callable]:
        """Registers the decorated function as method ``name``. With ``takes_call=True`` it is
        called as ``function(request, call)``, ``call`` being its :class:`Call`."""

        def register(function: Callable) -> Callable:
            self.add_method(name, function, takes_call=takes_call)
            return function

        return register

    def add_method(self, name: str, function: Callable, *, takes_call: bool = False) -> None:
        """Registers ``function`` as method ``name`` (see :meth:`method`)."""
        if not is_valid_name(name):
            raise ValueError(f"a method name is 1 to 64 characters of [A-Za-z0-9._-], not {name!r}")
        if name in self._methods:
            raise ValueError(f"method {name!r} is registered twice")
        if len(self._methods) >= MAX_HELLO_METHODS:
            raise ValueError(f"a worker serves at most {MAX_HELLO_METHODS} methods")
        self._methods[name] = _Method(function, takes_call)

    @property
    def method_names(self) -> Tuple[str, ...]:
        """The methods served, in the order they were registered (``Hello.methods``)."""
        return tuple(self._methods)

    def serve(self, channel: Channel, token: Optional[bytes] = None) -> str:
        """Speaks the protocol on ``channel`` until it ends. Returns ``"shutdown"`` after a
        ``Shutdown`` once every call is answered, ``"closed"`` when the host's stream ended
        between frames. Raises :class:`Refused` or :class:`HostViolation` (nothing more is sent
        then), or ``OSError`` when the channel fails. Closes the channel in every case."""
        if token is not None and len(token) != TOKEN_LEN:
            raise ValueError(f"a connection token is {TOKEN_LEN} bytes")
        session = _Session(self, channel, token)
        try:
            return session.run()
        finally:
            session.close()

    def run(self) -> int:
        """Serves on the channel the host set up (see :func:`channel_from_env`); the exit
        status for the process: 0 after ``Shutdown`` or the host's end of stream, 1 otherwise,
        with one line on stderr saying why."""
        try:
            channel, token = channel_from_env()
            self.serve(channel, token)
            return 0
        except (ChannelError, Refused, HostViolation, OSError) as err:
            print(f"{self.name}: {err}", file=sys.stderr, flush=True)
            return 1

    def _lookup(self, name: str) -> Optional[_Method]:
        return self._methods.get(name)


@dataclasses.dataclass
class _Running:
    call: Call
    progress: int = 0


class _Pool:
    """At most ``size`` daemon threads running tasks from one queue, started as needed. A
    running handler cannot be stopped, and need not be waited for when the worker exits."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._tasks: "queue.SimpleQueue[Tuple[Callable, tuple]]" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._pending = 0

    def submit(self, task: Callable, *args: Any) -> None:
        with self._lock:
            self._pending += 1
            if self._pending > self._idle and self._threads < self._size:
                self._threads += 1
                self._idle += 1
                threading.Thread(
                    target=self._loop, name=f"airlock-handler-{self._threads}", daemon=True
                ).start()
        self._tasks.put((task, args))

    def _loop(self) -> None:
        while True:
            task, args = self._tasks.get()
            with self._lock:
                self._idle -= 1
                self._pending -= 1
            task(*args)
            with self._lock:
                self._idle += 1


class _Session:
    """One connection, worker side: the state machine of PROTOCOL.md section 7.3.

    The main thread reads and handles the host's frames; handler threads send their own
    replies. Two locks, always taken in this order: ``_write`` (one frame at a time reaches the
    channel, whole) and ``_state`` (the call table). A call leaves the table in the same
    critical section that writes its terminal frame, so nothing is ever sent for an id after
    its ``Return`` or ``Fail``.
    """

    AWAITING_WELCOME = "AwaitingWelcome"
    SERVING = "Serving"
    DRAINING = "Draining"
    CLOSED = "Closed"

    def __init__(self, worker: Worker, channel: Channel, token: Optional[bytes]) -> None:
        self._worker = worker
        self._channel = channel
        self._token = token
        self._state = self.AWAITING_WELCOME
        self._welcome: Optional[Welcome] = None
        self._limits = worker.limits or Limits()
        self._running: Dict[bytes, _Running] = {}
        self._finished: "collections.OrderedDict[bytes, None]" = collections.OrderedDict()
        self._finished_capacity = FINISHED_ID_MEMORY
        self._write = threading.Lock()
        self._state_lock = threading.Lock()
        self._write_error: Optional[OSError] = None
        self._reader = _FrameReader(worker.max_frame)
        self._pool = _Pool(worker.max_concurrency)
        self._wake_read, self._wake_write = os.pipe()

    def limits(self) -> Limits:
        return self._limits

    # -- the main thread -------------------------------------------------------------------

    def run(self) -> str:
        """Serves until the connection ends (see :meth:`Worker.serve`)."""
        try:
            return self._serve()
        except BaseException:
            # A refusal, a host violation or a failed channel: nothing more is written, not
            # even by a handler finishing meanwhile.
            self._mark_closed()
            raise

    def _serve(self) -> str:
        hello = Hello(
            PROTOCOL_VERSION,
            self._worker.name,
            self._worker.version,
            self._worker.method_names,
            self._token,
        )
        self._send(encode_frame(hello))
        selector = selectors.DefaultSelector()
        try:
            selector.register(self._channel.read_fd, selectors.EVENT_READ, "channel")
            selector.register(self._wake_read, selectors.EVENT_READ, "wake")
            while True:
                if self._write_error is not None:
                    raise self._write_error
                if self._drained():
                    return "shutdown"
                for key, _ in selector.select():
                    if key.data == "wake":
                        os.read(self._wake_read, 4096)
                        continue
                    data = self._channel.read(_READ_CHUNK)
                    if not data:
                        self._reader.finish()
                        return "shutdown" if self._drained() else "closed"
                    self._reader.feed(data)
                    while True:
                        payload = self._reader.next_frame()
                        if payload is None:
                            break
                        self._handle(payload)
        finally:
            selector.close()

    def _handle(self, payload: bytes) -> None:
        try:
            frame = decode_frame(payload)
        except DecodeError as err:
            raise HostViolation(
                ViolationCode.MalformedFrame, "a valid frame encoding", err.reason
            ) from None
        kind = _kind_name(frame)
        if self._state == self.AWAITING_WELCOME:
            if isinstance(frame, Welcome):
                return self._on_welcome(frame)
            if isinstance(frame, Refuse):
                reason = frame.reason
                raise Refused(RefuseReason(reason), frame.host_protocol)
            raise HostViolation(ViolationCode.FrameBeforeHandshake, "Welcome or Refuse", kind)
        if isinstance(frame, (Welcome, Refuse)):
            raise HostViolation(ViolationCode.DuplicateHandshake, "Call, Cancel or Shutdown", kind)
        if isinstance(frame, (Hello, Progress, Return, Fail)):
            raise HostViolation(ViolationCode.ForbiddenKind, "Call, Cancel or Shutdown", kind)
        if isinstance(frame, CallFrame):
            return self._on_call(frame)
        if isinstance(frame, Cancel):
            return self._on_cancel(frame)
        # Shutdown: take no new calls; end once every call is answered.
        with self._state_lock:
            if self._state == self.SERVING:
                self._state = self.DRAINING
        return None

    def _on_welcome(self, welcome: Welcome) -> None:
        if welcome.max_frame < MIN_MAX_FRAME or not 1 <= welcome.max_in_flight <= MAX_IN_FLIGHT:
            raise HostViolation(ViolationCode.InvalidWelcome, "limits in range", repr(welcome))
        self._welcome = welcome
        # Frames already buffered behind the Welcome are judged by the new cap.
        self._reader.max_frame = welcome.max_frame
        self._finished_capacity = max(FINISHED_ID_MEMORY, 2 * welcome.max_in_flight)
        if self._worker.limits is None:
            self._limits = Limits(max_bytes=welcome.max_frame, max_len=welcome.max_frame)
        with self._state_lock:
            self._state = self.SERVING

    def _on_call(self, frame: CallFrame) -> None:
        if self._state == self.DRAINING:
            raise HostViolation(ViolationCode.ForbiddenKind, "no Call after Shutdown", "Call")
        if not is_valid_name(frame.method):
            raise HostViolation(ViolationCode.InvalidName, "a valid method name", "Call")
        call = Call(self, frame.id, frame.method)
        with self._state_lock:
            if frame.id in self._running or frame.id in self._finished:
                raise HostViolation(ViolationCode.DuplicateCallId, "a fresh call id", "Call")
            assert self._welcome is not None
            if len(self._running) >= self._welcome.max_in_flight:
                raise HostViolation(
                    ViolationCode.TooManyCalls, "at most max_in_flight calls", "Call"
                )
            self._running[frame.id] = _Running(call)
        method = self._worker._lookup(frame.method)
        if method is None:
            message = f"this worker serves no method named {frame.method!r}"
            self._finish_fail(call, ErrorKind.UnknownMethod, message)
            return
        self._pool.submit(self._run_call, call, method, frame.body)

    def _on_cancel(self, frame: Cancel) -> None:
        with self._write:
            with self._state_lock:
                running = self._running.pop(frame.id, None)
                if running is None:
                    if frame.id in self._finished:
                        return  # crossed our terminal frame on the wire: expected, ignored
                    raise HostViolation(
                        ViolationCode.UnknownCallId, "the id of a call received", "Cancel"
                    )
                self._remember(frame.id)
            running.call.cancelled.set()
            method = running.call.method
            fail = Fail(frame.id, method, ErrorKind.Cancelled, "cancelled by the host", None)
            self._send_locked(encode_frame(fail))

    # -- handler threads -------------------------------------------------------------------

    def _run_call(self, call: Call, method: _Method, body: bytes) -> None:
        """Runs one call on a handler thread and sends its one terminal frame."""
        if call.cancelled.is_set():
            return  # cancelled while it waited for a thread: answered already
        try:
            self._answer(call, method, body)
        except Exception as err:  # noqa: BLE001 - a defect here must still answer the call
            print(traceback.format_exc(), file=sys.stderr, end="", flush=True)
            self._finish_fail(call, ErrorKind.Internal, f"the worker failed: {_describe(err)}")

    def _answer(self, call: Call, method: _Method, body: bytes) -> None:
        try:
            request = decode_value(body, self._limits)
        except DecodeError as err:
            message = f"the request did not decode: {err}"
            return self._finish_fail(call, ErrorKind.BadRequest, message)
        try:
            if method.takes_call:
                result = method.function(request, call)
            else:
                result = method.function(request)
        except HandlerError as err:
            return self._finish_fail(call, ErrorKind.Handler, err.message, err.code)
        except BaseException as err:  # noqa: BLE001 - every failure of a handler is a Panic
            if call.cancelled.is_set():
                return
            print(
                f"{self._worker.name}: handler {call.method!r} raised:\n{traceback.format_exc()}",
                file=sys.stderr,
                end="",
                flush=True,
            )
            return self._finish_fail(call, ErrorKind.Panic, f"handler raised {_describe(err)}")
        try:
            response = encode_value(result, self._limits.max_depth)
        except EncodeError as err:
            message = f"the response did not encode: {err}"
            return self._finish_fail(call, ErrorKind.Internal, message)
        self._finish_return(call, response)

    def _finish_return(self, call: Call, body: bytes) -> None:
        assert self._welcome is not None
        max_frame = self._welcome.max_frame
        if _body_payload_len(call.method, len(body)) > max_frame:
            message = f"response of {len(body)} bytes exceeds the host's max_frame ({max_frame})"
            return self._finish_fail(call, ErrorKind.Limit, message)
        head = _body_head(6, call.id, call.method, len(body))
        self._finish(call.id, bytes(head), body)

    def _finish_fail(
        self, call: Call, kind: ErrorKind, message: str, code: Optional[int] = None
    ) -> None:
        frame = Fail(call.id, call.method, kind, clean_message(message), code)
        self._finish(call.id, encode_frame(frame), b"")

    def _finish(self, call_id: bytes, head: bytes, body: bytes) -> None:
        """Sends a call's one terminal frame, unless it has one already (it was cancelled)."""
        with self._write:
            with self._state_lock:
                if self._running.pop(call_id, None) is None:
                    return
                self._remember(call_id)
                drained = self._state == self.DRAINING and not self._running
            self._send_locked(head, body)
        if drained:
            self._wake()

    def send_progress(self, call_id: bytes, method: str, body: bytes) -> bool:
        assert self._welcome is not None
        if _body_payload_len(method, len(body)) > self._welcome.max_frame:
            return False
        with self._write:
            with self._state_lock:
                running = self._running.get(call_id)
                if running is None or running.progress >= self._welcome.max_progress_per_call:
                    return False
                running.progress += 1
            self._send_locked(bytes(_body_head(5, call_id, method, len(body))), body)
        return True

    # -- shared ----------------------------------------------------------------------------

    def _remember(self, call_id: bytes) -> None:
        """Keeps the id of a finished call (under ``_state_lock``), oldest forgotten first."""
        self._finished[call_id] = None
        while len(self._finished) > self._finished_capacity:
            self._finished.popitem(last=False)

    def _drained(self) -> bool:
        with self._state_lock:
            return self._state == self.DRAINING and not self._running

    def _send(self, head: bytes, body: bytes = b"") -> None:
        with self._write:
            self._send_locked(head, body)

    def _send_locked(self, head: bytes, body: bytes = b"") -> None:
        """Writes one frame whole (under ``_write``). After a failed write, or once the session
        is closed, nothing more is written: no frame ever follows a partial one."""
        if self._state == self.CLOSED or self._write_error is not None:
            return
        try:
            self._channel.write_all(head)
            if body:
                self._channel.write_all(body)
        except OSError as err:
            self._write_error = err
            self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_write, b"!")
        except OSError:
            pass  # the pipe is full: the main thread has a wake-up pending anyway

    def _mark_closed(self) -> None:
        """From here on nothing is written and no call is answered."""
        with self._write:
            with self._state_lock:
                self._state = self.CLOSED
                self._running.clear()

    def close(self) -> None:
        self._mark_closed()
        self._channel.close()
        for fd in (self._wake_read, self._wake_write):
            os.close(fd)
