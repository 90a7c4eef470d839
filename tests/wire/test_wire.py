"""Wire codec: round trips, and every kind of malformed frame is refused with WireError."""

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from paramserver.wire import Message, PROTOCOL_VERSION, WireError, decode, encode


def frames_of(msg):
    return [bytes(f) for f in encode(msg)]


def header(**fields):
    base = {"v": PROTOCOL_VERSION, "op": "pull", "rid": 1, "src": "t", "range": [0, 4]}
    base.update(fields)
    return msgpack.packb(base)


def test_push_round_trip_keeps_fields_and_values():
    values = np.arange(10, dtype=np.float64) / 3
    msg = Message("push", {"range": [5, 15], "step": 3, "version": 2, "batch": 32, "scale": 0.5},
                  [values], rid=9, src="w1")
    out = decode(frames_of(msg))
    assert (out.op, out.rid, out.src) == ("push", 9, "w1")
    assert out.fields == {"range": [5, 15], "step": 3, "version": 2, "batch": 32, "scale": 0.5}
    np.testing.assert_array_equal(out.arrays[0], values)


def test_sparse_push_carries_int64_keys_and_values():
    keys = np.array([3, 1, 4, 1], dtype=np.int64)
    vals = np.array([1, 2, 3, 4], dtype=np.float32)
    out = decode(frames_of(Message("push_sparse", {"step": 0, "version": 0, "batch": 1},
                                   [keys, vals])))
    assert out.arrays[0].dtype == np.int64 and out.arrays[1].dtype == np.float32
    np.testing.assert_array_equal(out.arrays[0], keys)


@pytest.mark.parametrize("frames, fragment", [
    ([], "empty"),
    ([b"\xc1\xff garbage"], "msgpack"),
    ([msgpack.packb([1, 2, 3])], "not a map"),
    ([header(v=PROTOCOL_VERSION + 1)], "protocol version"),
    ([header(v=None)], "protocol version"),
    ([header(op="explode")], "unknown op"),
    ([header(rid=-1)], "rid"),
    ([header(rid="x")], "rid"),
    ([header(src=5)], "src"),
    ([header(range=[4, 0])], "range"),
    ([header(range=[0, "a"])], "range"),
    ([header(range=[0, 1, 2])], "range"),
    ([header(min_version=-3)], "min_version"),
    ([header(min_version=True)], "min_version"),
    ([header(extra=1)], "unknown fields"),
    ([msgpack.packb({"v": PROTOCOL_VERSION, "op": "push", "rid": 1, "src": "t",
                     "range": [0, 2], "version": 0, "batch": 1})], "needs field"),
])
def test_malformed_headers_are_refused(frames, fragment):
    with pytest.raises(WireError, match=fragment):
        decode(frames)


def push_frames(spec, payload):
    head = {"v": PROTOCOL_VERSION, "op": "push", "rid": 1, "src": "t", "range": [0, 4],
            "step": 0, "version": 0, "batch": 1, "arrays": spec}
    return [msgpack.packb(head), *payload]


@pytest.mark.parametrize("spec, payload, fragment", [
    ([["float32", 4]], [b"\0" * 15], "bytes"),  # truncated
    ([["float32", 4]], [], "frames follow"),  # missing frame
    ([["float32", 4]], [b"\0" * 16, b"\0" * 16], "frames follow"),  # extra frame
    ([["complex64", 4]], [b"\0" * 32], "bad spec"),  # unsupported dtype
    ([["object", 4]], [b"\0" * 32], "bad spec"),
    ([["float32", -1]], [b""], "bad spec"),
    ("nonsense", [b"\0" * 16], "frames follow"),
])
def test_malformed_tensor_frames_are_refused(spec, payload, fragment):
    with pytest.raises(WireError, match=fragment):
        decode(push_frames(spec, payload))


def test_nan_in_float_field_is_refused():
    with pytest.raises(WireError, match="NaN"):
        decode(frames_of(Message("clock", {"step": 0, "batch": 1, "compute_time": float("nan")})))


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=0, max_size=4))
def test_random_frames_only_ever_raise_wire_error(frames):
    try:
        decode(frames)
    except WireError:
        pass


@settings(max_examples=1500, deadline=None)
@given(st.data())
def test_mutated_valid_frames_only_ever_raise_wire_error(data):
    good = frames_of(Message("push", {"range": [0, 3], "step": 1, "version": 0, "batch": 2},
                             [np.ones(3, dtype=np.float32)]))
    head = bytearray(good[0])
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(head) - 1))
        head[pos] = data.draw(st.integers(0, 255))
    try:
        decode([bytes(head), good[1]])
    except WireError:
        pass


def _nested(depth: int, leaf=1):
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def _raw_push_with(field: str, raw_value: bytes) -> bytes:
    """A push header whose `field` is `raw_value`, msgpack written by hand (its packer refuses
    to nest as deep as its unpacker accepts)."""
    head = {"v": PROTOCOL_VERSION, "op": "push", "rid": 1, "src": "w", "range": [0, 8],
            "step": 0, "version": 0, "batch": 1, field: "\0mark\0"}
    return msgpack.packb(head).replace(msgpack.packb("\0mark\0"), raw_value, 1)


@pytest.mark.parametrize("depth", [2, 33, 900, 999, 1000, 1010, 1023, 1024, 5000])
@pytest.mark.parametrize("field", ["range", "enc", "arrays", "rid", "zzz"])
def test_a_field_nested_at_any_depth_is_refused_with_a_short_line(field, depth):
    """Nesting msgpack accepts (up to 1023) but Python would recurse on when formatting the
    refusal used to raise RecursionError and end the role; every depth is a WireError whose
    text stays one short line."""
    with pytest.raises(WireError) as refused:
        decode([_raw_push_with(field, b"\x91" * depth + b"\x01")])
    assert len(str(refused.value)) < 200


def test_container_fields_nest_up_to_the_limit_and_no_deeper():
    from paramserver.wire.protocol import MAX_NESTING
    ok = Message("reshard", {"epoch": 1, "layout": _nested(MAX_NESTING - 1, []), "old": []})
    assert decode(encode(ok)).fields["layout"] == _nested(MAX_NESTING - 1, [])
    deep = {"a": 1}
    for _ in range(MAX_NESTING):
        deep = {"a": deep}
    for fields in ({"epoch": 1, "layout": _nested(MAX_NESTING, []), "old": []},
                   {"epoch": 1, "layout": [], "old": [0, {"x": _nested(MAX_NESTING)}]}):
        with pytest.raises(WireError, match="nests deeper than"):
            decode(encode(Message("reshard", fields)))
    with pytest.raises(WireError, match="nests deeper than"):
        decode(encode(Message("state", {"state": deep})))
