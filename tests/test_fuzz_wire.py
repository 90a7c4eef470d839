"""Fuzzing the wire (the short version of benchmarks/fuzz_wire.py): no frame crashes anyone."""

import importlib.util
import random
from pathlib import Path

SPEC = importlib.util.spec_from_file_location(
    "fuzz_wire", Path(__file__).resolve().parents[1] / "benchmarks" / "fuzz_wire.py")
fuzz = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(fuzz)


def test_fifty_thousand_hostile_frames_only_raise_wire_error():
    refused, accepted, _ = fuzz.fuzz_decoder(50_000, random.Random(1))
    assert refused + accepted == 50_000
    assert refused > 40_000  # the mutations really are mostly invalid


def test_hostile_messages_to_live_sockets_leave_both_serving():
    live = fuzz.fuzz_live(300, random.Random(2))
    assert live["alive"] and live["correct_after"]
    assert live["replies"] > 300  # most hostile messages got an error reply
