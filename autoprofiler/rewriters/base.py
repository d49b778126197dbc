"""The rewriter contract and the code extraction shared by every rewriter.

A rewriter turns (task, shown profile) into a candidate source defining ``ModelNew``::

    rewrite = rewriter.rewrite(task, profile)     # profile: already restricted, or None (blind)
    if rewrite.source is None:
        print("no candidate:", rewrite.error)

It never raises for a bad answer: the failure is data (``Rewrite.error``) so one task's failure never
stops a sweep.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # import cycles and heavy imports stay out of the runtime path
    from autoprofiler.profiling.profile import Profile
    from autoprofiler.tasks import Task

NO_CODE_ERROR = "no code block defining ModelNew in the answer"


@dataclass
class Rewrite:
    """One rewriter output.

    Attributes:
        source: candidate source defining ``ModelNew``; None when there is none.
        llm_calls: LLM calls spent (0 for a cache hit or a rule rewriter; 1 for one answered or failed
            call, however many HTTP attempts it took).
        prompt_tokens / completion_tokens: from the LLM's ``usage`` (0 when cached or rule-based).
        raw: the raw LLM answer, or the rule action's description with its reason.
        error: ``""`` when ``source`` is set, else why there is none.
        action: the rule action chosen (``RuleRewriter``), ``""`` for the LLM.
        attempts: HTTP requests behind ``llm_calls`` (retries included; 0 when cached).
    """

    source: str | None
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    raw: str = ""
    error: str = ""
    action: str = ""
    attempts: int = 0

    @property
    def ok(self) -> bool:
        return self.source is not None and not self.error

    def to_dict(self) -> dict:
        return asdict(self)


@runtime_checkable
class Rewriter(Protocol):
    """Anything with a stable ``identity`` (part of the reward key) and ``rewrite(task, profile)``."""

    identity: str

    def rewrite(self, task: Task, profile: Profile | None) -> Rewrite: ...


@runtime_checkable
class ActionRewriter(Protocol):
    """A rewriter whose choice is one of a few named actions (``RuleRewriter``).

    Its outcome depends on the profile only through the chosen action, so an environment evaluates
    each (task, action) once, keyed by ``actions_identity``, and derives the row of every configuration
    from the action that ``decide`` picks when shown that configuration.
    """

    identity: str
    actions_identity: str

    def rewrite(self, task: Task, profile: Profile | None) -> Rewrite: ...

    def actions(self) -> list[str]: ...

    def decide(self, profile: Profile | None) -> tuple[str, str]: ...

    def for_action(self, action: str) -> Rewriter: ...


class ExtractionError(ValueError):
    """The answer holds no usable ``ModelNew`` code; the message starts with ``NO_CODE_ERROR``."""


# A fenced block: ``` or ~~~ (3+), an optional info string, the body, the same fence closing it or the
# end of the text (an answer cut off at max_tokens still yields its last, unterminated block).
_FENCE = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)\n(?P<body>.*?)(?:^[ \t]*(?P=fence)[ \t]*$|\Z)",
    re.MULTILINE | re.DOTALL,
)
_DEFINES_MODELNEW = re.compile(r"^[ \t]*class[ \t]+ModelNew\b", re.MULTILINE)
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)


def code_blocks(answer: str) -> list[tuple[str, str]]:
    """Fenced code blocks of a Markdown answer as ``(info string, body)``, in order."""
    return [(m.group("info").strip().lower(), m.group("body")) for m in _FENCE.finditer(answer)]


def extract_code(answer: str) -> str:
    """The ``ModelNew`` source in an LLM answer.

    Rules, in order:

    1. Line endings are normalized to ``\\n``; ``<think>...</think>`` reasoning (emitted by reasoning
       models served by vLLM/SGLang) is dropped.
    2. Among the fenced blocks (any language tag), the ones defining ``class ModelNew`` are kept; when
       several do, the **last** is taken: models that revise their answer put the final version last.
       A block indented as a whole (inside a Markdown list) is dedented.
    3. With no fenced block at all, the whole answer is accepted when it parses as Python and defines
       ``class ModelNew`` (some servers strip the fence). Prose around unfenced code does not parse and
       is rejected.

    Parameters:
        answer: the assistant's text.

    Returns: the code, stripped of surrounding blank lines, ending in one newline.

    Raises: ``ExtractionError`` whose message starts with ``NO_CODE_ERROR`` and says what was found.

    Example::

        >>> extract_code("Here:\\n```python\\nclass ModelNew:\\n    pass\\n```\\nDone.")
        'class ModelNew:\\n    pass\\n'
    """
    if not isinstance(answer, str):
        raise ExtractionError(f"{NO_CODE_ERROR}: expected the answer as str, got {type(answer).__name__}")
    text = _THINK.sub("", answer.replace("\r\n", "\n"))
    blocks = code_blocks(text)
    defining = [body for _, body in blocks if _DEFINES_MODELNEW.search(body)]
    if defining:
        return textwrap.dedent(defining[-1]).strip("\n") + "\n"
    if blocks:
        raise ExtractionError(f"{NO_CODE_ERROR} ({len(blocks)} code block(s), none defines class ModelNew)")
    stripped = text.strip("\n")
    if not stripped.strip():
        raise ExtractionError(f"{NO_CODE_ERROR} (the answer is empty)")
    if not re.search(r"\bclass\s+ModelNew\b", stripped):
        raise ExtractionError(f"{NO_CODE_ERROR} (no code block, and no class ModelNew in the text)")
    try:
        tree = ast.parse(stripped)
    except SyntaxError as exc:
        raise ExtractionError(
            f"{NO_CODE_ERROR} (no code block; the text mentions class ModelNew but is not Python: "
            f"line {exc.lineno}: {exc.msg})"
        ) from None
    if not any(isinstance(node, ast.ClassDef) and node.name == "ModelNew" for node in tree.body):
        raise ExtractionError(f"{NO_CODE_ERROR} (no code block; the text defines no top-level ModelNew)")
    return stripped + "\n"
