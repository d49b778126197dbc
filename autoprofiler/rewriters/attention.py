"""Source-level substitution of explicit attention by ``torch.nn.functional.scaled_dot_product_attention``.

The pattern, in any function of a task source (methods included), is the textbook one::

    scores = q @ k.transpose(-2, -1) * scale          # or torch.matmul(q, k.mT) / d ** 0.5, or unscaled
    scores = scores.masked_fill(mask, float("-inf"))  # optional; causal: torch.ones(L, L, ...).triu(1)
    out = torch.softmax(scores, dim=-1) @ v           # or F.softmax(...), scores.softmax(-1), matmul(...)

and it is replaced by one call ``torch.nn.functional.scaled_dot_product_attention(q, k, v, ...)`` (with
``is_causal=True`` for the ``triu(1)`` mask, ``attn_mask=torch.logical_not(mask)`` for any other boolean
mask, ``scale=`` the scale), so the (L x L) score matrix is never materialized in DRAM: a fused (flash or
memory-efficient) kernel keeps it on chip.

What is matched, exactly (anything else is left alone, so a source this does not recognize is returned
unchanged): the intermediate names (``scores``, ``mask``) must be assigned once each, in top-level
statements of the function body (not inside ``if``/``for``), and used nowhere but in the pattern; softmax
must be over the last dimension (``dim=-1``) with no other arguments; the transpose must swap the last
two dimensions (``transpose(-2, -1)``, ``transpose(-1, -2)``, ``.mT``; ``transpose(1, 2)`` only under
``torch.bmm``, whose operands are 3-D); the masked value must be ``-inf``. The replaced statements become
``pass``, and the rest of the source is kept byte for byte (edits are made on source spans).

Example::

    >>> src = (
    ...     "def f(q, k, v):\\n"
    ...     "    s = q @ k.transpose(-2, -1) * 0.125\\n"
    ...     "    return torch.softmax(s, dim=-1) @ v\\n"
    ... )
    >>> new, count = substitute_attention(src)
    >>> count, "scaled_dot_product_attention(q, k, v, scale=float(0.125))" in new
    (1, True)
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

SDPA = "torch.nn.functional.scaled_dot_product_attention"


@dataclass(frozen=True)
class _Match:
    """One recognized attention: the expressions and the statements it consumes."""

    node: ast.expr  # the softmax(...) @ v expression to replace
    q: ast.expr
    k: ast.expr
    v: ast.expr
    scale: str | None  # source of the scale expression, already inverted for a division
    causal: bool
    mask: ast.expr | None  # a boolean mask that is not the causal triu(1) one
    consumed: tuple[ast.stmt, ...]  # assignments of the intermediate names, removed


def _is_name(node: ast.AST, *dotted: str) -> bool:
    """``node`` is one of the dotted names (``torch.softmax``, ``F.softmax``)."""
    try:
        text = ast.unparse(node)
    except Exception:  # pragma: no cover - unparse handles every expression node
        return False
    return text in dotted


def _const(node: ast.AST) -> object:
    """The Python value of a (possibly negated) literal, else a sentinel."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _const(node.operand)
        return -inner if isinstance(inner, int | float) and not isinstance(inner, bool) else _NO
    return _NO


_NO = object()
_SOFTMAX = ("torch.softmax", "F.softmax", "torch.nn.functional.softmax", "nn.functional.softmax")
_MATMUL = ("torch.matmul", "torch.bmm")


class _Function:
    """The top-level statements of one function body, and the loads and stores of every name in it."""

    def __init__(self, function: ast.FunctionDef | ast.AsyncFunctionDef):
        self.function = function
        self.assigns: dict[str, list[tuple[int, ast.Assign]]] = {}  # name -> (statement index, statement)
        self.stores: dict[str, int] = {}
        self.loads: dict[str, int] = {}
        self.position: dict[int, int] = {}  # id(node) -> index of the top-level statement holding it
        for index, stmt in enumerate(function.body):
            for node in ast.walk(stmt):
                self.position[id(node)] = index
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
            ):
                self.assigns.setdefault(stmt.targets[0].id, []).append((index, stmt))
        for node in ast.walk(function):
            if isinstance(node, ast.Name):
                bucket = self.loads if isinstance(node.ctx, ast.Load) else self.stores
                bucket[node.id] = bucket.get(node.id, 0) + 1
            elif isinstance(node, ast.arg):
                self.stores[node.arg] = self.stores.get(node.arg, 0) + 1

    def definition(self, name: str, before: int) -> tuple[int, ast.Assign] | None:
        """The last top-level ``name = ...`` before statement ``before``, when every store of ``name`` in
        the function is such a top-level assignment (so straight-line order decides which value is used)."""
        defs = self.assigns.get(name, [])
        if len(defs) != self.stores.get(name, 0):
            return None
        earlier = [(i, stmt) for i, stmt in defs if i < before]
        return earlier[-1] if earlier else None


