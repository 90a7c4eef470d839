"""Every rank's model layout known to the job: the fingerprint, the first difference in words,
the register field on the wire, and the coordinator core refusing a rank whose model differs."""

import pytest

from paramserver.coordinator.events import Registered, Reply, SaveLayout
from paramserver.coordinator.state import CoordinatorState
from paramserver.core.layout import LayoutError, ModelLayout, first_difference
from paramserver.spec.job import JobSpec, Limits, SyncSpec
from paramserver.wire import Message, WireError
from paramserver.wire.codec import decode, encode

# Two models of the same parameter count (64*128+128 + 128*10+10 = 9610 keys each way).
A = ModelLayout.of([("0.weight", (128, 64)), ("0.bias", (128,)),
                    ("2.weight", (10, 128)), ("2.bias", (10,))], "float32")
B = ModelLayout.of([("0.weight", (64, 128)), ("0.bias", (128,)),
                    ("2.weight", (10, 128)), ("2.bias", (10,))], "float32")


def test_the_fingerprint_tells_equal_layouts_from_different_ones_of_one_size():
    assert A.num_keys == B.num_keys == 64 * 128 + 128 + 1280 + 10
    assert A.digest == ModelLayout.of(A.params, "float32").digest != B.digest
    assert ModelLayout.of(A.params, "float64").digest != A.digest
    assert first_difference(A, A) is None
    assert first_difference(A, B, "on rank 0", "on rank 2") == (
        "parameter 0: '0.weight' (128, 64) on rank 0, '0.weight' (64, 128) on rank 2")
    shorter = ModelLayout.of(A.params[:3], "float32")
    assert "parameter 3: '2.bias' (10,) in the job, missing here" == first_difference(A, shorter)
    assert "dtype" in first_difference(A, ModelLayout.of(A.params, "float64"))


def test_the_wire_form_round_trips_and_bad_ones_are_refused():
    assert ModelLayout.from_wire(A.to_wire()) == A
    msg = decode(encode(Message("register", {"role": "worker", "layout": A.to_wire()})))
    assert ModelLayout.from_wire(msg["layout"]) == A
    with pytest.raises(WireError, match="layout"):
        decode(encode(Message("register", {"role": "worker", "layout": "x"})))
    bad = [{"digest": A.digest, "dtype": "float32", "params": [["w", [-1]]]},
           {"digest": A.digest, "dtype": "int8", "params": [["w", [1]]]},
           {**A.to_wire(), "digest": B.digest},  # the digest must be the params'
           {**A.to_wire(), "extra": 1}]
    for doc in bad:
        with pytest.raises(LayoutError):
            ModelLayout.from_wire(doc)
    # A layout too large for a control message goes as its fingerprint alone.
    huge = ModelLayout.of([(f"block{i}.weight" + "x" * 100, (4, 4)) for i in range(600)],
                          "float32")
    wire = huge.to_wire()
    assert "params" not in wire and len(encode(Message("register", {
        "role": "worker", "layout": wire}))[0]) < 1000
    back = ModelLayout.from_wire(wire)
    assert not back.complete and "fingerprint" in first_difference(back, A)


def _job(workers=3):
    return JobSpec(num_keys=0, workers=workers, servers=1, batch_size=8, sync=SyncSpec("bsp"),
                   eval_interval=0.0, limits=Limits(heartbeat_timeout=5.0))


def test_the_coordinator_refuses_a_rank_whose_model_differs_naming_the_parameter():
    state = CoordinatorState(_job(), None, None)
    state.handle(Registered("srv", "server", 0.0, to="r0", link="L0", addr="tcp://h:1"))
    out = state.handle(Registered("w0", "worker", 0.1, to="rw0", num_keys=A.num_keys,
                                  want_rank=0, layout=A))
    assert [i.layout for i in out if type(i) is SaveLayout] == [A.to_wire()]
    out = state.handle(Registered("w1", "worker", 0.2, to="rw1", num_keys=A.num_keys,
                                  want_rank=1, layout=A))
    assert not [i for i in out if type(i) is SaveLayout]
    assert any(type(i) is Reply and i.op == "welcome" for i in out)
    out = state.handle(Registered("w2", "worker", 0.3, to="rw2", num_keys=B.num_keys,
                                  want_rank=2, layout=B))
    error = [i for i in out if type(i) is Reply and i.op == "error"]
    assert error and error[0].to == "rw2", out
    assert error[0].fields["msg"] == (
        "rank 2's model differs from the job's (rank 0's, the first to join): parameter 0: "
        "'0.weight' (128, 64) on rank 0, '0.weight' (64, 128) on rank 2; every rank must "
        "build the same model")
    assert set(state.members.by_rank) == {0, 1}  # not a member: the barrier still waits
    out = state.handle(Registered("w3", "worker", 0.4, to="rw3", num_keys=5, want_rank=2))
    error = [i for i in out if type(i) is Reply and i.op == "error"]
    assert "rank 2's model has 5 parameters" in error[0].fields["msg"]
    state.check_invariants()
