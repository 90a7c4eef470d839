"""`paramserver train` with codecs on the wire (issue 22): the flags parsed once, the bytes
and codec in every step record, and training close to the dense run."""

import json

import numpy as np
import pytest

from paramserver.compression.wire import WireSpec
from paramserver.runlog.metrics import read_records
from paramserver.training.train_task import WireValues
from ps_helpers import train_side_by_side


# ---- the flags, parsed ------------------------------------------------------------------------
def test_compress_takes_pruners_and_codecs():
    assert WireSpec.parse("bf16").dense_codec
    assert WireSpec.parse("bf16").label() == "bf16"
    u8 = WireSpec.parse("uniform8", {"block": 64, "error_feedback": False})
    assert u8.codec_options == {"block": 64} and not u8.error_feedback
    tk = WireSpec.parse("topk", {"fraction": 0.01, "codec": "bf16"})
    assert tk.compressor().codec.name == "bf16" and tk.push_codec() is None
    assert tk.label() == "topk+bf16"
    pulls = WireSpec.parse("none", {}, "bf16", 7)
    assert pulls.pull_codec_object().name == "bf16" and pulls.pull_refresh == 7
    assert WireSpec.parse("none").compressor() is None


@pytest.mark.parametrize("args, words", [
    (("zip9",), "pruners: none, topk.*codecs: fp32"),
    (("topk", {"codec": "zip"}), "unknown codec 'zip'.*codecs"),
    (("bf16", {"nope": 1}), "no option"),
    (("topk", {"codec.block": 4}), "need --compress-opt codec"),
    (("none", {}, "nope"), "unknown --pull-compress"),
    (("none", {}, "bf16", 0), "pull-refresh"),
])
def test_unknown_names_and_options_list_the_known(args, words):
    with pytest.raises(ValueError, match=words):
        WireSpec.parse(*args)


def test_dense_codec_pushes_keep_the_codec_error_in_a_residual():
    values = WireValues(WireSpec.parse("uniform8"), 100)
    rng = np.random.default_rng(0)
    total_grad, total_sent = np.zeros(100), np.zeros(100)
    for _ in range(5):
        g = rng.standard_normal(100).astype(np.float32)
        v, sent = values.before_push(g)
        codec = values.push
        sent[:] = codec.decode(codec.encode(v), 100)  # what kv.push_async(sent=) writes
        values.after_push()
        total_grad += g
        total_sent += sent
    # What was sent plus what is held back is what was computed.
    np.testing.assert_allclose(total_sent + values.residual, total_grad, atol=1e-5)


def test_a_dense_pull_first_and_every_refresh_th():
    values = WireValues(WireSpec.parse("none", {}, "bf16", 3), 10)
    kinds = [values.next_pull() is None for _ in range(7)]
    assert kinds == [True, False, False, True, False, False, True]
    values.next_pull()
    values.abandoned()  # a dropped delta reply: the next pull is dense
    assert values.next_pull() is None


def test_codec_catalog_matches_the_registry():
    from paramserver.cli import catalog
    from paramserver.compression import CODECS
    assert catalog.CODECS == tuple(CODECS.names())


# ---- live --------------------------------------------------------------------------------------
def _train(root, runs: dict) -> dict:
    done = train_side_by_side(
        root, {name: ["--sync", "bsp", "--workers", "2", *a] for name, a in runs.items()}, 240)
    for out, proc in done.values():
        assert proc.returncode == 0, proc.stderr[-2000:]
    return {name: out for name, (out, _) in done.items()}


def test_bf16_pushes_and_delta_pulls_put_half_the_bytes_on_the_wire(tmp_path):
    out = _train(tmp_path, {"bf16": ["--steps", "8", "--eval-interval", "0", "--compress",
                                     "bf16", "--pull-compress", "bf16", "--pull-refresh",
                                     "3", "--lr", "0.2"]})["bf16"]
    steps = [r for r in read_records(out / "metrics.jsonl") if r["kind"] == "step"]
    assert len(steps) == 16
    dense = 4 * json.loads((out / "job.json").read_text())["num_keys"]
    for r in steps:
        assert (r["push_codec"], r["pull_codec"]) == ("bf16", "bf16")
        assert r["push_bytes"] == dense // 2
        # Pulls 0, 3, 6 are dense refreshes; the others bf16 deltas.
        assert r["pull_bytes"] == (dense if r["step"] % 3 == 0 else dense // 2), r
        assert np.isfinite(r["loss"])


@pytest.mark.slow
def test_codec_runs_train_close_to_the_dense_run(tmp_path):
    common = ["--epochs", "6", "--lr", "0.2", "--eval-interval", "0.5"]
    outs = _train(tmp_path, {
        "dense": common,
        "bf16": [*common, "--compress", "bf16", "--pull-compress", "bf16"],
        "uniform8": [*common, "--compress", "uniform8"]})
    acc = {n: json.loads((o / "summary.json").read_text())["final_test_accuracy"]
           for n, o in outs.items()}
    assert acc["dense"] >= 0.9, acc
    for name in ("bf16", "uniform8"):
        assert acc[name] >= acc["dense"] - 0.03, acc
