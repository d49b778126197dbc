"""bench/repeat_measurements.py on a recording whose run was measured twice (CPU, seconds).

The second measurement is a copy of one real H100 run with every speedup scaled, so the pairs, the
speedup ratio and the flips across 1.0 are known in advance; the profiles are copied unchanged, so
their metrics must agree exactly.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
RUN = "run=20261205T103621-0caa8f"


def _load():
    return load_script(ROOT / "bench" / "repeat_measurements.py")


def _recording(tmp_path: Path, scale: float) -> Path:
    """One real run, plus a second run holding the same keys with every speedup times ``scale``.

    The copies keep their ``created_at``; ties sort by run name, and ``again`` sorts after the digits.
    """
    rec = tmp_path / "rec"
    for table in ("profiles", "rewards"):
        source = ROOT / "datasets" / "recorded" / "h100" / table / RUN
        shutil.copytree(source, rec / table / RUN)
        again = rec / table / "run=again"
        again.mkdir(parents=True)
        for part in sorted(source.glob("*.parquet")):
            frame = pq.read_table(part)
            if table == "rewards":
                index = frame.schema.get_field_index("speedup")
                frame = frame.set_column(index, "speedup", pc.multiply(frame["speedup"], scale))
            pq.write_table(frame, again / part.name)
    return rec


def test_scaled_copy_gives_the_known_ratio_and_flips(tmp_path):
    bench = _load()
    rec = _recording(tmp_path, scale=1.10)
    reward_pairs = bench.pairs(bench.repeated(bench.read_table(rec / "rewards")))
    original = pq.read_table(ROOT / "datasets" / "recorded" / "h100" / "rewards" / RUN).to_pylist()
    assert len(reward_pairs) == len({row["key"] for row in original})
    summary = bench.reward_summary(reward_pairs)
    action = summary["action"]
    assert math.isclose(math.exp(action["speedup_abs_log_ratio"]["median"]), 1.10, rel_tol=1e-9)
    assert action["within_5pct"] == 0 and action["correct_agree"] == action["pairs"]
    first = [row for row in original if row["kind"] == "action" and row["correct"] and row["speedup"]]
    expected_flips = sum(row["speedup"] <= 1 < row["speedup"] * 1.10 for row in first)
    assert action["side_of_1_flips"] == expected_flips
    curse = bench.winners_curse(reward_pairs)  # effective speedups were copied unscaled: no gap
    assert curse["tasks"] > 0 and curse["best_action_differs"] == 0
    assert curse["oracle_in_sample_over_blind"] == curse["oracle_cross_call_over_blind"]
    profiles = bench.profile_summary(bench.pairs(bench.repeated(bench.read_table(rec / "profiles"))))
    assert profiles and all(s["metric_rel"]["max"] == 0 and s["kernel_count_agree"] == s["pairs"]
                            for s in profiles.values())


def test_cli_rejects_a_folder_that_is_not_a_recording(tmp_path, capsys):
    bench = _load()
    try:
        bench.main([str(tmp_path)])
    except SystemExit as exc:
        assert exc.code == 2
    assert "has no profiles/ folder: not a recording" in capsys.readouterr().err


def test_winners_curse_is_the_gap_between_choosing_and_scoring_on_one_call_or_two():
    """Two actions measured twice with noise that swaps their order: the oracle chosen and scored on one
    call leads blind; chosen on one call and scored on the other, it trails. Identical calls leave no gap.
    Call 1 picks tf32 (1.1 vs 1.0), which call 2 scores 1.0 against blind's 1.1; call 2 picks blind."""
    bench = _load()

    def rows(task, first, second):
        return [
            ({"kind": "action", "task_id": task, "action": a, "effective_speedup": x},
             {"kind": "action", "task_id": task, "action": a, "effective_speedup": y})
            for a, (x, y) in zip(("torch_compile", "tf32"), zip(first, second, strict=True), strict=True)
        ]

    noisy = bench.winners_curse(rows("t", (1.0, 1.1), (1.1, 1.0)))
    assert noisy["tasks"] == 1 and noisy["best_action_differs"] == 1
    assert math.isclose(noisy["oracle_in_sample_over_blind"], math.sqrt(1.1))
    assert math.isclose(noisy["oracle_cross_call_over_blind"], math.sqrt(1 / 1.1))
    same = bench.winners_curse(rows("t", (1.0, 1.2), (1.0, 1.2)))
    assert same["oracle_in_sample_over_blind"] == same["oracle_cross_call_over_blind"] == 1.2
    assert bench.winners_curse(rows("t", (None, 1.2), (1.0, 1.2))) == {"tasks": 0}