def _softmax_arg(node: ast.AST) -> ast.expr | None:
    """``S`` of ``softmax(S, dim=-1)`` in any of the accepted spellings, else None."""
    if not isinstance(node, ast.Call):
        return None
    args, keywords = list(node.args), {kw.arg: kw.value for kw in node.keywords}
    if None in keywords:
        return None
    if _is_name(node.func, *_SOFTMAX):
        if not args:
            return None
        subject, rest = args[0], args[1:]
    elif isinstance(node.func, ast.Attribute) and node.func.attr == "softmax":
        subject, rest = node.func.value, args
    else:
        return None
    dims = rest + ([keywords.pop("dim")] if "dim" in keywords else [])
    if keywords or len(dims) != 1 or _const(dims[0]) != -1:
        return None
    return subject


def _matmul_operands(node: ast.AST) -> tuple[ast.expr, ast.expr, bool] | None:
    """``(a, b, is_bmm)`` of ``a @ b`` / ``torch.matmul(a, b)`` / ``torch.bmm(a, b)`` / ``a.matmul(b)``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return node.left, node.right, False
    if (
        isinstance(node, ast.Call)
        and not node.keywords
        and len(node.args) == 2
        and _is_name(node.func, *_MATMUL)
    ):
        return node.args[0], node.args[1], _is_name(node.func, "torch.bmm")
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "matmul"
        and len(node.args) == 1
        and not node.keywords
    ):
        return node.func.value, node.args[0], False
    return None


def _untransposed(node: ast.AST, bmm: bool) -> ast.expr | None:
    """``k`` of ``k.transpose(-2, -1)`` (and the other accepted spellings), else None."""
    if isinstance(node, ast.Attribute) and node.attr == "mT":
        return node.value
    if not isinstance(node, ast.Call) or node.keywords:
        return None
    if isinstance(node.func, ast.Attribute) and node.func.attr == "transpose" and len(node.args) == 2:
        subject, dims = node.func.value, node.args
    elif _is_name(node.func, "torch.transpose") and len(node.args) == 3:
        subject, dims = node.args[0], node.args[1:]
    else:
        return None
    pair = {_const(dims[0]), _const(dims[1])}
    if pair == {-2, -1} or (bmm and pair == {1, 2}):
        return subject
    return None


def _is_minus_inf(node: ast.AST) -> bool:
    text = ast.unparse(node).replace(" ", "").replace("'", '"')
    return text in ('float("-inf")', '-float("inf")', "-math.inf", "-torch.inf", "float(-math.inf)")


def _is_causal_mask(node: ast.AST) -> bool:
    """``torch.ones(L, L, ...).triu(1)`` / ``.triu(diagonal=1)`` / ``torch.triu(torch.ones(...), 1)``."""
    if not isinstance(node, ast.Call):
        return False
    if isinstance(node.func, ast.Attribute) and node.func.attr == "triu":
        ones, offset = node.func.value, node.args[0] if node.args else None
    elif _is_name(node.func, "torch.triu") and node.args:
        ones, offset = node.args[0], node.args[1] if len(node.args) > 1 else None
    else:
        return False
    for kw in node.keywords:
        if kw.arg == "diagonal":
            offset = kw.value
    if offset is None or _const(offset) != 1:
        return False
    if not (isinstance(ones, ast.Call) and _is_name(ones.func, "torch.ones") and len(ones.args) == 2):
        return False
    same = ast.unparse(ones.args[0]) == ast.unparse(ones.args[1])
    boolean = any(kw.arg == "dtype" and _is_name(kw.value, "torch.bool") for kw in ones.keywords)
    return same and boolean


class _Matcher:
    """Finds attention patterns in one function (see the module docstring for what is accepted)."""

    def __init__(self, function: ast.FunctionDef | ast.AsyncFunctionDef):
        self.fn = _Function(function)

    def resolve(self, node: ast.expr, at: list[int], consumed: list[ast.stmt]) -> ast.expr:
        """``node``, or the value of the top-level assignment it names as seen from statement ``at[0]``
        (that assignment is recorded in ``consumed`` and becomes the new position)."""
        if isinstance(node, ast.Name):
            found = self.fn.definition(node.id, at[0])
            if found is not None:
                at[0] = found[0]
                consumed.append(found[1])
                return found[1].value
        return node

    def match(self, node: ast.expr) -> _Match | None:
        operands = _matmul_operands(node)
        if operands is None or id(node) not in self.fn.position:
            return None
        probs, v, _ = operands
        at, consumed = [self.fn.position[id(node)]], []
        scores = _softmax_arg(self.resolve(probs, at, consumed))
        if scores is None:
            return None
        scores = self.resolve(scores, at, consumed)
        causal, mask = False, None
        if (
            isinstance(scores, ast.Call)
            and isinstance(scores.func, ast.Attribute)
            and scores.func.attr == "masked_fill"
            and len(scores.args) == 2
            and not scores.keywords
            and _is_minus_inf(scores.args[1])
        ):
            mask_node, mask_at, mask_stmts = scores.args[0], list(at), []
            if _is_causal_mask(self.resolve(mask_node, mask_at, mask_stmts)):
                causal = True
                consumed.extend(mask_stmts)
            else:
                mask = mask_node  # a general mask keeps its own statement
            scores = self.resolve(scores.func.value, at, consumed)
        scale = None
        if isinstance(scores, ast.BinOp) and isinstance(scores.op, ast.Mult | ast.Div):
            left_qk, right_qk = _matmul_operands(scores.left), _matmul_operands(scores.right)
            if isinstance(scores.op, ast.Div) and left_qk:
                scale, scores = f"1.0 / ({ast.unparse(scores.right)})", scores.left
            elif isinstance(scores.op, ast.Mult) and left_qk:
                scale, scores = ast.unparse(scores.right), scores.left
            elif isinstance(scores.op, ast.Mult) and right_qk:
                scale, scores = ast.unparse(scores.left), scores.right
        qk = _matmul_operands(scores)
        if qk is None:
            return None
        q, kt, bmm = qk
        k = _untransposed(kt, bmm)
        if k is None or not self.uses_only_in_pattern(consumed, node):
            return None
        return _Match(node, q, k, v, scale, causal, mask, tuple(consumed))

    def uses_only_in_pattern(self, consumed: list[ast.stmt], node: ast.expr) -> bool:
        """Every intermediate name is loaded only inside the pattern (``node`` and the consumed values),
        and every store of it is one of the consumed statements."""
        inside: dict[str, int] = {}
        for part in [node, *(stmt.value for stmt in consumed)]:
            for sub in ast.walk(part):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                    inside[sub.id] = inside.get(sub.id, 0) + 1
        names = [stmt.targets[0].id for stmt in consumed]
        return all(
            self.fn.loads.get(name, 0) == inside.get(name, 0)
            and self.fn.stores.get(name, 0) == names.count(name)
            for name in names
        )


def _offsets(source: str) -> list[int]:
    starts, total = [0], 0
    for line in source.splitlines(keepends=True):
        total += len(line)
        starts.append(total)
    return starts


def substitute_attention(source: str) -> tuple[str, int]:
    """``(source with each recognized attention replaced by SDPA, how many were replaced)``.

    A source that does not parse, or holds no recognized pattern, comes back unchanged with count 0.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source, 0
    matches: list[_Match] = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        matcher = _Matcher(function)
        taken: set[int] = set()
        for node in ast.walk(function):
            if isinstance(node, ast.expr) and id(node) not in taken:
                found = matcher.match(node)
                if found is not None and not any(id(s) in taken for s in found.consumed):
                    matches.append(found)
                    taken.update(id(s) for s in found.consumed)
                    taken.update(id(sub) for sub in ast.walk(node))
    if not matches:
        return source, 0
    starts = _offsets(source)

    def span(node: ast.AST) -> tuple[int, int]:
        return (
            starts[node.lineno - 1] + node.col_offset,
            starts[node.end_lineno - 1] + node.end_col_offset,
        )

    def text(node: ast.AST) -> str:
        segment = ast.get_source_segment(source, node)
        return segment if segment is not None else ast.unparse(node)

    edits: list[tuple[int, int, str]] = []
    for m in matches:
        args = [text(m.q), text(m.k), text(m.v)]
        if m.mask is not None:
            args.append(f"attn_mask=torch.logical_not({text(m.mask)})")
        if m.causal:
            args.append("is_causal=True")
        if m.scale is not None:
            args.append(f"scale=float({m.scale})")
        start, end = span(m.node)
        edits.append((start, end, f"{SDPA}({', '.join(args)})"))
        for stmt in m.consumed:
            s, e = span(stmt)
            edits.append((s, e, "pass  # autoprofiler sdpa: intermediate of the fused attention"))
    out = source
    for start, end, replacement in sorted(edits, reverse=True):
        out = out[:start] + replacement + out[end:]
    return out, len(matches)
