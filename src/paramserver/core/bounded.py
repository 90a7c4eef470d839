"""Bounds on values that come from outside (a peer's frame, a file): how deep they nest.

A value nested a thousand deep is valid msgpack and valid JSON, but Python code that walks
or formats it recursively (repr, a dataclass's checks, json.dumps) raises RecursionError far
from the read. Readers refuse such values where they read them, with a stack of their own
rather than recursion.
"""

from __future__ import annotations

import json
from typing import Any

# Deeper than any job file, manifest or state this project writes (about 6), far below
# Python's recursion limit.
MAX_JSON_NESTING = 64


def nests_past(value, limit: int) -> bool:
    """Whether lists, tuples and maps in `value` nest more than `limit` deep."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        inner = item.values() if isinstance(item, dict) else item
        stack.extend((v, depth + 1) for v in inner if isinstance(v, (list, tuple, dict)))
    return False


def json_value(text: str | bytes, limit: int = MAX_JSON_NESTING) -> Any:
    """json.loads, refusing what nests deeper than `limit` with json.JSONDecodeError (a
    ValueError) as any other malformed JSON, never RecursionError."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise _malformed("nested deeper than Python can read", text) from None
    if isinstance(value, (list, dict)) and nests_past(value, limit):
        raise _malformed(f"nested deeper than {limit} levels", text)
    return value


def _malformed(why: str, text: str | bytes) -> json.JSONDecodeError:
    doc = text if isinstance(text, str) else text.decode("utf-8", "replace")
    return json.JSONDecodeError(why, doc, 0)
