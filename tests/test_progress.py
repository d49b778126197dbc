"""autoprofiler/runtime/progress.py: plain-line progress off a terminal, stage labels, one writer."""

from __future__ import annotations

import threading

from autoprofiler.runtime import progress
from autoprofiler.runtime.progress import Progress, stage


def test_plain_lines_carry_count_rate_and_eta(capsys, monkeypatch):
    """Off a terminal: a line per LINE_SECONDS with count, share, rate and ETA, and a final one."""
    monkeypatch.setattr(progress, "LINE_SECONDS", 0.0)
    monkeypatch.setattr(progress, "QUIET_SECONDS", 0.0)
    with stage("probe sweep"), Progress(4, "cells", tty=False) as bar:
        for _ in range(4):
            bar.update(1)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4 and lines[0].startswith("probe sweep: cells 1/4 (25%), ")
    assert "cell/s" in lines[0] and "ETA" in lines[0]
    assert lines[-1].startswith("probe sweep: cells 4/4 (100%), ") and "ETA" not in lines[-1]


def test_a_quick_loop_stays_quiet_and_lines_still_print(capsys):
    """A loop done within QUIET_SECONDS prints no progress; ``write`` always prints its line (stdout)."""
    with Progress(3, "cells", tty=False) as bar:
        bar.write("task a: correct")
        bar.update(3)
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == "task a: correct\n"
    with Progress(0, "cells", tty=False) as bar:  # nothing to count: no bar, lines still print
        bar.write("x")
    assert capsys.readouterr().out == "x\n"


def test_stage_labels_nest_and_reset():
    """The innermost stage names the bars; leaving it restores the outer one."""
    assert progress.current_stage() == ""
    with stage("learning"):
        with stage("decision 3"):
            assert Progress(1, "cells", enabled=False).desc == "decision 3: cells"
        assert Progress(1, "cells", enabled=False).desc == "learning: cells"
    assert Progress(1, "cells", enabled=False).desc == "cells"


def test_lines_from_threads_never_interleave(capsys):
    """Eight threads writing at once: every line arrives whole."""
    bar = Progress(800, "tasks", tty=False)

    def work(k: int) -> None:
        for i in range(100):
            bar.write(f"thread {k} line {i} " + "x" * 50)
            bar.update(1)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 800 and all(line.endswith("x" * 50) and line.count("thread") == 1 for line in lines)
