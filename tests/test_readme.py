"""The README's "## Commands" block, run line by line in order as a user would, so the README stays true.

Each line runs in a fresh folder that links ``datasets/``, ``trees/`` and ``workflows/`` from the
repository (so ``runs/`` is the test's own), on CPU, through this interpreter (``autoprofiler`` is
``python -m autoprofiler``). A line fails the test on a non-zero exit or a traceback anywhere in its
output. Lines that need what CI has not are skipped, each for the reason in ``NEEDS`` (printed with
``-s``); any other line runs. A line too slow for CI is made smaller in the README, not skipped here.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
#: What a line needs that a CPU-only CI machine lacks, by a flag it carries: the reason it is skipped.
NEEDS = {
    "--device cuda": "needs a CUDA GPU",
    "--source ncu": "needs a GPU with Nsight Compute (ncu) to profile",
    "--rewriter openai": "needs an LLM endpoint (AUTOPROFILER_LLM_BASE_URL, OPENAI_API_KEY)",
}
#: Folders of the repository a README line reads, linked into the test's working folder.
LINKED = ("datasets", "trees", "workflows")


def commands_block(text: str) -> list[str]:
    """The lines of the first ```bash block after the "## Commands" heading (continuations joined)."""
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("\n```", 1)[0]
    lines, pending = [], ""
    for raw in block.splitlines():
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        pending = ""
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def skip_reason(line: str) -> str | None:
    """Why CI cannot run ``line`` (None: it can)."""
    argv = shlex.split(line, comments=True)
    for flag, reason in NEEDS.items():
        name, _, value = flag.partition(" ")
        for i, arg in enumerate(argv):
            if arg == f"{name}={value}" or (arg == name and i + 1 < len(argv) and argv[i + 1] == value):
                return reason
    return None


def argv_of(line: str) -> list[str]:
    """The command as this interpreter runs it: ``autoprofiler`` -> ``python -m autoprofiler``."""
    argv = shlex.split(line, comments=True)
    if argv[0] == "autoprofiler":
        return [sys.executable, "-m", "autoprofiler", *argv[1:]]
    if argv[0] in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    raise ValueError(f"README command {line!r}: expected autoprofiler or python")


def test_the_commands_block_is_found_and_every_skip_has_a_reason():
    """The block parses into commands; only lines needing a GPU, ncu or an LLM are skipped; most run."""
    lines = commands_block(README.read_text())
    assert len(lines) >= 8, lines
    skipped = {line: skip_reason(line) for line in lines if skip_reason(line)}
    assert len(skipped) < len(lines) / 3, skipped
    assert all(any(flag.split()[0] in line for flag in NEEDS) for line in skipped)
    assert skip_reason("autoprofiler optimize x.py --device cuda") == "needs a CUDA GPU"
    assert skip_reason("python workflows/train.py environment=replay source=ncu") is None  # replay: CPU
    assert commands_block("x\n## Commands\n\n```bash\na \\\n  b # c\n# d\n```\n## Next\n") == ["a b # c"]


def test_the_readme_commands_run_in_order(tmp_path):
    """Every runnable README command exits 0 without a traceback, in order, in one working folder."""
    for name in LINKED:
        (tmp_path / name).symlink_to(REPO / name, target_is_directory=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    timings = []
    for line in commands_block(README.read_text()):
        reason = skip_reason(line)
        if reason:
            timings.append(f"  skipped ({reason}): {line}")
            continue
        started = time.monotonic()
        proc = subprocess.run(
            argv_of(line), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        seconds = time.monotonic() - started
        output = proc.stdout + proc.stderr
        tail = f"{proc.stdout[-2500:]}\n--- stderr ---\n{proc.stderr[-2500:]}"
        assert proc.returncode == 0, f"README command exited {proc.returncode}: {line}\n{tail}"
        assert "Traceback" not in output, f"README command printed a traceback: {line}\n{tail}"
        timings.append(f"  {seconds:6.1f} s: {line[:100]}")
    print("\nREADME commands:\n" + "\n".join(timings))
    assert (tmp_path / "runs" / "rec" / "rewards").is_dir() and (tmp_path / "runs" / "rec-report").is_dir()
