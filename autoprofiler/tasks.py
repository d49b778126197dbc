"""Tasks: reference PyTorch programs in KernelBench form.

A task file defines ``class Model(nn.Module)``, ``get_inputs()`` and ``get_init_inputs()``. Loading a
task never executes it: the source is parsed (``ast``) and checked for those three names.

Sources a task can come from (``load_tasks`` picks the loader from what the path is):

- one ``.py`` file: ``load_task_file``;
- a KernelBench checkout (a folder holding ``level1``, ``level2``, ``level3`` of ``N_Name.py``):
  ``load_kernelbench``; ids ``kernelbench/level1/1_Square_matrix_multiplication_``;
- an Ops-6K style table (``.parquet`` or ``.jsonl`` with columns ``code``, ``ops``, ``data_source``):
  ``load_ops_table``; ids ``<data_source>/row<K>``;
- a folder of our own task files (e.g. ``datasets/suite``): ``load_task_folder``; ids
  ``<folder name>/<relative path without .py>``, e.g. ``suite/l1/matmul_square``.

Level and tags of a file in a task folder come from its header comments, else from its folder
name (``l1``/``level1`` -> 1)::

    # level: 2
    # tags: matmul, activation, compute-bound

Example:
    >>> report = load_tasks("datasets/suite")        # doctest: +SKIP
    >>> len(report), report.errors                   # doctest: +SKIP
    (45, [])
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

REQUIRED_FUNCTIONS = ("get_inputs", "get_init_inputs")
OPS_TABLE_COLUMNS = ("code", "ops", "data_source")
_LEVEL_FOLDER = re.compile(r"^(?:l|level)([1-9])$", re.IGNORECASE)
_KERNELBENCH_FILE = re.compile(r"^(\d+)_(.+)\.py$")
_HEADER = re.compile(r"^#\s*(level|tags)\s*:\s*(.*?)\s*$", re.IGNORECASE)


def content_hash(source: str) -> str:
    """The content hash used as cache key everywhere: sha256 of the UTF-8 source, first 16 hex digits."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Task:
    """One reference program.

    Attributes:
        id: stable and unique within a suite, e.g. ``"suite/l1/matmul_square"``.
        source: the KernelBench-form Python source.
        hash: ``content_hash(source)``.
        level: tier: 1 single op, 2 fused chain of ops, 3 small model.
        tags: free-form labels (``"matmul"``, ``"conv"``, ``"reduction"``, ...).
        origin: where it came from: a path, or ``"file.parquet#row=12"``.
    """

    id: str
    source: str
    hash: str
    level: int
    tags: tuple[str, ...] = ()
    origin: str = ""

    @classmethod
    def from_source(cls, id: str, source: str, level: int = 1, tags=(), origin: str = "") -> Task:
        return cls(
            id=id, source=source, hash=content_hash(source), level=int(level), tags=tuple(tags), origin=origin
        )


