"""The comparison plan: which runs, in which folders, with which settings."""

import pytest

from paramserver.spec.config import TrainConfig
from paramserver.spec.compare_plan import (
    SCENARIOS, SINGLE, parse_scenarios, plan_runs, single_reference,
)
from paramserver.cli.compare_cmd import (
    paired_optimizers, parse_variants, policy_sync_options, rule_pairing,
)


def test_plan_covers_every_scenario_policy_and_repeat_once(tmp_path):
    base = TrainConfig(workers=4, batch_size=16, seed=7)
    scenarios = parse_scenarios(["one-slow", "fast=0:2"])
    runs = plan_runs(base, ["bsp", "asp"], scenarios, 2, tmp_path,
                     policy_options={"asp": {"x": 1}})
    keys = {(r.scenario, r.policy, r.repeat) for r in runs}
    assert len(runs) == len(keys) == 2 * 2 * 3
    assert {r.folder for r in runs} == {tmp_path / "runs" / s / p / f"rep-{k}" for s, p, k in keys}
    for r in runs:
        assert r.config.seed == 7 + r.repeat
        if r.policy != SINGLE:
            assert r.config.sync == r.policy
            assert r.config.straggler == scenarios[r.scenario][0]
    assert next(r for r in runs if r.policy == "asp").config.sync_options == {"x": 1}


def test_single_reference_has_the_global_batch_and_no_straggler():
    ref = single_reference(TrainConfig(workers=4, batch_size=16, straggler="1:3", sync="asp"))
    assert (ref.workers, ref.batch_size, ref.straggler, ref.sync) == (1, 64, "none", "bsp")


def test_unknown_scenario_lists_the_known_ones():
    with pytest.raises(ValueError, match="one-slow"):
        parse_scenarios(["nope"])
    assert parse_scenarios(None) == {"one-slow": SCENARIOS["one-slow"]}


def test_policy_options_parse_and_refuse_bad_pairs():
    assert policy_sync_options(["ssp.staleness=2", "ebsp.predictor=ema"]) == {
        "ssp": {"staleness": 2}, "ebsp": {"predictor": "ema"}}
    with pytest.raises(ValueError, match="POLICY.KEY=VALUE"):
        policy_sync_options(["staleness=2"])


def test_compress_variants_run_every_policy_once_per_setting(tmp_path):
    variants = parse_variants(["dense=none", "topk:fraction=0.01",
                               "topk:fraction=0.01:error_feedback=false"])
    assert variants == {"dense": ("none", {}),
                        "topk-fraction=0.01": ("topk", {"fraction": 0.01}),
                        "topk-fraction=0.01-error_feedback=false":
                            ("topk", {"fraction": 0.01, "error_feedback": False})}
    base = TrainConfig(workers=4, compress="std")
    runs = plan_runs(base, ["bsp", "asp"], parse_scenarios(["homogeneous"]), 1, tmp_path,
                     variants=variants)
    assert sorted(r.policy for r in runs) == sorted(
        [f"{p}+{v}" for p in ("bsp", "asp") for v in variants] + [SINGLE])
    for r in runs:
        if r.policy != SINGLE:
            policy, label = r.policy.split("+")
            assert r.config.sync == policy
            assert (r.config.compress, r.config.compress_options) == variants[label]
            assert r.folder == tmp_path / "runs" / "homogeneous" / r.policy / "rep-0"
    assert len({r.folder for r in runs}) == len(runs)


@pytest.mark.parametrize("bad", [[":fraction=0.1"], ["a=topk", "a=std"], ["x/y=topk"],
                                 ["topk:fraction"]])
def test_bad_compress_variants_are_refused(bad):
    with pytest.raises(ValueError):
        parse_variants(bad)


