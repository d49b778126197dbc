"""``autoprofiler profile``: the table, JSON, the cache, and exit codes for bad input and missing ncu."""

from __future__ import annotations

import json
from pathlib import Path

from autoprofiler.cli import EXIT_BAD_INPUT, EXIT_ENVIRONMENT, EXIT_OK, main

RELU = str(Path(__file__).resolve().parents[1] / "datasets" / "suite" / "l1" / "relu.py")


def test_profile_torch_table_then_json_from_cache(tmp_path, capsys):
    """One real torch.profiler run prints metric/unit/value rows and its cost; the cached rerun costs 0."""
    cache = str(tmp_path / "cache")
    args = ["profile", RELU, "--source", "torch", "--device", "cpu", "--groups", "torch_root,torch_launch"]
    assert main([*args, "--cache", cache]) == EXIT_OK
    out = capsys.readouterr().out
    assert "torch_root    torch__elementwise_time_share" in out
    assert "torch_launch  torch__wall_time_us            us" in out
    assert "aten::relu" in out and "cost: 0 replay passes" in out
    assert main([*args, "--cache", cache, "--json"]) == EXIT_OK
    data = json.loads(capsys.readouterr().out)
    assert data["groups"] == ["torch_launch", "torch_root"] and data["seconds"] == 0.0
    assert data["metrics"]["torch__elementwise_time_share"] > 0.9


def test_profile_exit_codes(tmp_path, capsys):
    """Unknown group or configuration, or an unloadable task: 2; ncu missing: 3 with the reason."""
    assert main(["profile", RELU, "--source", "torch", "--groups", "nope"]) == EXIT_BAD_INPUT
    assert "unknown metric group 'nope'" in capsys.readouterr().err
    assert main(["profile", RELU, "--source", "torch", "--config", "fastest"]) == EXIT_BAD_INPUT
    assert main(["profile", str(tmp_path / "missing.py"), "--source", "torch"]) == EXIT_BAD_INPUT
    missing_ncu = str(tmp_path / "bin" / "ncu")
    code = main(["profile", RELU, "--source", "ncu", "--ncu", missing_ncu, "--config", "memory"])
    assert code == EXIT_ENVIRONMENT
    err = capsys.readouterr().err.strip().splitlines()[-1]  # no CUDA here is named before a missing ncu
    assert "not found" in err or "torch sees no CUDA device" in err, err
