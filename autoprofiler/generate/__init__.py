"""Ops-6K-style task generator: compose catalog ops into KernelBench-form tasks, check them, table them.

Modules, lower to higher: ``spec`` (the types ops are written in), ``ops_dense``/``ops_pointwise``/
``ops_shape`` (the ops), ``catalog`` (``CATALOG``), ``sizing`` (the roofline estimate and batch choice),
``compose`` (``generate_task``), ``pool`` + ``_worker`` (worker processes that run task code),
``checks`` (the CPU check and GPU filter jobs), ``dataset`` (dedup, the table), ``verdicts`` (the GPU
filters' log and summary). Scripts: ``datasets/ops_gen/make.py``, ``datasets/ops_gen/filter_gpu.py``.

>>> from autoprofiler.generate import generate_task
>>> generate_task(0).data_source.startswith("torch#")
True
"""

from autoprofiler.generate.catalog import CATALOG, FAMILIES, make_catalog
from autoprofiler.generate.checks import check_on_cpu
from autoprofiler.generate.compose import ComposeError, GenerateConfig, GeneratedTask, generate_task
from autoprofiler.generate.dataset import Dataset, build_dataset, write_tables

__all__ = [
    "CATALOG",
    "FAMILIES",
    "ComposeError",
    "Dataset",
    "GenerateConfig",
    "GeneratedTask",
    "build_dataset",
    "check_on_cpu",
    "generate_task",
    "make_catalog",
    "write_tables",
]
