"""Static checks on a candidate before a worker is spent on it: parse, ``ModelNew``, try/except fallback.

Pure ``ast`` work in the parent process: nothing of the candidate is executed here.
"""

from __future__ import annotations

import ast


def find_fallback_handlers(tree: ast.AST) -> list[str]:
    """Except handlers inside functions whose body calls something outside a ``raise``.

    The heuristic for "try/except falling back to the reference": a candidate that wraps its kernel in
    ``try`` and, on failure, computes the answer another way (``except Exception: return torch.mm(a, b)``)
    is correct on the reference path and can be rewarded for a kernel that never ran. Flagged: any
    ``except`` handler located inside a function or lambda (methods of ``ModelNew`` and helpers alike)
    whose body contains a call that is not part of a ``raise`` statement. Allowed: module-level
    ``try/except`` (import or build fallbacks run once, and the kernel then runs for real), handlers that
    only re-raise, ``pass``, assign constants or return a constant.

    Returns:
        ``["line 12: except Exception: ... calls torch.mm"]``-style descriptions, empty when clean.

    >>> src = "def f(x):\\n    try:\\n        return k(x)\\n    except Exception:\\n        return g(x)\\n"
    >>> find_fallback_handlers(ast.parse(src))
    ['line 4: except handler in f() calls g(...)']
    """
    found: list[str] = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
            elif isinstance(child, ast.Lambda):
                visit(child, function or "<lambda>")
            elif isinstance(child, ast.ExceptHandler) and function is not None:
                call = _first_call_outside_raise(child.body)
                if call is not None:
                    found.append(f"line {child.lineno}: except handler in {function}() calls {call}(...)")
                visit(child, function)
            else:
                visit(child, function)

    visit(tree, None)
    return found


def _first_call_outside_raise(body: list[ast.stmt]) -> str | None:
    for stmt in body:
        if isinstance(stmt, ast.Raise):
            continue
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call):
                return _call_name(node.func)
    return None


def _call_name(func: ast.expr) -> str:
    try:
        return ast.unparse(func)
    except Exception:  # pragma: no cover - unparse handles every expression in practice
        return "<call>"


def check_source(source: str) -> tuple[str, str] | None:
    """Static checks on a candidate before it is run: ``(error_kind, reason)`` or ``None`` when fine.

    ``compile_error`` for a syntax error or no ``ModelNew`` defined or assigned at module level;
    ``suspicious`` for a try/except fallback (see ``find_fallback_handlers``).

    >>> check_source("class ModelNew:\\n    pass\\n") is None
    True
    >>> check_source("def f(:\\n")[0]
    'compile_error'
    """
    if not isinstance(source, str) or not source.strip():
        return "compile_error", "empty candidate source"
    try:
        tree = ast.parse(source, filename="<candidate>")
    except SyntaxError as exc:
        return "compile_error", f"SyntaxError: {exc.msg} (line {exc.lineno}: {(exc.text or '').strip()!r})"
    except (ValueError, RecursionError, MemoryError) as exc:
        return "compile_error", f"cannot parse the candidate: {type(exc).__name__}: {exc}"
    if not _defines_name(tree, "ModelNew"):
        return "compile_error", "the candidate defines no ModelNew (class or assignment at module level)"
    handlers = find_fallback_handlers(tree)
    if handlers:
        return "suspicious", "try/except fallback (may hide a kernel that never ran): " + "; ".join(handlers)
    return None


def _defines_name(tree: ast.Module, name: str) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            return True
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, ast.alias) and (node.asname or node.name.split(".")[-1]) == name:
            return True
    return False
