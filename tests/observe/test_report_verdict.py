"""The report's opening verdict, computed from hand-built table rows."""

from paramserver.report.table import Row
from paramserver.report.verdict import scenario_verdict, verdicts

TARGET = 0.9


def row(policy, tta, repeats=3, reached=None, lo=None, hi=None, final=0.95, best=0.95,
        scenario="one-slow"):
    reached = (repeats if tta is not None else 0) if reached is None else reached
    return Row(scenario=scenario, policy=policy, repeats=repeats, reached=reached,
               tta_median=tta, tta_min=tta if lo is None else lo,
               tta_max=tta if hi is None else hi, final_accuracy=final, best_accuracy=best,
               wait_fraction=0.1, staleness=0.0, samples_per_s=100.0, real_compute_share=None)


def test_names_the_fastest_with_ratio_seconds_cost_and_spread():
    v = scenario_verdict("one-slow", [row("bsp", 3.0, final=0.95),
                                      row("asp", 1.5, lo=1.0, hi=2.0, final=0.93),
                                      row("ebsp", 2.5), row("single", 0.5, repeats=1)], TARGET)
    assert v.fastest == ("asp",)  # the one-worker reference is faster but not a policy
    assert "asp is the soonest to reach 90% test accuracy: 1.50 s" in v.text
    assert "median of 3 repeats, 3 reached the target, spread 1.00–2.00 s" in v.text
    assert "×2.00 sooner than BSP (1.50 s saved on BSP's 3.00 s)" in v.text
    assert "final accuracy 93.0% against BSP's 95.0% (-2.0 points)" in v.text


def test_a_single_run_says_it_has_no_spread():
    v = scenario_verdict("s", [row("bsp", 3.0, repeats=1), row("asp", 1.0, repeats=1)], TARGET)
    assert v.fastest == ("asp",) and "single run, no spread" in v.text


def test_ties_name_every_tied_policy_bsp_first():
    v = scenario_verdict("s", [row("asp", 2.0), row("bsp", 2.0), row("ssp", 3.0)], TARGET)
    assert v.fastest == ("bsp", "asp")
    assert "bsp and asp tie as the soonest" in v.text and "BSP itself is the soonest" in v.text


def test_missing_bsp_gives_no_speedup():
    v = scenario_verdict("s", [row("asp", 2.0), row("ssp", 1.0)], TARGET)
    assert v.fastest == ("ssp",) and "no BSP runs here" in v.text and "×" not in v.text


def test_never_reached_and_diverged_policies_are_named_with_the_reason():
    rows = [row("bsp", 3.0), row("asp", 1.0), row("ssp", None, best=0.85),
            row("dssp", None, best=0.1)]
    v = scenario_verdict("s", rows, TARGET, diverged={"dssp": [4.0, 2.5, 3.0]})
    assert v.fastest == ("asp",)
    assert "ssp never reached the target within the run's budget (best 85.0%)" in v.text
    assert "dssp diverged: its test loss became NaN or infinite from 2.5 s on" in v.text
    assert "accuracy fell to chance" in v.text


def test_partial_misses_and_divergence_add_up():
    rows = [row("bsp", 3.0), row("asp", None, reached=1, lo=1.0, hi=1.0, best=0.8)]
    v = scenario_verdict("s", rows, TARGET, diverged={"asp": [5.0]})
    assert "asp diverged in 1 of 3 repeats" in v.text
    assert "never reached the target within the run's budget in 1 of 3 repeats" in v.text
    v = scenario_verdict("s", [row("bsp", 3.0), row("asp", 2.0, reached=2)], TARGET)
    assert "Not every repeat reached it: asp never reached the target" in v.text


def test_slow_or_missing_bsp_and_no_winner():
    v = scenario_verdict("s", [row("bsp", None), row("asp", 2.0)], TARGET)
    assert v.fastest == ("asp",) and "BSP never reached the target here" in v.text
    v = scenario_verdict("s", [row("bsp", None), row("asp", None)], TARGET)
    assert v.fastest == () and v.text.startswith("On s, no policy reached 90% test accuracy.")
    assert "bsp never reached" in v.text and "asp never reached" in v.text


