"""bench/learner_scale.py and bench/resample_recording.py on a small resampled recording (CPU, seconds).

The copies must be read by the real ``ReplayEnvironment`` under their own hashes and keys, labelled as
resampled, and (without jitter) replay exactly what their originals replay.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import load_script

from autoprofiler.environments import ReplayEnvironment
from autoprofiler.rewriters import RuleRewriter
from autoprofiler.tables import ProfileTable, RewardTable

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    sys.path.insert(0, str(ROOT / "bench"))  # learner_scale imports resample_recording from beside it
    return load_script(ROOT / "bench" / f"{name}.py", register=True)  # its dataclasses need it


@pytest.fixture(scope="module")
def resample():
    return _load("resample_recording")


@pytest.fixture(scope="module")
def originals(resample):
    return resample.original_tasks()


def test_copies_replay_what_their_originals_replay(resample, originals, tmp_path):
    """Without jitter a copy's rows are its original's under new keys: every configuration replays the
    same action and speedup, and no key of the copy is a key of the recording."""
    pairs = resample.resampled_tasks(originals, 12, seed=3)
    assert [c.id for c, _ in pairs] == [c.id for c, _ in resample.resampled_tasks(originals, 12, seed=3)]
    counts = resample.write_resampled(pairs, tmp_path, jitter=0.0, seed=3)
    assert counts["tasks"] == 12 and counts["profile_rows"] == 12 * 10
    copies = ReplayEnvironment(tmp_path, RuleRewriter(), "ncu", runner=None)
    recording = ReplayEnvironment(resample.RECORDINGS, RuleRewriter(), "ncu", runner=None)
    for copy, orig in pairs[:4]:
        assert copy.hash != orig.hash and copy.source.endswith(
            f"# resampled copy {copy.id.rsplit('/', 1)[1]} of {orig.id}\n"
        )
        for configuration in ("memory+speed_of_light", "root", "stalls+occupancy+root"):
            a, b = copies.outcome(copy, configuration), recording.outcome(orig, configuration)
            assert (a.action, a.speedup, a.correct) == (b.action, b.speedup, b.correct)
            assert a.key != b.key and a.task_id == copy.id
    assert not set(RewardTable(tmp_path / "rewards").records()[0]) - set(
        RewardTable(resample.RECORDINGS[0] / "rewards").records()[0]
    )
    profiles = ProfileTable(None, read_from=[r / "profiles" for r in resample.RECORDINGS])
    recorded = {r["key"] for r in profiles.records()}
    assert not recorded & {r["key"] for r in ProfileTable(tmp_path / "profiles").records()}


def test_measure_counts(tmp_path):
    """The script's core function on 100 copies: every task labelled resampled, the table read back whole,
    evaluations spent at most the naive count, jittered times, and a Markdown page that says what it is."""
    bench = _load("learner_scale")
    result = bench.measure(100, tmp_path, seed=0, jitter=0.02)
    learn, counts = result["learn"], result["resample"]
    assert counts["tasks"] == 100 and counts["profile_rows"] == 1000
    assert learn["tasks"] == learn["resampled"] == 100 and learn["train"] + learn["test"] == 100
    ev = learn["evaluations"]
    assert 0 < ev["spent"] <= ev["naive"] and ev["decisions"] == learn["decisions"] > 0
    assert ev["naive"] == learn["decisions"] * learn["train"]  # one seed: every training task per decision
    assert learn["oracle"]["tasks"] == 100 and learn["peak_rss_mb"] > 0
    rows = RewardTable(tmp_path / "recording" / "rewards").records()
    assert all(r["task_id"].startswith("resampled/") and r["run_id"] == "resampled-n100-seed0" for r in rows)
    recordings = _load("resample_recording").RECORDINGS
    recorded = RewardTable(None, read_from=[r / "rewards" for r in recordings]).records()
    source = {(r["task_hash"], r["action"]): r for r in recorded if r["kind"] == "action"}
    tasks = {c.hash: o for c, o in bench.resampled_tasks(bench.original_tasks(), 100, 0)}
    # every action row of each original, copied: the 5 rule actions, and the playbook's where recorded
    per_original = Counter(r["task_hash"] for r in recorded if r["kind"] == "action")
    assert counts["action_rows"] == sum(per_original[o.hash] for o in tasks.values()) >= 500
    ratios = [
        r["new_ms"] / source[(tasks[r["task_hash"]].hash, r["action"])]["new_ms"]
        for r in rows
        if r["kind"] == "action" and r["new_ms"]
    ]
    assert len(set(ratios)) > 1 and all(0.8 < x < 1.25 for x in ratios)  # exp(0.02 z), |z| < 10
    page = bench.markdown([result], "python bench/learner_scale.py --sizes 100", 0, 0.02)
    assert "pseudo-replicates" in page and "| 100 (" in page and "**not** evidence" in page
