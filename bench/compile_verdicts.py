"""The Ops-6K compile filter's verdicts for generated tasks recorded on the GPU, from their recording.

    python bench/compile_verdicts.py --recording datasets/recorded/h200

Every recorded task ran the rule rewriter's ``torch_compile`` action (inductor, default mode) on the
GPU at the recording's task size, checked against eager over the correctness trials: that is the
filter's compile run, so its verdict is taken from the action row instead of compiling the task a
second time. A task passes when the compiled model built and ran (``wrong_output`` still passes, as in
``filter_gpu.py --stage compile``: the difference is recorded, not judged); ``compile_error``,
``runtime_error``, ``timeout`` and ``crashed`` fail. Verdicts go to the log beside the table
(``datasets/ops_gen/gpu_verdicts.jsonl``, a task already judged there is kept) and the per-task
summary ``gpu_verdicts.parquet`` is rewritten.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoprofiler.generate.verdicts import (  # noqa: E402
    TASK_COLUMNS,
    append_verdict,
    read_verdicts,
    verdict_row,
    write_summary,
)

FAILED_TO_RUN = ("compile_error", "runtime_error", "timeout", "crashed")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recording", default=str(ROOT / "datasets" / "recorded" / "h200"))
    p.add_argument("--table", default=str(ROOT / "datasets" / "ops_gen" / "tasks.parquet"))
    p.add_argument("--verdicts", default=str(ROOT / "datasets" / "ops_gen" / "gpu_verdicts.jsonl"))
    args = p.parse_args(argv)
    if not Path(args.recording, "rewards").is_dir():
        print(f"error: --recording {args.recording}: no rewards/ folder", file=sys.stderr)
        return 2
    import json

    import pyarrow.parquet as pq

    from autoprofiler.tables import read_table

    tasks = pq.read_table(args.table, columns=list(TASK_COLUMNS)).to_pylist()
    known = {t["hash"] for t in tasks}
    verdicts = read_verdicts(args.verdicts)
    config = Path(args.recording, "config.json")
    size = json.loads(config.read_text()).get("task_size", "") if config.is_file() else ""
    rows = read_table(Path(args.recording) / "rewards", "reward").to_pylist()
    added = 0
    for row in rows:
        h = row["task_hash"]
        if row["kind"] != "action" or row["action"] != "torch_compile" or h not in known:
            continue
        if (h, "compile") in verdicts:
            continue
        kind = row["error_kind"] or ""
        ok = bool(row["compiled"]) and kind not in FAILED_TO_RUN
        data = {"speedup_vs_eager": row["speedup"], "eager_ms": None, "compile_s": None}
        context = {
            "device": row["device"],
            "size": size,
            "workers": 1,
            "from": f"{Path(args.recording).name} recording, action torch_compile, run {row['run_id']}",
            "date": str(row["created_at"])[:10],
        }
        verdict = verdict_row(h, "compile", ok, kind, (row["error"] or "")[:300], data, context)
        append_verdict(args.verdicts, verdict)
        verdicts[(h, "compile")] = verdict
        added += 1
    summary = write_summary(tasks, read_verdicts(args.verdicts), Path(args.verdicts).with_suffix(".parquet"))
    judged = sum(1 for t in tasks if (t["hash"], "compile") in verdicts)
    print(f"{added} compile verdicts added from {args.recording}; {judged} judged; summary -> {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