def test_bounded_staleness_policies_get_their_paired_rule_unless_one_is_given(tmp_path):
    assert paired_optimizers() == {"ssp": "dynsgd", "ebsp": "dynsgd", "dssp": "dynsgd"}
    assert rule_pairing(None) == ("sgd", paired_optimizers())
    assert rule_pairing("momentum") == ("momentum", {})  # a rule given is every run's
    base = TrainConfig(workers=4, optimizer="sgd", optimizer_options={"x": 1})
    runs = plan_runs(base, ["bsp", "ssp", "dssp"], parse_scenarios(["one-slow"]), 1, tmp_path,
                     policy_optimizers=paired_optimizers())
    rules = {r.policy: (r.config.optimizer, r.config.optimizer_options) for r in runs}
    assert rules == {"bsp": ("sgd", {"x": 1}), "ssp": ("dynsgd", {}), "dssp": ("dynsgd", {}),
                     SINGLE: ("sgd", {"x": 1})}
    # what each run records in config.json is the rule it ran with
    assert next(r for r in runs if r.policy == "ssp").config.as_dict()["optimizer"] == "dynsgd"
    variants = parse_variants(["dense=none"])
    runs = plan_runs(base, ["ssp"], parse_scenarios(["one-slow"]), 1, tmp_path,
                     variants=variants, policy_optimizers=paired_optimizers())
    assert {r.policy: r.config.optimizer for r in runs} == {"ssp+dense": "dynsgd", SINGLE: "sgd"}


def test_a_variant_may_set_its_own_pull_codec_and_refresh(tmp_path):
    variants = parse_variants(["dense=none", "bf16=bf16:pull=bf16",
                               "k=topk:fraction=0.01:codec=bf16:pull=uniform8:pull_refresh=50"])
    base = TrainConfig(workers=2, pull_compress="none", pull_refresh=20)
    runs = plan_runs(base, ["bsp"], parse_scenarios(["one-slow"]), 1, tmp_path,
                     single=False, variants=variants)
    got = {r.policy: (r.config.compress, r.config.compress_options, r.config.pull_compress,
                      r.config.pull_refresh) for r in runs}
    assert got == {"bsp+dense": ("none", {}, "none", 20),
                   "bsp+bf16": ("bf16", {}, "bf16", 20),
                   "bsp+k": ("topk", {"fraction": 0.01, "codec": "bf16"}, "uniform8", 50)}
    # each variant's settings are what the worker's WireSpec reads (pull keys are not codec
    # options)
    from paramserver.compression.wire import WireSpec
    for r in runs:
        c = r.config
        spec = WireSpec.parse(c.compress, c.compress_options, c.pull_compress, c.pull_refresh)
        assert spec.pull_codec == (None if c.pull_compress == "none" else c.pull_compress)


@pytest.mark.parametrize("codec", ["fp32", "fp16", "fp16-scaled", "bf16", "uniform8",
                                   "quantile8", "sign", "randomk", "powersgd"])
def test_every_codec_is_a_variant_pushed_and_pulled(codec):
    from paramserver.compression.wire import WireSpec
    from paramserver.spec.compare_plan import variant_settings
    ((label, (name, opts)),) = parse_variants([f"{codec}:pull={codec}"]).items()
    spec = WireSpec.parse(name, *variant_settings(opts, "none", 20))
    assert (spec.label(), spec.pull_codec) == (codec, codec)


def test_a_ctrl_c_while_the_report_is_drawn_says_how_to_draw_it(tmp_path, monkeypatch, capsys):
    """The runs are done and kept; a Ctrl-C while the figures are drawn said only
    'interrupted': now where the runs are and the command that draws the report, exit 130."""
    from paramserver import report
    from paramserver.cli import compare_cmd
    from paramserver.cli.main import main

    def drawing(out):
        raise KeyboardInterrupt
    monkeypatch.setattr(compare_cmd, "_run_all", lambda *args, **kwargs: [])
    monkeypatch.setattr(report, "build_report", drawing)
    out = tmp_path / "cmp"
    assert main(["compare", "--sync", "bsp", "--repeats", "1", "--no-single", "--quiet",
                 "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"interrupted while drawing the report; the runs are kept in {out}" in err, err
    assert f"paramserver report {out} draws it" in err and "Traceback" not in err
