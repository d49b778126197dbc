"""The held-out study's pure parts: bootstrap intervals, the study split, subsets chosen on training rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import load_script

from autoprofiler.heldout import (
    Interval,
    SubsetMatrix,
    bootstrap_mean,
    choose_on_train,
    objective_value,
    paired_difference,
    study_split,
    subsets,
    ties_at_best,
)
from autoprofiler.rewriters.split import is_tuning_task
from autoprofiler.tasks import Task, load_tasks

SUITE = Path(__file__).resolve().parents[1] / "datasets" / "suite"


# --- bootstrap ------------------------------------------------------------------------------------------
def test_bootstrap_of_two_values_spans_both():
    """Two tasks {0, 2}: resampled means are 0, 1, 2 (chances 1/4, 1/2, 1/4): the 95% interval is [0, 2]."""
    iv = bootstrap_mean([0.0, 2.0], samples=4000, seed=0)
    assert (iv.estimate, iv.low, iv.high, iv.n) == (1.0, 0.0, 2.0, 2)


def test_bootstrap_of_constant_values_has_no_width():
    """Every resample of identical values has the same mean."""
    iv = bootstrap_mean([0.3] * 7)
    assert (
        iv.low == pytest.approx(0.3) and iv.high == pytest.approx(0.3) and iv.estimate == pytest.approx(0.3)
    )


def test_bootstrap_is_deterministic_and_inside_the_range():
    """The same seed gives the same interval; the interval of a mean lies within the values' range and
    holds the mean; another seed gives another (close) interval."""
    values = [0.1, -0.4, 0.25, 0.9, 0.0, 0.3, -0.2, 0.6]
    a, b = bootstrap_mean(values, seed=3), bootstrap_mean(values, seed=3)
    assert a == b
    assert min(values) <= a.low < a.estimate < a.high <= max(values)
    assert a.estimate == pytest.approx(np.mean(values))
    assert bootstrap_mean(values, seed=4) != a


def test_narrower_with_more_tasks():
    """Repeating the same tasks four times (n x 4) narrows the interval (about by half)."""
    values = [0.1, -0.4, 0.25, 0.9, 0.0, 0.3]
    small, large = bootstrap_mean(values), bootstrap_mean(values * 4)
    assert (large.high - large.low) < 0.7 * (small.high - small.low)


def test_paired_difference_of_a_constant_shift():
    """b = a - 0.5 on every task: the paired difference is exactly 0.5 in every resample (an unpaired
    interval of the two means would be wide)."""
    a = [0.1, 2.0, -1.0, 0.7]
    iv = paired_difference(a, [x - 0.5 for x in a])
    assert (iv.estimate, iv.low, iv.high) == pytest.approx((0.5, 0.5, 0.5))
    assert iv.exp().estimate == pytest.approx(math.exp(0.5))


def test_interval_exp_maps_every_bound():
    """A mean log speedup interval becomes a geomean interval."""
    iv = Interval(0.0, math.log(0.5), math.log(2.0), 3).exp()
    assert (iv.estimate, iv.low, iv.high, iv.n) == pytest.approx((1.0, 0.5, 2.0, 3))


@pytest.mark.parametrize(
    "values, kwargs, message",
    [
        ([], {}, "non-empty"),
        ([1.0, float("nan")], {}, "finite"),
        ([1.0], {"samples": 0}, "samples"),
        ([1.0], {"confidence": 1.0}, "confidence"),
    ],
)
def test_bootstrap_rejects_bad_input(values, kwargs, message):
    """No values, a nan, no resamples or a confidence outside (0, 1): one error naming the problem."""
    with pytest.raises(ValueError, match=message):
        bootstrap_mean(values, **kwargs)


def test_paired_difference_needs_equal_lengths():
    with pytest.raises(ValueError, match="one length"):
        paired_difference([1.0, 2.0], [1.0])


# --- the split ------------------------------------------------------------------------------------------
def test_study_split_is_disjoint_complete_and_deterministic():
    """Every suite task is on exactly one side, the side is the playbook split's (content hash), and the
    same tasks in another order give the same sides."""
    tasks = list(load_tasks(SUITE).tasks)
    split = study_split(tasks)
    assert set(split.train).isdisjoint(split.held_out)
    assert sorted(split.train + split.held_out) == sorted(t.id for t in tasks)
    assert set(split.train) == {t.id for t in tasks if is_tuning_task(t.hash)}
    assert len(split.train) == 14 and len(split.held_out) == 31  # docs/rewriters.md: 14 of 45
    again = study_split(list(reversed(tasks)))
    assert set(again.train) == set(split.train) and set(again.held_out) == set(split.held_out)
    assert split.as_dict()["train"] == list(split.train)


def test_study_split_rejects_duplicates_and_an_empty_side():
    t = Task.from_source("a", "# a")
    with pytest.raises(ValueError, match="distinct"):
        study_split([t, t])
    one_side = [x for x in (Task.from_source(f"t{i}", f"# {i}") for i in range(9)) if is_tuning_task(x.hash)]
    with pytest.raises(ValueError, match="both sides"):
        study_split(one_side[:1])


# --- subsets and choices --------------------------------------------------------------------------------
def test_subsets_are_bit_masks_and_ties_keep_order():
    cols = subsets(["a", "b", "c"])
    assert len(cols) == 8 and cols[0] == frozenset() and cols[5] == {"a", "c"} and cols[-1] == {"a", "b", "c"}
    assert ties_at_best({"x": 0.5, "y": 0.5 - 1e-15, "z": 0.1}) == ["x", "y"]
    with pytest.raises(ValueError, match="finite"):
        ties_at_best({"x": float("nan")})


def test_choose_on_train_keeps_ties_and_skips_unanswered_columns():
    """Rows 0-1 train, rows 2-3 held out. Columns 0 and 1 tie on train (mean 0.15); column 2 is better
    on train but unanswered on row 0, so not eligible; column 3 is worse. Held out: the mean of the two
    tied columns per row, nan where one of them is unanswered."""
    nan = np.nan
    values = np.array(
        [
            [0.1, 0.2, nan, 0.0],
            [0.2, 0.1, 9.0, 0.0],
            [0.4, 0.0, 1.0, 1.0],
            [0.3, nan, 1.0, 1.0],
        ]
    )
    choice = choose_on_train(values, [0, 1, 2, 3], train=[0, 1], held=[2, 3])
    assert choice.eligible == 3 and choice.ties == (0, 1)
    assert choice.train_score == pytest.approx(0.15)
    assert choice.held_out[0] == pytest.approx(0.2) and math.isnan(choice.held_out[1])
    assert choose_on_train(values, [2], train=[0, 1], held=[2]) is None


def test_subset_matrix_objectives():
    """Effective speedups 2.0 and 0.5: log_speedup keeps the slowdown, reward clips it to 0, nan stays."""
    m = SubsetMatrix(
        ["t"],
        subsets(["a"]),
        np.array([[2.0, 0.5]]),
        [["keep", "torch_compile"]],
        np.array([[0.0, 3.0]]),
    )
    assert m.values("log_speedup")[0].tolist() == pytest.approx([math.log(2.0), math.log(0.5)])
    assert m.values("reward")[0].tolist() == pytest.approx([math.log(2.0), 0.0])
    assert m.index[frozenset({"a"})] == 1 and m.sizes().tolist() == [0, 1]
    assert objective_value(0.5, "reward") == 0.0 and objective_value(2.0, "reward") == pytest.approx(
        math.log(2)
    )
    with pytest.raises(ValueError, match="objective"):
        objective_value(1.0, "speed")
    with pytest.raises(ValueError, match="shape"):
        SubsetMatrix(["t"], subsets(["a"]), np.zeros((1, 3)), [[]], np.zeros((1, 3)))


# --- the bench script -------------------------------------------------------------------------------------
def _bench():
    root = Path(__file__).resolve().parents[1]
    return load_script(root / "bench" / "heldout_study.py", register=True)  # its dataclasses need it


def test_bench_rejects_bad_arguments(tmp_path, capsys):
    """An unknown rewriter and a zero bootstrap: one error line naming both, before any work, exit 2."""
    assert _bench().main(["--out", str(tmp_path / "x"), "--rewriters", "nope", "--bootstrap", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'nope'" in err[0] and "--bootstrap" in err[0]
    assert not (tmp_path / "x.md").exists()


def test_bench_oracle_over_subsets_skips_tasks_with_no_answered_subset():
    """A held-out task whose every subset chose an unrecorded action has no oracle value: it is left out
    (and counted), not scored -inf."""
    bench = _bench()

    class Matrix:
        def values(self, objective):
            return np.array([[0.1, np.nan], [np.nan, np.nan], [0.0, 0.3]])

    class Args:
        bootstrap, seed = 50, 0

    out = bench.oracle_all(Matrix(), [0, 1, 2], "log_speedup", Args())
    assert out["tasks"] == 2 and out["cells_answered"] == pytest.approx(3 / 6)
    assert out["estimate"] == pytest.approx(math.exp((0.1 + 0.3) / 2))


def test_bench_in_sample_note_depends_on_the_recording():
    """rule-v2 and playbook-v1 were written on datasets/h200_suite: in-sample there, out of sample on a
    generated recording; experience-v1 is fitted on each recording's own tuning split either way."""
    bench = _bench()
    suite, generated = bench.ROOT / "datasets" / "h200_suite", bench.ROOT / "datasets" / "recorded" / "h200"
    assert bench.in_sample_note("rule-v2", suite).startswith("in-sample")
    assert bench.in_sample_note("rule-v2", generated).startswith("out of sample")
    assert bench.in_sample_note("playbook-v1", generated).startswith("out of sample")
    assert bench.in_sample_note("experience-v1", suite) == bench.in_sample_note("experience-v1", generated)


