"""`--compress auto` (compression/auto.py): the per-tensor, per-link table, its options, the
worker's resolved wire spec, and one short live job with a slow and a fast worker."""

import itertools
import json
import math

import pytest

from paramserver.compression.auto import AutoOptions, Choice, choose_tensor, plan, tier
from paramserver.compression.wire import WireSpec
from paramserver.emulation.links import LinkTable
from paramserver.runlog.metrics import read_records
from ps_helpers import train_side_by_side

# The documented table (auto.py's docstring, --help), written out by hand: what a tensor of
# at least 4096 values pushes on a link of each rate (bits/s; None: no --link).
RATES = {None: "none", math.inf: "none", 40e9: "none", 10e9: "none", 9.99e9: "bf16",
         5e9: "bf16", 1e9: "bf16", 999_999_999.0: "uniform8", 100e6: "uniform8",
         10e6: "uniform8", 1.0: "uniform8"}
SIZES = {0: False, 1: False, 10: False, 4095: False, 4096: True, 4097: True, 8192: True,
         10**7: True}  # size -> is it large (>= 4096 values)


@pytest.mark.parametrize("rate, size", list(itertools.product(RATES, SIZES)))
def test_each_tensor_by_size_and_link_matches_the_documented_table(rate, size):
    got = choose_tensor(size, rate, AutoOptions()).label()
    assert got == (RATES[rate] if SIZES[size] else "none")


@pytest.mark.parametrize("rate", list(RATES))
def test_slow_topk_sends_top_k_with_bf16_values_below_1_gbit(rate):
    o = AutoOptions(slow="topk", fraction=0.05)
    want = {"uniform8": "topk+bf16"}.get(RATES[rate], RATES[rate])
    assert choose_tensor(8192, rate, o).label() == want
    if want == "topk+bf16":
        assert choose_tensor(8192, rate, o) == Choice("topk", (("fraction", 0.05),
                                                               ("codec", "bf16")))


def test_a_worker_pushes_its_large_tensors_format_and_dense_with_none_large():
    mlp = [8192, 128, 1280, 10]  # the digits MLP's tensors
    p = plan(mlp, 100e6, AutoOptions())
    assert [c.label() for c in p.tensors] == ["uniform8", "none", "none", "none"]
    # the small tensors stay float32 inside the push (codec mixed), the large one uniform8
    assert (p.tier, p.worker.label()) == ("slow", "uniform8+small-fp32")
    assert p.worker == Choice("mixed", (("inner", "uniform8"), ("dense_below", 4096)))
    assert plan([10, 4000], 100e6, AutoOptions()).worker.label() == "none"
    assert plan([], 100e6, AutoOptions()).worker.label() == "none"
    assert plan(mlp, 2e9, AutoOptions()).worker.label() == "bf16+small-fp32"
    assert plan([8192, 4096], 2e9, AutoOptions()).worker.label() == "bf16"  # none small
    # top-k picks keys over the whole vector: one format
    assert plan(mlp, 100e6, AutoOptions(slow="topk")).worker.label() == "topk+bf16"
    assert plan(mlp, None, AutoOptions()).tier == "dense"


def test_the_servers_links_cap_a_workers_rate_where_they_are_shaped():
    from paramserver.compression.auto import link_rate
    assert link_rate(None, [None, None], 4) is None  # nothing shaped: fast
    assert link_rate(100e6, [None], 4) == 100e6  # only the worker's own link
    # one shard at 1 Gbit/s shared by 4 workers: 250 Mbit/s each, below a 5 Gbit/s own link
    assert link_rate(5e9, [1e9], 4) == 250e6
    assert link_rate(None, [1e9], 4) == 250e6
    # two shards, each worker sends each its half: the slower shaped one bounds the push
    assert link_rate(None, [1e9, None], 4) == 500e6
    assert link_rate(100e6, [10e9, 10e9], 4) == 100e6  # the worker's own link is slower
    links = LinkTable.parse(["s=1gbit"])  # so auto compresses a fast worker behind it
    shard = links.link_for("s", 0).rate
    assert tier(link_rate(None, [shard], 8), AutoOptions()) == "slow"  # 125 Mbit/s each
    assert tier(link_rate(None, [shard], 1), AutoOptions()) == "bf16"


def test_thresholds_are_options_with_units():
    o = AutoOptions.parse({"dense_below": 100, "dense_at": "1gbit", "bf16_at": "100mbit"})
    assert (o.dense_at, o.bf16_at) == (1e9, 100e6)
    assert [tier(r, o) for r in (2e9, 1e9, 5e8, 100e6, 99e6)] == [
        "dense", "dense", "bf16", "bf16", "slow"]
    assert choose_tensor(100, 50e6, o).label() == "uniform8"
    assert choose_tensor(99, 50e6, o).label() == "none"
    assert AutoOptions.parse({"bf16_at": 5e8}).bf16_at == 5e8


