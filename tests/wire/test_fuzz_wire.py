"""Fuzzing the wire (the short version of benchmarks/fuzz_wire.py and fuzz_frames.py): every
frame kind, the shared-memory handshake included; no frame crashes anyone."""

import importlib.util
import random
from pathlib import Path

from paramserver.transport import shm
from paramserver.wire.protocol import SCHEMAS

SPEC = importlib.util.spec_from_file_location(
    "fuzz_wire", Path(__file__).resolve().parents[2] / "benchmarks" / "fuzz_wire.py")
fuzz = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(fuzz)


def test_the_fuzzer_generates_every_frame_kind():
    assert {m.op for m in fuzz.SEEDS} == set(SCHEMAS)
    rng, seeds = random.Random(0), fuzz.ShmSeeds()
    firsts = [fuzz.mutate(rng, seeds)[:1] for _ in range(2000)]
    assert sum(f == [shm.HELLO] for f in firsts) > 100
    assert sum(bool(f) and f[0].startswith(shm.REFS) for f in firsts) > 100
    # Unmutated seeds parse: the mutations start from real frames of every kind.
    for msg in fuzz.SEEDS:
        fuzz.parse([bytes(f) for f in fuzz.encode(msg)])


def test_fifty_thousand_hostile_frames_only_raise_the_parsers_errors():
    refused, accepted, _ = fuzz.fuzz_decoder(50_000, random.Random(1))
    assert refused + accepted == 50_000
    assert refused > 40_000  # the mutations really are mostly invalid


def test_hostile_messages_to_live_sockets_leave_both_serving():
    live = fuzz.fuzz_live(1500, random.Random(2))
    assert live["alive"] and live["correct_after"]
    assert live["replies"] > 2000  # most hostile messages got an answer


def test_the_fuzzer_nests_every_field_up_to_and_past_msgpacks_limit():
    """The generators that found the RecursionError class: depths across Python's recursion
    limit and msgpack's, in fields of every op; none of them gets past the decoder."""
    rng = random.Random(3)
    depths = {fuzz.nesting_depth(rng) for _ in range(3000)}
    assert min(depths) == 1 and max(depths) >= 1024
    assert set(range(990, 1024)) <= depths
    for _ in range(3000):
        try:
            fuzz.parse(fuzz.mutate_nesting(rng))
        except (fuzz.WireError, fuzz.ShmFrameError):
            pass