def test_auc_scores_and_one_verdict_per_scenario():
    rows = [row("bsp", 3.0, final=0.70), row("asp", 1.0, final=0.72),
            row("bsp", 1.0, scenario="even"), row("asp", 2.0, scenario="even")]
    out = verdicts(rows, 0.7, "auc", diverged={("even", "asp"): [1.0]})
    assert [(v.scenario, v.fastest) for v in out] == [("one-slow", ("asp",)), ("even", ("bsp",))]
    assert "test AUC 0.7" in out[0].text and "(+0.0200)" in out[0].text
    assert "diverged" not in out[1].text  # asp reached in every repeat: nothing failed


def test_a_winner_with_its_own_update_rule_is_named_with_it():
    ssp = row("ssp", 2.0)
    ssp.optimizer, ssp.own_rule = "dynsgd", True
    v = scenario_verdict("s", [row("bsp", 3.0), ssp], TARGET)
    assert v.fastest == ("ssp",) and "ssp (with dynsgd) is the soonest" in v.text


def test_runs_without_accuracy_get_a_throughput_answer_not_a_failure():
    """A simulation without --train measures no accuracy: the verdict must not call its
    policies failed (plateaued, stale) but name the one with the most samples per second."""
    bsp = row("bsp", None, final=None, best=None)
    fast = Row(**{**bsp.__dict__, "policy": "ebsp", "samples_per_s": 250.0,
                  "wait_fraction": 0.05})
    v = scenario_verdict("sim", [bsp, fast], TARGET)
    assert v.fastest == ()
    assert "no test accuracy was measured" in v.text
    assert "ebsp trains the most samples per second: 250, waiting 5.0%" in v.text
    assert "x2.50 BSP's" in v.text and "never reached" not in v.text
    # one run that did measure accuracy and missed is a failure again
    measured = row("ssp", None, final=0.5, best=0.6)
    assert "no test accuracy was measured" not in scenario_verdict(
        "sim", [bsp, fast, measured], TARGET).text


def test_a_policy_that_ended_below_the_target_is_named_but_not_the_answer():
    """ASP crossed the target first and fell back below it; LB-BSP crossed it later and stayed:
    the answer is LB-BSP, with ASP's early crossing and its final accuracy said."""
    rows = [row("bsp", 4.7, final=0.958), row("asp", 2.7, final=0.897),
            row("lbbsp", 2.8, final=0.956)]
    v = scenario_verdict("one-slow", rows, 0.95)
    assert v.fastest == ("lbbsp",)
    assert v.text.startswith("On one-slow, lbbsp is the soonest to reach 95% test accuracy")
    assert "Sooner, but ended below the target: asp reached it at 2.70 s and ended at 89.7%" \
        in v.text
    # when every policy that reached it fell back, the soonest is still the answer
    v = scenario_verdict("one-slow", [row("bsp", 4.7, final=0.94), row("asp", 2.7, final=0.9)],
                         0.95)
    assert v.fastest == ("asp",) and "ended below" not in v.text


def test_overlapping_repeats_are_a_tie_and_say_why():
    """LB-BSP at 2.14 s and ASP at 2.16 s, their repeats overlapping: no winner is named."""
    v = scenario_verdict("s", [row("bsp", 3.0), row("lbbsp", 2.14, lo=1.9, hi=2.6),
                               row("asp", 2.16, lo=2.0, hi=2.3), row("ssp", 2.8, lo=2.7,
                                                                     hi=2.9)], TARGET)
    assert v.fastest == ("lbbsp", "asp")
    assert "lbbsp and asp tie as the soonest" in v.text
    assert "overlap (lbbsp 1.90–2.60 s, asp 2.00–2.30 s)" in v.text
    apart = scenario_verdict("s", [row("bsp", 3.0), row("lbbsp", 2.14, lo=1.9, hi=2.0),
                                   row("asp", 2.5, lo=2.4, hi=2.6)], TARGET)
    assert apart.fastest == ("lbbsp",) and "tie" not in apart.text


def test_single_runs_within_five_percent_are_a_tie():
    close = scenario_verdict("s", [row("bsp", 3.0, repeats=1), row("lbbsp", 2.14, repeats=1),
                                   row("asp", 2.16, repeats=1)], TARGET)
    assert close.fastest == ("lbbsp", "asp")
    assert "Single runs within 5% of each other (lbbsp 2.14 s, asp 2.16 s)" in close.text
    assert "--repeats 3" in close.text
    far = scenario_verdict("s", [row("bsp", 3.0, repeats=1), row("asp", 2.0, repeats=1)],
                           TARGET)
    assert far.fastest == ("asp",)
