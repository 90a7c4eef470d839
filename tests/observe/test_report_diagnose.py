"""Why a run missed the target, and the fix named for its policy: report/core/diagnose.py on
hand-made outcomes, and the verdict that shows it."""

from paramserver.report.core.diagnose import RunOutcome, Setting, classify, diagnose
from paramserver.report.table import Row
from paramserver.report.verdict import scenario_verdict

CHANCE = 0.1


def out(reached=False, final=0.9, best=0.93, diverged_at=None):
    return RunOutcome(reached=reached, final=final, best=best, diverged_at=diverged_at)


def test_each_kind_of_failure_is_told_apart():
    assert classify(out(reached=True, final=0.96, best=0.97), CHANCE) is None
    assert classify(out(diverged_at=2.5, final=0.1), CHANCE) == "diverged"  # NaN loss first
    assert classify(out(final=0.12, best=0.7), CHANCE) == "chance"  # finite loss, one class
    assert classify(out(final=0.5, best=0.9), CHANCE) == "collapsed"
    assert classify(out(reached=True, final=0.6, best=0.96), CHANCE) == "collapsed"
    assert classify(out(final=0.93, best=0.94), CHANCE) == "plateaued"
    # without a known chance level, a run at 12% is only a collapse or a plateau
    assert classify(out(final=0.12, best=0.7), None) == "collapsed"
    assert classify(out(final=0.12, best=0.2), None) == "plateaued"


def test_ssp_under_a_persistent_straggler_is_told_it_sums_same_version_gradients():
    ssp = Setting("ssp", optimizer="sgd", lr=0.3, workers=4, straggler="1:3", staleness=1.5)
    d = diagnose(ssp, [out(final=0.1, best=0.7), out(final=0.1, best=0.6, diverged_at=2.8),
                       out(reached=True, final=0.96, best=0.97)], CHANCE)
    assert (d.kind, d.runs, d.repeats, d.others) == ("diverged", 1, 3, (("chance", 1),))
    three = diagnose(ssp, [out(diverged_at=1.0), out(final=0.5, best=0.9), out()], CHANCE)
    assert three.line("ssp").startswith("ssp diverged in 1 of 3 repeats (and accuracy "
                                        "collapsed in 1 of 3 repeats, plateaued below the "
                                        "target in 1 of 3 repeats): ")
    line = d.line("ssp")
    assert line.startswith("ssp diverged in 1 of 3 repeats (and fell to chance in 1 of 3 "
                           "repeats): test loss NaN or infinite from 2.8 s; SSP at lr 0.3 sums "
                           "same-version gradients under a persistent straggler")
    assert line.endswith("step up to 4x BSP's average; use --optimizer dynsgd or --lr 0.075")


def test_the_fix_depends_on_policy_straggler_and_optimizer():
    chance = [out(final=0.1, best=0.5)]
    # transient stragglers do not lockstep SSP's workers: the generic asynchronous advice
    d = diagnose(Setting("ssp", lr=0.3, workers=4, straggler="random:0.1:4", staleness=2.0),
                 chance, CHANCE)
    assert "mean staleness 2.0: stale gradients overshoot" in d.cause
    assert d.fix == "use --optimizer dynsgd or --lr 0.1"
    # already staleness-aware: only a smaller lr is left
    d = diagnose(Setting("dssp", optimizer="dynsgd", lr=0.3, straggler="1:3"), chance, CHANCE)
    assert "unstable at lr 0.3 even with dynsgd" in d.cause and d.fix == "use --lr 0.15"
    d = diagnose(Setting("bsp", lr=1.2, workers=4), chance, CHANCE)
    assert d.cause.endswith("lr 1.2 is too large for BSP's averaged step")
    assert d.fix == "use --lr 0.6" and d.line("bsp").startswith("bsp fell to chance: ")


def test_a_plateau_names_the_best_of_the_repeats_that_plateaued():
    d = diagnose(Setting("asp", lr=0.3, staleness=3.0),
                 [out(final=0.93, best=0.94), out(reached=True, final=0.97, best=0.98)],
                 CHANCE)
    assert d.line("asp") == ("asp plateaued below the target in 1 of 2 repeats: the sample "
                             "budget ran out first (best 94.0%); stale pushes (mean staleness "
                             "3.0) learn less per sample; use more --epochs")
    assert diagnose(Setting("bsp"), [out(reached=True, final=0.96, best=0.96)], CHANCE) is None
    d = diagnose(Setting("bsp"), [out(final=0.68, best=0.69)], 0.5, score="auc")
    assert d.cause == "the sample budget ran out first (best 0.6900)"


def row(policy, tta, reached):
    return Row(scenario="s", policy=policy, repeats=3, reached=reached, tta_median=tta,
               tta_min=tta, tta_max=tta, final_accuracy=0.95, best_accuracy=0.96,
               wait_fraction=0.1, staleness=0.0, samples_per_s=100.0, real_compute_share=None)


def test_the_verdict_carries_the_diagnosis_in_place_of_the_generic_reason():
    ssp = diagnose(Setting("ssp", lr=0.3, workers=4, straggler="1:3"),
                   [out(final=0.1, best=0.5)] * 3, CHANCE)
    asp = diagnose(Setting("asp", lr=0.3, staleness=3.0),
                   [out(reached=True, final=0.5, best=0.96)] + [out(reached=True, final=0.96,
                                                                    best=0.96)] * 2, CHANCE)
    v = scenario_verdict("s", [row("bsp", 3.0, 3), row("ssp", None, 0), row("asp", 2.0, 3)],
                         0.95, diagnoses={"ssp": ssp, "asp": asp})
    assert "Without a time to target: ssp fell to chance: the loss stayed finite" in v.text
    assert "use --optimizer dynsgd or --lr 0.075." in v.text
    assert "Reached, then lost: asp accuracy collapsed in 1 of 3 repeats: ASP applies" in v.text
    assert "never reached" not in v.text


def test_the_table_names_a_paired_rule_and_puts_the_diagnosis_under_its_row():
    from paramserver.report.table import render_table
    ssp = row("ssp", None, 0)
    ssp.optimizer, ssp.own_rule = "dynsgd", True
    text = render_table([row("bsp", 3.0, 3), ssp, row("asp", 2.0, 3)], 0.95,
                        why={("s", "ssp"): "ssp fell to chance: because; fix"})
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if "<td>ssp (dynsgd)</td>" in line)
    assert lines[at + 1] == ("<tr class='why'><td colspan='13'>↳ ssp fell to chance: because; "
                             "fix</td></tr>")
    assert text.count("class='why'") == 1


def test_a_plateau_names_the_flag_that_set_the_budget():
    """A run budgeted by --steps (a user script's compare refuses --epochs) is told to raise
    that flag, not --epochs."""
    from paramserver.report.core.diagnose import budget_flag
    assert budget_flag({"epochs": 30.0, "steps": None, "max_seconds": None}) == "--epochs"
    assert budget_flag({"epochs": 30.0, "steps": 50}) == "--steps"
    assert budget_flag({"steps": 50, "max_seconds": None}) == "--steps"  # a script's run
    assert budget_flag({"steps": None, "max_seconds": 60.0}) == "--max-seconds"
    assert budget_flag({}) == "--epochs"
    d = diagnose(Setting("bsp", lr=0.3, budget="--steps"), [out(final=0.88, best=0.89)], CHANCE)
    assert d.fix == "use more --steps, or a larger --lr"
    d = diagnose(Setting("asp", lr=0.3, staleness=3.0, budget="--max-seconds"),
                 [out(final=0.93, best=0.94)], CHANCE)
    assert d.fix == "use more --max-seconds"
