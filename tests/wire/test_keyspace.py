"""Key ranges and the balanced split of the key space over shards."""

import pytest
from hypothesis import given, strategies as st

from paramserver.core.keyspace import KeyRange, split_balanced


@given(st.integers(1, 10_000), st.integers(1, 64))
def test_split_covers_every_key_once_and_is_balanced(num_keys, shards):
    if num_keys < shards:
        with pytest.raises(ValueError):
            split_balanced(num_keys, shards)
        return
    ranges = split_balanced(num_keys, shards)
    assert ranges[0].lo == 0 and ranges[-1].hi == num_keys
    assert all(a.hi == b.lo for a, b in zip(ranges, ranges[1:]))
    sizes = [r.size for r in ranges]
    assert max(sizes) - min(sizes) <= 1


def test_intersection_and_containment():
    assert KeyRange(0, 10).intersect(KeyRange(5, 20)) == KeyRange(5, 10)
    assert KeyRange(0, 10).intersect(KeyRange(10, 20)) is None
    assert KeyRange(0, 10).contains(KeyRange(2, 10))
    assert not KeyRange(0, 10).contains(KeyRange(2, 11))
    with pytest.raises(ValueError):
        KeyRange(5, 4)
