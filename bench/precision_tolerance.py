"""Which tolerance reduced-precision candidates pass, through the sandboxed evaluator (CPU, small sizes).

    python bench/precision_tolerance.py --out bench/results/precision_tolerance_cpu.md

The playbook picks autocast_fp16 at a tolerance >= 1e-2 and autocast_bf16 at >= 1e-1 (``playbook.py``);
this checks those tiers on GEMM-heavy suite tasks: each candidate is evaluated at atol = rtol = each
tolerance (``rel_norm_tol`` at its default, 10x). CPU autocast rounds the operands like CUDA autocast
(fp16: 10 stored mantissa bits, bf16: 7) with fp32 accumulation; TF32 has no CPU path, so it is not here.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoprofiler.evaluation import EvalConfig, Evaluator  # noqa: E402
from autoprofiler.rewriters import PlaybookRewriter  # noqa: E402
from autoprofiler.tasks import load_task_file  # noqa: E402

TASKS = ("l1/matmul_square", "l3/mlp_block", "l2/linear_gelu")
ACTIONS = ("autocast_fp16", "autocast_bf16")
TOLERANCES = (1e-4, 1e-2, 5e-2, 1e-1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    config = EvalConfig(device="cpu", task_size="small", correctness_trials=2, timing_trials=3, warmup=1)
    lines = [
        "# Reduced-precision candidates vs tolerance (CPU, small sizes, sandboxed evaluator)",
        "",
        f"`python bench/precision_tolerance.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
        "| task | action | " + " | ".join(f"tol {t:g}" for t in TOLERANCES) + " |",
        "| --- | --- | " + " | ".join("---" for _ in TOLERANCES) + " |",
    ]
    with Evaluator(config, spares=1) as evaluator:
        for rel in TASKS:
            task = load_task_file(ROOT / "datasets" / "suite" / f"{rel}.py")
            for action in ACTIONS:
                source = PlaybookRewriter().source_for(task, action)
                cells = []
                for tol in TOLERANCES:
                    result = evaluator.evaluate(
                        task, source, config=dataclasses.replace(config, atol=tol, rtol=tol)
                    )
                    cells.append("pass" if result.correct else f"fail ({_max_diff(result.error)})")
                lines.append(f"| {rel} | {action} | " + " | ".join(cells) + " |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _max_diff(error: str) -> str:
    """The evaluator's 'max abs diff X' from a wrong_output message, else its first words."""
    marker = "max abs diff "
    if marker in error:
        return "max abs diff " + error.split(marker, 1)[1].split(" ", 1)[0]
    return " ".join(error.split()[:6])


if __name__ == "__main__":
    sys.exit(main())