@pytest.mark.parametrize("opts, words", [
    ({"nope": 1}, "no option.*nope.*its options: dense_below"),
    ({"dense_below": -1}, "dense_below"),
    ({"dense_below": 1.5}, "dense_below must be an integer"),
    ({"bf16_at": "fast"}, "bf16_at|link rate|rate"),
    ({"dense_at": 0}, "dense_at"),
    ({"bf16_at": "20gbit"}, "must not exceed dense_at"),
    ({"slow": "gzip"}, "slow must be one of uniform8, topk"),
    ({"fraction": 0}, "fraction"),
    ({"fraction": "a lot"}, "fraction must be a number"),
])
def test_bad_options_say_what_is_wrong(opts, words):
    with pytest.raises(ValueError, match=words):
        WireSpec.parse("auto", opts)


def test_auto_resolves_per_worker_from_the_jobs_links():
    links = LinkTable.parse(["w=100mbit", "w1=5gbit", "w2=unlimited"])
    spec = WireSpec.parse("auto", {}, "bf16", 5)
    assert spec.label() == "auto" and spec.compressor() is None and spec.push_codec() is None
    mlp = [8192, 128, 1280, 10]
    got = {}
    for rank in range(4):
        link = links.link_for("w", rank)
        got[rank] = spec.resolve(None if link is None else link.rate, mlp)
    assert {r: w.label() for r, w in got.items()} == {
        0: "uniform8+small-fp32", 1: "bf16+small-fp32", 2: "none", 3: "uniform8+small-fp32"}
    # the small tensors' keys: the first bias, the second layer and its bias, adjacent: one run
    assert got[0].dense_runs == ((8192, 9610),)
    codec = got[0].push_codec()
    assert (codec.name, codec.inner.name, codec.runs) == ("mixed", "uniform8", ((8192, 9610),))
    assert got[1].push_codec().inner.name == "bf16"
    assert got[2].compressor() is None and got[2].push_codec() is None
    # Pulls are --pull-compress's, whatever auto chose.
    assert all((w.pull_codec, w.pull_refresh) == ("bf16", 5) for w in got.values())
    topk = WireSpec.parse("auto", {"slow": "topk"}).resolve(1e6, mlp)
    assert topk.label() == "topk+bf16" and topk.compressor().codec.name == "bf16"
    assert WireSpec.parse("bf16").resolve(1e6, mlp).label() == "bf16"  # not auto: as it is


def test_live_a_slow_linked_worker_compresses_and_a_fast_one_does_not(tmp_path):
    out, proc = train_side_by_side(tmp_path, {"auto": [
        "--sync", "bsp", "--workers", "2", "--steps", "4", "--eval-interval", "0",
        "--compress", "auto", "--link", "w1=100mbit"]}, timeout=120)["auto"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = [r for r in read_records(out / "metrics.jsonl") if r["kind"] == "step"]
    dense = 4 * json.loads((out / "job.json").read_text())["num_keys"]
    by_worker = {w: [r for r in steps if r["worker"] == w] for w in (0, 1)}
    assert all(len(v) == 4 for v in by_worker.values())
    for r in by_worker[0]:
        assert (r["push_codec"], r["push_bytes"]) == ("none", dense)
        assert "push_saved_bytes" not in r  # float32 both ways: nothing saved to say
    for r in by_worker[1]:
        # uniform8 for the large tensor, its small ones float32 in the same push
        assert r["push_codec"] == "uniform8+small-fp32" and r["push_bytes"] < dense / 3, r
        assert (r["push_saved_bytes"], r["pull_saved_bytes"]) == (dense - r["push_bytes"], 0)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["push_codecs"] == ["none", "uniform8+small-fp32"]
    assert summary["push_saved_bytes_per_step"] == pytest.approx(
        sum(dense - r["push_bytes"] for r in by_worker[1]) / 4)


def test_defaults_are_the_ones_help_and_docs_state():
    import argparse

    from paramserver.cli.main import build_parser
    o = AutoOptions()
    assert (o.dense_below, o.dense_at, o.bf16_at, o.slow, o.fraction) == (
        4096, 10e9, 1e9, "uniform8", 0.01)
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = next(a.help for a in sub.choices["train"]._actions if "--compress" in a.option_strings)
    for words in ("auto", ">= 10 Gbit/s", ">= 1 Gbit/s bf16", "slower uniform8", "4096 values"):
        assert words in text, text
