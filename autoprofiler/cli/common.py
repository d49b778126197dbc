"""What every subcommand shares: the exit codes, ``_Stop`` (a one-line error with its exit code),
device and task-size resolution, loading one task file."""

from __future__ import annotations

EXIT_OK, EXIT_INCORRECT, EXIT_BAD_INPUT, EXIT_ENVIRONMENT = 0, 1, 2, 3


class _Stop(Exception):
    """A problem that ends the command with ``code`` after printing ``message``."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _resolve_device(device: str) -> str:
    """``auto``: cuda when torch sees a CUDA device, else cpu; a ``cuda`` device torch cannot see stops."""
    if device == "auto" or device.startswith("cuda"):
        import torch

        if device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if not torch.cuda.is_available():
            raise _Stop(
                EXIT_ENVIRONMENT,
                f"--device {device} but torch sees no CUDA device here; run on a GPU machine, or pass "
                "--device cpu (with --source torch)",
            )
    return device


def _task_size(size: str, device: str) -> str:
    """``auto``: small on the CPU, full elsewhere."""
    return size if size != "auto" else ("small" if device == "cpu" else "full")


def _load_eval_task(path: str):
    """A Task from a file: ``tasks.load_task_file`` when present (it validates), else a plain read."""
    from autoprofiler import tasks

    loader = getattr(tasks, "load_task_file", None)
    if loader is not None:
        return loader(path)
    from pathlib import Path

    return tasks.Task.from_source(Path(path).stem, Path(path).read_text(), level=0, origin=str(path))


def add_size_option(p) -> None:
    """``--size``: the task size every subcommand that runs a task takes."""
    p.add_argument(
        "--size",
        choices=("auto", "full", "small"),
        default="auto",
        help="task size (AUTOPROFILER_TASK_SIZE); auto: full on CUDA, small on CPU",
    )
