"""Reading PROTOCOL.md's golden vectors and tables, as protocol/tests/golden.rs reads them, so
the Python SDK is held to the same bytes as the Rust code."""

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

SPEC_PATH = os.path.join(HERE, "..", "..", "PROTOCOL.md")

with open(SPEC_PATH, encoding="utf-8") as spec_file:
    SPEC = spec_file.read()


def parse_hex(text):
    """Hex bytes separated by whitespace; ``#`` starts a comment; ``(empty)`` is no bytes."""
    tokens = []
    for line in text.splitlines():
        tokens += line.split("#", 1)[0].split()
    return bytes(int(t, 16) for t in tokens if t != "(empty)")


def hex_blocks(kind):
    """``[(name, words, bytes)]`` for every block tagged ```` ```hex <kind>:<name> [words] ````."""
    blocks = []
    for info, body in re.findall(r"^```([^\n]*)\n(.*?)^```\s*$", SPEC, re.M | re.S):
        words = info.split()
        if len(words) >= 2 and words[0] == "hex" and words[1].startswith(kind + ":"):
            blocks.append((words[1][len(kind) + 1 :], words[2:], parse_hex(body)))
    if not blocks:
        raise AssertionError(f"PROTOCOL.md has no `hex {kind}:` blocks")
    return blocks


def golden_table(marker):
    """The body rows of the table between ``<!-- golden:marker -->`` and its closing marker,
    each cell trimmed and stripped of its backticks."""
    start = SPEC.index(f"<!-- golden:{marker} -->")
    end = SPEC.index(f"<!-- /golden:{marker} -->", start)
    rows = [line.strip() for line in SPEC[start:end].splitlines() if line.strip().startswith("|")]
    return [
        [cell.strip().strip("`") for cell in row.strip("|").split("|")] for row in rows[2:]
    ]