class TaskLoadError(Exception):
    """A task that could not be loaded: where it came from and why.

    Example:
        >>> str(TaskLoadError("a/b.py", "missing class Model"))
        'a/b.py: missing class Model'
    """

    def __init__(self, path: str | Path, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")

    def __reduce__(self):
        return (TaskLoadError, (self.path, self.reason))

    def __eq__(self, other):
        return isinstance(other, TaskLoadError) and (self.path, self.reason) == (other.path, other.reason)

    def __hash__(self):
        return hash((self.path, self.reason))


@dataclass
class LoadReport:
    """What a loader found: the tasks that loaded and an error entry for each that did not.

    Iterating (and ``len``) goes over the tasks only; check ``errors`` (or ``ok``) for the rest.

    Example:
        >>> report = LoadReport()
        >>> report.add(Task.from_source("x", "class Model: ..."))
        >>> [t.id for t in report], report.ok
        (['x'], True)
    """

    tasks: list[Task] = field(default_factory=list)
    errors: list[TaskLoadError] = field(default_factory=list)

    def __iter__(self):
        return iter(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, index):
        return self.tasks[index]

    @property
    def ok(self) -> bool:
        return not self.errors

    def by_id(self) -> dict[str, Task]:
        return {task.id: task for task in self.tasks}

    def add(self, task: Task) -> None:
        """Append ``task``; a second task with an id already present becomes an error entry instead."""
        if any(existing.id == task.id for existing in self.tasks):
            self.errors.append(TaskLoadError(task.origin or task.id, f"duplicate task id {task.id!r}"))
            return
        self.tasks.append(task)

    def extend(self, other: LoadReport) -> None:
        for task in other.tasks:
            self.add(task)
        self.errors.extend(other.errors)


def check_source(source: str, origin: str = "<source>") -> None:
    """Check ``source`` is a KernelBench-form task without executing it.

    Raises:
        TaskLoadError: syntax error (with its line), no ``class Model``, or no module-level
            ``def get_inputs`` / ``def get_init_inputs``.

    Example:
        >>> check_source("class Model: pass")
        Traceback (most recent call last):
        ...
        autoprofiler.tasks.TaskLoadError: <source>: missing module-level function get_inputs, get_init_inputs
    """
    try:
        module = ast.parse(source, filename=str(origin))
    except SyntaxError as error:
        raise TaskLoadError(origin, f"syntax error at line {error.lineno}: {error.msg}") from None
    except ValueError as error:  # e.g. null bytes
        raise TaskLoadError(origin, f"cannot parse: {error}") from None
    classes = {node.name for node in module.body if isinstance(node, ast.ClassDef)}
    functions = {
        node.name for node in module.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    if "Model" not in classes:
        raise TaskLoadError(origin, "missing class Model (expected a module-level `class Model(nn.Module)`)")
    missing = [name for name in REQUIRED_FUNCTIONS if name not in functions]
    if missing:
        raise TaskLoadError(origin, f"missing module-level function {', '.join(missing)}")


def read_header(source: str) -> tuple[int | None, tuple[str, ...]]:
    """Level and tags from the leading comment block (``# level: 2``, ``# tags: a, b``).

    Example:
        >>> read_header("# level: 2\\n# tags: matmul, gelu\\nimport torch\\n")
        (2, ('matmul', 'gelu'))
    """
    level, tags = None, ()
    for line in source.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break
        match = _HEADER.match(stripped)
        if not match:
            continue
        key, value = match.group(1).lower(), match.group(2)
        if key == "level" and value.isdigit():
            level = int(value)
        elif key == "tags":
            tags = tuple(tag.strip() for tag in value.split(",") if tag.strip())
    return level, tags


def load_task_file(path: str | Path, id: str | None = None, level: int | None = None, tags=()) -> Task:
    """Load one task file without executing it.

    Args:
        path: a ``.py`` file in KernelBench form.
        id: the task id; default: the file stem.
        level: tier; default: the header comment ``# level: N``, else the parent folder
            (``l2``, ``level2``), else 1.
        tags: labels; default: the header comment ``# tags: a, b``.

    Raises:
        TaskLoadError: unreadable file, syntax error (with line), missing ``Model``,
            ``get_inputs`` or ``get_init_inputs``.

    Example:
        >>> task = load_task_file("datasets/suite/l1/matmul_square.py")  # doctest: +SKIP
        >>> task.id, task.level, task.tags                                 # doctest: +SKIP
        ('matmul_square', 1, ('matmul', 'fp32', 'compute-bound'))
    """
    path = Path(path)
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TaskLoadError(path, f"cannot read: {error}") from None
    check_source(source, path)
    header_level, header_tags = read_header(source)
    if level is None:
        level = header_level
    if level is None:
        match = _LEVEL_FOLDER.match(path.parent.name)
        level = int(match.group(1)) if match else 1
    return Task.from_source(
        id=id or path.stem, source=source, level=level, tags=tuple(tags) or header_tags, origin=str(path)
    )


def load_task_folder(folder: str | Path) -> LoadReport:
    """Load every ``*.py`` task under ``folder`` (recursively, sorted by path).

    Files whose name starts with ``_`` and folders starting with ``.`` or ``_`` are skipped (helpers,
    ``__pycache__``). Ids are ``<folder name>/<relative path without .py>``; level and tags as in
    ``load_task_file``.

    Raises:
        TaskLoadError: ``folder`` is not a directory (per-task problems go to ``report.errors``).

    Example:
        >>> report = load_task_folder("datasets/suite")   # doctest: +SKIP
        >>> report[0].id                                   # doctest: +SKIP
        'suite/l1/argmax_rows'
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise TaskLoadError(folder, "not a directory")
    report = LoadReport()
    for path in sorted(folder.rglob("*.py")):
        relative = path.relative_to(folder)
        if path.name.startswith("_") or any(part.startswith((".", "_")) for part in relative.parts[:-1]):
            continue
        task_id = f"{folder.resolve().name}/{relative.with_suffix('').as_posix()}"
        try:
            report.add(load_task_file(path, id=task_id))
        except TaskLoadError as error:
            report.errors.append(error)
    logger.info("loaded %d tasks from %s (%d errors)", len(report), folder, len(report.errors))
    return report


def load_kernelbench(root: str | Path, levels=(1, 2, 3)) -> LoadReport:
    """Load a KernelBench checkout: folders ``level1``..``level3`` of ``N_Name.py``.

    ``root`` may be the checkout or its ``KernelBench`` subfolder. Ids are
    ``kernelbench/level1/1_Square_matrix_multiplication_``; within a level, sorted by N numerically.
    Files not named ``N_Name.py`` are reported as errors. Other level folders (upstream has
    ``level4`` with Hugging Face models, ``level5``, ...) are loaded only when named in ``levels``.

    Example:
        >>> report = load_kernelbench("datasets/fixtures/kernelbench")   # doctest: +SKIP
        >>> [t.id for t in report][:2]                                    # doctest: +SKIP
        ['kernelbench/level1/1_Square_matrix_multiplication_',
         'kernelbench/level1/2_Standard_matrix_multiplication_']
    """
    root = Path(root)
    if not (root / "level1").is_dir() and (root / "KernelBench" / "level1").is_dir():
        root = root / "KernelBench"
    if not (root / "level1").is_dir():
        raise TaskLoadError(root, "not a KernelBench checkout: expected folders level1..level3")
    report = LoadReport()
    for level_dir in [root / f"level{level}" for level in sorted(levels)]:
        if not level_dir.is_dir():
            report.errors.append(TaskLoadError(level_dir, "level folder missing"))
            continue
        level = int(_LEVEL_FOLDER.match(level_dir.name).group(1))
        numbered = []
        for path in level_dir.glob("*.py"):
            match = _KERNELBENCH_FILE.match(path.name)
            if not match:
                report.errors.append(TaskLoadError(path, "file name is not N_Name.py"))
                continue
            numbered.append((int(match.group(1)), path))
        for _, path in sorted(numbered):
            task_id = f"kernelbench/{level_dir.name}/{path.stem}"
            try:
                report.add(
                    load_task_file(path, id=task_id, level=level, tags=(f"kernelbench-{level_dir.name}",))
                )
            except TaskLoadError as error:
                report.errors.append(error)
    logger.info("loaded %d KernelBench tasks from %s (%d errors)", len(report), root, len(report.errors))
    return report


def _parse_ops(value) -> tuple[str, ...]:
    """``ops`` cell -> tags: a list, a JSON/Python list literal in a string, or a comma-separated string."""
    if value is None:
        return ()
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError:
                try:
                    value = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    value = text.strip("[]").split(",")
        else:
            value = text.split(",")
    return tuple(str(op).strip().strip("'\"") for op in value if str(op).strip().strip("'\""))


def _read_table_rows(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # lazy: only this loader needs pyarrow

        table = pq.read_table(path)
        missing = [name for name in OPS_TABLE_COLUMNS if name not in table.column_names]
        if missing:
            raise TaskLoadError(
                path,
                f"missing column(s) {', '.join(missing)}; "
                f"expected {list(OPS_TABLE_COLUMNS)}, got {table.column_names}",
            )
        return table.select(list(OPS_TABLE_COLUMNS)).to_pylist()
    rows = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as error:
                raise TaskLoadError(path, f"line {line_number} is not JSON: {error}") from None
            if not isinstance(row, dict):
                raise TaskLoadError(path, f"line {line_number} is not a JSON object")
            rows.append(row)
    columns = set().union(*(row.keys() for row in rows)) if rows else set()
    missing = [name for name in OPS_TABLE_COLUMNS if name not in columns]
    if missing:
        raise TaskLoadError(
            path,
            f"missing column(s) {', '.join(missing)}; "
            f"expected {list(OPS_TABLE_COLUMNS)}, got {sorted(columns)}",
        )
    return rows


def ops_task_id(data_source, index: int, path: str | Path) -> str:
    """The id ``load_ops_table`` gives row ``index`` (0-based) of the table at ``path``.

    >>> ops_task_id("torch#3", 17, "tasks.parquet")
    'torch#3/row17'
    """
    return f"{str(data_source or Path(path).stem).strip().replace(' ', '_')}/row{index}"


def load_ops_table(path: str | Path, level: int | None = None) -> LoadReport:
    """Load an Ops-6K style table: ``.parquet`` or ``.jsonl`` with columns ``code``, ``ops``, ``data_source``.

    Row K (0-based) becomes task ``<data_source>/row<K>`` with tags from ``ops`` (a list, or a string
    holding a list or comma-separated names) and origin ``"<path>#row=K"``. Its level is ``level`` when
    given, else the code's ``# level: N`` header (as a task file's), else 1. A row whose code is not a
    valid task is an error entry; the other rows still load.

    Raises:
        TaskLoadError: unreadable file, unknown suffix, or a missing column (named in the reason).

    Example:
        >>> report = load_ops_table("datasets/fixtures/ops_table.jsonl")   # doctest: +SKIP
        >>> report[0].id, report[0].origin                                  # doctest: +SKIP
        ('ops6k-fixture/row0', 'datasets/fixtures/ops_table.jsonl#row=0')
    """
    path = Path(path)
    if path.suffix not in (".parquet", ".jsonl"):
        raise TaskLoadError(path, f"expected a .parquet or .jsonl table, got suffix {path.suffix!r}")
    if not path.is_file():
        raise TaskLoadError(path, "no such file")
    rows = _read_table_rows(path)
    report = LoadReport()
    for index, row in enumerate(rows):
        origin = f"{path}#row={index}"
        code = row.get("code")
        if not isinstance(code, str):
            report.errors.append(TaskLoadError(origin, f"code is {type(code).__name__}, expected str"))
            continue
        try:
            check_source(code, origin)
        except TaskLoadError as error:
            report.errors.append(error)
            continue
        report.add(
            Task.from_source(
                id=ops_task_id(row.get("data_source"), index, path),
                source=code,
                level=level or read_header(code)[0] or 1,
                tags=_parse_ops(row.get("ops")),
                origin=origin,
            )
        )
    logger.info("loaded %d tasks from %s (%d errors)", len(report), path, len(report.errors))
    return report


def load_tasks(spec: str | Path) -> LoadReport:
    """Load tasks from whatever ``spec`` names: a ``.py`` file, a KernelBench checkout (a folder with
    ``level1/`` or ``KernelBench/level1/``), a folder of task files, or a ``.parquet``/``.jsonl`` table.

    Raises:
        TaskLoadError: ``spec`` does not exist or is none of the above.

    Example:
        >>> [t.id for t in load_tasks("datasets/suite/l1/relu.py")]   # doctest: +SKIP
        ['relu']
    """
    path = Path(spec)
    if path.is_file():
        if path.suffix in (".parquet", ".jsonl"):
            return load_ops_table(path)
        if path.suffix == ".py":
            report = LoadReport()
            try:
                report.add(load_task_file(path))
            except TaskLoadError as error:
                report.errors.append(error)
            return report
        raise TaskLoadError(
            path, f"expected a .py task, a .parquet/.jsonl table or a folder, got {path.suffix!r}"
        )
    if path.is_dir():
        if (path / "level1").is_dir() or (path / "KernelBench" / "level1").is_dir():
            return load_kernelbench(path)
        return load_task_folder(path)
    raise TaskLoadError(path, "no such file or folder")


def refinement_task(task: Task, candidate_source: str, round: int) -> Task:
    """The program that round ``round`` optimizes: the best candidate so far, as a KernelBench task.

    The candidate's ``ModelNew`` becomes ``Model``: when the candidate defines ``get_inputs`` itself, its
    ``ModelNew`` tokens are renamed; otherwise the candidate is appended to the reference (which brings
    ``get_inputs``/``get_init_inputs``) followed by ``Model = ModelNew``. The next round is then evaluated
    against the previous best, and the speedup over the original is the product of the rounds'.
    """
    if re.search(r"^def\s+get_inputs\b", candidate_source, re.MULTILINE):
        source = re.sub(r"\bModelNew\b", "Model", candidate_source)
    else:
        source = (
            f"{task.source.rstrip()}\n\n# --- best candidate before round {round} ---\n"
            f"{candidate_source.rstrip()}\n\nModel = ModelNew\n"
        )
    return Task.from_source(
        f"{task.id}@r{round}", source, level=task.level, tags=task.tags, origin=task.origin
    )
