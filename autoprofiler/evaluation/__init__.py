"""Sandboxed evaluation of candidate kernels: ``Evaluator``, ``evaluate``, ``EvalConfig``, ``EvalResult``.

Modules: ``results`` (the contract's data), ``static_checks`` (parse + try/except-fallback heuristic),
``workers`` (fork server, worker processes, scrubbed environment), ``evaluator`` (the pool and the
result rules), ``_harness`` (the program that runs inside each sandboxed worker).

>>> from autoprofiler.evaluation import ERROR_KINDS
>>> "suspicious" in ERROR_KINDS
True
"""

from autoprofiler.evaluation.evaluator import (
    ERROR_KINDS,
    EvalConfig,
    EvalResult,
    Evaluator,
    EvaluatorError,
    TaskError,
    evaluate,
    identity_candidate,
)

__all__ = [
    "ERROR_KINDS",
    "EvalConfig",
    "EvalResult",
    "Evaluator",
    "EvaluatorError",
    "TaskError",
    "evaluate",
    "identity_candidate",
]