@pytest.mark.slow
def test_bench_on_the_h200_recording(tmp_path):
    """bench/heldout_study.py on rule-v2 (about 20 s): the split in the output is the study split, the
    oracle over the four configurations is at least every static configuration held out, the best static
    is its own reference, and the Markdown holds every section."""
    bench = _bench()
    out = tmp_path / "study"
    argv = [str(bench.ROOT / "datasets" / "h200_suite"), "--out", str(out), "--rewriters", "rule-v2"]
    assert bench.main([*argv, "--bootstrap", "200", "--random-seeds", "4"]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    split = data["meta"]["split"]
    assert (
        set(split["train"]).isdisjoint(split["held_out"])
        and len(split["train"]) + len(split["held_out"]) == 32
    )
    hashes = {t.id: t.hash for t in load_tasks(SUITE).tasks}
    assert all(is_tuning_task(hashes[t]) for t in split["train"])
    assert not any(is_tuning_task(hashes[t]) for t in split["held_out"])
    (r,) = data["results"]
    for objective in ("log_speedup", "reward"):
        p = r["objectives"][objective]["policies"]
        oracle = p["oracle (4 configurations)"]["held_out"]["value"]["estimate"]
        for n in ("algorithm", "memory", "latency", "compute"):
            assert oracle >= p[f"static:{n}"]["held_out"]["value"]["estimate"] - 1e-9
        ref = p["best static (train)"]["held_out"]["vs_reference"]
        assert ref["estimate"] == pytest.approx(1.0 if objective == "log_speedup" else 0.0)
    text = out.with_suffix(".md").read_text()
    for heading in (
        "## The split",
        "## Result",
        "## Key comparisons",
        "### Metric count under reward",
        "Cross-fitted",
    ):
        assert heading in text
